"""Hypothesis strategies for a kernel's inputs: dim sizes, value families, layouts, scalars,
and one whole example of a traced graph (`example`), which `check` draws.

Sizes and scalars work from a kernel's declared parameters (`metalforge.graph` params), so they
are usable on plain torch without any kernel. Tensor *data* is not drawn element by element: a
draw picks a value family and a seed, and `tensors.make_values` builds the tensor from them with
torch's generator. That keeps examples fast, shrinkable (family, seed, sizes shrink) and
reproducible from the report alone.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import torch
from hypothesis import strategies as st

from ..dtypes import DType
from ..graph import (
    AxisSpec,
    BinaryOp,
    ConstParam,
    Graph,
    Op,
    Param,
    ScalarParam,
    ScanOp,
    TensorParam,
    scatter_sites,
    take_sites,
    topo_order,
)
from ..shapes import base_multiple
from .tensors import (
    MODERATE_FAMILIES,
    describe_layout,
    families,
    layouts_for,
    make_values,
    materialise,
)

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
    literal: dict[str, int] = field(default_factory=dict)   # literal dim -> its fixed size


def dim_plan(params: Iterable[Param]) -> DimPlan:
    plain: dict[str, int] = {}
    derived: dict[str, AxisSpec] = {}
    batch: list[str] = []
    literal: dict[str, int] = {}
    n = 0
    for p in params:
        if not isinstance(p, TensorParam):
            continue
        n += 1
        for d in p.dims:
            if d.size is not None:          # "T[C, 4]": not drawn
                literal[d.name] = d.size
            elif d.batch:
                if d.name not in batch:
                    batch.append(d.name)
            elif d.derived:
                derived[d.name] = d
                plain[d.base] = math.lcm(plain.get(d.base, 1), base_multiple(d))
            else:
                plain.setdefault(d.name, 1)
    for name in literal:
        plain.pop(name, None)               # "K=4" here, plain "K" in another annotation
    return DimPlan(plain, derived, tuple(batch), n, literal)


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


def round_up(n: int, multiple: int) -> int:
    """The least multiple of `multiple` that is at least `n` (and at least `multiple`)."""
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
        if name in plan.literal:
            raise ValueError(f"dims: '{name}' is a literal dim: its size is "
                             f"{plan.literal[name]}, fixed by the annotation")
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
    out = {n: out[n] for n in names} | plan.literal
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
    size = round_up(draw(st.sampled_from([s for s in pool if s <= cap] or [1])), multiple)
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


# --------------------------------------------------------------------------- scalars


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


# --------------------------------------------------------------------------- one example


@dataclass(frozen=True)
class Drawn:
    """One example: the arguments and how each was made (for the report)."""
    args: dict[str, Any]
    lines: list[str]
    sizes: Sizes


def _graph_limits(graph: Graph) -> dict[str, bool]:
    """Which value families the ops of ``graph`` are defined on. A sum of unpacked words (the
    quantized schedule) assumes finite inputs: its per-group algebra s * sum(q x) + b * sum(x)
    turns an infinite bias or activation into ±inf where the element-by-element sum gives NaN
    (docs/reference/quantization.md)."""
    float_to_int = int_div = shifts = int_pow = False
    quantized = any(n.op == Op.UNPACK for r in graph.reductions() for n in topo_order([r]))
    for n in graph.nodes():
        if n.op == Op.CAST and n.args and n.args[0].dtype.is_float and not n.dtype.is_float:
            float_to_int = True
        if n.op != Op.BINARY:
            continue
        integer = not n.dtype.is_float
        int_div |= integer and n.attr in (BinaryOp.FLOORDIV, BinaryOp.MOD)
        shifts |= n.attr in (BinaryOp.SHL, BinaryOp.SHR)
        int_pow |= integer and n.attr == BinaryOp.POW
    # a running product (mf.cumprod) overflows to inf where its blocks do, and inf * 0 is NaN:
    # which elements then differ from the sequential product depends on the scan's order, so
    # its examples keep to moderate magnitudes (as inf/NaN inputs do)
    products = any(n.op == Op.SCAN and n.attr[0] == ScanOp.CUMPROD for n in graph.nodes())
    return {"nonfinite": not (float_to_int or quantized), "large": not float_to_int,
            "zeros": not int_div, "negative": not (shifts or int_pow), "moderate": products}


def index_tensors(graph: Graph) -> dict[str, str]:
    """{integer tensor: the axis it indexes} for gathers whose index is a tensor argument (as
    loaded, or converted, or clamped where some rows are ignored: `where(t == -100, 0, t)`):
    check draws their values in range (a separate test draws bad ones)."""
    out: dict[str, str] = {}
    sites = [(n.args[0], n.attr[1]) for n in take_sites(graph)]
    sites += [(n.args[1], n.attr[0]) for n in scatter_sites(graph)]    # mf.scatter_add's
    for idx, axis in sites:
        while True:
            if idx.op == Op.CAST and not idx.dtype.is_float:
                idx = idx.args[0]
            elif idx.op == Op.WHERE and Op.CONST in (idx.args[1].op, idx.args[2].op):
                idx = idx.args[2] if idx.args[1].op == Op.CONST else idx.args[1]
            else:
                break
        if idx.op == Op.LOAD:
            out[idx.attr] = axis
    return out


@dataclass(frozen=True)
class Inputs:
    """What `example` draws arguments from: `check`'s values= per parameter (``per_param``)
    and for every float tensor (``global_families``), whether to draw memory layouts, the bytes
    one example's inputs and outputs may take, the device the tensors live on, and whether a
    dim may be drawn empty."""
    per_param: Mapping[str, Any]
    global_families: Optional[Sequence[str]]
    layouts: bool
    budget: int
    device: str
    empty: bool = True


def example(draw, graph: Graph, consts: Mapping[str, Any], dims: Mapping[str, Any],
            inputs: Inputs, admit: Callable[[Mapping[str, int]], None] = lambda sizes: None
            ) -> Drawn:
    """The arguments of one call of ``graph`` (its Consts' values ``consts``): sizes within
    the budget of ``inputs`` (``dims`` pins some; ``admit`` may reject them before any value is
    drawn), then each tensor, scalar and Const."""
    plan = dim_plan(graph.params)
    reduced = frozenset(n.attr[1] for n in graph.reductions())
    reduced |= frozenset(plan.derived[a].base for a in reduced if a in plan.derived)
    indices = index_tensors(graph)               # gathered axes: never empty, valid indices
    reduced |= frozenset(indices.values())
    itemsize = max([t.dtype.itemsize for t in graph.tensors] + [4])
    max_elements = max(1, inputs.budget // ((plan.tensors + len(graph.outputs)) * itemsize))
    drawn = draw(sizes(plan, pinned=dims, max_elements=max_elements, reduced=reduced,
                       empty=inputs.empty), label="sizes")
    admit(drawn.sizes)                           # may reject the example before its values
    limits = _graph_limits(graph)
    nonfinite = limits["nonfinite"] and draw(st.booleans(), label="inf/NaN inputs")
    args: dict[str, Any] = {}
    lines = [f"sizes: {drawn.describe()}"]
    for p in graph.params:
        if isinstance(p, TensorParam):
            spec = inputs.per_param.get(p.name)
            if p.name in indices and spec is None:
                spec = (0, drawn.sizes[indices[p.name]] - 1)    # in range along the axis
            args[p.name], line = tensor(draw, graph.param(p.name).dtype, p, drawn, spec,
                                        inputs, nonfinite, limits)
            lines.append(line)
        elif isinstance(p, ScalarParam):
            v = draw(scalar(p, inputs.per_param.get(p.name)), label=p.name)
            args[p.name] = v
            lines.append(f"{p.name} = {v!r} ({p.pytype.__name__}, runtime scalar)")
        elif isinstance(p, ConstParam):
            args[p.name] = consts[p.name]
    return Drawn(args, lines, drawn)


def value_families(dtype: DType, name: str, spec, global_families, nonfinite: bool, limits
                   ) -> tuple[str, ...]:
    """The value families tensor `name` may take (what `values=` asks, else all allowed)."""
    allowed = families(dtype, nonfinite=nonfinite, large=limits["large"],
                       zeros=limits["zeros"])
    if (nonfinite or limits.get("moderate")) and dtype.is_float:
        allowed = tuple(f for f in allowed if f in MODERATE_FAMILIES)
    want = spec if spec is not None else (global_families if dtype.is_float else None)
    if isinstance(want, str):
        want = [want]
    if want is None:
        return allowed
    bad = [f for f in want if f not in families(dtype)]
    if bad:
        raise ValueError(f"values['{name}']: unknown family {', '.join(bad)} for {dtype.name} "
                         f"(families: {', '.join(families(dtype))})")
    return tuple(want)


def tensor(draw, dtype: DType, p: TensorParam, drawn: Sizes, spec, inputs: Inputs,
           nonfinite: bool, limits) -> tuple[torch.Tensor, str]:
    """One tensor argument (``spec``: what values= asks of it) and its line of the example's
    description."""
    shape = drawn.shape(p)
    rng = spec if isinstance(spec, tuple) and len(spec) == 2 else None
    fams = ("range",) if rng else value_families(dtype, p.name, spec, inputs.global_families,
                                                 nonfinite, limits)
    family = draw(st.sampled_from(_weighted(fams)), label=f"{p.name} family")
    seed = draw(st.integers(0, 2 ** 16), label=f"{p.name} seed")
    vals = make_values(dtype, shape, family, seed, value_range=rng,
                       zeros=limits["zeros"], negative=limits["negative"])
    layout = draw(st.sampled_from(layouts_for(shape)), label=f"{p.name} layout") \
        if inputs.layouts else "contiguous"
    t = materialise(vals, layout, device=inputs.device)
    what = f"range {rng}" if rng else f"family '{family}'"
    return t, (f"{p.name}: {dtype.name}{list(shape)} (annotation \"{p.annotation}\"), values "
               f"{what} seed {seed}, layout {describe_layout(t, layout)}")


def _weighted(fams: tuple[str, ...]) -> tuple[str, ...]:
    """The families to draw from, all-zero tensors a third as often as each other family (a
    zero input hides most of what the kernel computes from it)."""
    return tuple(f for f in fams for _ in range(1 if f == "zeros" or len(fams) == 1 else 3))
