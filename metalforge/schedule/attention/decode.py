"""The decode kernel without stage_kv (`decode`): a threadgroup per tile of query rows and
block of keys, its simdgroups taking turns over steps of keys, with key streams (`_stream_scan`)
or lane scores (`_lane_scan`), the states merged at the end."""
from __future__ import annotations

from ... import ir
from ...graph import topo_order
from ..base import IDX, make_kernel
from ..hardware import SIMD_WIDTH
from .combine import merge_lanes, merge_streams, share, shared_states
from .context import SIMD, THREADS, CallContext, Emitted, KernelState
from .head import block_keys, group_head, tile
from .scores import dots, lane_dots
from .softmax import empty_states, lane_softmax, softmax_step
from .staging import load_keys, stage, with_staged
from .values import accumulate, lane_values


def kernel(ctx: CallContext) -> ir.LoweredKernel:
    """A threadgroup per (rows that share keys, block of keys): its simdgroups take turns
    over the block's keys, each running mf_kp key streams of mf_w lanes; each stream keeps
    an online-softmax state per row; the states merge across streams (shuffles), then
    simdgroups (threadgroup memory); one block per row writes the outputs, several write
    partial states for the merge kernel. (With stage_kv the decode kernels are `staged`'s.)"""
    f = ctx.form
    nsg = ctx.policy.threads_per_group // SIMD_WIDTH
    epl = ctx.policy.reads_per_thread
    emax = SIMD_WIDTH * epl
    values = set(topo_order([f.values]))
    ks = with_staged(ctx, KernelState(
        Emitted(tg_decls=shared_states(nsg, emax)), qt=ctx.qt,
        group=ctx.policy.threads_per_group, epl=epl,
        streamed=frozenset(n for n in ctx.kv if n in values or not ctx.policy.lane_scores)))
    head = group_head(ctx, ks, nsg) + tile(ctx, ks) + block_keys(ctx, ks)
    staged, _ = stage(ctx, ks)
    loop, tail = _lane_scan(ctx, ks, nsg) if ctx.policy.lane_scores else _stream_scan(ctx, ks, nsg)
    scan: list[ir.Stmt] = [ir.Comment(f"one pass over the block's keys along '{f.key}' "
                                      f"(scores never stored)"), loop]
    body = head + ks.out.pre + staged + empty_states(ctx, ks) + scan + tail
    summary = (f"{ctx.graph.name} (decode): softmax over '{f.key}' of scores contracting "
               f"'{f.e}', times the values, summed over '{f.key}'; a threadgroup per "
               f"{ks.qt} query rows sharing their keys and block of keys, {nsg} "
               f"simdgroups over the keys"
               + (", each lane scoring keys of its own" if ctx.policy.lane_scores else "")
               + ", online softmax in one pass, fp32 state")
    return make_kernel(ctx.graph, ctx.index64, THREADS, ks.out.tg_decls + body, summary,
                       "decode", params=ctx.params, helpers=tuple(sorted(ks.out.helpers)))


def _lane_scan(ctx: CallContext, ks: KernelState, nsg: int) -> tuple[ir.Stmt, list[ir.Stmt]]:
    """Lane scores: the loop over steps of 32 keys a simdgroup, and the merge after it."""
    step: list[ir.Stmt] = [ir.Decl("mf_l", IDX, ir.Var("mf_step")
                                   + ir.Cast(IDX, ir.Var("mf_lane")))]
    scored, dot_of = lane_dots(ctx, ks)
    step += scored + lane_softmax(ctx, ks, dot_of) + lane_values(ctx, ks)
    loop = ir.For("mf_step", IDX, ir.Var("mf_l0") + ir.Cast(IDX, ir.Var("mf_sg") * SIMD),
                  ir.Var("mf_l1"), step, step=ir.Lit(SIMD_WIDTH * nsg, IDX))
    emax = SIMD_WIDTH * ks.epl
    return loop, merge_lanes(ctx, ks) + share(ctx, ks, nsg, emax)


def _stream_scan(ctx: CallContext, ks: KernelState,
                 nsg: int) -> tuple[ir.Stmt, list[ir.Stmt]]:
    """Key streams: the loop over steps of kp x keys_per_step keys a simdgroup, and the
    merge after it."""
    step = load_keys(ctx, ks)                  # emitted in the kernel's order
    scored, dot_of = dots(ctx, ks)
    step += scored + softmax_step(ctx, ks, dot_of) + accumulate(ctx, ks)
    per_step = ir.Cast(IDX, ir.Var("mf_kp") * ir.Lit(ctx.kps, "uint"))
    loop = ir.For("mf_base", IDX,
                  ir.Var("mf_l0") + ir.Cast(IDX, ir.Var("mf_sg")) * per_step,
                  ir.Var("mf_l1"), step, step=per_step * ir.Lit(nsg, IDX))
    emax = SIMD_WIDTH * ks.epl
    return loop, merge_streams(ctx, ks) + share(ctx, ks, nsg, emax)

