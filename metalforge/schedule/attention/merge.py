"""The merge kernel (`merge`): when a call splits a query row's keys into blocks, each block's
decode threadgroup leaves its online-softmax state (m, d, acc[E]) in the scratch buffer; this
kernel merges a row's states under their largest max and writes the outputs."""
from __future__ import annotations

from ... import ir
from .. import online
from ..base import IDX, make_kernel
from ..hardware import SIMD_WIDTH
from ..online import NEG_INF
from .context import SIMD, THREADS, CallContext, Emitted, KernelState
from .loops import slots
from .lse import any_lse
from .params import MERGE_LANES, MERGE_MIN_SHARE, MERGE_SIMDGROUPS, MERGE_STEP
from .write import epilogue

NSG = MERGE_SIMDGROUPS


def kernel(ctx: CallContext) -> ir.LoweredKernel:
    """Threadgroups of MERGE_SIMDGROUPS simdgroups, mf_parts per query row, each for the
    elements of E that mf_wp (at most MERGE_LANES) of a block's mf_w lanes hold. Every
    simdgroup finds the largest max M of all the row's key blocks (a block per lane), then
    sums d_s exp(m_s - M) and acc_s exp(m_s - M) over its share of the blocks: its kp
    streams of mf_wp lanes (a lane holds reads_per_thread elements of E) take MERGE_STEP
    blocks each at a time, their loads issued before any is used, and are summed by
    shuffles. Under one M the simdgroups' sums need no rescaling: through threadgroup
    memory, each thread adds them for its elements of E and writes their outputs (the
    first simdgroup alone took ~400 serial instructions for them on an H100)."""
    ks = KernelState(Emitted(), qt=ctx.qt, group=SIMD_WIDTH * NSG,
                     epl=ctx.policy.reads_per_thread, tiled=False)
    fin = epilogue(ctx, ks, ir.Var("mf_ae"), lambda body: _each_element(ctx, ks, body))
    ks.out.helpers.add("mf_simd_max")
    body: list[ir.Stmt] = [
        *_placement(ctx, ks),
        *ks.out.pre,
        # (the rows' logsumexp reads M after the sums: no block around them then)
        *(_block_sums(ctx, ks) if any_lse(ctx.form, ctx.graph.outputs)
          else [ir.Block(_block_sums(ctx, ks))]),
        ir.Barrier(),
        ir.Comment("each thread its elements of E: the simdgroups' sums added; outputs: "
                   "acc / d (all keys masked: 0 / 0 = NaN)"),
        fin]
    summary = (f"{ctx.graph.name} (merge): the online-softmax states of a query row's key "
               f"blocks merged, then the outputs; threadgroups of {NSG} simdgroups per "
               f"query row, each for a part of E")
    return make_kernel(ctx.graph, ctx.index64, THREADS, body, summary, "merge",
                       params=ctx.params, helpers=tuple(sorted(ks.out.helpers)))


def _each_element(ctx: CallContext, ks: KernelState, body: list[ir.Stmt]) -> ir.Stmt:
    """Thread mf_sg * 32 + mf_lane: elements mf_e of the threadgroup's part of E from it,
    every 32 x nsg-th, the simdgroups' sums added."""
    emax = SIMD_WIDTH * ks.epl
    part, lane = ir.Var("mf_part"), ir.Var("mf_lane")
    span = ir.Var("mf_wp") * ir.Lit(ks.epl, "uint")            # the threadgroup's elements of E
    e, s = ir.Var("mf_e"), ir.Var("mf_s")
    return ir.For("mf_e", "uint", part * span + ir.Var("mf_sg") * SIMD + lane,
                  ir.Call("min", (ir.Cast("uint", ctx.size(ctx.form.e)),
                                  (part + ir.Lit(1, "uint")) * span)), [
                      ir.Decl("mf_md", "float", ir.Lit(0.0, "float"), const=False),
                      ir.Decl("mf_ae", "float", ir.Lit(0.0, "float"), const=False),
                      ir.For("mf_s", "uint", ir.Lit(0, "uint"), ir.Lit(NSG, "uint"), [
                          ir.Assign(ir.Var("mf_md"),
                                    ir.Var("mf_md") + ir.Lane(ir.Var("mf_tg_d"), s)),
                          ir.Assign(ir.Var("mf_ae"), ir.Var("mf_ae") + ir.Lane(
                              ir.Var("mf_tg_acc"), s * ir.Lit(emax, "uint") + e))],
                          unroll=True),
                      *body], step=ir.Lit(NSG * SIMD_WIDTH, "uint"))


def _placement(ctx: CallContext, ks: KernelState) -> list[ir.Stmt]:
    """The threadgroup memory of the simdgroups' sums, the threadgroup's row and part of E,
    the lane's place (E chunk mf_sub of block stream mf_grp) and the simdgroup's blocks."""
    emax = SIMD_WIDTH * ks.epl
    splits, lane = ir.Var("mf_splits"), ir.Var("mf_lane")
    wp, part, share = ir.Var("mf_wp"), ir.Var("mf_part"), ir.Var("mf_share")
    return [
        ir.ArrayDecl("mf_tg_d", "float", NSG, "threadgroup"),
        ir.ArrayDecl("mf_tg_acc", "float", NSG * emax, "threadgroup"),
        ir.Comment(f"mf_parts threadgroups per query row, each the elements of E of up to "
                   f"{MERGE_LANES} lanes of a block (mf_wp); simdgroup mf_sg sums key blocks "
                   "[mf_b0, mf_b1), its lanes in parallel"),
        ir.Decl("mf_wp", "uint", ir.Call("min", (ir.Var("mf_w"),
                                                 ir.Lit(MERGE_LANES, "uint")))),
        ir.Decl("mf_parts", "uint", ir.Var("mf_w") / wp),
        ir.Decl("mf_row", "uint", ir.Var("mf_group") / ir.Var("mf_parts")),
        ir.Decl("mf_part", "uint", ir.Var("mf_group") % ir.Var("mf_parts")),
        ir.If(ir.Cast(IDX, ir.Var("mf_row")) >= ctx.span(ctx.rows), [ir.Return()]),
        ir.Decl("mf_sub", "uint", part * wp + lane % wp),
        ir.Decl("mf_grp", "uint", lane / wp),
        ir.Decl("mf_kp", "uint", SIMD / wp),
        ir.Comment(f"each simdgroup at least {MERGE_MIN_SHARE} blocks (its lanes load them "
                   "at once: fewer gain nothing)"),
        ir.Decl("mf_share", "uint", ir.Call("max", (
            (splits + ir.Lit(NSG - 1, "uint")) / ir.Lit(NSG, "uint"),
            ir.Lit(MERGE_MIN_SHARE, "uint")))),
        ir.Decl("mf_b0", "uint", ir.Call("min", (ir.Var("mf_sg") * share, splits))),
        ir.Decl("mf_b1", "uint", ir.Call("min", (ir.Var("mf_b0") + share, splits)))]


def _scratch(ks: KernelState, s: ir.Expr, k: ir.Expr) -> ir.Expr:
    """Element k of block s's state of the threadgroup's row in the scratch buffer."""
    base = ir.Cast(IDX, ir.Var("mf_row")) * ir.Cast(IDX, ir.Var("mf_splits"))
    return ir.Load("mf_scratch", (base + ir.Cast(IDX, s))
                   * ir.Lit(SIMD_WIDTH * ks.epl + 2, IDX) + k)


def _load_step(ctx: CallContext, ks: KernelState, s0: ir.Expr) -> ir.Stmt:
    """The lane's MERGE_STEP blocks of the step from block s0: m, d and its E slots."""
    s, u, j, b1 = ir.Var("mf_s"), ir.Var("mf_u"), ir.Var("mf_j"), ir.Var("mf_b1")
    mv, dv = ir.Lane(ir.Var("mf_mv"), u), ir.Lane(ir.Var("mf_dv"), u)
    av = ir.Lane(ir.Var("mf_av"), u * ir.Lit(ks.epl, "uint") + j)
    e = ir.Var("mf_sub") * ir.Lit(ks.epl, "uint") + j
    return ir.For("mf_u", "uint", ir.Lit(0, "uint"), ir.Lit(MERGE_STEP, "uint"), [
        ir.Decl("mf_s", "uint", s0 + u * ir.Var("mf_kp") + ir.Var("mf_grp")),
        ir.Assign(mv, ir.Select(s < b1, _scratch(ks, s, ir.Lit(0, IDX)), NEG_INF)),
        ir.Assign(dv, ir.Select(s < b1, _scratch(ks, s, ir.Lit(1, IDX)),
                                ir.Lit(0.0, "float"))),
        slots(ctx, ks, [ir.Assign(av, ir.Lit(0.0, "float")),
                        ir.If((s < b1).and_(ir.Cast(IDX, e) < ctx.size(ctx.form.e)),
                              [ir.Assign(av, _scratch(ks, s, ir.Lit(2, IDX)
                                                      + ir.Cast(IDX, e)))])])],
        unroll=True)


def _block_sums(ctx: CallContext, ks: KernelState) -> list[ir.Stmt]:
    """The simdgroup's share of the row's blocks: M over all blocks, then d and acc summed
    under it over the simdgroup's blocks and streams, into threadgroup memory."""
    emax = SIMD_WIDTH * ks.epl
    b0, b1, lane = ir.Var("mf_b0"), ir.Var("mf_b1"), ir.Var("mf_lane")
    s, u, j = ir.Var("mf_s"), ir.Var("mf_u"), ir.Var("mf_j")
    mm, md, off = ir.Var("mf_mm"), ir.Var("mf_md"), ir.Var("mf_off")
    zero = ir.Lit(0, "uint")
    acc = ir.Lane(ir.Var("mf_macc"), j)
    e = ir.Var("mf_sub") * ir.Lit(ks.epl, "uint") + j
    add = ir.For("mf_u", "uint", zero, ir.Lit(MERGE_STEP, "uint"), [
        ir.Decl("mf_c", "float", online.share(ir.Lane(ir.Var("mf_mv"), u), mm)),
        ir.Assign(md, md + ir.Lane(ir.Var("mf_dv"), u) * ir.Var("mf_c")),
        slots(ctx, ks, [ir.Assign(acc, acc + ir.Lane(
            ir.Var("mf_av"), u * ir.Lit(ks.epl, "uint") + j) * ir.Var("mf_c"))])], unroll=True)
    per = ir.Var("mf_kp") * ir.Lit(MERGE_STEP, "uint")
    sg = ir.Var("mf_sg")
    return [
        ir.Comment(f"the first {MERGE_STEP} blocks of each of the simdgroup's kp streams, "
                   "loaded before M is known (their loads and M's in one round)"),
        ir.ArrayDecl("mf_mv", "float", MERGE_STEP),
        ir.ArrayDecl("mf_dv", "float", MERGE_STEP),
        ir.ArrayDecl("mf_av", "float", MERGE_STEP * ks.epl),
        _load_step(ctx, ks, b0),
        ir.Comment("M: the largest max of all the row's blocks (every simdgroup, a block "
                   "per lane), so that the simdgroups' sums below need no rescaling"),
        ir.Decl("mf_mm", "float", NEG_INF, const=False),
        ir.For("mf_s", "uint", lane, ir.Var("mf_splits"), [ir.Assign(mm, ir.Call(
            "mf_maximum", (mm, _scratch(ks, s, ir.Lit(0, IDX)))))], step=SIMD),
        ir.Assign(mm, ir.Call("mf_simd_max", (mm,))),
        ir.Comment(f"this simdgroup's blocks: d = sum d_s exp(m_s - M) and acc likewise; kp "
                   f"streams of blocks, {MERGE_STEP} blocks each at a time (the next step's "
                   "loads issued once the step is added), summed across the streams"),
        ir.Decl("mf_md", "float", ir.Lit(0.0, "float"), const=False),
        ir.ArrayDecl("mf_macc", "float", ks.epl),
        slots(ctx, ks, [ir.Assign(acc, ir.Lit(0.0, "float"))]),
        ir.For("mf_s0", "uint", b0, b1, [
            add, ir.If(ir.Var("mf_s0") + per < b1,
                       [_load_step(ctx, ks, ir.Var("mf_s0") + per)])], step=per),
        ir.For("mf_off", "uint", ir.Var("mf_wp"), SIMD, [
            ir.Assign(md, md + ir.Call("simd_shuffle_xor", (md, off))),
            slots(ctx, ks, [ir.Assign(acc, acc + ir.Call("simd_shuffle_xor", (acc, off)))])],
            step=off),
        ir.Comment("this simdgroup's sums for the threadgroup"),
        ir.If(lane.eq(zero), [ir.Assign(ir.Lane(ir.Var("mf_tg_d"), sg), md)]),
        ir.If(ir.Var("mf_grp").eq(zero), [slots(ctx, ks, [ir.Assign(
            ir.Lane(ir.Var("mf_tg_acc"), sg * ir.Lit(emax, "uint") + e), acc)])])]
