"""Hypothesis strategies for a kernel's inputs: dim sizes, values, layouts, scalars, Consts.

Everything here works from a kernel's declared parameters (`metalforge.graph` params), so it is
usable on plain torch without any kernel. Tensor *data* is not drawn element by element: a draw
picks a value family and a seed, and `make_values` builds the tensor from them with torch's
generator. That keeps examples fast, shrinkable (family, seed, sizes shrink) and reproducible
from the report alone.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional, Sequence

import torch
from hypothesis import strategies as st

from ..dtypes import DType
from ..graph import AxisSpec, ConstParam, Param, ScalarParam, TensorParam
from ..shapes import base_multiple

# --------------------------------------------------------------------------- sizes

# The first of each is what hypothesis' simplest example (every check's first) takes: 3, not 1,
# so that it has several rows, heads, groups and threadgroups (an index that ignores which one
# it is in passes with one of each)
SMALL_SIZES = (3, 1, 2, 4, 5, 6, 7, 8)
EDGE_SIZES = (1, 2, 3, 4, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256,
              257, 511, 512, 513, 1023, 1024, 1025, 2047, 2048, 2049, 4095, 4096, 4097)
LARGE_SIZES = (8191, 8193, 16383, 16385, 32769, 65535, 65537, 262145, 1048577)
BATCH_SIZES = (3, 1, 2, 4, 5)
MAX_BATCH_DIMS = 3


@dataclass(frozen=True)
class Sizes:
    """Sizes drawn for one example: every axis's size and each batch axis's leading shape."""
    sizes: dict[str, int]
    batch: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def shape(self, param: TensorParam) -> tuple[int, ...]:
        """The full (unflattened) shape of a tensor argument."""
        shape: list[int] = []
        for axes in param.storage:
            if axes[0].batch:
                shape.extend(self.batch[axes[0].name])
            else:
                shape.append(math.prod(self.sizes[d.name] for d in axes))
        return tuple(shape)

    def describe(self) -> str:
        parts = [f"{k}={v}" for k, v in self.sizes.items() if k not in self.batch]
        parts += [f"*{k}={v}" for k, v in self.batch.items()]
        return ", ".join(parts)


@dataclass(frozen=True)
class DimPlan:
    """What must be drawn: plain dims (with the multiple they must be), derived, batch dims."""
    plain: dict[str, int]                 # base/plain dim -> required multiple (1 if free)
    derived: dict[str, AxisSpec]          # derived axis name -> spec
    batch: tuple[str, ...]
    tensors: int                          # tensor parameters (for the memory estimate)


def dim_plan(params: Iterable[Param]) -> DimPlan:
    plain: dict[str, int] = {}
    derived: dict[str, AxisSpec] = {}
    batch: list[str] = []
    n = 0
    for p in params:
        if not isinstance(p, TensorParam):
            continue
        n += 1
        for d in p.dims:
            if d.batch:
                if d.name not in batch:
                    batch.append(d.name)
            elif d.derived:
                derived[d.name] = d
                plain[d.base] = math.lcm(plain.get(d.base, 1), base_multiple(d))
            else:
                plain.setdefault(d.name, 1)
    return DimPlan(plain, derived, tuple(batch), n)


def _size_choices(pin: Any, name: str) -> st.SearchStrategy[int]:
    if isinstance(pin, bool):
        raise TypeError(f"dims['{name}'] must be an int, a range, (lo, hi) or a list of ints")
    if isinstance(pin, int):
        return st.just(pin)
    if isinstance(pin, range):
        return st.sampled_from(pin) if pin.step != 1 else st.integers(pin.start, pin.stop - 1)
    if isinstance(pin, tuple) and len(pin) == 2 and all(isinstance(v, int) for v in pin):
        return st.integers(pin[0], pin[1])
    if isinstance(pin, list) and pin and all(isinstance(v, int) for v in pin):
        return st.sampled_from(pin)
    raise TypeError(f"dims['{name}'] must be an int, a range, (lo, hi) or a non-empty list of "
                    f"ints, got {pin!r}")


def _batch_choices(pin: Any, name: str) -> st.SearchStrategy[tuple[int, ...]]:
    if isinstance(pin, tuple) and all(isinstance(v, int) for v in pin):
        return st.just(pin)
    if isinstance(pin, list) and pin and all(isinstance(v, tuple) for v in pin):
        return st.sampled_from(pin)
    raise TypeError(f"dims['{name}'] is a batch dim (*{name}): give its leading shape as a "
                    f"tuple of ints, or a list of such tuples, got {pin!r}")


def _round_up(n: int, multiple: int) -> int:
    return max(multiple, -(-n // multiple) * multiple)


@st.composite
def sizes(draw, plan: DimPlan, *, pinned: Optional[Mapping[str, Any]] = None,
          max_elements: int = 1 << 18, reduced: frozenset[str] = frozenset(),
          empty: bool = True) -> Sizes:
    """Sizes for every dim of ``plan``; the product of all sizes stays within ``max_elements``
    (unless the sizes ``pinned`` gives exceed it alone: they are drawn first, and the free dims
    share what of the budget they leave).

    Plain dims are drawn from small sizes, edge sizes (powers of two ± 1, 31/32/33, ...) and, if
    the budget allows, a few large ones, rounded up to the multiple derived dims need. In one
    example of eight (``empty``) one dim that is not ``reduced`` is 0: an empty output is one
    case, not the fate of most examples of a kernel with many dims. Batch dims get 0-3 leading
    dims of size 1-5.
    """
    pinned = dict(pinned or {})
    for name in pinned:
        if name in plan.derived:
            spec = plan.derived[name]
            raise ValueError(f"dims: '{name}' is derived from '{spec.base}'; pin '{spec.base}' "
                             f"instead")
        if name not in plan.plain and name not in plan.batch:
            known = sorted(plan.plain) + [f"*{b}" for b in plan.batch]
            raise ValueError(f"dims: the kernel has no dim '{name}' (its dims: "
                             f"{', '.join(known)})")
    out: dict[str, int] = {}
    budget = max(1, max_elements)
    names = list(plan.plain)
    can_empty = [n for n in names if n not in reduced and n not in pinned]
    zero = None
    if empty and can_empty and draw(st.integers(0, 7)) == 7:
        zero = draw(st.sampled_from(can_empty))
    batch: dict[str, tuple[int, ...]] = {}
    for name in plan.batch:                 # pinned sizes first: the free ones share what of
        if name in pinned:                  # the budget they leave
            batch[name] = tuple(draw(_batch_choices(pinned[name], name)))
    for name in names:
        if name in pinned:
            out[name] = draw(_size_choices(pinned[name], name))
            if out[name] % plan.plain[name]:
                raise ValueError(f"dims['{name}'] = {out[name]} must be a multiple of "
                                 f"{plan.plain[name]} (a derived dim divides it)")
    product = math.prod(max(v, 1) for v in out.values()) * \
        math.prod(max(math.prod(lead), 1) for lead in batch.values())
    free = [n for n in names if n not in pinned]
    for i, name in enumerate(free):
        multiple = plan.plain[name]
        rest = math.prod(plan.plain[n] for n in free[i + 1:])    # the least the others need
        cap = max(multiple, budget // (product * rest))
        out[name] = 0 if name == zero else _free_size(draw, cap, multiple)
        product *= max(out[name], 1)
    out = {n: out[n] for n in names}
    for name, spec in plan.derived.items():
        out[name] = (out[spec.base] * spec.mul) // spec.div + spec.add
    for name in plan.batch:
        if name not in pinned:
            batch[name] = _free_batch(draw, max(1, budget // product))
            product *= max(math.prod(batch[name]), 1)
        out[name] = math.prod(batch[name])
    batch = {n: batch[n] for n in plan.batch}
    return Sizes(out, batch)


def _free_size(draw, cap: int, multiple: int) -> int:
    """A dim's size: small, an edge size or (within `cap`) a large one; a multiple of
    `multiple`."""
    kinds = ["small", "small", "edge", "edge"]
    if any(s <= cap for s in LARGE_SIZES):
        kinds.append("large")
    pool = {"small": SMALL_SIZES, "edge": EDGE_SIZES, "large": LARGE_SIZES}[
        draw(st.sampled_from(kinds))]
    size = _round_up(draw(st.sampled_from([s for s in pool if s <= cap] or [1])), multiple)
    return max(multiple, cap // multiple * multiple) if size > cap else size


def _free_batch(draw, cap: int) -> tuple[int, ...]:
    """Leading batch dims (0 to MAX_BATCH_DIMS of them, one in the simplest example) whose
    product stays within `cap`."""
    count = draw(st.sampled_from((1, 0) + tuple(range(2, MAX_BATCH_DIMS + 1))))
    pool = [s for s in BATCH_SIZES if s <= cap] or [1]
    lead = tuple(draw(st.sampled_from(pool)) for _ in range(count))
    while math.prod(lead) > cap and lead:
        lead = lead[:-1]
    return lead


# --------------------------------------------------------------------------- values

FLOAT_FAMILIES = ("normal", "shifted", "mixed", "large", "tiny", "zeros", "special")
INT_FAMILIES = ("small", "wide", "zeros")
BOOL_FAMILIES = ("random", "true", "false")
NONFINITE_FAMILIES = ("special",)
# An example either has no ±inf/NaN input, or has some and pairs them only with moderate values:
# inf times a value that underflowed in f32 but not in float64 (0 * inf = NaN vs ±inf) is a
# precision artefact, not a kernel bug, and must not fail a check.
MODERATE_FAMILIES = ("normal", "zeros", "special")


def families(dtype: DType, *, nonfinite: bool = True, large: bool = True,
             zeros: bool = True) -> tuple[str, ...]:
    """The value families drawn for ``dtype`` (``nonfinite``: ±inf/NaN where the op is defined on
    them; ``large``: magnitudes that overflow conversions; ``zeros``: divisors may be 0)."""
    if dtype.kind == "bool":
        return BOOL_FAMILIES
    if dtype.is_int:
        extra = ("bits",) if dtype.kind == "uint" else ()     # packed words: every bit set
        return tuple(f for f in INT_FAMILIES + extra if (zeros or f != "zeros"))
    return tuple(f for f in FLOAT_FAMILIES
                 if (nonfinite or f not in NONFINITE_FAMILIES) and (large or f != "large"))


def _large_range(dtype: DType) -> tuple[float, float]:
    if dtype.name == "f16":
        return 1e2, 6e4
    return 1e2, 1e12


def make_values(dtype: DType, shape: Sequence[int], family: str, seed: int, *,
                value_range: Optional[tuple[float, float]] = None, zeros: bool = True,
                negative: bool = True) -> torch.Tensor:
    """A CPU tensor of ``dtype``/``shape`` whose values come from ``family`` (or, when given,
    uniform in ``value_range``), deterministic in ``seed``.

    Float families: normal (N(0,1)), shifted (N(0,1) + c, |c| in 2..100 with a random sign: one
    sign throughout, a mean far from 0 — what naive variances and wrong max/min identities get
    wrong), mixed (each element normal, large, tiny or zero), large
    (|x| log-uniform in 1e2..6e4 for f16, 1e2..1e12 otherwise), tiny (|x| log-uniform from the
    dtype's smallest normal up 2**12 times), zeros (±0), special (normal with ±inf and NaN
    sprinkled in). Int families: small (-3..3, 0..6 unsigned), wide (± 2**(bits/2 - 1), so
    products do not overflow), zeros, and for unsigned types bits (uniform over every value:
    packed words with all their fields). Bool: random, true, false. ``zeros=False`` keeps int values
    away from 0 (divisors); ``negative=False`` keeps them >= 0 (shift amounts).
    """
    g = torch.Generator().manual_seed(int(seed))
    shape = tuple(int(s) for s in shape)
    n = math.prod(shape)
    if value_range is not None:
        lo, hi = value_range
        if dtype.is_float:
            v = torch.rand(n, generator=g, dtype=torch.float64) * (hi - lo) + lo
        else:
            v = torch.randint(int(lo), int(hi) + 1, (n,), generator=g, dtype=torch.int64)
        return v.to(dtype.torch).reshape(shape)
    if dtype.kind == "bool":
        if family == "true":
            return torch.ones(shape, dtype=torch.bool)
        if family == "false":
            return torch.zeros(shape, dtype=torch.bool)
        return (torch.rand(n, generator=g) < 0.5).reshape(shape)
    if dtype.is_int:
        bits = dtype.itemsize * 8
        unsigned = dtype.kind == "uint" or not negative
        if family == "zeros":
            v = torch.zeros(n, dtype=torch.int64)
        elif family == "bits":
            v = torch.randint(0, 2 ** bits, (n,), generator=g, dtype=torch.int64)
        else:
            hi = 6 if family == "small" else 2 ** (bits // 2 - 1)
            lo = 0 if unsigned else -hi if family == "wide" else -3
            if family == "small" and not unsigned:
                hi = 3
            v = torch.randint(lo, hi + 1, (n,), generator=g, dtype=torch.int64)
        if not zeros:
            v = torch.where(v == 0, torch.ones_like(v), v)
        return v.to(dtype.torch).reshape(shape)
    # floats: build in float64, round once to the storage dtype
    sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).to(torch.float64)

    def loguniform(lo: float, hi: float) -> torch.Tensor:
        u = torch.rand(n, generator=g, dtype=torch.float64)
        return torch.exp(math.log(lo) + u * (math.log(hi) - math.log(lo)))

    tiny = float(torch.finfo(dtype.torch).tiny)
    if family == "normal":
        v = torch.randn(n, generator=g, dtype=torch.float64)
    elif family == "shifted":
        c = (2 + 98 * torch.rand(1, generator=g, dtype=torch.float64)) * \
            (1 if torch.rand(1, generator=g).item() < 0.5 else -1)
        v = torch.randn(n, generator=g, dtype=torch.float64) + c
    elif family == "large":
        v = sign * loguniform(*_large_range(dtype))
    elif family == "tiny":
        v = sign * loguniform(tiny, tiny * 2 ** 12)
    elif family == "zeros":
        v = sign * 0.0
    elif family == "mixed":
        pick = torch.randint(0, 4, (n,), generator=g)
        normal = torch.randn(n, generator=g, dtype=torch.float64)
        v = torch.stack([normal, sign * loguniform(*_large_range(dtype)),
                         sign * loguniform(tiny, tiny * 2 ** 12), sign * 0.0])
        v = v.gather(0, pick.unsqueeze(0)).squeeze(0)
    elif family == "special":
        v = torch.randn(n, generator=g, dtype=torch.float64)
        pick = torch.randint(0, 10, (n,), generator=g)
        v = torch.where(pick == 0, math.nan, v)
        v = torch.where(pick == 1, math.inf, v)
        v = torch.where(pick == 2, -math.inf, v)
    else:
        raise ValueError(f"unknown value family '{family}' for {dtype.name} (families: "
                         f"{', '.join(families(dtype))})")
    return v.to(dtype.torch).reshape(shape)


# --------------------------------------------------------------------------- layouts

LAYOUTS = ("contiguous", "transposed", "strided", "offset", "expanded")
OFFSET = 3            # elements of storage offset for the "offset" layout (breaks 16-byte alignment)


def layouts_for(shape: Sequence[int]) -> tuple[str, ...]:
    """The layouts that make sense for a tensor of ``shape``."""
    if math.prod(shape) == 0 or len(shape) == 0:
        return ("contiguous",)
    out = ["contiguous", "strided", "offset"]
    if len(shape) >= 2:
        out.insert(1, "transposed")
    if any(s > 1 for s in shape):
        out.append("expanded")
    return tuple(out)


def _poison(dtype: torch.dtype) -> Any:
    if dtype.is_floating_point:
        return math.nan
    if dtype == torch.bool:
        return True
    return torch.iinfo(dtype).max


def materialise(values: torch.Tensor, layout: str, *, device: str | torch.device = "cpu"
                ) -> torch.Tensor:
    """``values`` laid out in memory as ``layout`` (same logical values except "expanded", which
    repeats the first slice along the first dim longer than 1). Storage around and between the
    elements is filled with NaN / max-int so a kernel reading the wrong element shows it.
    """
    shape = tuple(values.shape)
    v = values.to(device)
    if layout == "contiguous" or math.prod(shape) == 0:
        return v.contiguous()
    if layout == "transposed":
        return v.transpose(-1, -2).contiguous().transpose(-1, -2)
    if layout == "strided":
        base = torch.full(shape[:-1] + (2 * shape[-1],), _poison(v.dtype), dtype=v.dtype,
                          device=v.device)
        base[..., ::2] = v
        return base[..., ::2]
    if layout == "offset":
        flat = torch.full((v.numel() + OFFSET,), _poison(v.dtype), dtype=v.dtype,
                          device=v.device)
        flat[OFFSET:] = v.reshape(-1)
        return flat[OFFSET:].view(shape)
    if layout == "expanded":
        dim = next(i for i, s in enumerate(shape) if s > 1)
        return v.narrow(dim, 0, 1).expand(shape)
    raise ValueError(f"unknown layout '{layout}' (layouts: {', '.join(LAYOUTS)})")


def describe_layout(t: torch.Tensor, layout: str) -> str:
    return f"{layout} (strides {tuple(t.stride())}, storage offset {t.storage_offset()})"


# --------------------------------------------------------------------------- scalars, Consts


def scalar(param: ScalarParam, pin: Any = None) -> st.SearchStrategy:
    """Values for a runtime scalar: its default, or small numbers; ``pin``: a value, a list of
    values or a (lo, hi) range. Floats are drawn as float32 values, the width the kernel binds."""
    if pin is not None:
        return _pinned(pin, param.name, param.pytype)
    first = [st.just(param.default)] if param.has_default else []
    if param.pytype is float and param.has_default:     # the f32 value the kernel will bind
        first = [st.just(_f32(param.default))]
    if param.pytype is bool:
        return st.sampled_from([param.default, not param.default] if param.has_default
                               else [False, True])
    if param.pytype is int:
        return st.one_of(*first, st.integers(-3, 8))
    # the positive range first: hypothesis' simplest example (every check's first) takes 1.0,
    # not 0.0, which would zero a scale or a soft cap and leave the example uninformative
    return st.one_of(*first, st.floats(_f32(1e-6), 1e3, width=32),
                     st.floats(-4.0, 4.0, width=32))


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


def _pinned(pin: Any, name: str, pytype: type) -> st.SearchStrategy:
    if isinstance(pin, st.SearchStrategy):
        return pin
    if isinstance(pin, list) and pin:
        return st.sampled_from(pin)
    if isinstance(pin, tuple) and len(pin) == 2:
        lo, hi = pin
        if pytype is int:
            return st.integers(int(lo), int(hi))
        return st.floats(_f32(lo), _f32(hi), width=32)
    if isinstance(pin, (bool, int, float)):
        return st.just(pytype(pin))
    raise TypeError(f"values['{name}'] must be a value, a list of values, a (lo, hi) range or a "
                    f"hypothesis strategy, got {pin!r}")


def _f32(v: float) -> float:
    """``v`` rounded to float32 (the width runtime float scalars are bound with)."""
    return float(torch.tensor(float(v), dtype=torch.float32))
