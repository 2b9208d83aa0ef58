"""The phases of the FlashAttention-2 prefill kernel (`flash`) per tile of keys, each run by
one simdgroup over its own 16 rows with no threadgroup barrier: `scores` (S = Q K^T over every
key of the tile, with the score's elementwise work, into its slice), `softmax` (two lanes a
row: the online update, P over the row's scores, the old sums' factor), `values` (O rescaled,
O += P V for all of E); after the keys `write` (the outputs, or the block's state for the
merge kernel). The slice is the simdgroup's alone: simdgroup barriers order its writes and
reads."""
from __future__ import annotations

from ... import ir
from .. import online
from ..base import IDX
from ..fragments import UINT, u
from ..matrix import strided
from ..online import NEG_INF
from .context import CallContext, KernelState
from .flash_budget import FLASH_TILE_KEYS, ROW_BLOCK
from .mma_phases import state
from .scores import score
from .write import epilogue

SIDE = strided.SIDE
PARTS = 2                                     # softmax lanes a row
FACTOR, MAX, SUM = 0, ROW_BLOCK, 2 * ROW_BLOCK   # the stats' places in mf_sx


def _qrow(row: ir.Expr) -> ir.Stmt:
    return ir.Decl("mf_qrow", UINT, ir.Var("mf_row0") + row)


def _sync(why: str) -> list[ir.Stmt]:
    return [ir.Comment(why), ir.Barrier("simdgroup")]


def scores(ctx: CallContext, ks: KernelState, blk: strided.Blocks, k_arr: str) -> list[ir.Stmt]:
    """Every 16-key block of the tile against the simdgroup's 16 rows: S = sum over E's
    16-blocks of Q x K^T, then per element the score's work (`score`), -inf past the tile's
    keys and the tile's rows, to mf_st[row * mf_ss + key]."""
    es = ir.Var("mf_es")
    body, value = score(ctx, ks, {ctx.form.contractions[0]: ir.Var("mf_dot")})
    out: list[ir.Stmt] = [ir.Comment(
        "scores: S = Q x K^T for the simdgroup's rows and every key of the tile, 16 x 16 a "
        "block, 16 elements of E a product; the score's elementwise work on each element, "
        "to its slice")]
    for i in range(FLASH_TILE_KEYS // SIDE):
        def put(row: ir.Expr, col: ir.Expr, ref: ir.Expr, i: int = i) -> list[ir.Stmt]:
            sc = ir.Var("mf_sv")
            return [_qrow(row), ir.Decl("mf_u", UINT, u(i * SIDE) + col),
                    ir.Decl("mf_l", IDX, ir.Var("mf_tk") + ir.Cast(IDX, ir.Var("mf_u"))),
                    ir.Decl("mf_dot", "float", ref),
                    ir.Decl("mf_sv", "float", NEG_INF, const=False),
                    ir.If((ir.Var("mf_u") < ir.Var("mf_tn")).and_(
                        ir.Var("mf_qrow") < ir.Var("mf_nlive")), body + [ir.Assign(sc, value)]),
                    ir.Store("mf_st", row * ir.Var("mf_ss") + ir.Var("mf_u"), sc,
                             space="threadgroup")]
        k_at = ir.Var(k_arr) + u(i * SIDE) * ir.Var(f"{k_arr}_stride") + es * u(SIDE)
        q_at = ir.Var("mf_qt") + ir.Var("mf_row0") * ir.Var("mf_qs") + es * u(SIDE)
        out.append(ir.If(u(i * SIDE) < ir.Var("mf_tn"), [
            *strided.clear(blk, i),
            ir.For("mf_es", UINT, u(0), ir.Var("mf_eb"), strided.multiply(
                blk, i, q_at, ir.Var("mf_qs"), k_at, ir.Var(f"{k_arr}_stride"))),
            *strided.each(blk, i, put)]))
    return out + _sync("its lanes' scores are in the slice before the softmax reads them")


def softmax(op: str) -> list[ir.Stmt]:
    """Row mf_srow's online update over the tile by its two lanes (pairs of keys in turn):
    the tile's max (xor 1), the old sums' factor (to mf_sx for the outputs), the weights p
    into the lane's partial sum and, as the operand type, over the row's scores (P; 0 past
    the tile's keys up to a 16-block)."""
    per = FLASH_TILE_KEYS // PARTS
    x = ir.Var("mf_x")
    # lane part p: keys 4j + 2p and 4j + 2p + 1 (P's two halves of one 4-byte word a lane)
    key = x / u(2) * u(4) + x % u(2) + ir.Var("mf_spart") * u(2)
    sv = ir.Lane(ir.Var("mf_pv"), x)
    mm, md, tmax = ir.Var("mf_mm"), ir.Var("mf_md"), ir.Var("mf_tmax")
    m_new, corr = ir.Var("mf_m_new"), ir.Var("mf_corr")
    whole = (ir.Var("mf_tn") + u(15)) / u(16) * u(16)
    in_tile = x * u(2) < ir.Var("mf_kt")
    return [
        ir.Comment("online softmax, two lanes a row: the tile's max, the old sums' factor, "
                   "the weights p (P, as the operand type, over the row's scores)"),
        ir.ArrayDecl("mf_pv", "float", per),
        ir.Decl("mf_tmax", "float", NEG_INF, const=False),
        ir.Comment("x past mf_kt / 2 holds no key of the tile (key < mf_kt exactly when x < "
                   "mf_kt / 2): skipped, the same branch for every lane"),
        ir.For("mf_x", UINT, u(0), u(per), [ir.If(in_tile, [
            ir.Assign(sv, ir.Select(key < ir.Var("mf_tn"), ir.Lane(
                ir.Var("mf_st"), ir.Var("mf_srow") * ir.Var("mf_ss") + key), NEG_INF)),
            ir.Assign(tmax, ir.Call("mf_maximum", (tmax, sv)))])], unroll=True),
        ir.Assign(tmax, ir.Call("mf_maximum", (tmax, ir.Call("simd_shuffle_xor",
                                                              (tmax, u(1)))))),
        ir.Decl("mf_m_new", "float", ir.Call("mf_maximum", (mm, tmax))),
        ir.Decl("mf_corr", "float", online.rescale(mm, m_new)),
        ir.Assign(md, md * corr),
        ir.For("mf_x", UINT, u(0), u(per), [ir.If(in_tile, [
            ir.Assign(sv, online.weight(sv, m_new)), ir.Assign(md, md + sv)])], unroll=True),
        ir.Assign(mm, m_new),
        *_sync("the row's two lanes have read its scores before P overwrites them"),
        ir.For("mf_x", UINT, u(0), u(per), [ir.If(key < whole, [
            ir.Store("mf_pt", ir.Var("mf_srow") * ir.Var("mf_ps") + key, ir.Cast(op, sv),
                     space="threadgroup")])], unroll=True),
        ir.If(ir.Var("mf_spart").eq(u(0)), [
            ir.Store("mf_sx", u(FACTOR) + ir.Var("mf_srow"), corr, space="threadgroup")]),
        *_sync("P and the rows' factors are in the slice before the values read them")]


def values(blk: strided.Blocks, emax: int, v_arr: str) -> list[ir.Stmt]:
    """The simdgroup's output blocks (every 16 elements of E) rescaled by their rows'
    factors, then O += P x V over the tile's keys, 16 a product."""
    ks16 = ir.Var("mf_ks")
    p_at = ir.Var("mf_pt") + ks16 * u(SIDE)
    out: list[ir.Stmt] = [ir.Comment("the values: O rescaled by each row's factor, then "
                                     "O += P x V for all of E, 16 keys a product")]
    runs: list[ir.Stmt] = []
    for i in range(emax // SIDE):
        scale = strided.each(blk, i, lambda row, col, ref: [ir.Assign(ref, ref * ir.Lane(
            ir.Var("mf_sx"), u(FACTOR) + row))])
        out.append(ir.If(u(i) < ir.Var("mf_eb"), scale) if i else ir.Block(scale))
        v_at = ir.Var(v_arr) + ks16 * u(SIDE) * ir.Var(f"{v_arr}_stride") + u(i * SIDE)
        mul = strided.multiply(blk, i, p_at, ir.Var("mf_ps"), v_at, ir.Var(f"{v_arr}_stride"))
        runs.append(ir.If(u(i) < ir.Var("mf_eb"), mul) if i else ir.Block(mul))
    return out + [ir.For("mf_ks", UINT, u(0), (ir.Var("mf_tn") + u(15)) / u(16), runs)]


def write(ctx: CallContext, ks: KernelState, blk: strided.Blocks, emax: int) -> list[ir.Stmt]:
    """After the keys: each row's max and sum (summed over its two lanes) to the slice, then
    each output element the simdgroup holds: acc / d through the work after the sum (one
    block of keys), else the block's state for the merge kernel."""
    md = ir.Var("mf_md")

    def each(body: list[ir.Stmt]) -> ir.Stmt:
        out: list[ir.Stmt] = []
        for i in range(emax // SIDE):
            def elem(row: ir.Expr, col: ir.Expr, ref: ir.Expr, i: int = i) -> list[ir.Stmt]:
                live = (ir.Var("mf_qrow") < ir.Var("mf_nlive")).and_(
                    ir.Cast(IDX, ir.Var("mf_e")) < ctx.size(ctx.form.e))
                return [_qrow(row), ir.Decl("mf_e", UINT, u(i * SIDE) + col),
                        ir.If(live, [
                            ir.Decl("mf_mm", "float", ir.Lane(ir.Var("mf_sx"), u(MAX) + row)),
                            ir.Decl("mf_md", "float", ir.Lane(ir.Var("mf_sx"), u(SUM) + row)),
                            ir.Decl("mf_ov", "float", ref), *body])]
            blocks = strided.each(blk, i, elem)
            out.append(ir.If(u(i) < ir.Var("mf_eb"), blocks) if i else ir.Block(blocks))
        return ir.Block(out)
    return [
        ir.Comment("each row's sum over its two lanes; its max and sum for the writes"),
        ir.Assign(md, md + ir.Call("simd_shuffle_xor", (md, u(1)))),
        ir.If(ir.Var("mf_spart").eq(u(0)), [
            ir.Store("mf_sx", u(MAX) + ir.Var("mf_srow"), ir.Var("mf_mm"), space="threadgroup"),
            ir.Store("mf_sx", u(SUM) + ir.Var("mf_srow"), md, space="threadgroup")]),
        *_sync("the rows' max and sum are in the slice before the writes read them"),
        ir.If(ir.Var("mf_splits").eq(u(1)), [
            ir.Comment("one block: outputs = acc / d (all keys masked: 0 / 0 = NaN, as "
                       "softmax gives)"), epilogue(ctx, ks, ir.Var("mf_ov"), each)],
            [ir.Comment("several blocks: this block's state (m, d, acc[E]) for the merge "
                        "kernel"), each(state(ctx, ks))])]
