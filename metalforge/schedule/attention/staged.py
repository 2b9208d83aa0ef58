"""The stage_kv decode kernels (`decode`, `decode_narrow`, `decode_wide` by E): a simdgroup per
query row of the tile, K/V tiles staged in threadgroup memory, the simdgroups splitting each
tile's keys; then the rows' accumulators summed across the simdgroups (`sum_rows`)."""
from __future__ import annotations

from ... import ir
from ..base import IDX, make_kernel
from ..hardware import SIMD_WIDTH
from ..online import NEG_INF
from .context import SIMD, THREADS, CallContext, Emitted, KernelState
from .head import block_keys, group_head, tile
from .loops import each_row, slot_e, slots
from .params import NARROW_LANES, NARROW_TILE_KEYS, TILE_BYTES, TILE_KEYS
from .scores import tile_scores
from .softmax import tile_softmax
from .staging import stage, with_staged
from .tiles import fill_tiles, tile_arrays
from .values import tile_values
from .write import write_row


def kernel(ctx: CallContext, variant: str = "decode") -> ir.LoweredKernel:
    """The decode kernel with stage_kv (see stage_kv_body): a threadgroup of one simdgroup
    per query row of the tile, the simdgroups splitting each tile's keys; K/V tiles in
    threadgroup memory. Each variant holds only the E its calls have (an accumulator per
    row for each `run` elements a lane): `decode` E up to 32 x run, `narrow` up to
    NARROW_LANES x run with the values loop's lanes in 32 / NARROW_LANES key streams,
    `wide` up to 32 x reads_per_thread."""
    f = ctx.form
    narrow = variant == "narrow"
    ks = with_staged(ctx, KernelState(
        Emitted(), qt=ctx.qt, group=SIMD_WIDTH * ctx.qt,
        epl=ctx.policy.reads_per_thread if variant == "wide" else ctx.run, over_e=True,
        vlanes=NARROW_LANES if narrow else SIMD_WIDTH,
        kt_max=NARROW_TILE_KEYS if narrow else TILE_KEYS))
    head = group_head(ctx, ks, ks.qt) + tile(ctx, ks) + block_keys(ctx, ks)
    staged, q_stores = stage(ctx, ks)
    scan = stage_kv_body(ctx, ks, q_stores)
    emax = ks.vlanes * ks.epl
    body = ks.out.tg_decls + head + ks.out.pre + staged + scan
    name = "decode" if variant == "decode" else f"decode_{variant}"
    summary = (f"{ctx.graph.name} ({name}, stage_kv): softmax over '{f.key}' of scores "
               f"contracting '{f.e}' (up to {emax}), times the values, summed over "
               f"'{f.key}'; a threadgroup per {ks.qt} query rows sharing their keys and "
               f"block of keys, a simdgroup per row; tiles of K and V staged in "
               f"threadgroup memory by the whole group, each simdgroup scoring its share of "
               f"a tile's keys against every row (a lane per key) and adding their p v for "
               f"every row, the lanes over E"
               + (f" in {SIMD_WIDTH // NARROW_LANES} key streams of {NARROW_LANES} lanes"
                  if narrow else "")
               + "; online softmax in one pass, fp32 state")
    return make_kernel(ctx.graph, ctx.index64, THREADS, body, summary, name,
                       params=ctx.params, helpers=tuple(sorted(ks.out.helpers)),
                       max_threads=ks.group)


def stage_kv_body(ctx: CallContext, ks: KernelState,
                  q_stores: list[ir.Stmt]) -> list[ir.Stmt]:
    """The stage_kv decode kernel after its head: q staged, then per tile of mf_kt keys:
    the group fills the K/V tiles, a barrier; each simdgroup scores its mf_ks keys of the
    tile against every row (tile_scores), a barrier; simdgroup t updates row t's online
    softmax (tile_softmax), a barrier; each simdgroup adds p v of its keys to its
    accumulators of every row (tile_values), a barrier before the next tile overwrites
    them. Then each row's accumulators are summed across the simdgroups through
    threadgroup memory, and simdgroup t writes row t's state."""
    f, qt = ctx.form, ks.qt
    lane, kt, sg = ir.Var("mf_lane"), ir.Var("mf_kt"), ir.Var("mf_sg")
    ks.out.tg_decls += [
        ir.ArrayDecl("mf_tg_s", "float", qt * ks.kt_max, "threadgroup"),
        ir.ArrayDecl("mf_tg_p", "float4", qt * ks.kt_max // 4, "threadgroup"),
        ir.ArrayDecl("mf_tg_c", "float", qt, "threadgroup")]
    racc = ir.Lane(ir.Var("mf_racc"), ir.Var("mf_t") * ir.Lit(ks.epl, "uint")
                   + ir.Var("mf_j"))
    setup: list[ir.Stmt] = [
        ir.Decl("mf_tid", "uint", sg * SIMD + lane),
        ir.Comment(f"scores: the {qt} simdgroups split each tile's keys, mf_ks each; lane "
                   f"mf_key of them, part mf_part of its E chunks (32 / mf_ks lanes per "
                   f"key)"),
        ir.Decl("mf_ks", "uint", kt / ir.Lit(qt, "uint")),
        ir.Decl("mf_key", "uint", sg * ir.Var("mf_ks") + lane % ir.Var("mf_ks")),
        ir.Decl("mf_part", "uint", lane / ir.Var("mf_ks")),
        ir.Decl("mf_parts", "uint", SIMD / ir.Var("mf_ks")),
        *tile_arrays(ctx, ks),
        ir.Comment("the keys' weights of all rows side by side, as floats"),
        ir.Decl("mf_tg_pf", "threadgroup float*", ir.Call(
            "reinterpret_cast<threadgroup float*>", (ir.Var("mf_tg_p"),)), const=False),
        ir.Comment("the simdgroup's row's online-softmax state (running max, lane-partial "
                   "sum) and its accumulators of every row over its keys"),
        ir.Decl("mf_mm", "float", NEG_INF, const=False),
        ir.Decl("mf_md", "float", ir.Lit(0.0, "float"), const=False),
        ir.ArrayDecl("mf_racc", "float", qt * ks.epl),
        ir.For("mf_t", "uint", ir.Lit(0, "uint"), ir.Lit(qt, "uint"), [
            slots(ctx, ks, [ir.Assign(racc, ir.Lit(0.0, "float"))])], unroll=True)]
    step: list[ir.Stmt] = [ir.Decl("mf_tn", "uint", ir.Cast("uint", ir.Call("min", (
                ir.Var("mf_l1") - ir.Var("mf_tk"), ir.Cast(IDX, kt)))))]
    fill = fill_tiles(ctx, ks)
    if q_stores:                        # before the copies' barrier
        assert isinstance(fill[-1], ir.Barrier)
        fill[-1:-1] = [ir.Comment("the first tile: the rows' q (loaded before the loop) into "
                                  "threadgroup memory"),
                       ir.If(ir.Var("mf_tk").eq(ir.Var("mf_l0")), q_stores)]
    step += fill
    step += tile_scores(ctx, ks) + [ir.Barrier()]
    step += tile_softmax(ctx, ks) + [ir.Barrier()]
    step += tile_values(ctx, ks)
    step += [ir.Comment("every simdgroup is done with the tile before it is refilled"),
             ir.Barrier()]
    loop = ir.For("mf_tk", IDX, ir.Var("mf_l0"), ir.Var("mf_l1"), step,
                  step=ir.Cast(IDX, kt))
    return setup + [ir.Comment(f"one pass over the block's keys along '{f.key}', a tile "
                               "at a time (scores never stored)"), loop] + sum_rows(ctx, ks)


def sum_rows(ctx: CallContext, ks: KernelState) -> list[ir.Stmt]:
    """After the keys: each row's accumulators summed over the simdgroups (with key
    streams, over the streams first, by shuffles) through threadgroup memory (the K tile's,
    free now, where it holds them), into simdgroup t's mf_macc for row t; then simdgroup t
    writes row t's state."""
    qt, emax = ks.qt, ks.vlanes * ks.epl
    t, sg, lane = ir.Var("mf_t"), ir.Var("mf_sg"), ir.Var("mf_lane")
    racc = ir.Lane(ir.Var("mf_racc"), t * ir.Lit(ks.epl, "uint") + ir.Var("mf_j"))
    acc = ir.Lane(ir.Var("mf_macc"), ir.Var("mf_j"))
    red = ir.Var("mf_red")
    e = slot_e(ctx, ks)
    first = next(iter(ctx.kv.values()))
    if qt * emax * 4 <= TILE_BYTES:
        where: ir.Stmt = ir.Decl("mf_red", "threadgroup float*", ir.Call(
            "reinterpret_cast<threadgroup float*>", (ir.Var(f"mf_tg_{first[3:]}"),)),
            const=False)
    else:
        ks.out.tg_decls.append(ir.ArrayDecl("mf_tg_red", "float", qt * emax, "threadgroup"))
        where = ir.Decl("mf_red", "threadgroup float*", ir.Var("mf_tg_red"), const=False)
    total: ir.Expr = ir.Lane(red, e)
    for s in range(1, qt):
        total = total + ir.Lane(red, ir.Lit(s * emax, "uint") + e)
    own = lane < ir.Lit(ks.vlanes, "uint")
    write = write_row(ctx, ks.with_row(ir.Var("mf_sg")))
    put = slots(ctx, ks, [ir.Decl("mf_e", "uint", e), ir.Assign(
        ir.Lane(red, sg * ir.Lit(emax, "uint") + ir.Var("mf_e")), racc)])
    out: list[ir.Stmt] = []
    if ks.vlanes != SIMD_WIDTH:
        out += [ir.Comment("the key streams' accumulators summed (the first stream's lanes "
                           "then hold them)"),
                each_row(ctx, ks, [ir.For("mf_off", "uint", ir.Lit(ks.vlanes, "uint"), SIMD, [
                    slots(ctx, ks, [ir.Assign(racc, racc + ir.Call("simd_shuffle_xor", (
                        racc, ir.Var("mf_off"))))])], step=ir.Var("mf_off"))])]
    return out + [
        ir.Comment("row by row: the simdgroups' accumulators summed through threadgroup "
                   "memory by the row's simdgroup"),
        where,
        ir.ArrayDecl("mf_macc", "float", ks.epl),
        slots(ctx, ks, [ir.Assign(acc, ir.Lit(0.0, "float"))]),
        each_row(ctx, ks, [
            put if ks.vlanes == SIMD_WIDTH else ir.If(own, [put]),
            ir.Barrier(),
            ir.If(sg.eq(t), [slots(ctx, ks, [ir.Assign(acc, total)])]),
            ir.Barrier()]),
        ir.Comment("the row's state: d summed over the lanes, then the outputs or the "
                   "block's state"),
        ir.If(sg < ir.Var("mf_nlive"), [
            ir.Assign(ir.Var("mf_md"), ir.Call("simd_sum", (ir.Var("mf_md"),))),
            ir.If(own, [write]) if ks.vlanes != SIMD_WIDTH else write])]
