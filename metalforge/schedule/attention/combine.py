"""Merging online-softmax states: across a simdgroup's key streams and lanes (shuffles) and
across the simdgroups of a threadgroup (through threadgroup memory), then writing the row."""
from __future__ import annotations

from typing import Callable

from ... import ir
from .. import online
from ..online import NEG_INF
from .context import SIMD, CallContext, KernelState
from .loops import each_row, lanes, slots
from .write import write_row


def merge_streams(ctx: CallContext, ks: KernelState) -> list[ir.Stmt]:
    """Merge the simdgroup's kp key streams (lanes mf_w apart hold the same E elements of
    different keys) by an xor butterfly; afterwards every stream holds the merge."""
    t, off = ir.Var("mf_t"), ir.Var("mf_off")
    m, d = ir.Lane(ir.Var("mf_m"), t), ir.Lane(ir.Var("mf_d"), t)
    acc = ir.Lane(ir.Var("mf_acc"), t * ir.Lit(ks.epl, "uint") + ir.Var("mf_j"))
    mo, mx = ir.Var("mf_mo"), ir.Var("mf_mx")

    def weight(ms: ir.Expr) -> ir.Expr:
        return online.share(ms, mx)
    return [
        ir.Comment("merge the simdgroup's key streams"),
        ir.For("mf_off", "uint", ir.Var("mf_w"), SIMD, [each_row(ctx, ks, [
            ir.Decl("mf_mo", "float", ir.Call("simd_shuffle_xor", (m, off))),
            ir.Decl("mf_do", "float", ir.Call("simd_shuffle_xor", (d, off))),
            ir.Decl("mf_mx", "float", ir.Call("mf_maximum", (m, mo))),
            ir.Decl("mf_c1", "float", weight(m)),
            ir.Decl("mf_c2", "float", weight(mo)),
            ir.Assign(d, d * ir.Var("mf_c1") + ir.Var("mf_do") * ir.Var("mf_c2")),
            slots(ctx, ks, [ir.Assign(acc, acc * ir.Var("mf_c1") + ir.Call(
                "simd_shuffle_xor", (acc, off)) * ir.Var("mf_c2"))]),
            ir.Assign(m, mx)])], step=off)]


def merge_lanes(ctx: CallContext, ks: KernelState) -> list[ir.Stmt]:
    """Lane scores: the simdgroup's state. m is the same in every lane; d is summed over
    the lanes, acc over the key streams (lanes mf_w apart hold the same E elements)."""
    t, off = ir.Var("mf_t"), ir.Var("mf_off")
    d = ir.Lane(ir.Var("mf_d"), t)
    acc = ir.Lane(ir.Var("mf_acc"), t * ir.Lit(ks.epl, "uint") + ir.Var("mf_j"))
    return [
        ir.Comment("the simdgroup's state: d summed over its lanes, acc over its key "
                   "streams"),
        each_row(ctx, ks, [
            ir.Assign(d, ir.Call("simd_sum", (d,))),
            ir.For("mf_off", "uint", ir.Var("mf_w"), SIMD, [slots(ctx, ks, [ir.Assign(
                acc, acc + ir.Call("simd_shuffle_xor", (acc, off)))])], step=off)])]


def merge_states(ctx: CallContext, ks: KernelState, count: ir.Expr, m_of: Callable[[ir.Expr],
                 ir.Expr],
                 d_of: Callable[[ir.Expr], ir.Expr],
                 acc_of: Callable[[ir.Expr, ir.Expr], ir.Expr]) -> list[ir.Stmt]:
    """(mf_mm, mf_md, mf_macc) = the merge of `count` states s (m_of(s), d_of(s),
    acc_of(s, e)): the largest max M, then d = sum d_s c_s and acc = sum acc_s c_s with
    c_s = exp(m_s - M) (0 for an empty state, m_s = -inf; NaN in any state makes the
    result NaN)."""
    s, c = ir.Var("mf_s"), ir.Var("mf_c")
    acc = ir.Lane(ir.Var("mf_macc"), ir.Var("mf_j"))
    e = ir.Var("mf_e")
    return [
        ir.Decl("mf_mm", "float", NEG_INF, const=False),
        ir.Decl("mf_md", "float", ir.Lit(0.0, "float"), const=False),
        ir.ArrayDecl("mf_macc", "float", ks.epl),
        slots(ctx, ks, [ir.Assign(acc, ir.Lit(0.0, "float"))]),
        ir.For("mf_s", "uint", ir.Lit(0, "uint"), count, [
            ir.Assign(ir.Var("mf_mm"), ir.Call("mf_maximum", (ir.Var("mf_mm"), m_of(s))))]),
        ir.For("mf_s", "uint", ir.Lit(0, "uint"), count, [
            ir.Decl("mf_ms", "float", m_of(s)),
            ir.Decl("mf_c", "float", online.share(ir.Var("mf_ms"), ir.Var("mf_mm"))),
            ir.Assign(ir.Var("mf_md"), ir.Var("mf_md") + d_of(s) * c),
            lanes(ctx, ks, [ir.Assign(acc, acc + acc_of(s, e) * c)])])]


def shared_states(nsg: int, emax: int) -> list[ir.Stmt]:
    """Threadgroup memory for nsg simdgroups' online-softmax states (m, d, acc[emax])."""
    return [ir.ArrayDecl("mf_tg_m", "float", nsg, "threadgroup"),
            ir.ArrayDecl("mf_tg_d", "float", nsg, "threadgroup"),
            ir.ArrayDecl("mf_tg_acc", "float", nsg * emax, "threadgroup")]


def put_state(ctx: CallContext, ks: KernelState, emax: int, m: ir.Expr, d: ir.Expr,
              acc: Callable[[ir.Expr], ir.Expr]) -> ir.Stmt:
    """This simdgroup's state into `shared_states` (its first key stream's lanes: lane 0
    m and d, each lane its E slots mf_sub * reads_per_thread + j, acc(j))."""
    j = ir.Var("mf_j")
    e = ir.Var("mf_sub") * ir.Lit(ks.epl, "uint") + j
    zero = ir.Lit(0, "uint")
    return ir.If(ir.Var("mf_grp").eq(zero), [
        ir.If(ir.Var("mf_lane").eq(zero), [
            ir.Assign(ir.Lane(ir.Var("mf_tg_m"), ir.Var("mf_sg")), m),
            ir.Assign(ir.Lane(ir.Var("mf_tg_d"), ir.Var("mf_sg")), d)]),
        slots(ctx, ks, [ir.Assign(ir.Lane(ir.Var("mf_tg_acc"), ir.Var("mf_sg")
                                      * ir.Lit(emax, "uint") + e), acc(j))])])


def merge_shared(ctx: CallContext, ks: KernelState, nsg: int, emax: int) -> list[ir.Stmt]:
    """(mf_mm, mf_md, mf_macc) = the merge of the nsg states in `shared_states`."""
    return merge_states(ctx, ks,
        ir.Lit(nsg, "uint"),
        lambda s: ir.Lane(ir.Var("mf_tg_m"), s), lambda s: ir.Lane(ir.Var("mf_tg_d"), s),
        lambda s, e: ir.Lane(ir.Var("mf_tg_acc"), s * ir.Lit(emax, "uint") + e))


def share(ctx: CallContext, ks: KernelState, nsg: int, emax: int) -> list[ir.Stmt]:
    """Row by row: the simdgroups' states through threadgroup memory, merged by
    simdgroup 0, which writes the outputs (one block) or the block's partial state."""
    t = ir.Var("mf_t")
    first = ir.Var("mf_grp").eq(ir.Lit(0, "uint"))
    return [
        ir.Comment("row by row: merge the simdgroups' states through threadgroup memory"),
        each_row(ctx, ks, [
            put_state(ctx, ks, emax, ir.Lane(ir.Var("mf_m"), t), ir.Lane(ir.Var("mf_d"), t),
                           lambda j: ir.Lane(ir.Var("mf_acc"),
                                             t * ir.Lit(ks.epl, "uint") + j)),
            ir.Barrier(),
            ir.If(ir.Var("mf_sg").eq(ir.Lit(0, "uint")).and_(first),
                  merge_shared(ctx, ks, nsg, emax) + [write_row(ctx, ks)]),
            ir.Barrier()])]
