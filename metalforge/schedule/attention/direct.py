"""The direct decode kernels (launch={'decode_direct': True}): no threadgroup staging and no
barrier in the key loop. Each simdgroup streams its own keys from device memory straight into
registers and keeps its own online-softmax states; the simdgroups of the threadgroup merge
once at the end through threadgroup memory, the key blocks in the merge kernel.

Layout (E = 128, f16, reads_per_thread 8): a key's row is 256 bytes, 16 lanes x one 16-byte
load, so one load instruction of the simdgroup covers 2 keys (its 2 key streams); E = 64:
8 lanes a key, 4 keys. Three kernels by E, each with its lanes per key fixed at compile time
(`direct_narrow` 8, `direct` 16, `direct_wide` 32 lanes: E up to 8 / 16 / 32 x
reads_per_thread); the host passes the same count as mf_w. Per step a key stream takes
keys_per_step keys: their K and V loads are all issued first (loads in flight), then

- partial dots: each lane's E elements of every (key, row) of the step against the rows' q
  held in registers (each lane the q elements of its chunk for every row of the tile: the
  kv head's query rows share every K/V load);
- one reduce-scatter butterfly over the key's lanes for all N = keys x rows partials at once
  (N/2 + N/4 + ... shuffles, not N per butterfly step): afterwards each lane holds whole
  dot products of its own (key, row) pairs;
- the scores' elementwise work (scale, masks, soft caps) once per pair, in the lane that
  holds it; then every lane of the stream gathers the step's N scores (N indexed shuffles);
- per row one online-softmax update, its rescale of d and acc skipped where the row's max did
  not move (its factor would be exactly 1: long contexts mostly skip it), then acc += p v
  (each lane its reads_per_thread E elements of every row).
"""
from __future__ import annotations

from typing import Mapping

from ... import ir
from ...graph import Node
from ..base import IDX, make_kernel
from ..hardware import SIMD_WIDTH
from ..online import NEG_INF
from .combine import merge_streams, share, shared_states
from .context import THREADS, CallContext, Emitted, KernelState
from .head import block_keys, group_head, tile
from .scores import partial_dots, score
from .softmax import empty_states, update_rows
from .staging import load_keys, stage, with_staged
from .values import accumulate

# the kernels' lanes per key (narrow, decode, wide): E up to lanes x reads_per_thread
LANES = (8, 16, 32)


def kernel(ctx: CallContext, lanes: int) -> ir.LoweredKernel:
    """The direct decode kernel with `lanes` lanes per key (8, 16 or 32)."""
    f = ctx.form
    tpg = ctx.policy.threads_per_group
    nsg, epl, kps = tpg // SIMD_WIDTH, ctx.policy.reads_per_thread, ctx.kps
    kp = SIMD_WIDTH // lanes
    emax = lanes * epl
    ks = with_staged(ctx, KernelState(
        Emitted(tg_decls=shared_states(nsg, emax)), qt=ctx.qt, group=tpg, epl=epl,
        streamed=frozenset(ctx.kv)))
    what = (f"{nsg} simdgroups, each streaming its own keys into registers ({kp} key "
            f"streams of {lanes} lanes, {epl} consecutive E elements a lane, "
            f"{kps} keys a stream per step)")
    head = group_head(ctx, ks, nsg, what, lanes=lanes) + tile(ctx, ks) + block_keys(ctx, ks)
    staged, _ = stage(ctx, ks)
    step = load_keys(ctx, ks) + reduced_scores(ctx, ks, lanes) + update_rows(ctx, ks, True) \
        + accumulate(ctx, ks)
    per_step = ir.Lit(kp * kps, IDX)
    loop = ir.For("mf_base", IDX, ir.Var("mf_l0") + ir.Cast(IDX, ir.Var("mf_sg")) * per_step,
                  ir.Var("mf_l1"), step, step=ir.Lit(kp * kps * nsg, IDX))
    scan: list[ir.Stmt] = [ir.Comment(f"one pass over the block's keys along '{f.key}', "
                                      "no barrier (scores never stored)"), loop]
    tail = merge_streams(ctx, ks, lanes) + share(ctx, ks, nsg, emax)
    body = head + ks.out.pre + staged + empty_states(ctx, ks) + scan + tail
    name = {8: "direct_narrow", 16: "direct", 32: "direct_wide"}[lanes]
    summary = (f"{ctx.graph.name} ({name}): softmax over '{f.key}' of scores contracting "
               f"'{f.e}' (up to {emax}), times the values, summed over '{f.key}'; a "
               f"threadgroup per {ks.qt} query rows sharing their keys and block of keys; "
               f"{nsg} simdgroups each streaming its own keys from device memory into "
               f"registers, no threadgroup staging, no barrier in the key loop; a key's "
               f"partial dots reduced by one reduce-scatter butterfly; online softmax in one "
               f"pass, fp32 state")
    return make_kernel(ctx.graph, ctx.index64, THREADS, ks.out.tg_decls + body, summary,
                       name, params=ctx.params, helpers=tuple(sorted(ks.out.helpers)))


def reduced_scores(ctx: CallContext, ks: KernelState, lanes: int) -> list[ir.Stmt]:
    """The step's scores mf_sc[u * qt + t] in every lane of the key stream: the partial
    dots, reduce-scattered over the key's lanes (`reduce_scatter`), each lane's own pairs
    scored (`own_scores`), then gathered (`gather_scores`)."""
    n = ctx.kps * ks.qt
    out: list[ir.Stmt] = [ir.Comment(
        f"scores: each lane's part of every (key, row) contraction, then one reduce-scatter "
        f"over the key's {lanes} lanes for all {n} of them: lane mf_sub then holds whole "
        f"ones, pair (mf_sub * {n}) / {lanes} on")]
    own: dict[Node, ir.Expr] = {}
    for i, (r, (_, part)) in enumerate(partial_dots(ctx, ks).items()):
        arr = f"mf_dot{i}"
        out += part + [ir.Block(reduce_scatter(arr, n, lanes))]
        own[r] = ir.Lane(ir.Var(arr), ir.Var("mf_o"))
    return out + own_scores(ctx, ks, lanes, own) + gather_scores(ks, n, lanes)


def reduce_scatter(arr: str, n: int, lanes: int) -> list[ir.Stmt]:
    """`arr`'s n values summed over the key's lanes, each lane keeping a share: at offset
    o (lanes / 2 down to 1) a lane keeps the upper half of its values if its bit o is set,
    else the lower, and adds its partner's copy of that half (one shuffle a kept value).
    Afterwards lane sub holds the sums of values sub * n / lanes + j, j < max(1, n / lanes)
    (from n < lanes on, the last steps are plain butterflies of one value)."""
    out: list[ir.Stmt] = []
    live, off = n, lanes // 2
    x = ir.Var("mf_x")
    while off >= 1:
        o = ir.Lit(off, "uint")
        if live > 1:
            half = live // 2
            hi = ir.Var(f"mf_hi{off}")
            low, high = ir.Lane(ir.Var(arr), x), ir.Lane(ir.Var(arr), x + ir.Lit(half, "uint"))
            out += [ir.Decl(f"mf_hi{off}", "bool", (ir.Var("mf_lane") & o).ne(
                        ir.Lit(0, "uint"))),
                    ir.For("mf_x", "uint", ir.Lit(0, "uint"), ir.Lit(half, "uint"), [
                        ir.Decl("mf_keep", "float", ir.Select(hi, high, low)),
                        ir.Decl("mf_give", "float", ir.Select(hi, low, high)),
                        ir.Assign(low, ir.Var("mf_keep") + ir.Call(
                            "simd_shuffle_xor", (ir.Var("mf_give"), o)))], unroll=True)]
            live = half
        else:
            first = ir.Lane(ir.Var(arr), ir.Lit(0, "uint"))
            out.append(ir.Assign(first, first + ir.Call("simd_shuffle_xor", (first, o))))
        off //= 2
    return out


def own_scores(ctx: CallContext, ks: KernelState, lanes: int,
               own: Mapping[Node, ir.Expr]) -> list[ir.Stmt]:
    """The scores' elementwise work on the lane's own whole dots (`own`: contraction ->
    its value at own slot mf_o), into mf_so[mf_o]: pair mf_i = key mf_u, row mf_t (-inf
    for a key past the block's end or a row past the tile's)."""
    n = ctx.kps * ks.qt
    per = max(1, n // lanes)
    qt = ir.Lit(ks.qt, "uint")
    first = ir.Var("mf_sub") * ir.Lit(n // lanes, "uint") if n >= lanes else \
        ir.Var("mf_sub") / ir.Lit(lanes // n, "uint")
    body, value = score(ctx, ks.with_row(ir.Var("mf_t")), own)
    so = ir.Lane(ir.Var("mf_so"), ir.Var("mf_o"))
    live = (ir.Var("mf_l") < ir.Var("mf_l1")).and_(ir.Var("mf_t") < ir.Var("mf_nlive"))
    return [
        ir.Comment("the lane's own pairs: the scores' elementwise work, once a pair"),
        ir.ArrayDecl("mf_so", "float", per),
        ir.For("mf_o", "uint", ir.Lit(0, "uint"), ir.Lit(per, "uint"), [
            ir.Decl("mf_i", "uint", first + ir.Var("mf_o")),
            ir.Decl("mf_u", "uint", ir.Var("mf_i") / qt),
            ir.Decl("mf_t", "uint", ir.Var("mf_i") % qt),
            ir.Decl("mf_l", IDX, ir.Var("mf_base") + ir.Cast(
                IDX, ir.Var("mf_u") * ir.Var("mf_kp") + ir.Var("mf_grp"))),
            ir.If(live, body + [ir.Assign(so, value)], [ir.Assign(so, NEG_INF)])],
            unroll=True)]


def gather_scores(ks: KernelState, n: int, lanes: int) -> list[ir.Stmt]:
    """Every lane of the key stream gets the step's n scores mf_sc[i] from the lanes that
    hold them (pair i: lane i * lanes / n of the stream, or with n > lanes lane i / (n /
    lanes), its own slot i % (n / lanes))."""
    i = ir.Var("mf_i")
    src: ir.Expr
    slot: ir.Expr
    if n >= lanes:
        src, slot = i / ir.Lit(n // lanes, "uint"), i % ir.Lit(n // lanes, "uint")
    else:
        src, slot = i * ir.Lit(lanes // n, "uint"), ir.Lit(0, "uint")
    lane = ir.Var("mf_grp") * ir.Lit(lanes, "uint") + src
    return [
        ir.Comment("every lane of the key stream: all the step's scores"),
        ir.ArrayDecl("mf_sc", "float", n),
        ir.For("mf_i", "uint", ir.Lit(0, "uint"), ir.Lit(n, "uint"), [
            ir.Assign(ir.Lane(ir.Var("mf_sc"), i), ir.Call(
                "simd_shuffle", (ir.Lane(ir.Var("mf_so"), slot), lane)))], unroll=True)]
