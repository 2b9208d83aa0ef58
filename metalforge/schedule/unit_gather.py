"""Gathers of one value per row (or column): `mf.take` among a reduction's per-row values.

In a row reduction over V, `mf.take(x, "V", t)` with `t` one index per row (x "T[R, V]",
t "i32[R]") is not an element value but a row value: its result has no V, so it is computed
once per row, like a reduction's result or a per-row input. Cross-entropy's target logit
(`mf.logsumexp(x, "V") - mf.take(x, "V", t)`) is the use: the gathered element is the row's
element at the row's own index, read once, not per element.

The lowering is the gathers' usual one (`ElementLowering._checked`): the index is checked
against the gathered axis; out of range, the kernel records it in the report buffer (so the
call raises `mf.GatherIndexError`) and reads position 0 instead. The element is then one load
at the unit's (row's or column's) position along every other axis of the tensor and the
checked position along the gathered one. Where a thread's unit may lie past the last one (the
column schedule's `split` kernel, `live`), the load is guarded like the unit's other loads.

The same holds for a column reduction over N: `mf.take(x, "N", t)` with t "i32[C]" is one
value per column.
"""
from __future__ import annotations

from typing import Optional

from .. import ir
from ..errors import UnsupportedConstruct, at
from ..graph import Graph, Node, Op, take_sites, topo_order
from .base import IDX
from .lower import ElementLowering, compute_type
from .reduce import ReductionContext, VariantParts


def unit_take(ctx: ReductionContext, parts: VariantParts, n: Node, pos: ir.Expr,
              live: Optional[ir.Expr] = None) -> ir.Expr:
    """Gather `n` (a TAKE node without the reduced axis) at this thread's row/column: the
    element of its tensor at the checked position `pos` along the gathered axis and the
    unit's position along the others; where `live` is given, only if it holds (0 else)."""
    name, axis = n.attr
    t = ctx.graph.tensor(name)
    e: Optional[ir.Expr] = None
    for a in t.axes:
        if a != axis and a not in ctx.outer:
            raise UnsupportedConstruct(
                f"mf.take({name!r}, axis={axis!r}){at(n.loc)}: one value per "
                f"{'row' if ctx.tag == 'row' else 'column'} is read at the "
                f"{'row' if ctx.tag == 'row' else 'column'}'s position along every other axis "
                f"of '{name}', but its axis {a!r} is not one of the kernel's "
                f"{'rows' if ctx.tag == 'row' else 'columns'} {list(ctx.outer)}")
        p = pos if a == axis else ctx.position(a, parts)
        e = p if e is None else e * ctx.size(a) + p
    offset = e if e is not None else ir.Lit(0, IDX)
    value: ir.Expr = ir.Cast(compute_type(t.dtype), ir.Load(ctx.names[name], offset))
    if live is not None:
        zero = ir.Lit(0.0 if t.dtype.is_float else (False if t.dtype.kind == "bool" else 0),
                      compute_type(t.dtype))
        value = ir.Select(live, value, zero)
    return value


def with_unit_gathers(ctx: ReductionContext, parts: VariantParts,
                      live: Optional[ir.Expr] = None) -> VariantParts:
    """`parts` with its row (column) values able to gather one value per unit (`unit_take`)."""
    parts.row_values.take = lambda n, pos: unit_take(ctx, parts, n, pos, live)
    return parts


def has_unit_gathers(ctx: ReductionContext) -> bool:
    """Whether some gather of the graph is a row (column) value."""
    return any(n.op == Op.TAKE and not ctx.elem(n) for n in ctx.nodes)


def gathers_once(values: ElementLowering, roots: list[Node]) -> bool:
    """Whether the unit values `roots` gather an element not yet read (a per-unit `mf.take`
    `values` has not lowered): an epilogue then computes them in the one thread that stores
    the results, so the gathered element is read once per unit, not by every thread."""
    return any(n.op == Op.TAKE for n in topo_order(roots, seen=values.values))


def unit_sites(graph: Graph, axis: str) -> frozenset[int]:
    """The numbers (in `take_sites`) of the gathers that are row (column) values of a reduction
    over `axis`: each a load of one element per row, which the schedule's byte count adds."""
    return frozenset(j for j, n in enumerate(take_sites(graph)) if axis not in n.axes)
