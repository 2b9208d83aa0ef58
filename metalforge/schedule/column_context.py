"""The column schedule's context: what holds for all kernels of one column reduction (the
reduced axis, whether the split kernel may chunk it, the partials a chunk leaves in scratch,
the wide kernel's columns a thread)."""
from __future__ import annotations

from dataclasses import dataclass, replace

from .. import ir
from ..graph import Graph, Op
from . import reduce
from .column_words import column_groups
from .policy import COLUMN_LOAD_BYTES, LaunchPolicy


def _bits(e: ir.Expr, frm: str, to: str) -> ir.Expr:
    """A 4-byte value of type `frm` as type `to`, bit for bit (partials in fp32 scratch)."""
    return e if frm == to else ir.Call(f"as_type<{to}>", (e,))


@dataclass(frozen=True, eq=False)
class ColumnContext(reduce.ReductionContext):
    """The reduction context of one column schedule, with what holds for all its kernels."""
    # one phase, every output one value per column: the split kernel may chunk the axis
    chunked: bool = False
    slots: tuple[tuple[str, str], ...] = ()   # chunked: `partial_slots` of its reductions
    inner: str = ""                           # the columns' innermost axis
    wide: int = 1                             # `wide_columns`
    # chunked, one_launch: the last group of a column block merges the chunks (column_ticket)
    ticket: bool = False


def column_context(graph: Graph, policy: LaunchPolicy, index64: bool) -> ColumnContext:
    """The context of the column schedule of `graph` (the axis its first reduction reduces)."""
    red = reduce.reduction_context(graph, policy, index64, graph.reductions()[0].attr[1], "col",
                                   "column")
    reds = reduce.phases(graph, online=True)
    chunked = max(r.phase for r in reds) == 0 and \
        all(red.axis not in o.axes for o in graph.outputs)
    ctx = ColumnContext(**reduce.context_fields(red), chunked=chunked,
                        slots=tuple(partial_slots(reds)) if chunked else (),
                        inner=red.outer[-1] if red.outer else "",
                        ticket=chunked and policy.one_launch and policy.fill_groups > 0)
    return replace(ctx, wide=wide_columns(ctx))


def wide_columns(ctx: ColumnContext) -> int:
    """Columns a thread of the `wide` kernel takes (vector_width, at most COLUMN_LOAD_BYTES
    of the widest tensor; 1: no wide kernel): for
    chunked graphs without gathers, index expressions or random draws (values that depend on
    the column) whose every loaded tensor has the reduced axis, and has the columns' innermost
    axis, if at all, innermost (so a thread's columns are one aligned vector of each), as has
    every output."""
    widest = max((t.dtype.itemsize for t in ctx.inputs if ctx.inner in t.axes), default=4)
    c = min(ctx.policy.vector_width, max(1, COLUMN_LOAD_BYTES // widest))
    # words or groups along the innermost column axis (K/8, K/GS of a kept K: the transposed
    # quantized sum) are one element for all the thread's columns: a word's values (up to 8)
    groups = column_groups(ctx)
    if groups:
        c = min(8, *(d.div for d in groups))
    if c == 1 or not ctx.chunked or not ctx.inner:
        return 1
    if any(n.op in (Op.TAKE, Op.INDEX, Op.RANDOM) for n in ctx.nodes):
        return 1
    if any(d.base != ctx.inner or d.div % c for d in groups):
        return 1
    for t in ctx.inputs:
        if ctx.axis not in t.axes or (ctx.inner in t.axes and t.axes[-1] != ctx.inner):
            return 1
    return c if all(o.axes[-1] == ctx.inner for o in ctx.graph.outputs) else 1


def partial_slots(reds: list[reduce.Reduction]) -> list[tuple[str, str]]:
    """(variable, MSL type) of each value a chunk leaves in scratch, per column: every
    accumulator, argmax/argmin's index, an online max's running sum."""
    out: list[tuple[str, str]] = []
    for r in reds:
        if r.online_max is not None:
            continue
        out.append((r.acc, r.acc_type))
        if r.has_index:
            out.append((r.idx, "uint"))
        if r.online_sum is not None:
            out.append((r.online_sum.acc, "float"))
    return out
