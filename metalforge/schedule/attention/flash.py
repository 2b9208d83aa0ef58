"""The prefill kernel in FlashAttention-2's structure (launch={'prefill_rows': 64 or 128}):
each simdgroup owns 16 query rows for the whole pass over the keys,

    S[16 rows x kt keys] = Q x K^T        its q rows (staged once) against the whole K tile
    online softmax of its rows             in its own slice of threadgroup memory, ordered
                                           by simdgroup barriers only (two lanes a row)
    O[16 rows x E]      += P x V           its P (the operand type, over its scores) against
                                           the whole V tile: E / 16 blocks, fp32

so a threadgroup of 4 (8) simdgroups serves 64 (128) query rows from each staged K/V tile,
and a tile costs two threadgroup barriers (its copies are in; everyone is done with it).
Products are `matrix.strided`'s 16 x 16 blocks on the target's matrix hardware (Metal 4
tensor ops where the target has them, simdgroup_matrix elsewhere), read element by element
through its layout-free `each` only.

Threadgroup memory is one array (`flash_budget`): K and V tiles of mf_kt keys, the q rows,
then each simdgroup's slice (scores, P over them, its rows' factor / max / sum); mf_kt is the
host's keys_per_tile for the call's E. Applies where `mma.operand` does (half / bfloat
operands staged as they are); the 32-row kernel (`mma`, launch={'prefill_rows': 32}) stays
selectable beside it."""
from __future__ import annotations

from typing import Optional

from ... import ir
from ...graph import Op, strip_casts
from ...target import Target
from ..base import IDX, make_kernel
from ..fragments import UINT, lane_place, u
from ..hardware import SIMD_WIDTH
from ..matrix import strided
from ..matrix.tile import MPP, SIMDGROUP
from ..online import NEG_INF
from .context import CallContext, Emitted, KernelState
from .flash_budget import (
    FLASH_BYTES,
    FLASH_TILE_KEYS,
    ROW_BLOCK,
    SCORE_PAD,
    STATS,
    keys_per_tile,
    max_e,
    most_bytes,
)
from .flash_phases import scores, softmax, values, write
from .head import block_keys, group_head, tile
from .mma import operand, stage_q, zero_fill
from .prefill import THREADS, matrix_operands
from .tiles import batched_copies, fill_tiles

# a full tile's 16-byte copies per thread and K/V read at 64 rows (128 threads): 16 keys x
# E = 128 and 32 keys x E = 64 both make 256, two a thread, issued as one batch (all loads
# of K and V, then the stores: `tiles.batched_copies` reordered), not a loop of
# load-then-store
BATCH = 2


def kernel(ctx: CallContext, target: Target, rows: int) -> Optional[ir.LoweredKernel]:
    """The kernel for `rows` query rows a threadgroup, or None where `mma.operand` says the
    matrix block does not apply (or no E fits a tile)."""
    op = operand(ctx, target)
    size = most_bytes(rows, SIMD_WIDTH * ctx.run)
    if op is None or not size:
        return None
    # the E this kernel runs (128 rows: up to 64, the host sends the rest to the decode
    # kernels), in whole 16-blocks: the output blocks each simdgroup holds
    emax = -(-max_e(rows, SIMD_WIDTH * ctx.run) // 16) * 16
    lowering_ = MPP if target.tensor_ops else SIMDGROUP
    nsg = rows // ROW_BLOCK
    ks = KernelState(Emitted(), qt=rows, group=SIMD_WIDTH * nsg,
                     epl=ctx.policy.reads_per_thread, kt_max=FLASH_TILE_KEYS)
    sblk = strided.Blocks("mf_sacc", lowering_, op, k_inner=True)
    oblk = strided.Blocks("mf_oacc", lowering_, op, k_inner=False)
    ks.out.helpers |= strided.helpers(sblk) | {"mf_maximum"}
    ks.out.tg_decls.append(ir.ArrayDecl("mf_tg_fa", "float4", -(-size // 16), "threadgroup"))
    head = group_head(ctx, ks, nsg, (
        f"{nsg} simdgroups of 16 rows each, every one over the whole tile; the group stages "
        "tiles of mf_kt keys of K and V and the rows' q in threadgroup memory")) \
        + tile(ctx, ks) + block_keys(ctx, ks)
    row = ks.with_row(ir.Var("mf_qrow"))
    operands = matrix_operands(ctx)
    assert operands is not None                      # `operand` found them
    q, k = operands
    k_arr, v_arr = ctx.kv[strip_casts(k)], ctx.kv[strip_casts(ctx.form.values)]
    body = _places(lowering_) + _layout(ctx, op, rows) + stage_q(ctx, row, op, q, rows, pairs=True)
    body += [ir.Comment("the softmax lanes' row (two a row): running max, partial sum"),
             ir.Decl("mf_mm", "float", NEG_INF, const=False),
             ir.Decl("mf_md", "float", ir.Lit(0.0, "float"), const=False),
             ir.Comment(f"the simdgroup's outputs: up to {emax // 16} blocks of 16 rows x 16 "
                        "E elements"), *strided.declare(oblk, emax // 16),
             ir.Comment("its scores of a tile: blocks of 16 rows x 16 keys"),
             *strided.declare(sblk, FLASH_TILE_KEYS // 16)]
    fill = _fill(ctx, row)
    step: list[ir.Stmt] = [ir.Decl("mf_tn", UINT, ir.Cast(UINT, ir.Call("min", (
        ir.Var("mf_l1") - ir.Var("mf_tk"), ir.Cast(IDX, ir.Var("mf_kt"))))))]
    step += fill + scores(ctx, row, sblk, k_arr) + softmax(op)
    step += values(oblk, emax, v_arr) + [
        ir.Comment("every simdgroup is done with the tiles before they are refilled"),
        ir.Barrier()]
    body += [ir.Comment(f"one pass over the block's keys along '{ctx.form.key}', a tile at a "
                        "time"),
             ir.For("mf_tk", IDX, ir.Var("mf_l0"), ir.Var("mf_l1"), step,
                    step=ir.Cast(IDX, ir.Var("mf_kt")))]
    body += write(ctx, row, oblk, emax)
    how = ("Metal 4 tensor ops (matmul2d over threadgroup tensors)" if lowering_ == MPP
           else "8x8 simdgroup_matrix products")
    return make_kernel(
        ctx.graph, ctx.index64, THREADS, ks.out.tg_decls + head + ks.out.pre + body,
        f"{ctx.graph.name} (prefill): FlashAttention-2's structure; softmax over "
        f"'{ctx.form.key}' of scores contracting '{ctx.form.e}' (up to {emax}), times the "
        f"values, summed over '{ctx.form.key}'; a threadgroup per {rows} query rows sharing "
        f"their keys and block of keys, {nsg} simdgroups each owning 16 rows over every key "
        f"of a tile (S, its online softmax, P x V for all of E); q, K and V staged as {op} "
        f"in threadgroup memory; 16 x 16 blocks on {how} with {op} operands and fp32 "
        f"accumulation; one pass", "prefill", params=ctx.params,
        helpers=tuple(sorted(ks.out.helpers)), max_threads=ks.group)


def _fill(ctx: CallContext, ks: KernelState) -> list[ir.Stmt]:
    """`tiles.fill_tiles`' staging of the tile (then, on a partial tile, `mma.zero_fill`),
    with a full tile of BATCH copies a thread (E a multiple of 8 and innermost in K and V,
    not gathered) batched: every load of K and V before any store (one wait on memory a
    tile, not one a read)."""
    fill = fill_tiles(ctx, ks)
    assert isinstance(fill[-1], ir.Barrier)
    at = len(fill) - 2                               # the copies, before the barrier
    plain = all(ctx.tensor_of(n).axes[-1] == ctx.form.e and n.op != Op.TAKE for n in ctx.kv)
    copies = fill[at]
    if plain and ctx.vw == 8 and isinstance(copies, ir.For) and copies.var == "mf_i":
        full = ir.Var("mf_vec_ok").and_(ir.Var("mf_dc").eq(u(0))).and_(
            (ir.Var("mf_tn") * ir.Var("mf_chunks")).eq(u(BATCH * ks.group)))
        batch = batched_copies(ctx, ks, BATCH)     # per read: its loads, then its stores
        loads = [b for b in batch if not isinstance(b, ir.Store)]
        stores = [b for b in batch if isinstance(b, ir.Store)]
        fill[at] = ir.If(full, loads + [ir.Comment("... then every store")] + stores, [copies])
    fill[-1:-1] = zero_fill(ctx, ks.group)
    return fill


def _places(lowering_: str) -> list[ir.Stmt]:
    """The thread's places: in the group, its simdgroup's first row, its softmax row (two
    lanes a row) and part (and its place in an 8x8 fragment for simdgroup_matrix)."""
    sg, lane = ir.Var("mf_sg"), ir.Var("mf_lane")
    out: list[ir.Stmt] = [
        ir.Decl("mf_tid", UINT, sg * u(SIMD_WIDTH) + lane),
        ir.Comment("the simdgroup's 16 rows of the tile; the softmax: lanes 2r, 2r + 1 take "
                   "its row r"),
        ir.Decl("mf_row0", UINT, sg * u(ROW_BLOCK)),
        ir.Decl("mf_srow", UINT, lane / u(2)),
        ir.Decl("mf_spart", UINT, lane % u(2))]
    return out + (lane_place(lane) if lowering_ == SIMDGROUP else [])


def _layout(ctx: CallContext, op: str, rows: int) -> list[ir.Stmt]:
    """The one threadgroup array's parts (`flash_budget`): K and V tiles (mf_kv<i>, mf_kt
    rows of mf_qs values), q (mf_qt, `rows` rows), then the simdgroup's slice: scores mf_st
    (fp32, mf_ss a row: mf_kt, padded by mf_spad where that fits; P over them, mf_pt,
    2 x mf_ss a row) and its rows' stats mf_sx (factor, max, sum: 16 each). mf_ew: E
    rounded up to whole 16-blocks."""
    e = ctx.size(ctx.form.e)
    qs, kt = ir.Var("mf_qs"), ir.Var("mf_kt")
    out: list[ir.Stmt] = [
        ir.Decl("mf_chunks", UINT, ir.Cast(UINT, (e + ir.Lit(7, IDX)) / ir.Lit(8, IDX))),
        ir.Comment("K and V tiles, then the q rows (rows of mf_qs values: E rounded to 8, "
                   "padded by 16 bytes), then each simdgroup's slice (scores, P over them, "
                   "its rows' factor, max and sum)"),
        ir.Decl("mf_qs", UINT, ir.Var("mf_chunks") * u(8) + u(8))]
    base: ir.Expr = ir.Var("mf_tg_fa")
    for i, (n, arr) in enumerate(ctx.kv.items()):
        st = ctx.in_stype(ctx.tensor_of(n))
        at = ir.Call(f"reinterpret_cast<threadgroup {st}*>", (base,))
        out += [ir.Decl(arr, f"threadgroup {st}*", at + u(i) * kt * qs if i else at,
                        const=False),
                ir.Decl(f"{arr}_stride", UINT, qs)]
    last = list(ctx.kv.values())[-1]
    ss = ir.Var("mf_ss")
    padded = ((u(2) * kt + u(rows)) * qs * u(2) + u(rows // ROW_BLOCK * 4) * (
        u(ROW_BLOCK) * (kt + u(SCORE_PAD)) + u(STATS)))
    return out + [
        ir.Comment(f"score rows padded by {SCORE_PAD} floats where that fits "
                   f"{FLASH_BYTES} bytes (flash_budget.score_pad)"),
        ir.Decl("mf_spad", UINT, ir.Select(padded <= u(FLASH_BYTES), u(SCORE_PAD), u(0))),
        ir.Decl("mf_ss", UINT, kt + ir.Var("mf_spad")),
        ir.Decl("mf_qt", f"threadgroup {op}*", ir.Call(
            f"reinterpret_cast<threadgroup {op}*>", (ir.Var(last) + kt * qs,)), const=False),
        ir.Decl("mf_st", "threadgroup float*", ir.Call(
            "reinterpret_cast<threadgroup float*>", (ir.Var("mf_qt") + u(rows) * qs,))
            + ir.Var("mf_sg") * (u(ROW_BLOCK) * ss + u(STATS)), const=False),
        ir.Decl("mf_pt", f"threadgroup {op}*", ir.Call(
            f"reinterpret_cast<threadgroup {op}*>", (ir.Var("mf_st"),)), const=False),
        ir.Decl("mf_ps", UINT, u(2) * ss),
        ir.Decl("mf_sx", "threadgroup float*", ir.Var("mf_st") + u(ROW_BLOCK) * ss,
                const=False),
        ir.Decl("mf_ew", UINT, ir.Cast(UINT, (e + ir.Lit(15, IDX)) / ir.Lit(16, IDX)
                                       * ir.Lit(16, IDX))),
        ir.Decl("mf_eb", UINT, ir.Var("mf_ew") / u(16))]


__all__ = ["kernel", "keys_per_tile"]
