"""Where a quantized kernel's values are: positions along each axis (element k of K, weight row
mf_n, row mf_m of x, the simdgroup's place along the other output axes), offsets into tensors,
the registers of a chunk (packed words, shared values, sums), and the lowering of element
values that reads them (packed words unpacked by a literal shift where the slot is known)."""
from __future__ import annotations

from typing import Optional, Sequence

from ... import ir
from ...graph import Node, TensorParam
from ..base import IDX
from ..lower import ElementLowering, compute_type, ident
from ..names import tensor_var
from ..reduce import declare_position
from .context import QuantContext, QuantState
from .params import TILED

Run = tuple[ir.Expr, int]
"""(first, n): element mf_j of n consecutive values of K from `first`, a multiple of n."""


def idx(v: int) -> ir.Lit:
    """The literal v in the kernel's index type."""
    return ir.Lit(v, IDX)


def position_in(ctx: QuantContext, into: QuantState, flat: str, axes: Sequence[str],
                axis: str, name: str) -> ir.Var:
    """`axis`'s position in `flat` (`reduce.declare_position`), in the kernel's preamble."""
    return declare_position(flat, axes, axis, name, into.v, ctx.size, ctx.span)


def prefix_position(st: QuantState, axis: str) -> ir.Expr:
    """The simdgroup's position along an output axis other than the rows axis (with rows of
    x blocked, `x_rows`: row mf_m of x along the innermost one, the block's elsewhere)."""
    ctx = st.ctx
    name = f"mf_pos_{ident(axis)}"
    prefix, flat = ctx.prefix, "mf_outer"
    if st.mb > 1:
        if axis == ctx.prefix[-1]:
            return ir.Var("mf_m")
        prefix, flat = ctx.prefix[:-1], "mf_xblock"
    return position_in(ctx, st, flat, prefix, axis, name)


def at(st: QuantState, axis: str, k: ir.Expr, run: Optional[Run] = None) -> ir.Expr:
    """The position along `axis` of element k (K), of row mf_n (N), or the simdgroup's.
    With `run`, k is element mf_j of a run of values (a chunk, or a word's values), so that a
    group or word holding them all is found from the run's first alone."""
    ctx = st.ctx
    if axis == ctx.axis:
        return k
    if axis == ctx.rows_axis:
        return ir.Var("mf_n")
    if st.name in TILED and axis == ctx.prefix[-1]:
        return ir.Var("mf_m")                      # the tiled kernel's row of x
    if axis in ctx.prefix:
        return prefix_position(st, axis)
    spec = ctx.graph.axis_spec(axis)               # K/GS: element k reads k / GS
    d = ir.Lit(spec.div, IDX)
    if run is not None and spec.div % run[1] == 0:
        return run[0] / d                          # the whole run is in one group
    if run is not None and run[1] % spec.div == 0:
        return run[0] / d + ir.Cast(IDX, ir.Var("mf_j") / ir.Lit(spec.div, "uint"))
    return k / d


def offset(st: QuantState, t: TensorParam, k: ir.Expr, run: Optional[Run] = None) -> ir.Expr:
    """The element of `t` at element k of K (row-major over its axes)."""
    e: ir.Expr = ir.Lit(0, IDX)
    for i, a in enumerate(t.axes):
        p = at(st, a, k, run)
        e = p if i == 0 else e * st.ctx.size(a) + p
    return e


def row_position(st: QuantState, axis: str) -> ir.Expr:
    """Positions for the epilogue's row values (inside the rows loop)."""
    return at(st, axis, ir.Lit(0, IDX))


def outer_load(st: QuantState, n: Node) -> ir.Expr:
    """A row value's load: input `n` at the row's position."""
    t = st.ctx.graph.tensor(n.attr)
    return ir.Cast(compute_type(t.dtype),
                   ir.Load(st.ctx.names[t.name], offset(st, t, ir.Lit(0, IDX))))


def x_slot(st: QuantState, j: ir.Expr) -> ir.Expr:
    """Element j's register among the chunk's shared values (of row mf_i of x)."""
    return j if st.mb == 1 else ir.Var("mf_i") * ir.Lit(st.ctx.chunk, "uint") + j


def numbered(name: str, i: int) -> str:
    """The register array `name` of the kernel's i-th sum (the first keeps the plain name)."""
    return name if i == 0 else f"{name}{i}"


def acc(st: QuantState, i: int = 0) -> ir.Expr:
    """Sum i's value for weight row mf_r (and row mf_i of x)."""
    r = ir.Var("mf_r")
    return ir.Lane(ir.Var(numbered("mf_acc", i)), r if st.mb == 1 else
                   r * ir.Lit(st.mb, "uint") + ir.Var("mf_i"))


def word(ctx: QuantContext, name: str) -> ir.Expr:
    """The packed word holding element mf_j of the chunk, in row mf_r's registers."""
    w = ir.Lane(ir.Var(tensor_var(name, "w")), ir.Var("mf_r"))
    return w if ctx.words == 1 else ir.Lane(w, ir.Var("mf_j") / ir.Lit(ctx.per_word, "uint"))


def lowering(st: QuantState, fast: bool, k: Optional[ir.Expr] = None,
             run: Optional[Run] = None) -> ElementLowering:
    """Element values of the chunk's element mf_j: from registers on the fast path (shared
    values, words), from global loads on the tail path (or of element `k`; with `run`,
    element mf_j of a run of values, see `at`)."""
    ctx = st.ctx
    if fast:
        run = (ir.Var("mf_k0"), ctx.chunk)
    if k is None:
        k = (ir.Var("mf_k0") if run is None else run[0]) + ir.Cast(IDX, ir.Var("mf_j"))
    elem = k

    def load(n: Node) -> ir.Expr:
        t = ctx.graph.tensor(n.attr)
        if fast and t in ctx.shared:
            return ir.Lane(ir.Var(tensor_var(t.name, "reg")), x_slot(st, ir.Var("mf_j")))
        if fast and t.name in ctx.packed:
            return word(ctx, t.name)
        return ir.Cast(compute_type(t.dtype), ir.Load(ctx.names[t.name], offset(st, t, elem, run)))

    def shift(n: Node) -> ir.Expr:
        per = ctx.per_word
        if run is not None and run[1] % per == 0:        # runs of whole words
            slot: ir.Expr = ir.Var("mf_j") % ir.Lit(per, "uint")
        elif run is not None and per % run[1] == 0:      # runs inside one word
            slot = ir.Cast("uint", run[0] % ir.Lit(per, IDX)) + ir.Var("mf_j")
        else:
            slot = ir.Cast("uint", elem % ir.Lit(per, IDX))
        return slot * ir.Lit(ctx.bits, "uint")

    return ElementLowering(ctx.graph, load, lambda a: at(st, a, elem, run), ctx.size,
                           lambda s: ctx.names[s], prefix="mf_e", shift=shift)
