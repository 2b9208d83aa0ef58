"""The two attention backward kernels on 16 x 16 matrix blocks (the pieces: `blocks`): dk/dv
over the keys of a kv head, dq over its query rows; None where `blocks.operand` says they do
not apply (the caller keeps the fp32 kernels)."""
from __future__ import annotations

from typing import Callable, Optional

from ... import ir
from ...target import Target
from ..base import IDX
from ..fragments import u
from ..matrix import resident, strided
from ..matrix.tile import MPP
from . import rowacc
from .blocks import (
    ACC,
    SGS,
    SIDE,
    accounting,
    accumulate,
    elements,
    how,
    key_blocks,
    key_place,
    lowering_of,
    operand,
    products,
    row_place,
    rows_seen,
    stage,
    start,
    store_acc,
)
from .kernels import Ctx, kernel_of, positions
from .matrix import MAT_E


def _blocks(op: str, lowering_: str) -> tuple[strided.Blocks, strided.Blocks]:
    """The scores' and dP's blocks (B k-inner) and the gradients' (B k-outer)."""
    return (strided.Blocks("mf_sacc", lowering_, op, k_inner=True),
            strided.Blocks("mf_gacc", lowering_, op, k_inner=False))


def _first(name: str) -> ir.Expr:
    """A simdgroup's first row of 16: `name` + 16 sg."""
    return ir.Var(name) + ir.Cast(IDX, ir.Var("mf_sg") * u(SIDE))


def _setup(ctx: Ctx, target: Target) -> Optional[
        tuple[str, str, strided.Blocks, strided.Blocks, set[str]]]:
    """(operand type, lowering, the S / dP blocks, the gradients' blocks, helpers) of a block
    kernel; None where the inputs take the fp32 kernels."""
    op = operand(ctx, target)
    if op is None:
        return None
    low = lowering_of(target)
    sblk, gblk = _blocks(op, low)
    return op, low, sblk, gblk, strided.helpers(sblk) | {"mf_pack8_of"}


def _res(op: str) -> resident.Resident:
    return resident.Resident("mf_sres", op, MAT_E)


def _scores(mpp: bool, op: str, sblk: strided.Blocks) -> list[ir.Stmt]:
    """The S and dP blocks: of the whole-E op (`_products`) at tensor-op targets."""
    if not mpp:
        return strided.declare(sblk, 2)
    return [*resident.declare_op(_res(op)), *resident.tensor_destinations(_res(op), sblk, 2)]


def _products(mpp: bool, op: str, sblk: strided.Blocks, pairs: list[tuple[str, str]],
              own: ir.Expr) -> ir.Stmt:
    """Blocks 0, 1 = A B^T of each (A: the simdgroup's 16 rows, B: the shared tile's) of
    `pairs`: at tensor-op targets one run over MAT_E each (rows ROW apart, zero past E), else
    a product per 16 values of E (`blocks.products`)."""
    if not mpp:
        return products(sblk, pairs, own, u(0))
    rs = ir.Var("mf_rs")
    return ir.Block([*strided.clear(sblk, 0), *strided.clear(sblk, 1), *(
        resident.multiply_tensors(_res(op), sblk, i, ir.Var(a) + own * rs, rs, ir.Var(b), rs)
        for i, (a, b) in enumerate(pairs))])


def _put(ctx: Ctx, mpp: bool, gblk: strided.Blocks, outs: tuple[tuple[str, int, str], ...],
         where: Callable[[ir.Expr], list[ir.Stmt]], live: Callable[[ir.Expr], ir.Expr]
         ) -> list[ir.Stmt]:
    """The gradients (dest, first block, kind) of `outs` stored: from the row accumulators
    (`rowacc`, tensor ops) or the 16x16 blocks from `first` (simdgroup_matrix)."""
    out: list[ir.Stmt] = []
    for dest, first, kind in outs:
        out += (rowacc.put(ctx, dest, kind, where, live) if mpp else
                store_acc(ctx, gblk, first, kind, where, live))
    return out


def dkdv_kernel(ctx: Ctx, target: Target) -> Optional[ir.LoweredKernel]:
    setup = _setup(ctx, target)
    if setup is None:
        return None
    op, low, sblk, gblk, helpers = setup
    mpp, racc = low == MPP, rowacc.rows(op)
    r = ctx.roles
    k0, t0, own = ir.Var("mf_k0"), ir.Var("mf_t0"), ir.Var("mf_sg") * u(SIDE)
    step: list[ir.Stmt] = [
        ir.Comment("the block's 16 query rows: q and dO staged by the group"),
        stage(ctx, op, [("mf_tq", r.q), ("mf_tdo", r.dy)], t0, SIDE, ctx.span(r.tile),
              row_place(ctx), stats=True),
        ir.Barrier(),
        ir.Comment("S^T = K Q^T and dP^T = V dO^T (16 keys x 16 rows); per element P^T and "
                   f"dS^T as {op}"),
        _products(mpp, op, sblk, [("mf_tk", "mf_tq"), ("mf_tv", "mf_tdo")], own),
        *elements(ctx, op, sblk, lambda i, j: k0 + ir.Cast(IDX, i),
                  lambda i, j: t0 + ir.Cast(IDX, j), lambda i, j: j,
                  [(r.p, "mf_tp"), (r.dc, "mf_tc")], helpers),
        ir.Comment("dV += P^T dO, dK += dS^T Q (16 keys x E)"),
        *(rowacc.accumulate(racc, (("mf_dv", "mf_tp", ir.Var("mf_tdo")),
                                   ("mf_dk", "mf_tc", ir.Var("mf_tq")))) if mpp else
          [*accumulate(gblk, 0, "mf_tp", "mf_tdo", u(0)),
           *accumulate(gblk, ACC, "mf_tc", "mf_tq", u(0))]),
        ir.Comment("every simdgroup is done with the rows before they are restaged"),
        ir.Barrier()]

    def key_at(i: ir.Expr) -> list[ir.Stmt]:
        return [ir.Decl("mf_l", IDX, k0 + ir.Cast(IDX, i))]
    body: list[ir.Stmt] = [
        ir.Comment(accounting(ctx, op, SGS, 2, 2, False)),
        *start(ctx, low, op, (("mf_tq", "mf_tdo"), ("mf_tk", "mf_tv"), ("mf_tp", "mf_tc")),
               ctx.size(r.key), whole=mpp),
        ir.Decl("mf_k0", IDX, _first("mf_b0")),
        *(rowacc.zero((("mf_tq", SIDE), ("mf_tdo", SIDE), ("mf_tk", SIDE * SGS),
                       ("mf_tv", SIDE * SGS)), op, SGS) if mpp else []),
        ir.Comment("the group's keys of K and V, staged once"),
        stage(ctx, op, [("mf_tk", r.k), ("mf_tv", r.v)], ir.Var("mf_b0"), SIDE * SGS,
              ctx.size(r.key), key_place),
        ir.Comment("the simdgroup's blocks: S^T and dP^T; dV (0 ..) and dK (.. 2 x E / 16)"),
        *_scores(mpp, op, sblk),
        *(resident.declare_rows(racc, ("mf_dv", "mf_dk")) if mpp else
          strided.declare(gblk, 2 * ACC)),
        ir.Comment("every query row reading the keys (GQA: the kv head's query heads too), "
                   "16 at a time, in order"),
        ir.For("mf_t0", IDX, ir.Lit(0, IDX), ctx.span(r.tile),
               rows_seen(ctx, ir.Var("mf_b0"), SIDE * SGS, step), step=ir.Lit(SIDE, IDX)),
        ir.Comment("the simdgroup's keys' dk and dv"),
        *_put(ctx, mpp, gblk, (("mf_dk", ACC, "dk"), ("mf_dv", 0, "dv")), key_at,
              lambda i: k0 + ir.Cast(IDX, i) < ctx.size(r.key))]
    summary = (f"{ctx.graph.name} (attention backward, dk dv, 16x16 blocks): a threadgroup "
               f"per {SIDE * SGS} keys of a kv head, 16 a simdgroup; per 16 query rows "
               f"reading them S^T = K Q^T, dP^T = V dO^T, P and dS as {op}, dV += P^T dO, "
               f"dK += dS^T Q, on {how(low)} with {op} operands and fp32 accumulation")
    return kernel_of(ctx, body, "dkdv_block", summary, helpers, 32 * SGS)


def dq_kernel(ctx: Ctx, target: Target) -> Optional[ir.LoweredKernel]:
    setup = _setup(ctx, target)
    if setup is None:
        return None
    op, low, sblk, gblk, helpers = setup
    mpp, racc = low == MPP, rowacc.rows(op)
    r = ctx.roles
    k0, t0, own = ir.Var("mf_k0"), ir.Var("mf_t0"), ir.Var("mf_sg") * u(SIDE)
    step: list[ir.Stmt] = [
        ir.Comment("the block's 16 keys: K and V staged by the group"),
        stage(ctx, op, [("mf_tk", r.k), ("mf_tv", r.v)], k0, SIDE, ctx.size(r.key),
              key_place),
        ir.Barrier(),
        ir.Comment(f"S = Q K^T and dP = dO V^T (16 rows x 16 keys); per element dS as {op}"),
        _products(mpp, op, sblk, [("mf_tq", "mf_tk"), ("mf_tdo", "mf_tv")], own),
        *elements(ctx, op, sblk, lambda i, j: k0 + ir.Cast(IDX, j),
                  lambda i, j: t0 + ir.Cast(IDX, i), lambda i, j: own + i, [(r.dc, "mf_tc")],
                  helpers),
        ir.Comment("dQ += dS K (16 rows x E)"),
        *(rowacc.accumulate(racc, (("mf_dq", "mf_tc", ir.Var("mf_tk")),)) if mpp else
          accumulate(gblk, 0, "mf_tc", "mf_tk", u(0))),
        ir.Comment("every simdgroup is done with the keys before they are restaged"),
        ir.Barrier()]

    def row_at(i: ir.Expr) -> list[ir.Stmt]:
        return positions(ctx, t0 + ir.Cast(IDX, i), r.tile)
    body: list[ir.Stmt] = [
        ir.Comment(accounting(ctx, op, SGS, 2, 1, False)),
        *start(ctx, low, op, (("mf_tk", "mf_tv"), ("mf_tq", "mf_tdo"), ("mf_tc",)),
               ctx.span(r.tile), whole=mpp),
        ir.Decl("mf_t0", IDX, _first("mf_b0")),
        *(rowacc.zero((("mf_tk", SIDE), ("mf_tv", SIDE), ("mf_tq", SIDE * SGS),
                       ("mf_tdo", SIDE * SGS)), op, SGS) if mpp else []),
        ir.Comment("the group's query rows of q and dO, staged once"),
        stage(ctx, op, [("mf_tq", r.q), ("mf_tdo", r.dy)], ir.Var("mf_b0"), SIDE * SGS,
              ctx.span(r.tile), row_place(ctx), stats=True),
        ir.Comment("the simdgroup's blocks: S and dP; dQ"),
        *_scores(mpp, op, sblk),
        *(resident.declare_rows(racc, ("mf_dq",)) if mpp else strided.declare(gblk, ACC)),
        *key_blocks(ctx, step),
        ir.Comment("the simdgroup's rows' dq"),
        *_put(ctx, mpp, gblk, (("mf_dq", 0, "dq"),), row_at,
              lambda i: t0 + ir.Cast(IDX, i) < ctx.span(r.tile))]
    summary = (f"{ctx.graph.name} (attention backward, dq, 16x16 blocks): a threadgroup per "
               f"{SIDE * SGS} query rows of a kv head, 16 a simdgroup; per 16 keys S = Q K^T, "
               f"dP = dO V^T, dS as {op}, dQ += dS K, on {how(low)} with {op} operands and "
               "fp32 accumulation")
    return kernel_of(ctx, body, "dq_block", summary, helpers, 32 * SGS)
