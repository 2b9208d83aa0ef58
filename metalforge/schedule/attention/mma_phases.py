"""The phases of the matrix-block prefill kernel (`mma`) per tile of keys: `scores` (S = Q K^T
into threadgroup memory, with the score's elementwise work), `softmax` (four threads a row:
the online update, P over the row's scores), `values` (O rescaled, O += P V), and after the
keys `write` (the outputs, or the block's state for the merge kernel)."""
from __future__ import annotations

from typing import Callable, Optional

from ... import ir
from .. import online
from ..base import IDX
from ..fragments import UINT, u
from ..matrix import strided
from ..online import NEG_INF
from .context import CallContext, KernelState, offset
from .params import NARROW_TILE_KEYS
from .scores import element_score, inside_bounds
from .write import epilogue

SIDE = strided.SIDE
PARTS = 4                                     # softmax threads a row


def _qrow(row: ir.Expr) -> ir.Stmt:
    return ir.Decl("mf_qrow", UINT, ir.Var("mf_row0") + row)


def scores(ctx: CallContext, ks: KernelState, blk: strided.Blocks, k_arr: str) -> list[ir.Stmt]:
    """The simdgroup's key blocks of the tile (mf_sc, mf_sc + 2: up to 16 keys each) against
    its 16 rows: S = sum over E's 16-blocks of Q x K^T, then per element the score's work
    (`score`: scale, masks, caps), -inf past the tile's keys and the tile's rows, to
    mf_st[row * mf_kt + key]; a whole tile inside every row's bounds without the mask or
    guards (`scores.inside_bounds`)."""
    es = ir.Var("mf_es")
    guard = (ir.Var("mf_u") < ir.Var("mf_tn")).and_(ir.Var("mf_qrow") < ir.Var("mf_nlive"))
    whole = inside_bounds(ctx, ir.Var("mf_kt"))
    out: list[ir.Stmt] = [ir.Comment(
        "scores: S = Q x K^T, 16 rows x 16 keys a block, 16 elements of E a product; then "
        "the score's elementwise work on each element, to threadgroup memory")]
    for i in range(NARROW_TILE_KEYS // (2 * SIDE)):
        kb = ir.Var("mf_sc") + u(2 * i) if i else ir.Var("mf_sc")

        def put(kb: ir.Expr, check: Optional[ir.Expr]) -> Callable[
                [ir.Expr, ir.Expr, ir.Expr], list[ir.Stmt]]:
            def elem(row: ir.Expr, col: ir.Expr, ref: ir.Expr) -> list[ir.Stmt]:
                return [_qrow(row), ir.Decl("mf_u", UINT, kb * u(SIDE) + col),
                        ir.Decl("mf_l", IDX, ir.Var("mf_tk") + ir.Cast(IDX, ir.Var("mf_u"))),
                        ir.Decl("mf_dot", "float", ref), *element_score(ctx, ks, check),
                        ir.Store("mf_st", ir.Var("mf_qrow") * ir.Var("mf_kt") + ir.Var("mf_u"),
                                 ir.Var("mf_sv"), space="threadgroup")]
            return elem
        work = strided.each(blk, i, put(kb, guard))
        if whole is not None:
            work = [ir.If(whole, strided.each(blk, i, put(kb, None)), work)]
        k_at = ir.Var(k_arr) + kb * u(SIDE) * ir.Var(f"{k_arr}_stride") + es * u(SIDE)
        q_at = ir.Var("mf_qt") + ir.Var("mf_row0") * ir.Var("mf_qs") + es * u(SIDE)
        out.append(ir.If(kb * u(SIDE) < ir.Var("mf_tn"), [
            *strided.clear(blk, i),
            ir.For("mf_es", UINT, u(0), ir.Var("mf_eb"), strided.multiply(
                blk, i, q_at, ir.Var("mf_qs"), k_at, ir.Var(f"{k_arr}_stride"))),
            *work]))
    return out


def softmax(ks: KernelState, op: str) -> list[ir.Stmt]:
    """Row mf_srow's online update over the tile by its four threads (keys mf_spart, + 4,
    ...): the tile's max (xor 1, 2), the old sums' factor (to mf_tg_c for the outputs'
    simdgroups), the weights p into the thread's partial sum and, as the operand type, over
    the row's scores (P; 0 past the tile's keys up to a 16-block)."""
    per = NARROW_TILE_KEYS // PARTS
    x = ir.Var("mf_x")
    key = x * u(PARTS) + ir.Var("mf_spart")
    sv = ir.Lane(ir.Var("mf_pv"), x)
    mm, md, tmax = ir.Var("mf_mm"), ir.Var("mf_md"), ir.Var("mf_tmax")
    m_new, corr = ir.Var("mf_m_new"), ir.Var("mf_corr")
    whole = (ir.Var("mf_tn") + u(15)) / u(16) * u(16)
    return [
        ir.Comment("online softmax, four threads a row: the tile's max, the old sums' "
                   "factor, the weights p (P, as the operand type, over the row's scores)"),
        ir.ArrayDecl("mf_pv", "float", per),
        ir.Decl("mf_tmax", "float", NEG_INF, const=False),
        ir.For("mf_x", UINT, u(0), u(per), [
            ir.Assign(sv, ir.Select(key < ir.Var("mf_tn"), ir.Lane(
                ir.Var("mf_st"), ir.Var("mf_srow") * ir.Var("mf_kt") + key), NEG_INF)),
            ir.Assign(tmax, ir.Call("mf_maximum", (tmax, sv)))], unroll=True),
        *[ir.Assign(tmax, ir.Call("mf_maximum", (tmax, ir.Call(
            "simd_shuffle_xor", (tmax, u(off)))))) for off in (1, 2)],
        ir.Decl("mf_m_new", "float", ir.Call("mf_maximum", (mm, tmax))),
        ir.Decl("mf_corr", "float", online.rescale(mm, m_new)),
        ir.Assign(md, md * corr),
        ir.For("mf_x", UINT, u(0), u(per), [
            ir.Assign(sv, online.weight(sv, m_new)), ir.Assign(md, md + sv)], unroll=True),
        ir.Assign(mm, m_new),
        ir.Comment("the row's four threads have read its scores before P overwrites them"),
        ir.Barrier("simdgroup"),
        ir.For("mf_x", UINT, u(0), u(per), [ir.If(key < whole, [
            ir.Store("mf_pt", ir.Var("mf_srow") * ir.Var("mf_ps") + key, ir.Cast(op, sv),
                     space="threadgroup")])], unroll=True),
        ir.If(ir.Var("mf_spart").eq(u(0)), [
            ir.Store("mf_tg_c", ir.Var("mf_srow"), corr, space="threadgroup")])]


def values(blk: strided.Blocks, emax: int, v_arr: str) -> list[ir.Stmt]:
    """The simdgroup's output blocks (E blocks mf_sc, mf_sc + 2, ...) rescaled by their rows'
    factors, then O += P x V over the tile's keys, 16 a product."""
    ks16 = ir.Var("mf_ks")
    p_at = ir.Var("mf_pt") + ir.Var("mf_row0") * ir.Var("mf_ps") + ks16 * u(SIDE)
    out: list[ir.Stmt] = [ir.Comment("the values: O rescaled by each row's factor, then "
                                     "O += P x V, 16 keys a product")]
    runs: list[ir.Stmt] = []
    for i in range(emax // (2 * SIDE)):
        eb = ir.Var("mf_sc") + u(2 * i) if i else ir.Var("mf_sc")
        out += strided.each(blk, i, lambda row, col, ref: [ir.Assign(ref, ref * ir.Lane(
            ir.Var("mf_tg_c"), ir.Var("mf_row0") + row))])
        v_at = ir.Var(v_arr) + ks16 * u(SIDE) * ir.Var(f"{v_arr}_stride") + eb * u(SIDE)
        runs.append(ir.If(eb < ir.Var("mf_eb"), strided.multiply(
            blk, i, p_at, ir.Var("mf_ps"), v_at, ir.Var(f"{v_arr}_stride"))))
    return out + [ir.For("mf_ks", UINT, u(0), (ir.Var("mf_tn") + u(15)) / u(16), runs)]


def write(ctx: CallContext, ks: KernelState, blk: strided.Blocks, emax: int) -> list[ir.Stmt]:
    """After the keys: each row's max and sum (summed over its four threads) to threadgroup
    memory, then each output element the simdgroup holds: acc / d through the work after the
    sum (one block of keys), else the block's state for the merge kernel."""
    md = ir.Var("mf_md")

    def each(body: list[ir.Stmt]) -> ir.Stmt:
        out: list[ir.Stmt] = []
        for i in range(emax // (2 * SIDE)):
            eb = ir.Var("mf_sc") + u(2 * i) if i else ir.Var("mf_sc")

            def elem(row: ir.Expr, col: ir.Expr, ref: ir.Expr,
                     eb: ir.Expr = eb) -> list[ir.Stmt]:
                live = (ir.Var("mf_qrow") < ir.Var("mf_nlive")).and_(
                    ir.Cast(IDX, ir.Var("mf_e")) < ctx.size(ctx.form.e))
                return [_qrow(row), ir.Decl("mf_e", UINT, eb * u(SIDE) + col),
                        ir.If(live, [
                            ir.Decl("mf_mm", "float", ir.Lane(ir.Var("mf_tg_m"),
                                                              ir.Var("mf_qrow"))),
                            ir.Decl("mf_md", "float", ir.Lane(ir.Var("mf_tg_d"),
                                                              ir.Var("mf_qrow"))),
                            ir.Decl("mf_ov", "float", ref), *body])]
            out.append(ir.If(eb < ir.Var("mf_eb"), strided.each(blk, i, elem)))
        return ir.Block(out)
    return [
        ir.Comment("each row's sum over its four threads; its max and sum for the writes"),
        *[ir.Assign(md, md + ir.Call("simd_shuffle_xor", (md, u(off)))) for off in (1, 2)],
        ir.If(ir.Var("mf_spart").eq(u(0)), [
            ir.Store("mf_tg_m", ir.Var("mf_srow"), ir.Var("mf_mm"), space="threadgroup"),
            ir.Store("mf_tg_d", ir.Var("mf_srow"), md, space="threadgroup")]),
        ir.Barrier(),
        ir.If(ir.Var("mf_splits").eq(u(1)), [
            ir.Comment("one block: outputs = acc / d (all keys masked: 0 / 0 = NaN, as "
                       "softmax gives)"), epilogue(ctx, ks, ir.Var("mf_ov"), each)],
            [ir.Comment("several blocks: this block's state (m, d, acc[E]) for the merge "
                        "kernel"), each(state(ctx, ks))])]


def state(ctx: CallContext, ks: KernelState) -> list[ir.Stmt]:
    """One element of the block's state: the row's m and d (with E element 0), acc."""
    row_id = offset(ctx, ks, ctx.rows)
    partial = ir.Var("mf_partial")
    return [
        ir.Decl("mf_partial", IDX, (row_id * ir.Cast(IDX, ir.Var("mf_splits"))
                                    + ir.Cast(IDX, ir.Var("mf_block")))
                * ir.Lit(ctx.scratch_e + 2, IDX)),
        ir.If(ir.Var("mf_e").eq(u(0)), [
            ir.Store("mf_scratch", partial, ir.Var("mf_mm")),
            ir.Store("mf_scratch", partial + ir.Lit(1, IDX), ir.Var("mf_md"))]),
        ir.Store("mf_scratch", partial + ir.Lit(2, IDX) + ir.Cast(IDX, ir.Var("mf_e")),
                 ir.Var("mf_ov"))]

