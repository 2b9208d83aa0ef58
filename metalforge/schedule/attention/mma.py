"""The prefill kernel on the matrix block (`schedule/matrix/strided`): both contractions as
16 x 16 products with the tensors' own half or bfloat values as operands and fp32
accumulation, on the target's matrix hardware (Metal 4 tensor ops where the target has them:
apple10, and cuda's tensor cores; simdgroup_matrix elsewhere), as FlashAttention does:

    S[32 rows x tile keys] = Q x K^T          (A = the staged q rows, B = the key tile, k-inner)
    online softmax of S, per row, in fp32      (P = its weights, cast to the operand type)
    O[32 rows x E]        += P x V            (A = P, B = the value tile, k-outer)

A threadgroup of four simdgroups takes a tile of MATRIX_ROWS = 32 query rows that read the
same keys (the host schedule's geometry of `prefill.kernel`, which it replaces for these
operands): simdgroup (mf_sr, mf_sc) = (sg / 2, sg % 2) holds rows mf_sr * 16 .. + 16 of the
tile, the tile's key blocks of 16 and E blocks of 16 of column parity mf_sc. The matrix
block's outputs are read element by element through its layout-free `each`, so the scores go
to threadgroup memory (mf_st: fp32, row stride mf_kt) where four threads a row run the online
softmax and write P over the row's own scores; each row's factor of the old sums reaches the
simdgroups holding its outputs through mf_tg_c. Threadgroup memory: the K/V tiles of the
decode kernels (`tiles`) and one buffer for q (mf_qt, rows of mf_qs) followed by the scores.

Operands the block reads whole (16 x 16) are zero past their data: q past E and past the
tile's rows, K and V past E and past the tile's keys (`zero_fill`, on partial tiles only).

Built (`operand`) when the scores' q side, K and V are the same half / bfloat (held as such:
a tensor read or an explicit cast) and the scores' k side and the values are the staged K/V
reads themselves (a cast of one at most), copied in 16-byte chunks: then the staged tiles are
the operands. Other graphs (f32, a computed k side, reads_per_thread < 8) keep
`prefill.kernel`'s fp32 simdgroup_matrix products.
"""
from __future__ import annotations

from typing import Optional

from ... import ir
from ...graph import Node, strip_casts
from ...target import Target
from ..base import IDX
from ..fragments import UINT, lane_place, u
from ..hardware import SIMD_WIDTH
from ..lower import as_float
from ..matmul.form import held_dtype
from ..matrix import strided
from ..matrix.tile import MPP, SIMDGROUP, operand_type
from ..online import NEG_INF
from .context import CallContext, Emitted, KernelState, lowering
from .head import tiled_head
from .mma_phases import scores, softmax, values, write
from .params import MATRIX_ROWS, NARROW_LANES, NARROW_TILE_KEYS, PAD_BYTES, TILE_BYTES, TILE_KEYS
from .prefill import finish, matrix_operands
from .tiles import fill_tiles, tile_arrays

SIMDGROUPS = 4
ROW_BLOCK = 16                     # query rows a simdgroup (the block's side)


def operand(ctx: CallContext, target: Target) -> Optional[str]:
    """The operands' MSL type ("half" or "bfloat") when this kernel applies, else None."""
    ops = matrix_operands(ctx)
    if ops is None or not ctx.policy.stage_kv or not ctx.tile_axes:
        return None
    q, k = ops
    k_read, v_read = strip_casts(k), strip_casts(ctx.form.values)
    if k_read not in ctx.kv or v_read not in ctx.kv:
        return None
    kt, vt = ctx.tensor_of(k_read).dtype, ctx.tensor_of(v_read).dtype
    if not held_dtype(strip_casts(q)) == kt == vt:
        return None
    # the tiles' rows must hold E rounded up to a 16-block: whole 16-byte chunks plus the
    # padding do (8 elements a chunk); narrower chunks (reads_per_thread < 8) may not
    if ctx.vw * kt.itemsize != 16:
        return None
    op = operand_type(kt, vt, target)
    return None if op == "float" else op


def scratch_bytes(run: int) -> int:
    """The q rows and the scores together at their largest over E (up to 32 x run): q rows of
    E rounded to 8 plus PAD_BYTES, scores of the tile's keys (the host's keys_per_tile for
    2-byte K/V), both for MATRIX_ROWS rows."""
    most = 0
    for e in range(8, SIMD_WIDTH * run + 1, 8):
        kt = NARROW_TILE_KEYS if e <= NARROW_LANES * run else TILE_KEYS
        while kt * (e + PAD_BYTES // 2) * 2 > TILE_BYTES:
            kt //= 2
        most = max(most, MATRIX_ROWS * ((e + PAD_BYTES // 2) * 2 + kt * 4))
    return most


def kernel(ctx: CallContext, target: Target) -> Optional[ir.LoweredKernel]:
    """The prefill kernel on the matrix block, or None where `operand` says it does not
    apply."""
    op = operand(ctx, target)
    if op is None:
        return None
    lowering_ = MPP if target.tensor_ops else SIMDGROUP
    f = ctx.form
    ks = KernelState(Emitted(), qt=MATRIX_ROWS, group=SIMD_WIDTH * SIMDGROUPS,
                     epl=ctx.policy.reads_per_thread, kt_max=NARROW_TILE_KEYS)
    emax = SIMD_WIDTH * ctx.run
    sblk = strided.Blocks("mf_sacc", lowering_, op, k_inner=True)
    oblk = strided.Blocks("mf_oacc", lowering_, op, k_inner=False)
    ks.out.helpers |= strided.helpers(sblk) | {"mf_maximum"}
    head = tiled_head(ctx, ks, SIMDGROUPS, (
        "4 simdgroups, each 16 rows x half the key and E blocks; the group stages tiles of "
        "mf_kt keys of K and V and the rows' q in threadgroup memory"), inner=True)
    row = ks.with_row(ir.Var("mf_qrow"), table=True)
    body = _places(lowering_) + tile_arrays(ctx, row, runs=False) + _buffers(ctx, ks, op)
    operands = matrix_operands(ctx)
    assert operands is not None                      # `operand` found them
    q, k = operands
    k_arr, v_arr = ctx.kv[strip_casts(k)], ctx.kv[strip_casts(f.values)]
    body += stage_q(ctx, row, op, q)
    body += [ir.Comment("the softmax threads' row (four a row): running max, partial sum"),
             ir.Decl("mf_mm", "float", NEG_INF, const=False),
             ir.Decl("mf_md", "float", ir.Lit(0.0, "float"), const=False),
             ir.Comment(f"the simdgroup's outputs: {emax // 32} blocks of 16 rows x 16 E "
                        "elements"), *strided.declare(oblk, emax // 32),
             ir.Comment("its scores of a tile: up to two blocks of 16 rows x 16 keys"),
             *strided.declare(sblk, NARROW_TILE_KEYS // 32)]
    fill = fill_tiles(ctx, row)
    assert isinstance(fill[-1], ir.Barrier)
    fill[-1:-1] = zero_fill(ctx)
    step: list[ir.Stmt] = [ir.Decl("mf_tn", UINT, ir.Cast(UINT, ir.Call("min", (
        ir.Var("mf_l1") - ir.Var("mf_tk"), ir.Cast(IDX, ir.Var("mf_kt"))))))]
    step += fill + scores(ctx, row, sblk, k_arr) + [ir.Barrier()] + softmax(ks, op) + [ir.Barrier()]
    step += values(oblk, emax, v_arr) + [
        ir.Comment("every simdgroup is done with the tiles before they are refilled"),
        ir.Barrier()]
    body += [ir.Comment(f"one pass over the block's keys along '{f.key}', a tile at a time"),
             ir.For("mf_tk", IDX, ir.Var("mf_l0"), ir.Var("mf_l1"), step,
                    step=ir.Cast(IDX, ir.Var("mf_kt")))]
    body += write(ctx, row, oblk, emax)
    how = ("Metal 4 tensor ops (matmul2d over threadgroup tensors)" if lowering_ == MPP
           else "8x8 simdgroup_matrix products")
    return finish(ctx, ks, head, body, emax, MATRIX_ROWS, (
        f"4 simdgroups of 16 rows; q, K and V tiles staged as {op} in threadgroup memory; "
        f"S = Q K^T and O += P V as 16 x 16 blocks on {how} with {op} operands and fp32 "
        f"accumulation; the online softmax in fp32 (P cast to {op}), one pass"))


def _places(lowering_: str) -> list[ir.Stmt]:
    """The thread's places: in the group, its simdgroup's rows and column parity, its
    softmax row and part (and its place in an 8x8 fragment for simdgroup_matrix)."""
    sg, lane = ir.Var("mf_sg"), ir.Var("mf_lane")
    out: list[ir.Stmt] = [
        ir.Decl("mf_tid", UINT, sg * u(SIMD_WIDTH) + lane),
        ir.Comment("the simdgroup's 16 rows of the tile and its parity of key and E blocks"),
        ir.Decl("mf_row0", UINT, sg / u(2) * u(ROW_BLOCK)),
        ir.Decl("mf_sc", UINT, sg % u(2)),
        ir.Comment("the softmax: four threads a row of the tile (lanes 4r .. 4r + 3)"),
        ir.Decl("mf_srow", UINT, ir.Var("mf_tid") / u(4)),
        ir.Decl("mf_spart", UINT, ir.Var("mf_tid") % u(4))]
    return out + (lane_place(lane) if lowering_ == SIMDGROUP else [])


def _buffers(ctx: CallContext, ks: KernelState, op: str) -> list[ir.Stmt]:
    """The q rows and the scores (one threadgroup buffer: q first, mf_qs elements a row, E
    rounded to whole vectors plus PAD_BYTES, as the K/V tiles' rows; then the scores, mf_kt
    floats a row, P written over each row's own scores as the operand type, 2 x mf_kt a
    row), the rows' factors and final states; mf_ew: E rounded up to whole 16-blocks."""
    size = scratch_bytes(ctx.run)
    ks.out.tg_decls += [ir.ArrayDecl("mf_tg_qs", op, size // 2, "threadgroup"),
                        ir.ArrayDecl("mf_tg_c", "float", MATRIX_ROWS, "threadgroup"),
                        ir.ArrayDecl("mf_tg_m", "float", MATRIX_ROWS, "threadgroup"),
                        ir.ArrayDecl("mf_tg_d", "float", MATRIX_ROWS, "threadgroup")]
    qs = ir.Var("mf_chunks") * u(ctx.vw) + u(PAD_BYTES // 2)
    e = ctx.size(ctx.form.e)
    return [
        ir.Comment(f"q rows (mf_qt, {op}, mf_qs a row), then the scores (mf_st, fp32, mf_kt "
                   "a row; P over them: mf_pt, 2 x mf_kt a row)"),
        ir.Decl("mf_qs", UINT, qs),
        ir.Decl("mf_qt", f"threadgroup {op}*", ir.Var("mf_tg_qs"), const=False),
        ir.Decl("mf_st", "threadgroup float*", ir.Call(
            "reinterpret_cast<threadgroup float*>", (ir.Var("mf_qt") + u(MATRIX_ROWS)
                                                     * ir.Var("mf_qs"),)), const=False),
        ir.Decl("mf_pt", f"threadgroup {op}*", ir.Call(
            f"reinterpret_cast<threadgroup {op}*>", (ir.Var("mf_st"),)), const=False),
        ir.Decl("mf_ps", UINT, u(2) * ir.Var("mf_kt")),
        ir.Decl("mf_ew", UINT, ir.Cast(UINT, (e + ir.Lit(15, IDX)) / ir.Lit(16, IDX)
                                       * ir.Lit(16, IDX))),
        ir.Decl("mf_eb", UINT, ir.Var("mf_ew") / u(16))]


def stage_q(ctx: CallContext, ks: KernelState, op: str, qn: Node) -> list[ir.Stmt]:
    """The tile's q rows into mf_qt as the operand type, E up to mf_ew (0 past E and for
    rows past the tile's end), by all the group's threads; the first tile's barrier orders
    them before the scores read them."""
    low = lowering(ctx, ks, "mf_q")
    body = low.lower([qn])
    value = as_float(low.value(qn), qn)
    ks.out.helpers |= low.helpers
    qi, at = ir.Var("mf_qi"), ir.Var("mf_qrow") * ir.Var("mf_qs") + ir.Var("mf_e")
    live = (ir.Var("mf_qrow") < ir.Var("mf_nlive")).and_(
        ir.Cast(IDX, ir.Var("mf_e")) < ctx.size(ctx.form.e))
    return [
        ir.Comment(f"the tile's q rows as {op} operands (0 past E and past the tile's rows)"),
        ir.For("mf_qi", UINT, ir.Var("mf_tid"), u(MATRIX_ROWS) * ir.Var("mf_ew"), [
            ir.Decl("mf_qrow", UINT, qi / ir.Var("mf_ew")),
            ir.Decl("mf_e", UINT, qi % ir.Var("mf_ew")),
            ir.Store("mf_qt", at, ir.Cast(op, ir.Lit(0.0, "float")), space="threadgroup"),
            ir.If(live, body + [ir.Store("mf_qt", at, ir.Cast(op, value),
                                         space="threadgroup")])],
            step=u(ks.group))]


def zero_fill(ctx: CallContext, keys: Optional[int] = None, columns: bool = True
              ) -> list[ir.Stmt]:
    """On a partial tile (keys or E not whole 16-blocks): the K/V tiles' elements the blocks
    read past the copied ones, 0 (rows mf_tn .. up to a 16-block, columns E .. mf_ew), so
    that stale or uninitialised memory never meets a product; two adjacent elements a
    thread, after a barrier of its own where columns are zeroed (the copies' last element
    and the first zero may share a 4-byte word). With `keys` (the blocks read a whole tile
    of that many keys), the rows up to it; without `columns` (the kernel zeroed the columns
    past E once), only a tile short of keys is partial, and its zeros are whole rows no copy
    writes (no barrier)."""
    e, tn = ctx.size(ctx.form.e), ir.Var("mf_tn")
    rows = (tn + u(15)) / u(16) * u(16) if keys is None else u(keys)
    z, r, c = ir.Var("mf_z"), ir.Var("mf_zr"), ir.Var("mf_zc") + ir.Var("mf_x")
    stores: list[ir.Stmt] = [
        ir.Store(arr, r * ir.Var(f"{arr}_stride") + c, ir.Cast(
            ctx.in_stype(ctx.tensor_of(n)), ir.Lit(0.0, "float")), space="threadgroup")
        for n, arr in ctx.kv.items()]
    short = (tn % u(16)).ne(u(0)) if keys is None else tn < u(keys)
    partial = short.or_((e % ir.Lit(16, IDX)).ne(ir.Lit(0, IDX))) if columns else short
    half_w = ir.Var("mf_ew") / u(2)
    what = ("K and V past the copied keys and past E (up to whole "
            + ("16-blocks" if keys is None else f"16-blocks, {keys} keys") + ") are 0"
            if columns else f"rows past the copied keys (up to {keys}) are 0")
    zero: list[ir.Stmt] = [ir.For("mf_z", UINT, ir.Var("mf_tid"), rows * half_w, [
        ir.Decl("mf_zr", UINT, z / half_w),
        ir.Decl("mf_zc", UINT, z % half_w * u(2)),
        ir.For("mf_x", UINT, u(0), u(2), [
            ir.If((r >= tn).or_(ir.Cast(IDX, c) >= e) if columns else r >= tn, stores)],
            unroll=True)], step=u(SIMD_WIDTH * SIMDGROUPS))]
    return [
        ir.Comment(f"a partial tile: {what}"),
        ir.If(partial, ([ir.Barrier()] if columns else []) + zero)]
