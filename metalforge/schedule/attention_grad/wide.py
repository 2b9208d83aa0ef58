"""The attention backward's 16x16 block kernels with WIDE simdgroups a threadgroup (launch
option grad_simdgroups = 4; FlashAttention-2's backward within Metal's 32 KB of threadgroup
memory): each simdgroup keeps its own 16 keys of K and V (dk/dv) or its own 16 query rows of q
and dO (dq) in registers, as matmul2d's left input cooperative tensors (`matrix.resident`,
K = MAT_E), loaded once; threadgroup memory holds only what every simdgroup reads (the step's
16 query rows of q and dO, or 16 keys of K and V) and each simdgroup's scratch of P^T / dS^T.

    dkdv   64 keys of a kv head a threadgroup; per block of 16 query rows (every row reading
           them, in order: deterministic, GQA summed without atomics) q, dO, lse and delta
           staged once for the 4 simdgroups; per simdgroup S^T = K Q^T, dP^T = V dO^T (one
           16 x 16 x MAT_E product each, K from registers), per element P^T and dS^T to its
           own scratch (simdgroup barrier), dV += P^T dO, dK += dS^T Q.
    dq     64 query rows a threadgroup; per block of 16 keys K and V staged once; per
           simdgroup S = Q K^T, dP = dO V^T, dS to its scratch, dQ += dS K.

A step costs two threadgroup barriers however many simdgroups (staged rows complete; every
simdgroup done with them). With launch option grad_step_blocks = 2 (the cuda default) a step
stages 32 query rows (dk/dv) or 32 keys (dq) and each simdgroup works through them as two
blocks of 16 (`_dkdv_block`, `_dq_block`): half the barriers and load round trips a row.
Tensor ops only (apple10, cuda): apple9's simdgroup_matrix lowering and the other cases keep
`block_kernels` (plan.py routes them)."""
from __future__ import annotations

from typing import Optional

from ... import ir
from ...target import Target
from ..base import IDX
from ..fragments import UINT, u
from ..hardware import SIMD_WIDTH
from ..matrix import resident, strided
from ..matrix.tile import MPP
from . import rowacc
from .block_kernels import SG0, Setup, opening
from .blocks import (
    PAD,
    SIDE,
    elements,
    key_blocks,
    key_place,
    operand,
    row_place,
    rows_seen,
    stage,
)
from .kernels import Ctx, kernel_of, positions
from .matrix import K0, MAT_E, T0

WIDE = 4                       # simdgroups a threadgroup (16 keys or query rows each)
OWN = ("mf_oc0", "mf_oc1")     # the simdgroup's resident left operands


def applies(ctx: Ctx, target: Target) -> Optional[str]:
    """The operand type where the wide kernels apply (the block kernels do, on tensor ops)."""
    op = operand(ctx, target)
    return op if op is not None and target.tensor_ops else None


def _own(ctx: Ctx, res: resident.Resident, sources: tuple[ir.Stmt, ...],
         tiles: tuple[str, str]) -> list[ir.Stmt]:
    """Each simdgroup's 16 rows of two tensors into its resident operands: a round per
    simdgroup, the group staging them (`sources[g]`: its stage) in the tiles."""
    rs = ir.Var("mf_rs")
    take = [resident.load(res, o, ir.Var(t), rs) for o, t in zip(OWN, tiles)]
    return [ir.Comment("each simdgroup's own 16 rows into its registers, a round each "
                       "(the group stages them in the shared tiles)"),
            *(resident.declare(res, o) for o in OWN),
            ir.For("mf_g", UINT, u(0), u(WIDE), [
                ir.Decl("mf_gi", UINT, ir.Var("mf_g")), *sources, ir.Barrier(),
                ir.If(ir.Var("mf_sg").eq(ir.Var("mf_g")), take), ir.Barrier()])]


def _products(res: resident.Resident, blk: strided.Blocks, tiles: tuple[ir.Expr, ir.Expr]
              ) -> ir.Stmt:
    """Blocks 0, 1 = own operand 0, 1 x 16 rows^T of the shared tiles (from `tiles`)."""
    rs = ir.Var("mf_rs")
    return ir.Block([*strided.clear(blk, 0), *strided.clear(blk, 1),
                     *(resident.multiply(res, o, blk, i, t, rs)
                       for i, (o, t) in enumerate(zip(OWN, tiles)))])


def _plus(e: ir.Expr, n: int) -> ir.Expr:
    return e + u(n) if n else e


def _block_of(tile: str, b: int) -> ir.Expr:
    """The step's 16-row block b of a shared tile: its first row."""
    return ir.Var(tile) + u(b * SIDE) * ir.Var("mf_rs") if b else ir.Var(tile)


def _group_first() -> ir.Expr:
    """Round mf_gi's first row or key: mf_b0 + 16 mf_gi."""
    return ir.Var("mf_b0") + ir.Cast(IDX, ir.Var("mf_gi") * u(SIDE))


def _left(s: Setup, coops: bool, names: tuple[str, ...]) -> list[ir.Stmt]:
    """With `coops`: the simdgroup's P^T / dS^T (or dS) as left input cooperative tensors of
    the accumulators' op, set element by element from the blocks (their layout is the
    blocks': `Target.row_lanes`) in place of the scratch in threadgroup memory."""
    if not coops:
        return []
    return [ir.Comment("the weights' left operands, in registers (the blocks' layout)"),
            *(resident.declare(s.racc, n) for n in names)]


def _dkdv_block(ctx: Ctx, s: Setup, coops: bool, b: int, blocks: int) -> list[ir.Stmt]:
    """The simdgroup's work on the step's staged block b of 16 query rows."""
    r = ctx.roles
    q, do = _block_of("mf_tq", b), _block_of("mf_tdo", b)
    of = f" (block {b} of the step's {blocks})" if blocks > 1 else ""
    return [
        ir.Comment(f"S^T = K Q^T and dP^T = V dO^T (16 keys x 16 rows{of}, K and V from "
                   f"registers); per element P^T and dS^T as {s.op} to the simdgroup's "
                   + ("registers" if coops else "scratch")),
        _products(s.res, s.sblk, (q, do)),
        *elements(ctx, s.op, s.sblk, lambda i, j: K0 + ir.Cast(IDX, i),
                  lambda i, j: T0 + ir.Cast(IDX, _plus(j, b * SIDE)),
                  lambda i, j: _plus(j, b * SIDE),
                  [(r.p, "mf_tp"), (r.dc, "mf_tc")], s.helpers, coops),
        ir.Comment(f"dV += P^T dO, dK += dS^T Q (16 keys x {MAT_E}: one run each)"),
        *rowacc.accumulate(s.racc, (("mf_dv", "mf_tp", do), ("mf_dk", "mf_tc", q)), coops)]


def _dkdv(ctx: Ctx, s: Setup, coops: bool, blocks: int) -> ir.LoweredKernel:
    r = ctx.roles
    rows = SIDE * blocks
    step: list[ir.Stmt] = [
        ir.Comment(f"the block's {rows} query rows: q, dO, lse, delta staged once for every "
                   "simdgroup"),
        stage(ctx, s.op, [("mf_tq", r.q), ("mf_tdo", r.dy)], T0, rows, ctx.span(r.tile),
              row_place(ctx), stats=True, sgs=WIDE),
        ir.Barrier(),
        *(st for b in range(blocks) for st in _dkdv_block(ctx, s, coops, b, blocks)),
        ir.Comment("every simdgroup is done with the rows before they are restaged"),
        ir.Barrier()]
    def live(i: ir.Expr) -> ir.Expr:
        return K0 + ir.Cast(IDX, i) < ctx.size(r.key)

    def key_at(i: ir.Expr) -> list[ir.Stmt]:
        return [ir.Decl("mf_l", IDX, K0 + ir.Cast(IDX, i))]
    keys = stage(ctx, s.op, [("mf_tq", r.k), ("mf_tdo", r.v)], _group_first(),
                 SIDE, ctx.size(r.key), key_place, sgs=WIDE)
    body: list[ir.Stmt] = [
        *opening(ctx, s, (("mf_tq", "mf_tdo"), (), () if coops else ("mf_tp", "mf_tc")),
                 ctx.size(r.key), "mf_k0", WIDE, rows),
        *resident.declare_op(s.res),
        *_own(ctx, s.res, (keys,), ("mf_tq", "mf_tdo")),
        ir.Comment(f"the simdgroup's blocks: S^T and dP^T; dV and dK (16 x {MAT_E} each)"),
        *resident.destinations(s.res, OWN[0], s.sblk, 2),
        *resident.declare_rows(s.racc, ("mf_dv", "mf_dk")),
        *_left(s, coops, ("mf_tp", "mf_tc")),
        ir.Comment("every query row reading the keys (GQA: the kv head's query heads too), "
                   f"{rows} at a time, in order"),
        ir.For("mf_t0", IDX, ir.Lit(0, IDX), ctx.span(r.tile),
               rows_seen(ctx, ir.Var("mf_b0"), SIDE * WIDE, step, rows), step=ir.Lit(rows, IDX)),
        ir.Comment("the simdgroup's keys' dk and dv"),
        *rowacc.put(ctx, "mf_dk", "dk", key_at, live),
        *rowacc.put(ctx, "mf_dv", "dv", key_at, live)]
    summary = (f"{ctx.graph.name} (attention backward, dk dv, wide: {WIDE} simdgroups): a "
               f"threadgroup per {SIDE * WIDE} keys of a kv head, 16 a simdgroup with their K "
               "and V in registers; per 16 query rows reading them S^T = K Q^T, dP^T = V dO^T, "
               f"P and dS as {s.op}, dV += P^T dO, dK += dS^T Q, on Metal 4 tensor ops with {s.op} "
               "operands and fp32 accumulation")
    return kernel_of(ctx, body, "dkdv_wide", summary, s.helpers, SIMD_WIDTH * WIDE)


def _dq_block(ctx: Ctx, s: Setup, coops: bool, b: int, blocks: int) -> list[ir.Stmt]:
    """The simdgroup's work on the step's staged block b of 16 keys."""
    r = ctx.roles
    k, v = _block_of("mf_tk", b), _block_of("mf_tv", b)
    of = f" (block {b} of the step's {blocks})" if blocks > 1 else ""
    return [
        ir.Comment(f"S = Q K^T and dP = dO V^T (16 rows x 16 keys{of}, q and dO from "
                   f"registers); per element dS as {s.op} to the simdgroup's "
                   + ("registers" if coops else "scratch")),
        _products(s.res, s.sblk, (k, v)),
        *elements(ctx, s.op, s.sblk, lambda i, j: K0 + ir.Cast(IDX, _plus(j, b * SIDE)),
                  lambda i, j: T0 + ir.Cast(IDX, i), lambda i, j: SG0 + i, [(r.dc, "mf_tc")],
                  s.helpers, coops),
        ir.Comment(f"dQ += dS K (16 rows x {MAT_E}: one run)"),
        *rowacc.accumulate(s.racc, (("mf_dq", "mf_tc", k),), coops)]


def _dq(ctx: Ctx, s: Setup, coops: bool, blocks: int) -> ir.LoweredKernel:
    r = ctx.roles
    keys = SIDE * blocks
    step: list[ir.Stmt] = [
        ir.Comment(f"the block's {keys} keys: K and V staged once for every simdgroup"),
        stage(ctx, s.op, [("mf_tk", r.k), ("mf_tv", r.v)], K0, keys, ctx.size(r.key),
              key_place, sgs=WIDE),
        ir.Barrier(),
        *(st for b in range(blocks) for st in _dq_block(ctx, s, coops, b, blocks)),
        ir.Comment("every simdgroup is done with the keys before they are restaged"),
        ir.Barrier()]

    def row_at(i: ir.Expr) -> list[ir.Stmt]:
        return positions(ctx, T0 + ir.Cast(IDX, i), r.tile)
    rows = stage(ctx, s.op, [("mf_tk", r.q), ("mf_tv", r.dy)], _group_first(),
                 SIDE, ctx.span(r.tile), row_place(ctx), stats=True, sgs=WIDE,
                 stat_at=ir.Var("mf_gi") * u(SIDE))
    body: list[ir.Stmt] = [
        *opening(ctx, s, (("mf_tk", "mf_tv"), (), () if coops else ("mf_tc",)),
                 ctx.span(r.tile), "mf_t0", WIDE, keys),
        *resident.declare_op(s.res),
        *_own(ctx, s.res, (rows,), ("mf_tk", "mf_tv")),
        ir.Comment(f"the simdgroup's blocks: S and dP; dQ (16 x {MAT_E})"),
        *resident.destinations(s.res, OWN[0], s.sblk, 2),
        *resident.declare_rows(s.racc, ("mf_dq",)),
        *_left(s, coops, ("mf_tc",)),
        *key_blocks(ctx, step, WIDE, keys),
        ir.Comment("the simdgroup's rows' dq"),
        *rowacc.put(ctx, "mf_dq", "dq", row_at, lambda i: T0 + ir.Cast(IDX, i)
                < ctx.span(r.tile))]
    summary = (f"{ctx.graph.name} (attention backward, dq, wide: {WIDE} simdgroups): a "
               f"threadgroup per {SIDE * WIDE} query rows of a kv head, 16 a simdgroup with "
               f"their q and dO in registers; per 16 keys S = Q K^T, dP = dO V^T, dS as {s.op}, "
               f"dQ += dS K, on Metal 4 tensor ops with {s.op} operands and fp32 accumulation")
    return kernel_of(ctx, body, "dq_wide", summary, s.helpers, SIMD_WIDTH * WIDE)


def wide_kernel(kind: str, ctx: Ctx, target: Target, blocks: int = 1
                ) -> Optional[ir.LoweredKernel]:
    """The wide kernel `kind` ("dq" or "dkdv"), its steps `blocks` blocks of 16 rows or keys;
    None where it does not apply (`applies`)."""
    s = Setup.of(applies(ctx, target), MPP)
    return None if s is None else {"dq": _dq, "dkdv": _dkdv}[kind](
        ctx, s, bool(target.row_lanes), blocks)


__all__ = ["WIDE", "PAD", "applies", "wide_kernel"]
