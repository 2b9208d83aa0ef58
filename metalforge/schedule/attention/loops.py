"""The loops every attention kernel is written with: a lane's E slots (`slots`, `lanes`), a
tile's rows (`each_row`, `every_row`), a step's keys (`each_key`, `keys`)."""
from __future__ import annotations

from typing import Callable, Sequence

from ... import ir
from ...graph import Node, Op, topo_order
from ..base import IDX
from ..hardware import SIMD_WIDTH
from .context import CallContext, KernelState


def slots(ctx: CallContext, ks: KernelState, body: list[ir.Stmt]) -> ir.Stmt:
    """`body` for each of the lane's E slots mf_j < reads_per_thread (unrolled)."""
    return ir.For("mf_j", "uint", ir.Lit(0, "uint"), ir.Lit(ks.epl, "uint"), body,
                  unroll=True)


def slot_e(ctx: CallContext, ks: KernelState) -> ir.Expr:
    """The E element of the lane's slot mf_j: mf_sub * reads_per_thread + j (a lane holds
    reads_per_thread consecutive elements of a key spread over mf_w lanes); in the
    stage_kv kernel, all 32 lanes over E (the narrow kernel: 16 per key stream), `run`
    consecutive elements each per stretch of 32 x run (E = 128: 4 each; narrow: 16 x
    run)."""
    j = ir.Var("mf_j")
    if ks.over_e:
        run = ir.Lit(ctx.run, "uint")
        return (j / run * ir.Lit(ks.vlanes * ctx.run, "uint") + vlane(ctx, ks) * run
                + j % run)
    return ir.Var("mf_sub") * ir.Lit(ks.epl, "uint") + j


def vlane(ctx: CallContext, ks: KernelState) -> ir.Expr:
    """The lane's place among the value lanes of its key stream (stage_kv)."""
    lane = ir.Var("mf_lane")
    return lane if ks.vlanes == SIMD_WIDTH else lane % ir.Lit(ks.vlanes, "uint")


def lanes(ctx: CallContext, ks: KernelState, body: list[ir.Stmt]) -> ir.Stmt:
    """`body` for each of the lane's E elements mf_e = slot_e() inside E."""
    e = slot_e(ctx, ks)
    return slots(ctx, ks, [
        ir.Decl("mf_e", "uint", e),
        ir.If(ir.Cast(IDX, ir.Var("mf_e")) < ctx.size(ctx.form.e), body)])


def each_row(ctx: CallContext, ks: KernelState, body: list[ir.Stmt]) -> ir.Stmt:
    """`body` for each row mf_t < rows_per_group of the tile that exists (unrolled; the
    rows that exist are the first mf_nlive, the same in every thread of the group)."""
    t = ir.Var("mf_t")
    return every_row(ctx, ks, [ir.If(t < ir.Var("mf_nlive"), body)])


def every_row(ctx: CallContext, ks: KernelState, body: list[ir.Stmt]) -> ir.Stmt:
    """`body` for every row mf_t < rows_per_group of the tile, those past its end too:
    straight-line code for work whose results the rows past the end never use and that
    reads nothing they lack (registers, the staged tiles and rows)."""
    return ir.For("mf_t", "uint", ir.Lit(0, "uint"), ir.Lit(ks.qt, "uint"), body,
                  unroll=True)


def rows_reading(ctx: CallContext, ks: KernelState, roots: Sequence[Node],
                 known: set[Node]) -> Callable[[list[ir.Stmt]], ir.Stmt]:
    """The row loop for work computing `roots`: every_row when it reads no tensor but
    those in `known` (already in registers or threadgroup memory), so that a row past the
    tile's end may compute it; else each_row."""
    if all(n in known for n in topo_order(list(roots)) if n.op in (Op.LOAD, Op.TAKE)):
        return lambda body: every_row(ctx, ks, body)
    return lambda body: each_row(ctx, ks, body)


def each_key(ctx: CallContext, ks: KernelState, body: list[ir.Stmt]) -> ir.Stmt:
    """`body` for each key mf_u < keys_per_step of the lane's key stream (unrolled)."""
    return ir.For("mf_u", "uint", ir.Lit(0, "uint"), ir.Lit(ctx.kps, "uint"), body,
                  unroll=True)


def keys(ctx: CallContext, ks: KernelState, body: list[ir.Stmt],
         past: Sequence[ir.Stmt] = ()) -> ir.Stmt:
    """`body` for each key mf_l = mf_base + u * kp + grp of the step inside the block's
    keys (the simdgroup's kp key streams interleave; with lane scores, inside the 32 keys
    the simdgroup scored, mf_lend); `past` for keys past the end."""
    key = ir.Var("mf_base") + ir.Cast(IDX, ir.Var("mf_u") * ir.Var("mf_kp")
                                      + ir.Var("mf_grp"))
    end = ir.Var("mf_lend" if ctx.policy.lane_scores else "mf_l1")
    return each_key(ctx, ks, [
        ir.Decl("mf_l", IDX, key),
        ir.If(ir.Var("mf_l") < end, body, list(past))])
