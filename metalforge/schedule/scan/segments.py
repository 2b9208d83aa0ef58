"""The split of few long rows over several threadgroups (`segments`): each row in S segments
of whole chunks, one threadgroup each. A first launch (the `totals` kernel) combines each
segment's elements into its total, to the scratch buffer; the second (the `row` kernel) starts
each segment's running carry at the combine of the totals of the segments before it in its
row (a serial loop over at most S - 1 values, every thread alike) and scans the segment.
Never decoupled look-back: Metal promises no forward progress between threadgroups, so a
segment never waits for another. With S = 1 (the host's choice for most calls: enough rows
to fill the GPU) the row kernel reads no scratch and the totals kernel does not run.

The column kernels split a long axis the same way where the columns alone are too few threads
(`column_header`: thread i on column i % C, segment i / C; the `col_totals` kernel first).

Scratch: the total of scan q, row (column) r, segment s at (q * rows + r) * S + s (fp32: float
scans only split; q counts floats: a segmented cumsum's (flags, sum) pair takes q and q + 1)."""
from __future__ import annotations

from ... import ir
from .. import reduce
from ..base import IDX
from ..hardware import SIMD_WIDTH
from ..rows.context import RowContext
from .blocks import combine, lit
from .context import Scan

SEGMENTS = "segments"              # the launch parameter: segments per row


def extra_params(first: int) -> tuple[ir.Argument, ...]:
    """The split kernels' arguments after the graph's: the scratch buffer and S."""
    return (ir.Argument("mf_scratch", first, "buffer", "float", ("scratch",), True),
            ir.Argument("mf_segs", first + 1, "scalar", "uint", ("launch", SEGMENTS),
                        cast="int32"))


def header(ctx: RowContext) -> tuple[tuple[ir.ThreadInput, ...], list[ir.Stmt]]:
    """The thread's row and segment (group g: row g / S, segment g % S), the row's chunks and
    the segment's [mf_j0, mf_j1) of them (S = 1: the whole row)."""
    threads = (ir.ThreadInput("mf_group", "uint", "threadgroup_position_in_grid"),
               ir.ThreadInput("mf_lid", "uint", "thread_position_in_threadgroup"),
               ir.ThreadInput("mf_tpg", "uint", "threads_per_threadgroup"),
               ir.ThreadInput("mf_sg", "uint", "simdgroup_index_in_threadgroup"),
               ir.ThreadInput("mf_lane", "uint", "thread_index_in_simdgroup"))
    segs, reads = ir.Var("mf_segs"), ctx.policy.reads_per_thread
    length = ir.Cast("uint", ctx.size(ctx.axis))
    span = ir.Var("mf_tpg") * lit(reads)
    per = ir.Var("mf_per")
    return threads, [
        ir.Comment("one threadgroup per segment of a row (mf_segs segments a row, whole "
                   f"chunks of threads x {reads} elements each)"),
        ir.Decl("mf_row", "uint", ir.Var("mf_group") / segs),
        ir.Decl("mf_seg", "uint", ir.Var("mf_group") % segs),
        ir.Decl("mf_t", "uint", ir.Var("mf_lid")),
        ir.Decl("mf_nsg", "uint", (ir.Var("mf_tpg") + lit(SIMD_WIDTH - 1)) / lit(SIMD_WIDTH)),
        ir.Decl("mf_chunks", "uint", (length + (span - lit(1))) / span),
        ir.Decl("mf_per", "uint", (ir.Var("mf_chunks") + (segs - lit(1))) / segs),
        ir.Decl("mf_j0", "uint", ir.Var("mf_seg") * per),
        ir.Decl("mf_j1", "uint", ir.Call("min", (ir.Var("mf_j0") + per, ir.Var("mf_chunks"))))]


def column_header(ctx: reduce.ReductionContext
                  ) -> tuple[tuple[ir.ThreadInput, ...], list[ir.Stmt]]:
    """The column kernels: thread i on column i % C and segment i / C of the axis
    (neighbouring threads on neighbouring columns), the segment's positions [mf_k_first,
    mf_k_end); past the last segment (a grid rounded up), leave."""
    ncols, segs = ctx.span(ctx.outer), ir.Var("mf_segs")
    tid = ir.Cast(IDX, ir.Var("mf_tid"))
    length = ir.Cast("uint", ctx.size(ctx.axis))
    per = ir.Var("mf_per")
    return (ir.ThreadInput("mf_tid", "uint", "thread_position_in_grid"),), [
        ir.Comment("one thread per column and segment of the axis (mf_segs segments)"),
        ir.Decl("mf_col", "uint", ir.Cast("uint", tid % ncols)),
        ir.Decl("mf_seg", "uint", ir.Cast("uint", tid / ncols)),
        ir.If(ir.Var("mf_seg") >= segs, [ir.Return()]),
        ir.Decl("mf_per", "uint", (length + (segs - lit(1))) / segs),
        ir.Decl("mf_k_first", "uint", ir.Var("mf_seg") * per),
        ir.Decl("mf_k_end", "uint", ir.Call("min", (ir.Var("mf_k_first") + per, length)))]


def scratch_at(ctx: reduce.ReductionContext, s: Scan, seg: ir.Expr, unit: str = "mf_row",
               part: int = 0) -> ir.Expr:
    """Where float `part` of scan s's total of segment `seg` of this row (`unit` mf_col:
    column) sits in scratch."""
    r: ir.Expr = ir.Cast(IDX, ir.Var(unit))
    if s.slot + part > 0:
        r = ir.Lit(s.slot + part, IDX) * ctx.span(ctx.outer) + r
    return r * ir.Cast(IDX, ir.Var("mf_segs")) + ir.Cast(IDX, seg)


def carry_in(ctx: reduce.ReductionContext, scans: list[Scan], unit: str = "mf_row"
             ) -> list[ir.Stmt]:
    """Each scan's carry into this segment: the combine of the totals of the segments before
    it in its row (column), in order (none for the first segment)."""
    sl = ir.Var("mf_s")
    body: list[ir.Stmt] = [
        ir.Assign(ir.Var(s.name("carry")), combine(s, ir.Var(s.name("carry")), total(
            s, [ir.Load("mf_scratch", scratch_at(ctx, s, sl, unit, p))
                for p in range(s.floats)]))) for s in scans]
    return [ir.Comment("the segments before this one: their totals from the first launch"),
            ir.For("mf_s", "uint", lit(0), ir.Var("mf_seg"), body)]


def store_totals(ctx: reduce.ReductionContext, scans: list[Scan], unit: str = "mf_row",
                 value: str = "carry") -> list[ir.Stmt]:
    """The totals kernels' end: the segment's totals to scratch (each scan's `value` after
    its last element), by the group's first thread for a row, every thread for a column."""
    stores: list[ir.Stmt] = [
        ir.Store("mf_scratch", scratch_at(ctx, s, ir.Var("mf_seg"), unit, p),
                 ir.Var(s.name(value)) if s.floats == 1 else
                 ir.Lane(ir.Var(s.name(value)), lit(p)))
        for s in scans for p in range(s.floats)]
    if unit != "mf_row":
        return [ir.Comment("the segment's totals, for the segments after it")] + stores
    return [ir.Comment("the segment's totals, for the segments after it"),
            ir.If(ir.Var("mf_t").eq(lit(0)), stores)]


def total(s: Scan, floats: list[ir.Expr]) -> ir.Expr:
    """A segment's total from its floats in scratch (a segmented cumsum's: the pair)."""
    return floats[0] if s.floats == 1 else ir.Call("float2", tuple(floats))
