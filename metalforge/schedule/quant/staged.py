"""The staged matvec kernel `qmv_staged`: for an epilogue that gathers the kernel's own results
(`gathers`: RoPE's partner row inside the q/k projection).

One threadgroup per position of the other output axes (a head, at one row of x) owns every row
of the rows axis there. Its STAGED_THREADS / 32 simdgroups take the axis' blocks of
rows_per_group rows in turn (simdgroup s: blocks s, s + 16, ...), each block summed as qmv sums
one (the same chunk loop, loads and arithmetic), and lane 0 of the simdgroup writes each row's
sums into threadgroup memory (`mf_stage_<i>[row]`). After one barrier the threadgroup's threads
compute the epilogue, thread t for rows t, t + STAGED_THREADS, ...: a row's sums and its
partner's, whose index is proven in range, are read from threadgroup memory; no row is summed
twice and no partner needs another threadgroup. The rows axis holds at most MAX_STAGED_ROWS
rows (a launch with more is refused, `QuantSchedule.host_name`).
"""
from __future__ import annotations

from ... import ir
from ...graph import ReduceOp
from .. import reduce
from ..base import IDX, make_kernel
from ..hardware import SIMD_WIDTH
from . import xsums
from .blocks import aligned, epilogue, rows_loop
from .context import QuantState
from .gathers import MAX_STAGED_ROWS, partner
from .matvec import chunk_loop, combine, only_whole
from .positions import idx, numbered

STAGED_THREADS = 512            # threads of a staged threadgroup: 16 simdgroups


def _stage(i: int, row: ir.Expr) -> ir.Expr:
    """Sum i of row `row`, staged in threadgroup memory."""
    return ir.Lane(ir.Var(f"mf_stage_{i}"), row)


def _block(st: QuantState) -> list[ir.Stmt]:
    """One block of rows (mf_n0 on): zeroed sums, the chunk loop, the sums across the
    simdgroup, lane 0 staging each row's."""
    ctx = st.ctx
    rows = ctx.policy.rows_per_group
    n_sums = len(ctx.reds)
    real = ir.Var("mf_n") < ctx.size(ctx.rows_axis)
    put: list[ir.Stmt] = [ir.Assign(_stage(i, ir.Var("mf_n")), _acc(i)) for i in range(n_sums)]
    return [
        ir.Decl("mf_n0", IDX, ir.Var("mf_blk") * idx(rows)),
        *(ir.ArrayDecl(numbered("mf_acc", i), "float", rows) for i in range(n_sums)),
        ir.For("mf_r", "uint", ir.Lit(0, "uint"), ir.Lit(rows, "uint"), [
            ir.Assign(_acc(i), ir.Lit(0.0, "float")) for i in range(n_sums)], unroll=True),
        *xsums.declare(st),
        ir.Comment(f"lane l takes chunks l, l + 32, ... of {ctx.chunk} values along "
                   f"'{ctx.axis}'"),
        chunk_loop(st),
        *_stage_xsums(st),
        ir.Comment("each row: sum across the simdgroup, lane 0 stages it (rows past the end "
                   "are not)"),
        rows_loop(st, combine(epilogue_reds(st))
                  + [ir.If(real.and_(ir.Var("mf_lane").eq(ir.Lit(0, "uint"))), put)],
                  clamp=False)]


def _stage_xsums(st: QuantState) -> list[ir.Stmt]:
    """The sums of x alone across the simdgroup; the first block's lane 0 stages them."""
    n = len(st.ctx.xsums)
    if not n:
        return []
    first = ir.Var("mf_blk").eq(idx(0)).and_(ir.Var("mf_lane").eq(ir.Lit(0, "uint")))
    return [ir.Comment("the sums of x alone across the simdgroup; block 0's lane 0 stages "
                       "them"),
            *(ir.Assign(ir.Var(xsums.name(i)), ir.Call("simd_sum", (ir.Var(xsums.name(i)),)))
              for i in range(n)),
            ir.If(first, [ir.Assign(ir.Lane(ir.Var("mf_xstage"), ir.Lit(i, "uint")),
                                    ir.Var(xsums.name(i))) for i in range(n)])]


def _acc(i: int) -> ir.Expr:
    return ir.Lane(ir.Var(numbered("mf_acc", i)), ir.Var("mf_r"))


def epilogue_reds(st: QuantState) -> list[reduce.Reduction]:
    """The sums as reductions over the block's accumulators (for the simd combine)."""
    return [reduce.Reduction(n, ReduceOp.SUM, st.ctx.axis, i + 1, acc_at=_acc(i))
            for i, n in enumerate(st.ctx.reds)]


def _header(st: QuantState) -> list[ir.Stmt]:
    ctx = st.ctx
    rows = ctx.policy.rows_per_group
    return [
        ir.Comment(f"one threadgroup per position of the other output axes, owning every row "
                   f"of '{ctx.rows_axis}' there; its simdgroups take the blocks of {rows} rows "
                   f"in turn"),
        ir.Decl("mf_outer", IDX, ir.Cast(IDX, ir.Var("mf_group"))),
        ir.Decl("mf_blocks", IDX, (ctx.size(ctx.rows_axis) + idx(rows - 1)) / idx(rows)),
        *([] if only_whole(st) else [ir.Decl("mf_vec_ok", "bool", aligned(ctx))])]


def kernel(st: QuantState) -> ir.LoweredKernel:
    """The staged kernel: blocks summed and staged, a barrier, the epilogue per row with its
    partners from threadgroup memory."""
    ctx, v = st.ctx, st.v
    n_rows = ctx.size(ctx.rows_axis)
    for i in range(len(ctx.reds)):
        v.tg_arrays.append(ir.ArrayDecl(f"mf_stage_{i}", "float", MAX_STAGED_ROWS,
                                        "threadgroup"))
    if ctx.xsums:
        v.tg_arrays.append(ir.ArrayDecl("mf_xstage", "float", len(ctx.xsums), "threadgroup"))
    for i, n in enumerate(ctx.xsums):
        v.row_values.values[n] = ir.Lane(ir.Var("mf_xstage"), ir.Lit(i, "uint"))
    v.row_values.take_value = partner(st, _stage)
    _, outputs = epilogue(st, [_stage(i, ir.Var("mf_n")) for i in range(len(ctx.reds))])
    groups = STAGED_THREADS // SIMD_WIDTH
    threads = (ir.ThreadInput("mf_group", "uint", "threadgroup_position_in_grid"),
               ir.ThreadInput("mf_lid", "uint", "thread_position_in_threadgroup"),
               ir.ThreadInput("mf_lane", "uint", "thread_index_in_simdgroup"),
               ir.ThreadInput("mf_sg", "uint", "simdgroup_index_in_threadgroup"))
    head = _header(st)
    body = list(v.tg_arrays) + head + v.pre + [
        ir.For("mf_blk", IDX, ir.Cast(IDX, ir.Var("mf_sg")), ir.Var("mf_blocks"), _block(st),
               step=idx(groups)),
        ir.Comment("every row's sums staged: the epilogue reads a row's and its partners'"),
        ir.Barrier(),
        ir.For("mf_n", IDX, ir.Cast(IDX, ir.Var("mf_lid")), n_rows, outputs,
               step=idx(STAGED_THREADS))]
    summary = (f"{ctx.graph.name} (qmv_staged): y = sum over '{ctx.axis}' of values unpacked "
               f"from {ctx.bits}-bit words; one threadgroup of {STAGED_THREADS} threads per "
               f"position of the other output axes, its simdgroups taking the blocks of "
               f"{ctx.policy.rows_per_group} rows of '{ctx.rows_axis}' in turn, every row's "
               f"sums staged in threadgroup memory for the epilogue's gathers; fp32 "
               f"accumulation")
    return make_kernel(ctx.graph, ctx.index64, threads, body, summary, st.name,
                       max_threads=STAGED_THREADS)
