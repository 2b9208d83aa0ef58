"""Gathers in a quantized matvec's epilogue: `mf.take` of the kernel's own results (a
TAKE_VALUE node), as RoPE inside the q/k projection reads each row's partner,

    y = mf.sum((mf.unpack(wq, bits=4) * s + b) * x, axis="K")          # [H, E]
    partner = mf.take(y, axis="E", index=mf.where(i < half, i + half, i - half))

The partner row is another weight row's sum. The staged kernel (`staged`) gives one threadgroup
every row of the rows axis at one position of the other output axes (a whole head), stages
their sums in threadgroup memory and computes the epilogue with the partner read from there.
A row the threadgroup holds is any row of the axis, so the gather is served exactly where its
index is proven in [0, size) (`ranges.index_in_range`, an interval proof symbolic in the
sizes); any other gather of a computed value is refused with the reason (`check`).

Here: `value_gathers` (the graph's TAKE_VALUE nodes), `check` (what the staged kernel serves)
and `partner` (the lowering of a gathered value at the partner's row, for the epilogue's
`ElementLowering`).
"""
from __future__ import annotations

from typing import Callable

from ... import ir
from ...errors import UnsupportedConstruct, at
from ...graph import Graph, Node, Op, topo_order
from .. import ranges
from ..base import IDX
from ..lower import ElementLowering, compute_type
from .context import QuantContext, QuantState
from .positions import row_position

MAX_STAGED_ROWS = 1024          # rows of the rows axis one threadgroup stages (4 KiB a sum)


def value_gathers(graph: Graph) -> list[Node]:
    """The gathers of computed values (`mf.take` of a non-argument), in graph order."""
    return [n for n in graph.nodes() if n.op == Op.TAKE_VALUE]


def _refuse(ctx: QuantContext, n: Node, why: str) -> UnsupportedConstruct:
    return UnsupportedConstruct(
        f"kernel '{ctx.graph.name}': mf.take(..., axis={n.attr!r}){at(n.loc)} of a computed "
        f"value: {why}")


def check(ctx: QuantContext) -> None:
    """Every gather of a computed value is one the staged kernel serves: along the rows axis
    (the output's innermost axis, the weight rows), of an epilogue value (the sums and values
    of the row, not of K), with an index free of sums and proven in range; else an error
    saying which condition fails and what would hold."""
    sums = set(ctx.reds)
    for n in value_gathers(ctx.graph):
        value, idx = n.args
        if n.attr != ctx.rows_axis:
            raise _refuse(ctx, n, f"a quantized matvec gathers its results along its weight "
                                  f"rows only (the output's innermost axis "
                                  f"'{ctx.rows_axis}'), not along '{n.attr}'")
        if ctx.axis in value.axes or not any(m in sums for m in topo_order([value])):
            raise _refuse(ctx, n, f"the value taken from must be computed from the kernel's "
                                  f"mf.sum over '{ctx.axis}' (an epilogue value)")
        if any(m.op in (Op.REDUCE, Op.UNPACK, Op.TAKE_VALUE) for m in topo_order([idx])):
            raise _refuse(ctx, n, "its index reads a sum or another gathered value; the index "
                                  "must be an index expression (mf.index, mf.size, integers)")
        if any(m.op == Op.TAKE_VALUE for m in topo_order([value]) if m is not n):
            raise _refuse(ctx, n, "a gathered value taken from again; take once")
        if not ranges.index_in_range(ctx.graph, idx, n.attr):
            raise _refuse(ctx, n, f"its index is not provably in [0, size('{n.attr}')): the "
                                  f"kernel reads the partner from the rows one threadgroup "
                                  f"stages (all of '{n.attr}' at the row's other positions), "
                                  f"so an index must be proven in range at build time (an "
                                  f"affine expression of mf.index('{n.attr}') within the axis, "
                                  f"a where-guarded partner as rotate-half RoPE's, or a clamp: "
                                  f"mf.clamp(i, 0, mf.size('{n.attr}') - 1))")


class _PartnerLowering(ElementLowering):
    """The lowering of a gathered value at the partner's row: every value gets a fresh
    numbered name (the row's own values, positions and loads keep theirs)."""

    def _name(self, n: Node) -> str:
        return f"{self.prefix}{next(self._ids)}"


def partner(st: QuantState, stage: Callable[[int, ir.Expr], ir.Expr]
            ) -> Callable[[Node, ir.Expr], tuple[list[ir.Stmt], ir.Expr]]:
    """The epilogue's `take_value`: the gathered value at row `pos` of the rows axis, its sums
    read from the threadgroup's staged sums (`stage(i, row)`: sum i of that row), its row
    values loaded at that row, every other position the element's own."""
    ctx = st.ctx
    count = iter(range(1, 1 << 30))
    outer = st.v.row_values

    def take(n: Node, pos: ir.Expr) -> tuple[list[ir.Stmt], ir.Expr]:
        k = next(count)
        row = ir.Var(f"mf_partner_{k}")

        def position(axis: str) -> ir.Expr:
            return row if axis == ctx.rows_axis else row_position(st, axis)

        def load(m: Node) -> ir.Expr:
            t = ctx.graph.tensor(m.attr)
            off: ir.Expr = ir.Lit(0, IDX)
            for i, a in enumerate(t.axes):
                off = position(a) if i == 0 else off * ctx.size(a) + position(a)
            return ir.Cast(compute_type(t.dtype), ir.Load(ctx.names[t.name], off))

        sub = _PartnerLowering(ctx.graph, load, position, ctx.size, lambda s: ctx.names[s],
                               prefix=f"mf_partner_{k}_", proven=outer.proven)
        for i, red in enumerate(ctx.reds):
            sub.values[red] = stage(i, row)
        for red in ctx.xsums:                  # sums of x alone: one value for every row
            sub.values[red] = outer.values[red]
        stmts: list[ir.Stmt] = [
            ir.Comment(f"the partner's value: row {n.attr} = the gathered index (proven in "
                       "range), its sums from the rows this kernel holds"),
            ir.Decl(row.name, IDX, pos)]
        stmts += sub.lower([n.args[0]])
        ctx.uses.helpers.update(sub.helpers)
        return stmts, sub.value(n.args[0])
    return take
