"""The values: acc += p v for a step's keys (`accumulate`), for lane scores (`lane_values`,
each key's weight from the lane that scored it) and for a staged tile (`tile_values`)."""
from __future__ import annotations

from typing import Mapping, Optional

from ... import ir
from ...graph import Node, topo_order
from ..base import IDX
from ..hardware import SIMD_WIDTH
from ..lower import as_float, compute_type
from .context import SIMD, CallContext, KernelState, lowering
from .loops import each_key, each_row, every_row, keys, lanes, rows_reading, slots, vlane
from .staging import elements, key_value, load_keys
from .tiles import tile_reads


def accumulate(ctx: CallContext, ks: KernelState) -> list[ir.Stmt]:
    """acc += p v for every (row, key) of the step."""
    f = ctx.form
    vals = lowering(ctx, ks, "mf_w")
    key_value(ctx, ks, vals)
    body = vals.lower([f.values])
    ks.out.helpers |= vals.helpers
    t = ir.Var("mf_t")
    acc = ir.Lane(ir.Var("mf_acc"), t * ir.Lit(ks.epl, "uint") + ir.Var("mf_j"))
    p = ir.Lane(ir.Var("mf_p"), ir.Var("mf_u") * ir.Lit(ks.qt, "uint") + t)
    return [ir.Comment("the values: acc += p v"),
            keys(ctx, ks, [each_row(ctx, ks, [elements(ctx, ks, f.values, body + [
                ir.Assign(acc, acc + p * as_float(vals.value(f.values), f.values))])])])]


def lane_values(ctx: CallContext, ks: KernelState) -> list[ir.Stmt]:
    """Lane scores: the step's 32 keys' values, kp * keys_per_step at a time in the usual
    layout (a key's E elements over mf_w lanes, kp key streams), each key's weight p
    fetched from the lane that scored it."""
    t, u = ir.Var("mf_t"), ir.Var("mf_u")
    p = ir.Lane(ir.Var("mf_p"), u * ir.Lit(ks.qt, "uint") + t)
    # the lane that scored key mf_i + u * kp + grp (past the step's 32 keys: unused, but a
    # shuffle must still name a lane of the simdgroup)
    src = (ir.Var("mf_i") + u * ir.Var("mf_kp") + ir.Var("mf_grp")) % SIMD
    per = ir.Var("mf_kp") * ir.Lit(ctx.kps, "uint")
    return [ir.Decl("mf_lend", IDX, ir.Call("min", (ir.Var("mf_l1"), ir.Var("mf_step")
                                                    + ir.Lit(SIMD_WIDTH, IDX)))),
            ir.For("mf_i", "uint", ir.Lit(0, "uint"), SIMD, [
        ir.Decl("mf_base", IDX, ir.Var("mf_step") + ir.Cast(IDX, ir.Var("mf_i"))),
        *load_keys(ctx, ks),
        ir.ArrayDecl("mf_p", "float", ctx.kps * ks.qt),
        each_key(ctx, ks, [each_row(ctx, ks, [ir.Assign(p, ir.Call(
            "simd_shuffle", (ir.Lane(ir.Var("mf_ps"), t), src)))])]),
        *accumulate(ctx, ks)], step=per)]


def _key_weights(ks: KernelState) -> list[ir.Stmt]:
    """Key mf_u's weights of all rows into registers mf_pk[t]: float4 reads when the rows
    are a multiple of 4."""
    qt = ks.qt
    u, t = ir.Var("mf_u"), ir.Var("mf_t")
    pk = ir.Lane(ir.Var("mf_pk"), t)
    if qt % 4 == 0:
        y, z = ir.Var("mf_y"), ir.Var("mf_z")
        weights: list[ir.Stmt] = [ir.For("mf_y", "uint", ir.Lit(0, "uint"),
                                         ir.Lit(qt // 4, "uint"), [
            ir.Decl("mf_p4", "float4", ir.Load("mf_tg_pf", u * ir.Lit(qt, "uint")
                                               + y * ir.Lit(4, "uint"), 4, "float",
                                               space="threadgroup")),
            ir.For("mf_z", "uint", ir.Lit(0, "uint"), ir.Lit(4, "uint"), [
                ir.Assign(ir.Lane(ir.Var("mf_pk"), y * ir.Lit(4, "uint") + z),
                          ir.Lane(ir.Var("mf_p4"), z))], unroll=True)], unroll=True)]
    else:
        weights = [ir.For("mf_t", "uint", ir.Lit(0, "uint"), ir.Lit(qt, "uint"), [
            ir.Assign(pk, ir.Lane(ir.Var("mf_tg_pf"), u * ir.Lit(qt, "uint") + t))],
            unroll=True)]
    weights.insert(0, ir.ArrayDecl("mf_pk", "float", qt))
    return weights


def _run_reads(ctx: CallContext, vnodes: list[Node]
               ) -> tuple[list[ir.Stmt], dict[Node, ir.Expr]]:
    """Key mf_u's run of `run` elements from mf_e0 of each staged V read as one vector read,
    converted once for all the rows: (the reads, the values as registers)."""
    run, u, x, e0 = ctx.run, ir.Var("mf_u"), ir.Var("mf_x"), ir.Var("mf_e0")
    reads: list[ir.Stmt] = []
    for n in vnodes:
        arr = ctx.kv[n]
        st = ctx.in_stype(ctx.tensor_of(n))
        reads.append(ir.Decl(f"{arr}v", ir.vector_type(st, run), ir.Load(
            arr, u * ir.Var(f"{arr}_stride") + e0, run, st, space="threadgroup")))
        # converted once for all the rows
        ct = compute_type(ctx.tensor_of(n).dtype)
        reads += [ir.ArrayDecl(f"{arr}f", ct, run), ir.For(
            "mf_x", "uint", ir.Lit(0, "uint"), ir.Lit(run, "uint"), [ir.Assign(
                ir.Lane(ir.Var(f"{arr}f"), x),
                ir.Cast(ct, ir.Lane(ir.Var(f"{arr}v"), x)))], unroll=True)]
    regs: dict[Node, ir.Expr] = {n: ir.Lane(ir.Var(f"{ctx.kv[n]}f"), x) for n in vnodes}
    return reads, regs


def tile_values(ctx: CallContext, ks: KernelState) -> list[ir.Stmt]:
    """This simdgroup's accumulators (every row) rescaled by the rows' factors, then
    acc[t] += p[t] v for its mf_ks keys of the tile one after another, the lanes over E
    reading v from the staged tile once for all rows (the narrow kernel: in key streams of
    NARROW_LANES lanes). Each key's weights of all rows are one read (float4s when the
    rows are a multiple of 4). Per stretch of vlanes x run elements, the lane's run
    consecutive ones as one vec<T, run> read when E is a multiple of run (mf_run_ok: the
    lane's run is wholly inside E or past it, decided once per stretch, not per key), else
    one by one (guarded)."""
    f, run = ctx.form, ctx.run
    u, x, t = ir.Var("mf_u"), ir.Var("mf_x"), ir.Var("mf_t")
    acc = ir.Lane(ir.Var("mf_racc"), t * ir.Lit(ks.epl, "uint") + ir.Var("mf_j"))
    pk = ir.Lane(ir.Var("mf_pk"), t)
    vnodes = [n for n in ctx.kv if n in topo_order([f.values])]

    def add(reads: Mapping[Node, ir.Expr]) -> list[ir.Stmt]:
        vals = lowering(ctx, ks, "mf_w")
        vals.values.update(ks.staged)
        vals.values.update(reads)
        body = vals.lower([f.values])
        ks.out.helpers |= vals.helpers
        return body + [ir.Assign(acc, acc + pk * as_float(vals.value(f.values), f.values))]

    streams = SIMD_WIDTH // ks.vlanes
    weights = _key_weights(ks)

    def each_key(body: list[ir.Stmt]) -> ir.Stmt:
        """body for the simdgroup's keys of the tile: every one, or (narrow) every
        streams-th from the lane's stream."""
        first: ir.Expr = ir.Var("mf_u0")
        step: Optional[ir.Expr] = None
        if streams > 1:
            first = first + ir.Var("mf_lane") / ir.Lit(ks.vlanes, "uint")
            step = ir.Lit(streams, "uint")
        return ir.For("mf_u", "uint", first, ir.Var("mf_u1"), [
            ir.Decl("mf_l", IDX, ir.Var("mf_tk") + ir.Cast(IDX, u)), *weights, *body],
            step=step)
    by_elems = each_key([each_row(ctx, ks, [lanes(ctx, ks, add(tile_reads(ctx, ks)))])])
    each: ir.Stmt = by_elems
    # a vector of run elements is aligned: rows start 16-byte aligned at multiples of vw
    # elements (plus PAD_BYTES), the lane's run at a multiple of run
    if run in (2, 4) and ctx.vw % run == 0:
        e0 = ir.Var("mf_e0")
        reads, regs = _run_reads(ctx, vnodes)
        # rows past the tile's end have weight 0 (tile_softmax): unguarded when the
        # values read nothing but the tile and the staged rows
        rows = rows_reading(ctx, ks, [f.values], set(vnodes) | set(ks.staged))
        by_runs = ir.For("mf_s", "uint", ir.Lit(0, "uint"), ir.Lit(ks.epl // run, "uint"), [
            ir.Decl("mf_e0", "uint", ir.Var("mf_s") * ir.Lit(ks.vlanes * run, "uint")
                    + vlane(ctx, ks) * ir.Lit(run, "uint")),
            ir.If(ir.Cast(IDX, e0) < ctx.size(f.e), [each_key(reads + [rows([
                ir.For("mf_x", "uint", ir.Lit(0, "uint"), ir.Lit(run, "uint"), [
                    ir.Decl("mf_j", "uint", ir.Var("mf_s") * ir.Lit(run, "uint") + x),
                    ir.Decl("mf_e", "uint", e0 + x), *add(regs)], unroll=True)])])])],
            unroll=True)
        each = ir.If(ir.Var("mf_run_ok"), [by_runs], [by_elems])
    return [
        ir.Comment("the values: this simdgroup's accumulators rescaled by each row's "
                   "factor, then acc[t] += p[t] v over its keys of the tile"),
        every_row(ctx, ks, [ir.Decl("mf_c", "float", ir.Lane(ir.Var("mf_tg_c"), t)),
                         slots(ctx, ks, [ir.Assign(acc, acc * ir.Var("mf_c"))])]),
        ir.Decl("mf_u0", "uint", ir.Var("mf_sg") * ir.Var("mf_ks")),
        ir.Decl("mf_u1", "uint", ir.Call("min", (ir.Var("mf_u0") + ir.Var("mf_ks"),
                                                 ir.Var("mf_tn")))),
        ir.Comment(f"{run} consecutive elements a lane per stretch of "
                   f"{ks.vlanes * run}" + (
                       f"; {streams} key streams of {ks.vlanes} lanes taking the keys "
                       f"in turn" if streams > 1 else "")),
        each]
