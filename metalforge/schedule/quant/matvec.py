"""The matvec kernels: `qmv` (one row of x per simdgroup), `qmvx` (x_rows of them) and their
`_split` variants (k_splits simdgroups per block of weight rows, each a slice of K, their
partials merged through threadgroup memory). The schedule they follow is described in the
package's doc (schedule/quant/__init__.py)."""
from __future__ import annotations

from ... import ir
from .. import reduce
from ..base import IDX, make_kernel
from ..hardware import SIMD_WIDTH
from . import pairing, prologue, xsums
from .affine import affine_chunk
from .blocks import (
    aligned,
    each_x_row,
    element,
    epilogue,
    load_shared,
    load_words,
    rows_loop,
    x_rows_loop,
)
from .context import QuantState
from .form import affines
from .gathers import partner
from .params import SIMD
from .positions import idx, numbered


def only_whole(st: QuantState) -> bool:
    """Whether the kernel has no element-by-element path: K is always a multiple of the
    chunk, and the kernel does not split K. The split kernels keep the (never taken) branch:
    without it NVRTC gave qmv_split 72 registers instead of 64 and it ran 8-13% slower at
    4096x11008 and 4096x14336 (H100, 2026-11-28), where qmv and qmvx ran as fast or faster
    (qmvx at M = 4: 119 registers instead of 166, 7-13% faster)."""
    return st.ctx.whole_k and st.splits == 1


def _task(st: QuantState) -> list[ir.Stmt]:
    """The simdgroup's task (a block of rows at one position of the other output axes) and,
    with K split, its slice."""
    ctx, rows, S = st.ctx, st.ctx.policy.rows_per_group, st.splits
    sg = ir.Var("mf_tid") / SIMD                   # the simdgroup's index in the grid
    if S == 1:
        return [ir.Comment(f"one simdgroup per block of {rows} rows of '{ctx.rows_axis}'"),
                ir.Decl("mf_task", IDX, ir.Cast(IDX, sg))]
    return [ir.Comment(f"{S} simdgroups (of one threadgroup) per block of {rows} rows of "
                       f"'{ctx.rows_axis}'; simdgroup mf_split of them takes slice "
                       f"mf_split of '{ctx.axis}'"),
            ir.Decl("mf_task", IDX, ir.Cast(IDX, sg / ir.Lit(S, "uint"))),
            ir.Decl("mf_split", "uint", sg % ir.Lit(S, "uint"))]


def header(st: QuantState) -> list[ir.Stmt]:
    """The simdgroup's block of rows (and slice of K), the alignment test and zeroed
    accumulators."""
    ctx, rows, S, mb = st.ctx, st.ctx.policy.rows_per_group, st.splits, st.mb
    if st.name == "qmv_prologue":
        return prologue.header(st) + _zeroed(st)
    blocks = (ctx.size(ctx.rows_axis) + idx(rows - 1)) / idx(rows)
    head: list[ir.Stmt] = []
    if pairing.is_paired(st):                # blocks of R/2 rows of each half of Q rows
        rows = pairing.half(st)
        head = [ir.Comment(f"rows paired at distance Q (the epilogue's gathers read row i + Q "
                           f"or i - Q): a block is {rows} rows of the first Q and their "
                           f"partners")] + pairing.q_value(st)
        blocks = (ir.Var("mf_q") + idx(rows - 1)) / idx(rows)
    out = head + _task(st) + [ir.Decl("mf_blocks", IDX, blocks),
                       ir.Decl("mf_outer", IDX, ir.Var("mf_task") / ir.Var("mf_blocks"))]
    tasks = ctx.span(ctx.prefix)       # positions of the other output axes (qmvx: blocks)
    if mb > 1:
        m = ctx.size(ctx.prefix[-1])
        out += [ir.Comment(f"and a block of {mb} rows of '{ctx.prefix[-1]}' (of x): "
                           f"rows mf_m0, ..., mf_m0 + {mb - 1}"),
                ir.Decl("mf_mblocks", IDX, (m + idx(mb - 1)) / idx(mb))]
        tasks = (ctx.span(ctx.prefix[:-1]) * ir.Var("mf_mblocks") if ctx.prefix[:-1]
                 else ir.Var("mf_mblocks"))
    if S == 1:
        out.append(ir.If(ir.Var("mf_outer") >= tasks, [ir.Return()]))
    else:
        out += [ir.Comment("the grid is padded to whole threadgroups: simdgroups past the "
                           "end skip the work but stay for the barrier"),
                ir.Decl("mf_live", "bool", ir.Var("mf_outer") < tasks)]
    if mb > 1:
        out += [ir.Decl("mf_xblock", IDX, ir.Var("mf_outer") / ir.Var("mf_mblocks")),
                ir.Decl("mf_m0", IDX, ir.Var("mf_outer") % ir.Var("mf_mblocks") * idx(mb))]
    rows = ctx.policy.rows_per_group
    first = pairing.half(st) if pairing.is_paired(st) else rows
    return out + [
        ir.Decl("mf_n0", IDX, ir.Var("mf_task") % ir.Var("mf_blocks") * idx(first)),
        *_zeroed(st)]


def _zeroed(st: QuantState) -> list[ir.Stmt]:
    """The alignment test (where chunks may be guarded) and the zeroed accumulators."""
    ctx, rows, mb = st.ctx, st.ctx.policy.rows_per_group, st.mb
    return [
        *([] if only_whole(st) else [ir.Decl("mf_vec_ok", "bool", aligned(ctx))]),
        *(ir.ArrayDecl(numbered("mf_acc", i), "float", rows * mb)
          for i in range(len(ctx.reds))),
        ir.For("mf_r", "uint", ir.Lit(0, "uint"), ir.Lit(rows * mb, "uint"), [
            ir.Assign(ir.Lane(ir.Var(numbered("mf_acc", i)), ir.Var("mf_r")),
                      ir.Lit(0.0, "float")) for i in range(len(ctx.reds))], unroll=True),
        *xsums.declare(st)]


def whole_chunk(st: QuantState) -> list[ir.Stmt]:
    """A chunk inside K with aligned rows: every load of the chunk first (each row's words
    and per-group values, then the shared values), then the arithmetic, so a lane has all its
    loads in flight at once."""
    ctx = st.ctx
    C, rows = ctx.chunk, ctx.policy.rows_per_group
    arrays, row_loads = load_words(st)
    forms = affines(ctx)
    what = f"{ctx.words} packed words (one {4 * ctx.words}-byte load)"
    if len(ctx.packed) > 1:
        what = f"{ctx.words} packed words of each of {len(ctx.packed)} weights"
    if forms is not None:
        chunk = affine_chunk(st, forms)
        arrays += chunk.arrays
        row_loads += chunk.loads
        rows_body = chunk.body
        what += ", its group's scale and bias"
    else:
        rows_body = [rows_loop(st, x_rows_loop(st, [ir.For(
            "mf_j", "uint", ir.Lit(0, "uint"), ir.Lit(C, "uint"), element(st, True),
            unroll=True)]))]
    # the rows' loads (from memory) go out first, then the shared values (cache hits)
    out: list[ir.Stmt] = [ir.Comment(f"loads of the block's {rows} row(s), all issued before "
                                     f"any is used: per row {what}")]
    out += arrays + [rows_loop(st, row_loads)]
    staged = st.name == "qmv_prologue"          # x from threadgroup memory
    out += [] if staged else [ir.Comment(f"values every row shares: {C} per lane, in "
                                         "registers")] + load_shared(st)
    out += xsums.chunk_terms(st, True)
    if forms is not None:
        out += [ir.Comment("x of each element and their sum: sum_k (q s + b) x = "
                           "s sum_k q x + b sum_k x (s, b: one per group)")]
        out += prologue.staged_x(st) if staged else chunk.xs
    out += [ir.Comment("each row: unpack its words from registers, add to its sum")]
    return out + rows_body


def chunk_loop(st: QuantState) -> ir.Stmt:
    """Lane l's chunks along K (of slice s: chunks 32 s + l, then every 32 S-th): whole ones
    fast, the rest guarded (none where K is always a multiple of the chunk)."""
    ctx, S = st.ctx, st.splits
    C, K = ctx.chunk, ctx.size(ctx.axis)
    first: ir.Expr = ir.Var("mf_lane")
    if S > 1:
        first = ir.Var("mf_split") * SIMD + first
    if only_whole(st):
        body = [ir.Comment(f"'{ctx.axis}' is a multiple of {C} (its derived dims): every "
                           "chunk is whole, in registers, unguarded")] + whole_chunk(st)
    else:
        kj = ir.Var("mf_k0") + ir.Cast(IDX, ir.Var("mf_j"))
        tail = xsums.chunk_terms(st, False) + [rows_loop(st, x_rows_loop(st, [
            ir.For("mf_j", "uint", ir.Lit(0, "uint"), ir.Lit(C, "uint"),
                   [ir.If(kj < K, element(st, False))], unroll=True)]))]
        body = [ir.If(ir.Var("mf_vec_ok").and_(ir.Var("mf_k0") + idx(C) <= K),
                      [ir.Comment("a whole chunk: registers, unguarded")] + whole_chunk(st),
                      [ir.Comment("the row's end (or unaligned rows): element by element, "
                                  "guarded")] + tail)]
    if st.name == "qmv_prologue":
        return prologue.loop(st, body)
    loop: ir.Stmt = ir.For("mf_k0", IDX, ir.Cast(IDX, first * ir.Lit(C, "uint")), K, body,
                           step=idx(S * SIMD_WIDTH * C))
    return loop if S == 1 else ir.If(ir.Var("mf_live"), [loop])


def combine(reds: list[reduce.Reduction]) -> list[ir.Stmt]:
    """Each sum across the simdgroup."""
    return [s for r in reds for s in reduce.simd_combine(r)]


def store_rows(st: QuantState) -> list[ir.Stmt]:
    """Each row's sum across the simdgroup (and across the block's simdgroups, through
    threadgroup memory); one lane computes and stores the outputs."""
    ctx, S, mb = st.ctx, st.splits, st.mb
    rows = ctx.policy.rows_per_group
    shared = xsums.combine(st)                     # (S = 1 and mb = 1 where there are any)
    paired = pairing.is_paired(st)
    if paired:                                     # partners from the block's registers
        st.v.row_values.take_value = partner(st, lambda i, p: pairing.slot_value(st, i, p))
    reds, outputs = epilogue(st)
    if paired and S == 1:
        return shared + paired_rows(st, combine(reds), outputs)
    if st.name == "qmv_prologue":               # simdgroups past the blocks store nothing
        return [ir.If(ir.Var("mf_live"), [
            ir.Comment("each row: sum across the simdgroup, lane 0 stores"),
            rows_loop(st, combine(reds) + [ir.If(_keep(st), outputs)], clamp=False)])]
    lane0 = ir.Var("mf_lane").eq(ir.Lit(0, "uint"))
    # rows past N (clamped to N - 1 where they load) are not stored
    real: ir.Expr = ir.Lit(True, "bool") if rows == 1 else \
        ir.Var("mf_n") < ctx.size(ctx.rows_axis)
    keep = lane0 if rows == 1 else real.and_(lane0)
    if mb > 1:                   # rows of x past M (clamped where they load) are not stored
        keep = keep.and_(ir.Var("mf_m") < ctx.size(ctx.prefix[-1]))
    if S == 1:
        return shared + [ir.Comment("each row: sum across the simdgroup, lane 0 stores"),
                rows_loop(st, x_rows_loop(st, combine(reds) + [ir.If(keep, outputs)],
                                          clamp=False), clamp=False)]
    # partial (simdgroup g, weight row r, row i of x) at slot (g * rows + r) * mb + i
    lane, sg, u_mb = ir.Var("mf_lane"), ir.Var("mf_sg"), ir.Lit(mb, "uint")
    slot = ir.Var("mf_r") * u_mb + (ir.Var("mf_i") if mb > 1 else ir.Lit(0, "uint"))
    per_sg = ir.Lit(rows * mb, "uint")
    # the sums of x alone ride along: merged again with every row (the same total each time)
    put, merge = reduce.through_threadgroup(
        st.v, reds + xsums.reductions(st), SIMD_WIDTH * rows * mb, sg * per_sg + slot,
        (sg - ir.Var("mf_split") + lane) * per_sg + slot, lane < ir.Lit(S, "uint"))
    keep = ir.Var("mf_live").and_(ir.Var("mf_split").eq(ir.Lit(0, "uint"))).and_(keep)

    def each(body: list[ir.Stmt]) -> list[ir.Stmt]:
        return [each_x_row(st, body)] if mb > 1 else body
    if paired:
        last = paired_rows(st, merge, outputs, ir.Var("mf_live").and_(
            ir.Var("mf_split").eq(ir.Lit(0, "uint"))))
    else:
        last = [ir.Comment("the first simdgroup's lane 0 stores each row"),
                rows_loop(st, x_rows_loop(st, merge + [ir.If(keep, outputs)], clamp=False),
                          clamp=False)]
    return shared + [ir.Comment("each row: sum across the simdgroup"),
            rows_loop(st, each(combine(reds))),
            ir.Comment(f"across the block's {S} simdgroups: one partial per simdgroup and "
                       f"row{' (of weights and of x)' if mb > 1 else ''} through "
                       "threadgroup memory, then a second simd reduction"),
            ir.If(lane0, [rows_loop(st, each(put))]), ir.Barrier(), *last]


def _keep(st: QuantState) -> ir.Expr:
    """Lane 0 of a row inside N."""
    lane0 = ir.Var("mf_lane").eq(ir.Lit(0, "uint"))
    if st.ctx.policy.rows_per_group == 1:
        return lane0
    return (ir.Var("mf_n") < st.ctx.size(st.ctx.rows_axis)).and_(lane0)


def paired_rows(st: QuantState, sums: list[ir.Stmt], outputs: list[ir.Stmt],
                live: ir.Expr = ir.Lit(True, "bool")) -> list[ir.Stmt]:
    """qmv_paired: every row's sums first (`sums`: across the simdgroup, or the block's
    partials merged), then lane 0 computes and stores each row's outputs, its partner's sums
    read from registers (every lane holds every row's). `live`: the simdgroups that store."""
    keep = pairing.real(st).and_(ir.Var("mf_lane").eq(ir.Lit(0, "uint")))
    if not (isinstance(live, ir.Lit) and live.value is True):
        keep = live.and_(keep)
    return [ir.Comment("each row's sums, every lane holding every row's"),
            rows_loop(st, sums, clamp=False),
            ir.Comment("lane 0 stores each row of the head (u < Q), its partner from the "
                       "registers"),
            rows_loop(st, [ir.If(keep, outputs)], clamp=False)]


def _summary(st: QuantState) -> str:
    ctx, S, mb = st.ctx, st.splits, st.mb
    split = "" if S == 1 else (f", {S} simdgroups per block each summing a slice of "
                               f"'{ctx.axis}' (merged through threadgroup memory)")
    xrows = "" if mb == 1 else (f" and {mb} rows of '{ctx.prefix[-1]}' (each value unpacked "
                                f"once for them)")
    return (f"{ctx.graph.name} ({st.name}): y = sum over '{ctx.axis}' of values unpacked from "
            f"{ctx.bits}-bit words; one simdgroup per {ctx.policy.rows_per_group} rows of "
            f"'{ctx.rows_axis}'{xrows}{split}, {ctx.chunk} values per lane per chunk "
            f"({ctx.words} words), shared values in registers; fp32 accumulation")


def kernel(st: QuantState) -> ir.LoweredKernel:
    """The matvec kernel `st.name` (qmv, qmv_split, qmvx or qmvx_split)."""
    ctx, S, v = st.ctx, st.splits, st.v
    threads = [ir.ThreadInput("mf_tid", "uint", "thread_position_in_grid"),
               ir.ThreadInput("mf_lane", "uint", "thread_index_in_simdgroup")]
    if S > 1:
        threads.append(ir.ThreadInput("mf_sg", "uint", "simdgroup_index_in_threadgroup"))
    if st.name == "qmv_prologue":
        threads.append(ir.ThreadInput("mf_lid", "uint", "thread_position_in_threadgroup"))
    head, loop, finish = header(st), chunk_loop(st), store_rows(st)
    lanes = "lane l takes chunks l, l + 32, ..." if S == 1 else \
        f"lane l of slice s takes chunks 32 s + l, then every {32 * S}th,"
    body = list(v.tg_arrays) + head + v.pre + [
        ir.Comment(f"{lanes} of {ctx.chunk} values along '{ctx.axis}'"), loop, *finish]
    return make_kernel(ctx.graph, ctx.index64, tuple(threads), body, _summary(st), st.name)
