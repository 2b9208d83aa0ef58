"""What the row and column reduction schedules share: phases, accumulators, combines, checks.

A reduction kernel runs in *phases*. Phase p computes every reduction whose input needs only
the loaded tensors and the results of phases < p (LayerNorm: the mean in phase 0, the variance
in phase 1; softmax: the max, then the sum); after the last phase the *epilogue* computes and
stores the outputs. Values without the reduced axis (a reduction result, `rsqrt(var + eps)`, a
per-row input) are *row values*, computed once per row by every thread; values with it are
*element values*, computed per element inside the phase's loop.

Online pairs: in a schedule that re-reads the row each phase (the looped row variant), a
`sum(exp(a - max(a)))` is computed in the same pass as its `max(a)` with a running max and a
rescaled running sum (`mf_online_add`), which saves one pass over the row for softmax and
log_softmax. The sum's terms are exactly the two-pass ones, so NaN/inf behave the same.
Centered pairs (`centered`, where the schedule asks): there too, a sum of squares around a row
value of a sum (LayerNorm's variance around its mean) rides along with that sum, saving
LayerNorm's second pass. Both kinds of pair are found in the graph by `pairs`.

Compensated sums: where one thread folds many elements one after another (the looped row
variant, the column schedule), a plain fp32 running sum loses about n*eps of accuracy (n terms
per thread), while torch's cascade summation stays near eps. There float sums (and the running
sum of an online pair) carry a Neumaier compensation term `mf_cmp{i}` that collects the rounding
error of every addition (`mf_sum_add`); it is folded into the sum once the thread's loop is done
(`finish`), before partials are combined across threads (a short tree, accurate as it is). This
relies on IEEE addition as written: Metal's safe math mode, which torch.mps.compile_shader uses
unless PYTORCH_MPS_FAST_MATH is set (fast math may reassociate the error term away, leaving
plain fp32 accuracy).

Accumulators are fp32 for float values (f16/bf16 compute in f32), and int/uint (32-bit) for
max/min/argmax/argmin of integers up to 32 bits. torch's NaN rules: max/min/sum propagate NaN,
argmax/argmin return the first NaN's index, otherwise the first index of the extreme value.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Iterable, Mapping, Optional, Protocol, Sequence

from .. import ir
from ..dtypes import DType
from ..errors import LaunchError, UnsupportedConstruct, at, empty_extreme
from ..graph import (
    Graph,
    Node,
    Op,
    ReduceOp,
    ScalarParam,
    TensorParam,
    literal_size,
    topo_order,
)
from . import centered
from .base import IDX
from .elementwise import input_stype, kernel_params, msl_names, output_stype, product, used_params
from .hardware import MAX_THREADGROUP_BYTES
from .lower import ElementLowering, compute_type, convert, ident
from .names import template_vars
from .pairs import centered_pairs, exp_sum_pairs, nan_in_sum
from .policy import LaunchPolicy

SENTINEL = 0xFFFFFFFF                      # "no index yet" for argmax/argmin (uint)
_EXTREME = (ReduceOp.MAX, ReduceOp.MIN, ReduceOp.ARGMAX, ReduceOp.ARGMIN)


def accumulator_type(dt: DType) -> str:
    """MSL type of a running value over `dt` values: fp32 for floats (f16/bf16 too), int or
    uint for integers of up to 32 bits."""
    if dt.is_float:
        return "float"
    return "uint" if dt.kind == "uint" else "int"


@dataclass
class Reduction:
    node: Node
    kind: str
    axis: str
    i: int                                 # its number: accumulators mf_acc{i}, mf_arg{i}
    phase: int = 0
    online_sum: Optional["Reduction"] = None   # a max whose paired sum(exp(a - max)) rides along
    online_max: Optional["Reduction"] = None   # a sum computed online with this max
    # a sum whose sum of squares around a row value of it rides along (`centered`), that sum
    # of squares, and the row value (LayerNorm's mean and variance in one pass)
    squares: Optional["Reduction"] = None
    squares_of: Optional["Reduction"] = None
    center: Optional[Node] = None
    compensated: bool = False              # a float sum with a Neumaier compensation term
    # the sum of an online pair whose shift is logsumexp's safe max, where(|max| == inf, 0, max)
    # (`_safe_max`): its result is fixed where the max is infinite (`result`)
    safe_shift: bool = False
    # a float max whose NaN the paired sum(exp(a - max)) carries to every output that uses the
    # max (`nan_in_sum`): it may skip NaN (fmax / simd_max: cheaper than NaN-propagating)
    nan_via_sum: bool = False
    # where the running value lives when it is not the scalar mf_acc{i}: an element of a
    # register array (the quantized matvec keeps one accumulator per weight row, mf_acc[mf_r])
    acc_at: Optional[ir.Expr] = None

    @property
    def acc_ref(self) -> ir.Expr:
        """The running value as an expression (read and assigned)."""
        return self.acc_at if self.acc_at is not None else ir.Var(self.acc)

    @property
    def rides(self) -> Optional["Reduction"]:
        """The reduction whose pass computes this one (an online pair's max, a centered pair's
        sum); None where it folds its own elements."""
        return self.online_max or self.squares_of

    @property
    def arg(self) -> Node:
        return self.node.args[0]

    @property
    def value_dtype(self) -> DType:
        return self.arg.dtype

    @property
    def acc_type(self) -> str:
        """MSL type of the running value."""
        return accumulator_type(self.arg.dtype)

    @property
    def is_float(self) -> bool:
        return self.arg.dtype.is_float

    @property
    def has_index(self) -> bool:
        return self.kind in (ReduceOp.ARGMAX, ReduceOp.ARGMIN)

    @property
    def acc(self) -> str:
        return f"mf_acc{self.i}"

    @property
    def idx(self) -> str:
        return f"mf_arg{self.i}"

    @property
    def cmp(self) -> str:
        """The compensation term of a compensated sum."""
        return f"mf_cmp{self.i}"


def check_supported(graph: Graph, n: Node) -> None:
    """The value types the reduction schedules handle; a clear error otherwise."""
    kind, axis = n.attr
    dt = n.args[0].dtype
    ok = dt.is_float if kind in (ReduceOp.SUM, ReduceOp.PROD) else \
        (dt.is_float or (dt.is_int and dt.itemsize <= 4))
    if not ok:
        what = "integer sums and products (torch accumulates them in int64, which simdgroup " \
               "collectives do not support)" if kind in (ReduceOp.SUM, ReduceOp.PROD) else \
               f"{dt} values"
        raise UnsupportedConstruct(
            f"kernel '{graph.name}': mf.{kind}(..., axis={axis!r}){at(n.loc)}: {what} cannot be "
            f"reduced by the reduction schedules (they take float values, and max/min/argmax/"
            f"argmin of integers up to 32 bits); convert first, e.g. x.to(mf.f32)")


def phases(graph: Graph, online: bool, compensated: bool = False, centered: bool = False
           ) -> list[Reduction]:
    """Every reduction with its phase (see the module doc); `online` pairs sum(exp(a - max(a)))
    with its max; `centered` pairs sum((x - c)^2) with sum(x) where c is a row value of it
    (`schedule.centered`); `compensated` gives float sums a compensation term (for schedules
    where a thread adds many elements in sequence). The running sum of an online pair is always
    compensated, the sum of a centered pair too (both only occur in such schedules)."""
    nodes = list(graph.nodes())
    reds: list[Reduction] = []
    by_node: dict[Node, Reduction] = {}
    for n in nodes:
        if n.op == Op.REDUCE:
            check_supported(graph, n)
            r = Reduction(n, n.attr[0], n.attr[1], len(reds) + 1)
            reds.append(r)
            by_node[n] = r
    pairs = []
    for m, sm, safe in exp_sum_pairs([r.node for r in reds]):
        by_node[sm].safe_shift = safe
        pairs.append((by_node[m], by_node[sm]))
    if online:
        for mr, r in pairs:
            if mr.online_sum is None and r.online_max is None:
                mr.online_sum, r.online_max = r, mr
    for mr, r in pairs:
        mr.nan_via_sum = nan_in_sum(graph, mr.node, r.node)
    if centered:
        online_sums = {r.node for r in reds if r.online_max is not None}
        for sm, sq, c in centered_pairs([r.node for r in reds], online_sums):
            by_node[sm].squares, by_node[sq].squares_of, by_node[sq].center = \
                by_node[sq], by_node[sm], c
    avail: dict[Node, int] = {}
    for n in nodes:
        if n.op == Op.REDUCE:
            r = by_node[n]
            r.phase = avail[r.online_max.node] - 1 if r.online_max else avail[n.args[0]]
            if r.squares_of is not None and r.center is not None:
                s = r.squares_of
                if all(avail[m] <= s.phase + 1 for m in topo_order([r.center])
                       if m.op == Op.REDUCE and m is not s.node):
                    r.phase = s.phase
                else:                                   # c needs a later phase: two passes
                    s.squares = r.squares_of = r.center = None
            avail[n] = r.phase + 1
        else:
            avail[n] = max((avail[a] for a in n.args), default=0)
    for r in reds:
        r.compensated = r.kind == ReduceOp.SUM and r.is_float and r.squares_of is None and (
            compensated or r.online_max is not None or r.squares is not None)
    # renumber phases densely (an online pair can leave a phase empty)
    used = sorted({r.phase for r in reds})
    for r in reds:
        r.phase = used.index(r.phase)
    return reds


def check_sizes(graph: Graph, reds: list[Reduction], sizes: Mapping[str, int]) -> None:
    """torch refuses max/min/argmax/argmin over an empty axis; so do we (before launching)."""
    for r in reds:
        if r.kind in _EXTREME and sizes.get(r.axis, 1) == 0:
            raise empty_extreme(graph.name, r.kind, r.axis, r.node.loc)


# --------------------------------------------------------------------------- IR pieces

def identity_of(combine: str, t: str) -> ir.Expr:
    """The identity of `combine` ("sum", "prod", "max" or "min") for running values of MSL
    type `t`: 0, 1, -inf / lowest, +inf / max (reductions and scans)."""
    if combine == "sum":
        return ir.Lit(0.0 if t == "float" else 0, t)
    if combine == "prod":
        return ir.Lit(1.0 if t == "float" else 1, t)
    big = combine == "max"
    if t == "float":
        return ir.Lit(float("-inf") if big else float("inf"), t)
    return ir.Var(f"numeric_limits<{t}>::{'lowest' if big else 'max'}()")


def identity(r: Reduction) -> ir.Expr:
    combine: dict[str, str] = {ReduceOp.ARGMAX: "max", ReduceOp.ARGMIN: "min"}
    return identity_of(combine.get(r.kind, str(r.kind)), r.acc_type)


def declare(r: Reduction) -> list[ir.Stmt]:
    """The running accumulator(s) of one reduction, at their identity."""
    if r.online_max is not None:          # the running sum of an online pair
        out: list[ir.Stmt] = [ir.Decl(r.acc, "float", ir.Lit(0.0, "float"), const=False)]
    else:
        out = [ir.Decl(r.acc, r.acc_type, identity(r), const=False)]
    if r.squares_of is not None:          # the squares of a centered pair: their state
        out += centered.declare(r.i)
    if r.compensated:
        out.append(ir.Decl(r.cmp, "float", ir.Lit(0.0, "float"), const=False))
    if r.online_max is not None:
        return out
    if r.has_index:
        out.append(ir.Decl(r.idx, "uint", ir.Lit(SENTINEL, "uint"), const=False))
    return out


def update(r: Reduction, v: ir.Expr, pos: ir.Expr) -> list[ir.Stmt]:
    """Fold one element value v (at position pos along the axis) into the accumulator.
    Elements must arrive in increasing position per thread (argmax keeps the first)."""
    acc = r.acc_ref
    k = r.kind
    if r.online_sum is not None:
        s = ir.Var(r.online_sum.acc)
        return [ir.Assign(s, ir.Call("mf_online_add", (acc, ir.Var(r.online_sum.cmp), s, v)))]
    if r.squares is not None:
        return centered.update(r.squares.i, ir.Var(r.squares.acc), acc, ir.Var(r.cmp), v)
    if k == ReduceOp.SUM and r.compensated:
        return [ir.Assign(acc, ir.Call("mf_sum_add", (ir.Var(r.cmp), acc, v)))]
    if k == ReduceOp.SUM:
        return [ir.Assign(acc, acc + v)]
    if k == ReduceOp.PROD:
        return [ir.Assign(acc, acc * v)]
    if k in (ReduceOp.MAX, ReduceOp.MIN):
        return [ir.Assign(acc, ir.Call(_extreme(r), (acc, v)))]
    # argmax / argmin: first index of the extreme; the first NaN wins
    idx = ir.Var(r.idx)
    better: ir.Expr = v > acc if k == ReduceOp.ARGMAX else v < acc
    if r.is_float:
        better = better.or_((v.ne(v)).and_(acc.eq(acc)))
    cond = (idx.eq(ir.Lit(SENTINEL, "uint"))).or_(better)
    return [ir.If(cond, [ir.Assign(acc, v), ir.Assign(idx, ir.Cast("uint", pos))])]


def _extreme(r: Reduction) -> str:
    """The two-operand max/min of a reduction's values: NaN-propagating for floats (torch's
    amax/amin), Metal's NaN-skipping fmax where the paired sum carries the NaN."""
    if not r.is_float:
        return r.kind
    return f"f{r.kind}" if r.nan_via_sum else f"mf_{r.kind}imum"


def update_chunk(r: Reduction, values: str, n: int) -> list[ir.Stmt]:
    """Fold a whole chunk of n element values (the register array `values`) into an online
    max and its sum at once (`mf_online_add_chunk`: one rescale test and one compensated add
    per chunk), or into a centered pair's sum and squares (`mf_centered_add_chunk`)."""
    if r.squares is not None:
        return centered.update_chunk(r.squares.i, ir.Var(r.squares.acc), r.acc_ref,
                                     ir.Var(r.cmp), values, n)
    assert r.online_sum is not None, "a chunk update is for an online (max, sum) pair"
    s = ir.Var(r.online_sum.acc)
    return [ir.Assign(s, ir.Call("mf_online_add_chunk", (
        r.acc_ref, ir.Var(r.online_sum.cmp), s, ir.Var(values), ir.Lit(n, "uint"))))]


def finish(reds: list[Reduction]) -> list[ir.Stmt]:
    """After a thread's sequential loop: fold each compensation term into its sum (a finite
    correction; an inf or NaN sum stays as it is), and turn a centered pair's squared distances
    from the thread's shift into its squares around the thread's mean."""
    out: list[ir.Stmt] = []
    for r in reds:
        if r.compensated:
            out.append(ir.Assign(ir.Var(r.acc), ir.Var(r.acc) + ir.Var(r.cmp)))
    if out:
        out.insert(0, ir.Comment("add the rounding errors the compensated sums collected"))
    squares = [r for r in reds if r.squares_of is not None]
    if squares:
        out.append(ir.Comment("the squared distances from the thread's first element as the "
                              "squares around its mean"))
    for r in squares:
        out += centered.done(r.i, ir.Var(r.acc))
    return out


def simd_combine(r: Reduction) -> list[ir.Stmt]:
    """Reduce the accumulators across a simdgroup: every lane gets the simdgroup's result."""
    acc = r.acc_ref
    k = r.kind
    if r.online_sum is not None:
        s = ir.Var(r.online_sum.acc)
        return [ir.Assign(s, ir.Call("mf_simd_online", (acc, s)))]
    if r.squares_of is not None:
        return centered.simd_combine(r.i, acc)
    if k == ReduceOp.SUM:
        return [ir.Assign(acc, ir.Call("simd_sum", (acc,)))]
    if k == ReduceOp.PROD:
        return [ir.Assign(acc, ir.Call("simd_product", (acc,)))]
    if k in (ReduceOp.MAX, ReduceOp.MIN):
        fn = f"mf_simd_{k}" if r.is_float and not r.nan_via_sum else f"simd_{k}"
        return [ir.Assign(acc, ir.Call(fn, (acc,)))]
    fn = f"mf_simd_{k}" if r.is_float else f"mf_simd_i{k}"
    return [ir.Assign(ir.Var(r.idx), ir.Call(fn, (acc, ir.Var(r.idx))))]


def merge(r: Reduction, other_acc: ir.Expr, other_idx: Optional[ir.Expr]) -> list[ir.Stmt]:
    """Fold another thread's partial result (read from threadgroup memory) into this one's;
    the partial covers later positions than this thread's when other_idx is None-free ties."""
    acc = r.acc_ref
    k = r.kind
    if r.online_sum is not None:
        assert other_idx is not None, "an online max merges with the other thread's sum"
        s = ir.Var(r.online_sum.acc)
        return [ir.Assign(s, ir.Call("mf_online_merge", (acc, s, other_acc, other_idx)))]
    if k == ReduceOp.SUM:
        return [ir.Assign(acc, acc + other_acc)]
    if k == ReduceOp.PROD:
        return [ir.Assign(acc, acc * other_acc)]
    if k in (ReduceOp.MAX, ReduceOp.MIN):
        return [ir.Assign(acc, ir.Call(_extreme(r), (acc, other_acc)))]
    assert other_idx is not None, f"{k} merges with the other thread's index"
    idx = ir.Var(r.idx)
    o_nan = other_acc.ne(other_acc) if r.is_float else None
    better: ir.Expr = other_acc > acc if k == ReduceOp.ARGMAX else other_acc < acc
    same = (other_acc.eq(acc)).and_(other_idx < idx)
    better = better.or_(same)
    if o_nan is not None:
        a_nan = acc.ne(acc)
        # a NaN beats any number; between NaNs the smaller index wins
        better = ir.Select(a_nan, o_nan.and_(other_idx < idx),
                           o_nan.or_(better))
    cond = (other_idx.ne(ir.Lit(SENTINEL, "uint"))).and_(better)
    return [ir.If(cond, [ir.Assign(acc, other_acc), ir.Assign(idx, other_idx)])]


def through_threadgroup(v: "VariantParts", reds: list[Reduction], slots: int, slot: ir.Expr,
                        read: ir.Expr, have: ir.Expr) -> tuple[list[ir.Stmt], list[ir.Stmt]]:
    """Combine simdgroup results across the simdgroups of a threadgroup, through one
    threadgroup array of `slots` partials per reduction (added to `v.tg_arrays`; argmax/argmin
    get a second one for the index). Returns (the stores of this simdgroup's result into
    `slot`, for one lane of it to run; the reads: every lane takes slot `read` where `have`,
    the identity elsewhere, and the simdgroup reduces them again, so every lane holds the
    combined result). The caller puts a barrier between the two. Call after `simd_combine`."""
    stores: list[ir.Stmt] = []
    reads: list[ir.Stmt] = []
    second: list[ir.Stmt] = []
    for r in reds:
        v.tg_arrays.append(ir.ArrayDecl(f"mf_tg{r.i}", r.acc_type if r.online_max is None
                                        else "float", slots, "threadgroup"))
        stores.append(ir.Assign(ir.Lane(ir.Var(f"mf_tg{r.i}"), slot), r.acc_ref))
        ident_v = ir.Lit(0.0, "float") if r.online_max is not None else identity(r)
        reads.append(ir.Assign(r.acc_ref, ir.Select(
            have, ir.Lane(ir.Var(f"mf_tg{r.i}"), read), ident_v)))
        if r.squares_of is not None:          # the state of a centered pair's squares
            for letter, x in zip(centered.STATE, centered.state(r.i)):
                tg = ir.Var(f"mf_tg{letter}{r.i}")
                v.tg_arrays.append(ir.ArrayDecl(tg.name, "float", slots, "threadgroup"))
                stores.append(ir.Assign(ir.Lane(tg, slot), x))
                reads.append(ir.Assign(x, ir.Select(have, ir.Lane(tg, read),
                                                    ir.Lit(0.0, "float"))))
        if r.has_index:
            v.tg_arrays.append(ir.ArrayDecl(f"mf_tgi{r.i}", "uint", slots, "threadgroup"))
            stores.append(ir.Assign(ir.Lane(ir.Var(f"mf_tgi{r.i}"), slot), ir.Var(r.idx)))
            reads.append(ir.Assign(ir.Var(r.idx), ir.Select(
                have, ir.Lane(ir.Var(f"mf_tgi{r.i}"), read), ir.Lit(SENTINEL, "uint"))))
        if r.online_max is None:
            second += simd_combine(r)
    return stores, reads + second


def helpers_of(reds: list[Reduction], simd: bool) -> set[str]:
    hs: set[str] = set()
    for r in reds:
        if r.compensated and r.online_max is None and r.squares is None:
            hs.add("mf_sum_add")
        if r.squares is not None:
            hs |= centered.HELPERS - ({"mf_simd_centered"} if not simd else set())
        elif r.online_sum is not None:
            hs |= {"mf_online_add", "mf_online_merge"} | ({"mf_simd_online"} if simd else set())
        elif r.kind in (ReduceOp.MAX, ReduceOp.MIN) and r.is_float:
            if not r.nan_via_sum:              # NaN-skipping fmax / simd_max need no helper
                hs.add(f"mf_{r.kind}imum")
                if simd:
                    hs.add(f"mf_simd_{r.kind}")
        elif r.has_index and simd:
            hs.add(f"mf_simd_{r.kind}" if r.is_float else f"mf_simd_i{r.kind}")
    return hs


def result(r: Reduction) -> ir.Expr:
    """The reduction's value as its node's compute type."""
    if r.has_index:
        return ir.Cast(compute_type(r.node.dtype), ir.Var(r.idx))
    if r.online_max is not None:
        m = ir.Var(r.online_max.acc)
        if r.safe_shift:
            # logsumexp's shift is 0 where the max is infinite: the two-pass sum of exp(a - 0)
            # is 0 for a row of -inf, inf for one with +inf (NaN makes the max NaN online)
            return ir.Select(m.eq(ir.Lit(float("-inf"), "float")), ir.Lit(0.0, "float"),
                             ir.Select(m.eq(ir.Lit(float("inf"), "float")),
                                       ir.Lit(float("inf"), "float"), ir.Var(r.acc)))
        # a max of -inf means every term was exp(-inf - -inf): the two-pass sum is NaN
        return ir.Select(m.eq(ir.Lit(float("-inf"), "float")),
                         ir.Lit(float("nan"), "float"), ir.Var(r.acc))
    want = compute_type(r.node.dtype)
    return ir.Var(r.acc) if want == r.acc_type else ir.Cast(want, ir.Var(r.acc))


def results(row_values: ElementLowering, rs: list[Reduction]) -> list[ir.Stmt]:
    """Make the results of `rs` (combined across the row) row values of `row_values`; returns
    the statements a centered pair's squares need: its center c, computed from the sum as
    the graph says, and V = q + n (k + t / n - c)^2 (`centered.squares`)."""
    for r in rs:
        row_values.values[r.node] = result(r)
    out: list[ir.Stmt] = []
    for r in rs:
        if r.squares_of is None:
            continue
        assert r.center is not None
        out += row_values.lower([r.center])
        c = row_values.value(r.center)
        name = f"mf_sq{r.i}"
        out += centered.squares(r.i, ir.Var(r.acc), c, name)
        row_values.values[r.node] = ir.Var(name)
    if out:
        out.insert(0, ir.Comment("the squares around the center: those around the mean plus "
                                 "n (mean - center)^2"))
    return out


# --------------------------------------------------------------------------- builders

class Preamble(Protocol):
    """Where per-thread positions are declared once, up front (a VariantParts, attention's
    builder)."""
    pre: list[ir.Stmt]
    pre_names: set[str]


def declare_position(flat: str, axes: Sequence[str], axis: str, name: str, into: Preamble,
                     size: Callable[[str], ir.Expr],
                     span: Callable[[Sequence[str]], ir.Expr]) -> ir.Var:
    """`axis`'s position in `flat`, a row-major index over `axes`: `name`, declared once in
    `into`'s preamble as (flat / span of the axes after it) % size(axis)."""
    if name not in into.pre_names:
        k = axes.index(axis)
        e: ir.Expr = ir.Cast(IDX, ir.Var(flat))
        if axes[k + 1:]:
            e = e / span(axes[k + 1:])
        if k > 0:
            e = e % size(axis)
        into.pre.append(ir.Decl(name, IDX, e))
        into.pre_names.add(name)
    return ir.Var(name)


@dataclass
class VariantParts:
    """What one kernel variant collects while it is built (`build_variants` makes a fresh one
    for each): the preamble of per-row/column values, threadgroup arrays, how often each input
    is read, the main statements, and the lowering of row (column) values."""
    name: str
    row_values: ElementLowering
    pre: list[ir.Stmt] = field(default_factory=list)
    pre_names: set[str] = field(default_factory=set)
    tg_arrays: list[ir.ArrayDecl] = field(default_factory=list)
    passes: dict[str, int] = field(default_factory=dict)    # input → reads per row
    loaded: set[str] = field(default_factory=set)            # inputs already in registers
    main: list[ir.Stmt] = field(default_factory=list)

    @property
    def tg_bytes(self) -> int:
        """4-byte scalars, float4s (16 bytes), or half / bfloat (2: the tiled quantized
        kernel's staged tiles)."""
        size = {"float4": 16, "half": 2, "bfloat": 2}
        return sum(size.get(a.type, 4) * a.length for a in self.tg_arrays)


@dataclass(frozen=True, eq=False)
class ReductionContext:
    """What is fixed for one build of a row or column schedule: the graph (checked), its
    parameters and names, the reduced `axis` and the `outer` ones (every output axis but
    `axis`: the thread's row or column). `tag` names the thread's unit in generated code
    (mf_row, mf_rowpos_<axis>). `sizes_used` and `helpers` accumulate what the library's
    kernels use over the build (one parameter list, one helper set). The methods are the terms
    the reduction schedules share: names and types of parameters, axis sizes (recording the
    ones used), positions along the outer axes, the element cone of a phase, folds into
    accumulators."""
    graph: Graph
    policy: LaunchPolicy
    index64: bool
    axis: str
    tag: str
    outer: tuple[str, ...]
    allowed: frozenset[str]
    nodes: tuple[Node, ...]
    inputs: list[TensorParam]
    scalars: list[ScalarParam]
    tvars: Mapping[str, DType]
    names: dict[str, str]
    out_names: list[str]
    sizes_used: list[str]
    helpers: set[str]

    # -- types and names ---------------------------------------------------------------
    def in_stype(self, t: TensorParam) -> str:
        return input_stype(t, self.tvars)

    def out_stype(self, k: int) -> str:
        return output_stype(self.graph, self.tvars, k)

    def size(self, axis: str) -> ir.Expr:
        fixed = literal_size(self.graph, axis)     # a literal dim: a constant of the kernel
        if fixed is not None:
            return ir.Lit(fixed, IDX)
        if axis not in self.sizes_used:
            self.sizes_used.append(axis)
        return ir.Var(f"mf_size_{ident(axis)}")

    def elem(self, n: Node) -> bool:
        return self.axis in n.axes

    # -- the thread's row/column (declared in a preamble on first use) -------------------
    def span(self, axes: Iterable[str]) -> ir.Expr:
        return product(self.size, axes)

    def position_in(self, flat: str, axes: Sequence[str], axis: str, name: str,
                    into: Preamble) -> ir.Var:
        return declare_position(flat, axes, axis, name, into, self.size, self.span)

    def cone(self, roots: list[Node], stop: Iterable[Node] = ()
             ) -> tuple[list[str], list[Node]]:
        """Element nodes reachable from roots (stopping at row values, and at `stop`: values
        already in registers): (the tensors they load, in order of first use; the frontier of
        row values)."""
        seen: set[Node] = set(stop)
        tensors: list[str] = []
        frontier: list[Node] = []
        stack = list(roots)
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            if not self.elem(n):
                frontier.append(n)
                continue
            if n.op == Op.LOAD and n.attr not in tensors:
                tensors.append(n.attr)
            stack.extend(n.args)
        return tensors, frontier

    def fold(self, el: ElementLowering, reds: list[Reduction], pos: ir.Expr) -> list[ir.Stmt]:
        """Fold each reduction's element value (lowered by `el`, at position `pos` of the
        axis) into its accumulator; the sum of an online pair rides along with its max, the
        squares of a centered pair with its sum."""
        out: list[ir.Stmt] = []
        for r in reds:
            if r.rides is None:
                out += update(r, self.acc_value(el, r), pos)
        return out

    @staticmethod
    def acc_value(el: ElementLowering, r: Reduction) -> ir.Expr:
        """Reduction r's element value (lowered by `el`) in its accumulator's type."""
        v = el.value(r.arg)
        return v if r.acc_type == compute_type(r.arg.dtype) else ir.Cast(r.acc_type, v)

    def out_value(self, k: int, low: ElementLowering) -> ir.Expr:
        """Output k's value (lowered by `low`) converted to its storage type."""
        o = self.graph.outputs[k]
        return ir.Cast(self.out_stype(k), convert(low.value(o.node), o.node.dtype, o.dtype))

    def position(self, axis: str, into: Preamble) -> ir.Expr:
        """The thread's position along one of the outer axes (declared in `into`); along an
        axis derived from one (K/8 of K: a packed word, K/GS a group), that position // d."""
        spec = self.graph.axis_spec(axis)
        if axis not in self.outer and spec.derived and spec.base in self.outer:
            return self.position(spec.base, into) / ir.Lit(spec.div, IDX)
        return self.position_in(f"mf_{self.tag}", self.outer, axis,
                                f"mf_{self.tag}pos_{ident(axis)}", into)


def reduction_context(graph: Graph, policy: LaunchPolicy, index64: bool, axis: str, tag: str,
                      unit: str) -> ReductionContext:
    """The context of a row (`unit` "row") or column reduction over `axis`, after checking
    that every input's axes are kept or reduced and every output covers the same units."""
    widest = max(graph.outputs, key=lambda o: len(o.axes)).axes
    outer = tuple(a for a in widest if a != axis)
    allowed = frozenset(outer) | {axis}
    nodes = list(graph.nodes())
    inputs, scalars = used_params(graph, nodes)
    check_axes(graph, axis, outer, widest, inputs, nodes, unit)
    names, out_names = msl_names(graph)
    return ReductionContext(graph, policy, index64, axis, tag, outer, allowed, tuple(nodes),
                            inputs, scalars, template_vars(graph.dtype_vars), names, out_names,
                            [axis] + list(outer), set())


def check_axes(graph: Graph, axis: str, outer: tuple[str, ...], widest: tuple[str, ...],
               inputs: Sequence[TensorParam], nodes: Sequence[Node], unit: str) -> None:
    """Every input axis is kept by the outputs, reduced, gathered or derived from the reduced
    axis (K/GS); every output covers the same `unit`s (rows, columns)."""
    allowed = set(outer) | {axis}
    taken = {n.attr for n in nodes if n.op == Op.TAKE}      # (tensor, gathered axis)
    for t in inputs:
        extra = [a for a in t.axes if a not in allowed and (t.name, a) not in taken
                 and graph.axis_spec(a).base != axis        # K/GS: read as k // GS
                 # a column of words unpacked along a kept K (quant.transposed): k // 8
                 and not (unit == "column" and graph.axis_spec(a).base in outer)]
        if extra:
            raise UnsupportedConstruct(
                f"kernel '{graph.name}': input '{t.name}' has axis {extra[0]!r}, which no "
                f"output keeps and no reduction removes")
    for o in graph.outputs:
        if set(o.axes) - {axis} != set(outer):
            raise UnsupportedConstruct(
                f"kernel '{graph.name}': outputs over axes {list(o.axes)} and "
                f"{list(widest)}: every output of a {unit} reduction must cover the same "
                f"{unit}s {list(outer)}")


def context_fields(ctx: ReductionContext) -> dict[str, Any]:
    """The fields of a reduction context, for a family's context that extends it."""
    return {f.name: getattr(ctx, f.name) for f in fields(ctx)}


def variant_parts(ctx: ReductionContext, name: str,
                  outer_load: Callable[[VariantParts, Node], ir.Expr]) -> VariantParts:
    """A fresh collector for variant `name`: its row values read inputs with `outer_load` and
    declare positions in its own preamble."""
    parts: VariantParts

    def position(axis: str) -> ir.Expr:
        return ctx.position(axis, parts)
    parts = VariantParts(name, ElementLowering(ctx.graph, lambda n: outer_load(parts, n),
                                               position, ctx.size, lambda s: ctx.names[s],
                                               prefix="mf_r"))
    return parts


def build_variants(ctx: ReductionContext, names: tuple[str, ...],
                   kernel: Callable[[str], tuple[ir.LoweredKernel, VariantParts]],
                   advice: str = ""
                   ) -> tuple[dict[str, ir.LoweredKernel], dict[str, dict[str, int]], int]:
    """Build the kernel of every variant (`kernel(name)`: the kernel and the fresh
    `VariantParts` it filled); they share one parameter list and helper set. Returns
    ({name: kernel}, {name: input passes}, the most threadgroup bytes any needs)."""
    kernels: dict[str, ir.LoweredKernel] = {}
    passes: dict[str, dict[str, int]] = {}
    tg = 0
    for name in names:
        kernels[name], parts = kernel(name)
        ctx.helpers.update(parts.row_values.helpers)           # per-row values' helpers too
        passes[name] = parts.passes
        tg = max(tg, parts.tg_bytes)
    if tg > MAX_THREADGROUP_BYTES:
        raise LaunchError(f"kernel '{ctx.graph.name}': its reductions need {tg} bytes of "
                          f"threadgroup memory, over the {MAX_THREADGROUP_BYTES}-byte "
                          f"limit{advice}")
    params = kernel_params(ctx)
    helpers = tuple(sorted(ctx.helpers))
    return ({name: replace(k, params=params, helpers=helpers) for name, k in kernels.items()},
            passes, tg)

