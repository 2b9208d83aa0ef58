"""The two attention backward kernels on 16 x 16 matrix blocks (the pieces: `blocks`): dk/dv
over the keys of a kv head, dq over its query rows; None where `blocks.operand` says they do
not apply (the caller keeps the fp32 kernels)."""
from __future__ import annotations

from dataclasses import dataclass
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
from .matrix import K0, MAT_E, T0


def _blocks(op: str, lowering_: str) -> tuple[strided.Blocks, strided.Blocks]:
    """The scores' and dP's blocks (B k-inner) and the gradients' (B k-outer)."""
    return (strided.Blocks("mf_sacc", lowering_, op, k_inner=True),
            strided.Blocks("mf_gacc", lowering_, op, k_inner=False))


def _first(name: str) -> ir.Expr:
    """A simdgroup's first row of 16: `name` + 16 sg."""
    return ir.Var(name) + ir.Cast(IDX, ir.Var("mf_sg") * u(SIDE))


@dataclass(frozen=True)
class Setup:
    """What the block kernels (and `wide`'s) of operand type `op` start from: the lowering,
    the S / dP blocks, the gradients' blocks, and the helpers (the kernel adds to them)."""
    op: str
    low: str
    sblk: strided.Blocks
    gblk: strided.Blocks
    helpers: set[str]

    @classmethod
    def of(cls, op: Optional[str], low: str) -> Optional[Setup]:
        """None where there is no operand type (the inputs take the fp32 kernels)."""
        if op is None:
            return None
        sblk, gblk = _blocks(op, low)
        return cls(op, low, sblk, gblk, strided.helpers(sblk) | {"mf_pack8_of"})

    @property
    def mpp(self) -> bool:
        """On tensor ops: the gradients in row accumulators (`racc`)."""
        return self.low == MPP

    @property
    def racc(self) -> resident.Rows:
        return rowacc.rows(self.op)

    @property
    def res(self) -> resident.Resident:
        """The whole-E tensor op of the S and dP products."""
        return resident.Resident("mf_sres", self.op, MAT_E)


SG0 = ir.Var("mf_sg") * u(SIDE)     # the simdgroup's first row of 16 in the block


def opening(ctx: Ctx, s: Setup, tiles: tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]],
            count: ir.Expr, first: str, sgs: int = SGS, rows: int = SIDE) -> list[ir.Stmt]:
    """A block kernel's start: the accounting comment, the buffers and head (`blocks.start`;
    `tiles`: the step's shared tiles, the group's own staged arrays (none: the own rows are
    resident in registers), the scratch), `first` = the simdgroup's first key or row, and at
    tensor ops the staged tiles zeroed (`rows` rows each shared tile, 16 sgs each own
    array)."""
    shared, own, scratch = tiles
    zeroed = tuple((t, rows) for t in shared) + tuple((t, SIDE * sgs) for t in own)
    return [ir.Comment(accounting(ctx, s.op, sgs, len(own), len(scratch), not own, rows)),
            *start(ctx, s.low, s.op, tiles, count, sgs, whole=s.mpp, shared_rows=rows),
            ir.Decl(first, IDX, _first("mf_b0")),
            *(rowacc.zero(zeroed, s.op, sgs) if s.mpp else [])]


def _scores(s: Setup) -> list[ir.Stmt]:
    """The S and dP blocks: of the whole-E op (`_products`) at tensor-op targets."""
    if not s.mpp:
        return strided.declare(s.sblk, 2)
    return [*resident.declare_op(s.res), *resident.tensor_destinations(s.res, s.sblk, 2)]


def _products(s: Setup, pairs: list[tuple[str, str]]) -> ir.Stmt:
    """Blocks 0, 1 = A B^T of each (A: the simdgroup's 16 rows, B: the shared tile's) of
    `pairs`: at tensor-op targets one run over MAT_E each (rows ROW apart, zero past E), else
    a product per 16 values of E (`blocks.products`)."""
    if not s.mpp:
        return products(s.sblk, pairs, SG0, u(0))
    rs = ir.Var("mf_rs")
    return ir.Block([*strided.clear(s.sblk, 0), *strided.clear(s.sblk, 1), *(
        resident.multiply_tensors(s.res, s.sblk, i, ir.Var(a) + SG0 * rs, rs, ir.Var(b), rs)
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


def _dkdv(ctx: Ctx, s: Setup) -> ir.LoweredKernel:
    r = ctx.roles
    step: list[ir.Stmt] = [
        ir.Comment("the block's 16 query rows: q and dO staged by the group"),
        stage(ctx, s.op, [("mf_tq", r.q), ("mf_tdo", r.dy)], T0, SIDE, ctx.span(r.tile),
              row_place(ctx), stats=True),
        ir.Barrier(),
        ir.Comment("S^T = K Q^T and dP^T = V dO^T (16 keys x 16 rows); per element P^T and "
                   f"dS^T as {s.op}"),
        _products(s, [("mf_tk", "mf_tq"), ("mf_tv", "mf_tdo")]),
        *elements(ctx, s.op, s.sblk, lambda i, j: K0 + ir.Cast(IDX, i),
                  lambda i, j: T0 + ir.Cast(IDX, j), lambda i, j: j,
                  [(r.p, "mf_tp"), (r.dc, "mf_tc")], s.helpers),
        ir.Comment("dV += P^T dO, dK += dS^T Q (16 keys x E)"),
        *(rowacc.accumulate(s.racc, (("mf_dv", "mf_tp", ir.Var("mf_tdo")),
                                     ("mf_dk", "mf_tc", ir.Var("mf_tq")))) if s.mpp else
          [*accumulate(s.gblk, 0, "mf_tp", "mf_tdo", u(0)),
           *accumulate(s.gblk, ACC, "mf_tc", "mf_tq", u(0))]),
        ir.Comment("every simdgroup is done with the rows before they are restaged"),
        ir.Barrier()]

    def key_at(i: ir.Expr) -> list[ir.Stmt]:
        return [ir.Decl("mf_l", IDX, K0 + ir.Cast(IDX, i))]
    body: list[ir.Stmt] = [
        *opening(ctx, s, (("mf_tq", "mf_tdo"), ("mf_tk", "mf_tv"), ("mf_tp", "mf_tc")),
                 ctx.size(r.key), "mf_k0"),
        ir.Comment("the group's keys of K and V, staged once"),
        stage(ctx, s.op, [("mf_tk", r.k), ("mf_tv", r.v)], ir.Var("mf_b0"), SIDE * SGS,
              ctx.size(r.key), key_place),
        ir.Comment("the simdgroup's blocks: S^T and dP^T; dV (0 ..) and dK (.. 2 x E / 16)"),
        *_scores(s),
        *(resident.declare_rows(s.racc, ("mf_dv", "mf_dk")) if s.mpp else
          strided.declare(s.gblk, 2 * ACC)),
        ir.Comment("every query row reading the keys (GQA: the kv head's query heads too), "
                   "16 at a time, in order"),
        ir.For("mf_t0", IDX, ir.Lit(0, IDX), ctx.span(r.tile),
               rows_seen(ctx, ir.Var("mf_b0"), SIDE * SGS, step), step=ir.Lit(SIDE, IDX)),
        ir.Comment("the simdgroup's keys' dk and dv"),
        *_put(ctx, s.mpp, s.gblk, (("mf_dk", ACC, "dk"), ("mf_dv", 0, "dv")), key_at,
              lambda i: K0 + ir.Cast(IDX, i) < ctx.size(r.key))]
    summary = (f"{ctx.graph.name} (attention backward, dk dv, 16x16 blocks): a threadgroup "
               f"per {SIDE * SGS} keys of a kv head, 16 a simdgroup; per 16 query rows "
               f"reading them S^T = K Q^T, dP^T = V dO^T, P and dS as {s.op}, dV += P^T dO, "
               f"dK += dS^T Q, on {how(s.low)} with {s.op} operands and fp32 accumulation")
    return kernel_of(ctx, body, "dkdv_block", summary, s.helpers, 32 * SGS)


def _dq(ctx: Ctx, s: Setup) -> ir.LoweredKernel:
    r = ctx.roles
    step: list[ir.Stmt] = [
        ir.Comment("the block's 16 keys: K and V staged by the group"),
        stage(ctx, s.op, [("mf_tk", r.k), ("mf_tv", r.v)], K0, SIDE, ctx.size(r.key),
              key_place),
        ir.Barrier(),
        ir.Comment(f"S = Q K^T and dP = dO V^T (16 rows x 16 keys); per element dS as {s.op}"),
        _products(s, [("mf_tq", "mf_tk"), ("mf_tdo", "mf_tv")]),
        *elements(ctx, s.op, s.sblk, lambda i, j: K0 + ir.Cast(IDX, j),
                  lambda i, j: T0 + ir.Cast(IDX, i), lambda i, j: SG0 + i, [(r.dc, "mf_tc")],
                  s.helpers),
        ir.Comment("dQ += dS K (16 rows x E)"),
        *(rowacc.accumulate(s.racc, (("mf_dq", "mf_tc", ir.Var("mf_tk")),)) if s.mpp else
          accumulate(s.gblk, 0, "mf_tc", "mf_tk", u(0))),
        ir.Comment("every simdgroup is done with the keys before they are restaged"),
        ir.Barrier()]

    def row_at(i: ir.Expr) -> list[ir.Stmt]:
        return positions(ctx, T0 + ir.Cast(IDX, i), r.tile)
    body: list[ir.Stmt] = [
        *opening(ctx, s, (("mf_tk", "mf_tv"), ("mf_tq", "mf_tdo"), ("mf_tc",)),
                 ctx.span(r.tile), "mf_t0"),
        ir.Comment("the group's query rows of q and dO, staged once"),
        stage(ctx, s.op, [("mf_tq", r.q), ("mf_tdo", r.dy)], ir.Var("mf_b0"), SIDE * SGS,
              ctx.span(r.tile), row_place(ctx), stats=True),
        ir.Comment("the simdgroup's blocks: S and dP; dQ"),
        *_scores(s),
        *(resident.declare_rows(s.racc, ("mf_dq",)) if s.mpp else strided.declare(s.gblk, ACC)),
        *key_blocks(ctx, step),
        ir.Comment("the simdgroup's rows' dq"),
        *_put(ctx, s.mpp, s.gblk, (("mf_dq", 0, "dq"),), row_at,
              lambda i: T0 + ir.Cast(IDX, i) < ctx.span(r.tile))]
    summary = (f"{ctx.graph.name} (attention backward, dq, 16x16 blocks): a threadgroup per "
               f"{SIDE * SGS} query rows of a kv head, 16 a simdgroup; per 16 keys S = Q K^T, "
               f"dP = dO V^T, dS as {s.op}, dQ += dS K, on {how(s.low)} with {s.op} operands and "
               "fp32 accumulation")
    return kernel_of(ctx, body, "dq_block", summary, s.helpers, 32 * SGS)


def block_kernel(kind: str, ctx: Ctx, target: Target) -> Optional[ir.LoweredKernel]:
    """The block kernel `kind` ("dq" or "dkdv"); None where the inputs take the fp32
    kernels."""
    s = Setup.of(operand(ctx, target), lowering_of(target))
    return None if s is None else {"dq": _dq, "dkdv": _dkdv}[kind](ctx, s)
