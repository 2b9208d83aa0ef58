"""The attention schedule's prefill kernel on simdgroup matrices (`prefill`): a threadgroup of
MATRIX_ROWS / 8 simdgroups takes a tile of MATRIX_ROWS query rows that read the same keys, each
simdgroup 8 of them; the keys go a staged tile at a time (the decode kernels' `fill_tiles`), and
both contractions are 8x8 simdgroup_matrix products in fp32 (`mf_mma`):

    S[8 rows x 8 keys]  = sum over E blocks of Q[8 rows x 8 e] x K^T[8 e x 8 keys]
    O[8 rows x 8 e]    += P[8 rows x 8 keys] x V[8 keys x 8 e]

A lane holds two elements of each matrix (thread_elements(): row mf_mr, columns mf_mc and
mf_mc + 1, Apple's lane layout), so the score's elementwise work (scale, masks, caps) runs on
the lane's own two scores per key block, and a row's online softmax combines the four lanes
that hold it (xor 1 and 8). Q is read once into fragments; K^T and V fragments come from the
staged tile (0 past E and past the tile's keys: stale tile memory never meets a product).

Built when the graph's scores contract one product of a factor without keys (q) and a factor
without query rows (k), and the values have no query rows either: then both contractions are
matrix products. Other graphs keep the decode kernels for every call.
"""
from __future__ import annotations

from typing import Optional

from ... import ir
from ...graph import BinaryOp, Node, Op, strip_casts
from .. import online
from ..base import IDX, make_kernel
from ..fragments import UINT, frag, lane_place, mma, u, unrolled, zero
from ..hardware import FRAG, SIMD_WIDTH
from ..lower import as_float
from ..online import NEG_INF
from .context import CallContext, Emitted, KernelState, lowering
from .head import tiled_head
from .params import MATRIX_ROWS, NARROW_TILE_KEYS
from .scores import score
from .tiles import fill_tiles, tile_arrays, tile_reads
from .write import write_row

THREADS = (ir.ThreadInput("mf_group", UINT, "threadgroup_position_in_grid"),
           ir.ThreadInput("mf_sg", UINT, "simdgroup_index_in_threadgroup"),
           ir.ThreadInput("mf_lane", UINT, "thread_index_in_simdgroup"))


def matrix_operands(ctx: CallContext) -> Optional[tuple[Node, Node]]:
    """(q side, k side) of the scores' one contraction when it is their product and the values
    read no query row: the graph's contractions are then matrix products. Else None."""
    f = ctx.form
    if len(f.contractions) != 1:
        return None
    prod = strip_casts(f.contractions[0].args[0])
    if prod.op != Op.BINARY or prod.attr != BinaryOp.MUL:
        return None
    tiles = set(ctx.tile_axes)
    for q, k in (prod.args, prod.args[::-1]):
        if f.key not in q.axes and f.e in q.axes and f.e in k.axes and not tiles & set(k.axes):
            if not tiles & set(f.values.axes):
                return q, k
    return None


def kernel(ctx: CallContext, rows: int = MATRIX_ROWS,
           keys: int = NARROW_TILE_KEYS) -> Optional[ir.LoweredKernel]:
    """The prefill kernel for tiles of `rows` query rows (a multiple of 8) and K/V tiles of up
    to `keys` keys (a multiple of 8), holding E up to 32 x run, or None when the graph's
    contractions are not matrix products."""
    ops = matrix_operands(ctx)
    if ops is None or not ctx.policy.stage_kv or not ctx.tile_axes:
        return None
    f = ctx.form
    ks = KernelState(Emitted(), qt=rows, group=SIMD_WIDTH * (rows // FRAG),
                     epl=ctx.policy.reads_per_thread, kt_max=keys)
    emax = SIMD_WIDTH * ctx.run
    head = tiled_head(ctx, ks, rows // FRAG, (
        "8 rows a simdgroup; the group stages tiles of mf_kt keys of K and V in threadgroup "
        "memory, each simdgroup multiplies its rows with every key of the tile"))
    row = ks.with_row(ir.Var("mf_qrow"), table=True)
    q_side, k_side = ops
    dmax = emax // FRAG
    body = (_lane_row() + tile_arrays(ctx, row, runs=False) + q_fragments(ctx, row, q_side, dmax)
            + fragment_state(ctx, row, dmax))
    step: list[ir.Stmt] = [ir.Decl("mf_tn", UINT, ir.Cast(UINT, ir.Call("min", (
        ir.Var("mf_l1") - ir.Var("mf_tk"), ir.Cast(IDX, ir.Var("mf_kt"))))))]
    step += fill_tiles(ctx, row)
    step += fragment_scores(ctx, row, k_side, dmax)
    step += fragment_softmax(ctx, row, dmax)
    step += fragment_values(ctx, row, dmax)
    step += [ir.Comment("every simdgroup is done with the tile before it is refilled"),
             ir.Barrier()]
    loop = ir.For("mf_tk", IDX, ir.Var("mf_l0"), ir.Var("mf_l1"), step,
                  step=ir.Cast(IDX, ir.Var("mf_kt")))
    body += [ir.Comment(f"one pass over the block's keys along '{f.key}', a tile at a "
                        "time (scores never stored)"), loop]
    body += fragment_write(ctx, row, dmax)
    ks.out.helpers.add("mf_mma")
    return finish(ctx, ks, head, body, emax, rows, (
        "8 rows a simdgroup; tiles of K and V staged in threadgroup memory by the whole group; "
        "the scores and the values' products as 8x8 simdgroup_matrix products in fp32; online "
        "softmax in one pass, fp32 state"))


def finish(ctx: CallContext, ks: KernelState, head: list[ir.Stmt], body: list[ir.Stmt],
           emax: int, rows: int, how: str, variant: str = "prefill") -> ir.LoweredKernel:
    """A prefill kernel (`variant`) of `head` then `body`, its threadgroup arrays and
    positions up front, summarised as the prefill kernels' shared opening (what it computes,
    E up to `emax`, `rows` query rows a threadgroup) then `how` it does it."""
    f = ctx.form
    return make_kernel(
        ctx.graph, ctx.index64, THREADS, ks.out.tg_decls + head + ks.out.pre + body,
        f"{ctx.graph.name} (prefill): softmax over '{f.key}' of scores contracting "
        f"'{f.e}' (up to {emax}), times the values, summed over '{f.key}'; a threadgroup "
        f"per {rows} query rows sharing their keys and block of keys, {how}", variant,
        params=ctx.params, helpers=tuple(sorted(ks.out.helpers)), max_threads=ks.group)


def _lane_row() -> list[ir.Stmt]:
    """The lane's place in its fragments and its query row of the tile."""
    lane = ir.Var("mf_lane")
    return lane_place(lane) + [
        ir.Comment("the lane's query row of the tile"),
        ir.Decl("mf_qrow", UINT, ir.Var("mf_sg") * u(FRAG) + ir.Var("mf_mr")),
        ir.Decl("mf_live", "bool", ir.Var("mf_qrow") < ir.Var("mf_nlive")),
        ir.Decl("mf_tid", UINT, ir.Var("mf_sg") * u(SIMD_WIDTH) + lane)]


def q_fragments(ctx: CallContext, ks: KernelState, q: Node, dmax: int) -> list[ir.Stmt]:
    """The lane's elements of its rows' q side, as the A operands of the scores: fragment
    d holds E elements d * 8 + mf_mc (+ 1) of row mf_qrow (0 past E and for rows past the
    tile axes' end)."""
    low = lowering(ctx, ks, "mf_q")
    body = low.lower([q])
    value = as_float(low.value(q), q)
    ks.out.helpers |= low.helpers
    qf = frag("mf_qf", ir.Var("mf_d"), ir.Var("mf_i"))
    return [
        ir.Comment("q: the A operands of the scores, E in blocks of 8 (0 past E)"),
        ir.ArrayDecl("mf_qf", "float2", dmax),
        unrolled("mf_d", dmax, [unrolled("mf_i", 2, [
            ir.Decl("mf_e", UINT, ir.Var("mf_d") * u(FRAG) + ir.Var("mf_mc") + ir.Var("mf_i")),
            ir.Assign(qf, ir.Lit(0.0, "float")),
            ir.If(ir.Var("mf_live").and_(ir.Cast(IDX, ir.Var("mf_e")) < ctx.size(ctx.form.e)),
                  body + [ir.Assign(qf, value)])])])]


def fragment_state(ctx: CallContext, ks: KernelState, dmax: int) -> list[ir.Stmt]:
    """The online-softmax state of the lane's row (running max, lane-partial sum) and its
    part of the rows' accumulators O (8 x 8 blocks over E)."""
    return [
        ir.Comment("the lane's row's state: running max, lane-partial sum; O in blocks of "
                   "8 over E"),
        ir.Decl("mf_mm", "float", NEG_INF, const=False),
        ir.Decl("mf_md", "float", ir.Lit(0.0, "float"), const=False),
        ir.ArrayDecl("mf_of", "float2", dmax),
        unrolled("mf_d", dmax, [ir.Assign(frag("mf_of", ir.Var("mf_d")), zero())])]


def tile_element(ctx: CallContext, ks: KernelState, side: Node, key: ir.Expr, e: ir.Expr,
                 prefix: str) -> list[ir.Stmt]:
    """`mf_x` = `side` (k or v side: elementwise work on staged K/V reads) at tile key `key`
    and E element `e`, 0 past the tile's keys and past E."""
    low = lowering(ctx, ks, prefix)
    low.values.update(tile_reads(ctx, ks))
    body = low.lower([side])
    ks.out.helpers |= low.helpers
    inside = (ir.Var("mf_u") < ir.Var("mf_tn")).and_(
        ir.Cast(IDX, ir.Var("mf_e")) < ctx.size(ctx.form.e))
    return [ir.Decl("mf_u", UINT, key), ir.Decl("mf_e", UINT, e),
            ir.Decl("mf_l", IDX, ir.Var("mf_tk") + ir.Cast(IDX, ir.Var("mf_u"))),
            ir.Decl("mf_x", "float", ir.Lit(0.0, "float"), const=False),
            ir.If(inside, body + [ir.Assign(ir.Var("mf_x"), as_float(low.value(side),
                                                                      side))])]


def fragment_scores(ctx: CallContext, ks: KernelState, k: Node, dmax: int) -> list[ir.Stmt]:
    """The tile's scores of the simdgroup's 8 rows, 8 keys (block kb) at a time: S = sum
    over E blocks of Q x K^T (K^T from the staged tile), then per element the score's
    elementwise work (`score`: scale, masks, caps); -inf past the tile's keys and for
    rows past the tile axes' end."""
    kb, d, i = ir.Var("mf_kb"), ir.Var("mf_d"), ir.Var("mf_i")
    kf, sdot = frag("mf_kf", i), ir.Var("mf_sdot")
    kt_el = tile_element(ctx, ks, k, kb * u(FRAG) + ir.Var("mf_mc") + i,
                         d * u(FRAG) + ir.Var("mf_mr"), "mf_k")
    s_body, s_value = score(ctx, ks, {ctx.form.contractions[0]: ir.Lane(sdot, i)})
    sf = frag("mf_sf", kb, i)
    key_of = kb * u(FRAG) + ir.Var("mf_mc") + i
    scored: list[ir.Stmt] = [
        ir.Decl("mf_u", UINT, key_of),
        ir.Decl("mf_l", IDX, ir.Var("mf_tk") + ir.Cast(IDX, ir.Var("mf_u"))),
        ir.Assign(sf, NEG_INF),
        ir.If((ir.Var("mf_u") < ir.Var("mf_tn")).and_(ir.Var("mf_live")),
              s_body + [ir.Assign(sf, s_value)])]
    e_blocks = ir.Cast(IDX, d * u(FRAG)) < ctx.size(ctx.form.e)
    return [
        ir.Comment("scores: S = Q x K^T over E in blocks of 8, 8 keys at a time, then the "
                   "score's elementwise work on the lane's two"),
        ir.ArrayDecl("mf_sf", "float2", ks.kt_max // FRAG),
        unrolled("mf_kb", ks.kt_max // FRAG, [ir.If(kb * u(FRAG) < ir.Var("mf_tn"), [
            ir.Decl("mf_sdot", "float2", zero(), const=False),
            unrolled("mf_d", dmax, [ir.If(e_blocks, [
                ir.Decl("mf_kf", "float2", None, const=False),
                unrolled("mf_i", 2, kt_el + [ir.Assign(kf, ir.Var("mf_x"))]),
                ir.Assign(sdot, mma(frag("mf_qf", d), ir.Var("mf_kf"), sdot))])]),
            unrolled("mf_i", 2, scored)])])]


def fragment_softmax(ctx: CallContext, ks: KernelState, dmax: int) -> list[ir.Stmt]:
    """One online-softmax update of the lane's row over the tile: the tile's max over the
    row's four lanes (xor 1 and 8), the old sums and O rescaled, the scores replaced by
    their weights p (the A operands of the values)."""
    kb, i = ir.Var("mf_kb"), ir.Var("mf_i")
    sf = frag("mf_sf", kb, i)
    mm, md, tmax = ir.Var("mf_mm"), ir.Var("mf_md"), ir.Var("mf_tmax")
    m_new, corr = ir.Var("mf_m_new"), ir.Var("mf_corr")
    in_tile = kb * u(FRAG) < ir.Var("mf_tn")
    ks.out.helpers.add("mf_maximum")
    return [
        ir.Comment("online softmax of the lane's row: the tile's max over the row's four "
                   "lanes, the old sums' factor, the weights p"),
        ir.Decl("mf_tmax", "float", NEG_INF, const=False),
        unrolled("mf_kb", ks.kt_max // FRAG, [ir.If(in_tile, [unrolled("mf_i", 2, [
            ir.Assign(tmax, ir.Call("mf_maximum", (tmax, sf)))])])]),
        *[ir.Assign(tmax, ir.Call("mf_maximum", (tmax, ir.Call(
            "simd_shuffle_xor", (tmax, u(off)))))) for off in (1, 8)],
        ir.Decl("mf_m_new", "float", ir.Call("mf_maximum", (mm, tmax))),
        ir.Decl("mf_corr", "float", online.rescale(mm, m_new)),
        ir.Assign(md, md * corr),
        unrolled("mf_kb", ks.kt_max // FRAG, [ir.If(in_tile, [unrolled("mf_i", 2, [
            ir.Assign(sf, online.weight(sf, m_new)),
            ir.Assign(md, md + sf)])])]),
        ir.Assign(mm, m_new),
        unrolled("mf_d", dmax, [ir.Assign(frag("mf_of", ir.Var("mf_d")),
                                           frag("mf_of", ir.Var("mf_d")) * corr)])]


def fragment_values(ctx: CallContext, ks: KernelState, dmax: int) -> list[ir.Stmt]:
    """O += P x V for the tile, block by block of 8 E elements and 8 keys (V from the
    staged tile)."""
    kb, d, i = ir.Var("mf_kb"), ir.Var("mf_d"), ir.Var("mf_i")
    of = frag("mf_of", d)
    v_el = tile_element(ctx, ks, ctx.form.values, kb * u(FRAG) + ir.Var("mf_mr"),
                        d * u(FRAG) + ir.Var("mf_mc") + i, "mf_v")
    e_blocks = ir.Cast(IDX, d * u(FRAG)) < ctx.size(ctx.form.e)
    return [
        ir.Comment("the values: O += P x V in blocks of 8 keys and 8 elements of E"),
        unrolled("mf_d", dmax, [ir.If(e_blocks, [
            unrolled("mf_kb", ks.kt_max // FRAG, [ir.If(kb * u(FRAG) < ir.Var("mf_tn"), [
                ir.Decl("mf_vf", "float2", None, const=False),
                unrolled("mf_i", 2, v_el + [ir.Assign(frag("mf_vf", i), ir.Var("mf_x"))]),
                ir.Assign(of, mma(frag("mf_sf", kb), ir.Var("mf_vf"), of))])])])])]


def fragment_write(ctx: CallContext, ks: KernelState, dmax: int) -> list[ir.Stmt]:
    """The row's sum over its four lanes, then the lane's elements of O written as the decode
    kernels write a row (write_row): the outputs, or the block's state for the merge kernel
    (m and d by the row's first lane)."""
    d, i = ir.Var("mf_d"), ir.Var("mf_i")
    md = ir.Var("mf_md")

    def each(body: list[ir.Stmt]) -> ir.Stmt:
        return unrolled("mf_d", dmax, [unrolled("mf_i", 2, [
            ir.Decl("mf_e", UINT, d * u(FRAG) + ir.Var("mf_mc") + i),
            ir.If(ir.Var("mf_live").and_(ir.Cast(IDX, ir.Var("mf_e")) < ctx.size(ctx.form.e)),
                  body)])])
    return [
        ir.Comment("the row's sum over its four lanes"),
        *[ir.Assign(md, md + ir.Call("simd_shuffle_xor", (md, u(off)))) for off in (1, 8)],
        write_row(ctx, ks, frag("mf_of", d, i), each,
                  ir.Var("mf_live").and_(ir.Var("mf_mc").eq(u(0))))]
