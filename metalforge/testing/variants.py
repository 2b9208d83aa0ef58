"""The variants `check` compiles a kernel as: a dtype for each dtype variable x a value for each
`mf.Const`, those the schedules refuse set apart, and at most a profile's number of them chosen
to cover the most dtypes and values.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from .. import dtypes as _dtypes
from ..errors import BindingError, TraceError, UnsupportedConstruct
from ..graph import ConstParam, Graph, TensorParam
from ..runtime import schedule_of

# the dtypes tried, in this order, for a dtype variable that dtypes= leaves free
PREFERRED = ("f32", "f16", "bf16", "i32", "u32", "i16", "u16", "i8", "u8", "bool")


@dataclass(frozen=True)
class CheckVariant:
    """One compiled specialisation: dtype-variable bindings and Const values."""
    dtypes: dict[str, str]
    consts: dict[str, Any]
    graph: Graph
    grad: bool = False          # also compare gradients (check's grad=)

    def describe(self) -> str:
        parts = [f"{k}={v}" for k, v in self.dtypes.items()]
        parts += [f"{k}={v!r}" for k, v in self.consts.items()]
        return ", ".join(parts) or "(single variant)"


def const_values(param: ConstParam, pin: Any = None) -> list:
    """The variants compiled for a Const: both bools; an int Const's default (else 1, 2, 4);
    ``pin``: one value or a list."""
    if pin is not None:
        vals = list(pin) if isinstance(pin, (list, tuple)) else [pin]
        for v in vals:
            if not isinstance(v, param.pytype) or (param.pytype is int and isinstance(v, bool)):
                raise TypeError(f"values['{param.name}']: Const[{param.pytype.__name__}] "
                                f"values must be {param.pytype.__name__}, got {v!r}")
        return vals
    if param.pytype is bool:
        return [param.default, not param.default] if param.has_default else [False, True]
    return [param.default] if param.has_default else [1, 2, 4]


def split_values(values, params, kernel):
    if values is None:
        return {}, None
    if isinstance(values, str):
        return {}, [values]
    if isinstance(values, (list, tuple)) and all(isinstance(v, str) for v in values):
        return {}, list(values)
    if not isinstance(values, Mapping):
        raise TypeError(f"check({kernel.name}): values= must be a mapping from parameter name "
                        f"to families/ranges/values, or family name(s); got {values!r}")
    names = {p.name for p in params}
    for k in values:
        if k not in names:
            raise ValueError(f"check({kernel.name}): values= names '{k}', which is not a "
                             f"parameter (parameters: {', '.join(sorted(names))})")
    return dict(values), None


def _dtype_vars(params) -> dict[str, list[TensorParam]]:
    out: dict[str, list[TensorParam]] = {}
    for p in params:
        if isinstance(p, TensorParam) and p.dtype_var:
            out.setdefault(p.dtype_var, []).append(p)
    return out


def variants(kernel, params, dtypes, per_param) -> tuple[list[CheckVariant], list[str]]:
    """The variants that trace and lower, and those the schedules refuse with a clear error
    before any launch (e.g. integer sums): "T=i32: <error>". Refusing is the kernel's
    documented behaviour, not a wrong answer, so these are left out (and reported)."""
    dvars = _dtype_vars(params)
    dtypes = dict(dtypes or {})
    for k in dtypes:
        if k not in dvars:
            raise ValueError(f"check({kernel.name}): dtypes= names '{k}', which is not a dtype "
                             f"variable of the kernel (its variables: "
                             f"{', '.join(dvars) or 'none'})")
    choices: list[list[str]] = []
    for var in dvars:
        want = dtypes.get(var)
        if want is None:
            cands = list(PREFERRED)
        else:
            cands = [want] if isinstance(want, str) else list(want)
            for c in cands:
                if c not in _dtypes.ANNOTATION_DTYPES:
                    raise ValueError(f"check({kernel.name}): dtypes['{var}'] has unknown dtype "
                                     f"'{c}' (known: {', '.join(_dtypes.ANNOTATION_DTYPES)})")
        choices.append(cands)
    consts = [p for p in params if isinstance(p, ConstParam)]
    const_choices = [const_values(p, per_param.get(p.name)) for p in consts]
    out: list[CheckVariant] = []
    errors: list[str] = []
    refused: list[str] = []
    for combo in itertools.product(*choices):
        dt = dict(zip(dvars, combo))
        for cvals in itertools.product(*const_choices):
            cs = {p.name: v for p, v in zip(consts, cvals)}
            try:
                graph = kernel.graph(**dt, **cs)        # bindings only: trace, no tensors
            except (BindingError, TraceError) as e:     # this dtype is not accepted
                if str(e) not in errors:
                    errors.append(str(e))
                continue
            v = CheckVariant(dt, cs, graph)
            try:
                schedule_of(graph, launch=getattr(kernel, "launch", None))
            except UnsupportedConstruct as e:
                refused.append(f"{v.describe()}: {e}")
                continue
            out.append(v)
    if not out:
        raise ValueError(f"check({kernel.name}): no dtype/Const combination traces and lowers; "
                         f"the errors were:\n" + "\n".join((errors + refused)[:5]))
    return out, refused


def spread(variants: list[CheckVariant], cap: Optional[int]) -> list[CheckVariant]:
    """At most ``cap`` variants, chosen greedily to cover the most dtype and Const values:
    each pick is the (earliest) variant adding the most values not yet covered."""
    if cap is None or len(variants) <= cap:
        return variants

    def values(v: CheckVariant) -> set:
        return set(v.dtypes.items()) | {(k, repr(x)) for k, x in v.consts.items()}

    chosen: list[CheckVariant] = []
    seen: set = set()
    while len(chosen) < cap:
        rest = [v for v in variants if v not in chosen]
        best = max(rest, key=lambda v: (len(values(v) - seen), -variants.index(v)))
        chosen.append(best)
        seen |= values(best)
    return sorted(chosen, key=variants.index)
