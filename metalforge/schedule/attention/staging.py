"""Staging: each query row's q in registers or threadgroup memory (`stage`, `stage_shared`;
`with_staged` is where a kernel's state finds them) and a lane's K/V elements of a step's keys
loaded into registers (`load_keys`, `own_key_chunks`)."""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from ... import ir
from ...graph import BinaryOp, Node, Op, TensorParam, topo_order
from ..base import IDX
from ..hardware import SIMD_WIDTH
from ..lower import ElementLowering, as_float, compute_type
from .context import SIMD, CallContext, KernelState, lowering, offset
from .loops import each_row, keys, lanes, slots


def staged_nodes(ctx: CallContext) -> list[Node]:
    """What the score contractions read that does not change with the key (each query row's
    q): the outermost such values of their cones."""
    f = ctx.form
    nodes: list[Node] = []
    for r in f.contractions:
        cone = topo_order([r.args[0]])
        fixed = {n for n in cone if f.key not in n.axes and f.e in n.axes}
        nodes += [n for n in cone if n in fixed and n not in nodes and not any(
            n in u.args for u in cone if u in fixed)]
    return nodes


def with_staged(ctx: CallContext, ks: KernelState) -> KernelState:
    """`ks` reading the staged values where `stage` puts them: registers
    `mf_staged<i>[t * epl + j]`, or (lane scores, stage_kv) threadgroup arrays
    `mf_tgq<i>[t * Emax + e]`."""
    nodes = staged_nodes(ctx)
    t = ir.Var("mf_t")
    if ctx.policy.lane_scores or ctx.policy.stage_kv:
        emax = SIMD_WIDTH * ks.epl
        names = {n: f"mf_tgq{i}" for i, n in enumerate(nodes)}
        return replace(ks, staged_tg=names, staged={
            n: ir.Lane(ir.Var(name), t * ir.Lit(emax, "uint") + ir.Var("mf_e"))
            for n, name in names.items()})
    return replace(ks, staged_tg={}, staged={
        n: ir.Lane(ir.Var(f"mf_staged{i}"), t * ir.Lit(ks.epl, "uint") + ir.Var("mf_j"))
        for i, n in enumerate(nodes)})


def stage(ctx: CallContext, ks: KernelState) -> tuple[list[ir.Stmt], list[ir.Stmt]]:
    """Register staging of what the score contractions read that does not change with the
    key (each query row's q): each lane loads its E elements of every row once, before
    the key loop, into `mf_staged<i>[t][j]` (0 past E). With lane scores or stage_kv,
    `stage_shared`. Returns (the statements, stage_kv's stores for the first tile)."""
    nodes = staged_nodes(ctx)
    if ctx.policy.lane_scores or ctx.policy.stage_kv:
        return stage_shared(ctx, ks, nodes)
    out: list[ir.Stmt] = []
    for i, n in enumerate(nodes):
        low = lowering(ctx, ks, f"mf_st{i}_")
        body = low.lower([n])
        ks.out.helpers |= low.helpers
        name = f"mf_staged{i}"
        slot = ir.Lane(ir.Var(name), ir.Var("mf_t") * ir.Lit(ks.epl, "uint")
                       + ir.Var("mf_j"))
        zero = ir.Lit(0.0, "float") if compute_type(n.dtype) == "float" else ir.Lit(
            0, compute_type(n.dtype))
        out += [ir.ArrayDecl(name, compute_type(n.dtype), ks.qt * ks.epl),
                each_row(ctx, ks, [slots(ctx, ks, [ir.Assign(slot, zero)]),
                               lanes(ctx, ks, body + [ir.Assign(slot, low.value(n))])])]
    if out:
        out.insert(0, ir.Comment("each query row's values every key multiplies, in "
                                 "registers (0 past E)"))
    return out, []


def stage_shared(ctx: CallContext, ks: KernelState,
                 nodes: list[Node]) -> tuple[list[ir.Stmt], list[ir.Stmt]]:
    """Threadgroup staging of the same values for lane scores: every lane reads all of a
    row's E values, so the group's threads fill `mf_tgq<i>[t * Emax + e]` together (0 past
    E and for dead rows), then wait at a barrier."""
    emax = SIMD_WIDTH * ks.epl
    tpg = ks.group
    q_stores: list[ir.Stmt] = []
    out: list[ir.Stmt] = [ir.Comment(
        "each query row's values every key multiplies, in threadgroup memory: every lane "
        "reads all of them" + ("; loaded here, stored with the first tile's copies"
                               if ctx.policy.stage_kv else ""))]
    t, e = ir.Var("mf_t"), ir.Var("mf_e")
    for i, n in enumerate(nodes):
        low = lowering(ctx, ks.with_row(t), f"mf_st{i}_")
        body = low.lower([n])
        value = as_float(low.value(n), n)
        ks.out.helpers |= low.helpers
        name = f"mf_tgq{i}"
        slot = ir.Lane(ir.Var(name), t * ir.Lit(emax, "uint") + e)
        zero = ir.Lit(0.0, "float")
        if ctx.policy.stage_kv:
            # declared as float4 (16-byte aligned): tile_scores reads it a float4 at a time
            ks.out.tg_decls.append(ir.ArrayDecl(f"{name}_v", "float4", ks.qt * emax // 4,
                                              "threadgroup"))
            out.append(ir.Decl(name, "threadgroup float*", ir.Call(
                "reinterpret_cast<threadgroup float*>", (ir.Var(f"{name}_v"),)),
                const=False))
        else:
            ks.out.tg_decls.append(ir.ArrayDecl(name, "float", ks.qt * emax, "threadgroup"))
        # the row (mf_t) a run-time value: its positions computed, not read from the
        # tile's arrays
        live = t < ir.Var("mf_nlive")
        where = [ir.Decl("mf_t", "uint", ir.Var("mf_qi") / ir.Lit(emax, "uint")),
                 ir.Decl("mf_e", "uint", ir.Var("mf_qi") % ir.Lit(emax, "uint"))]
        valid = live.and_(ir.Cast(IDX, e) < ctx.size(ctx.form.e))
        if not ctx.policy.stage_kv:
            out.append(ir.For("mf_qi", "uint", ir.Var("mf_sg") * SIMD + ir.Var("mf_lane"),
                              ir.Lit(ks.qt * emax, "uint"), [
                *where, ir.Assign(slot, zero), ir.If(valid, body + [ir.Assign(slot, value)])],
                step=ir.Lit(tpg, "uint")))
            continue
        # stage_kv: the thread's qt x Emax / tpg values loaded into registers here and
        # stored once the first tile's copies are issued (`q_stores`), so that their
        # loads and the tile's wait in one round
        reg = ir.Lane(ir.Var(f"mf_qr{i}"), ir.Var("mf_n"))
        qi = ir.Decl("mf_qi", "uint", ir.Var("mf_sg") * SIMD + ir.Var("mf_lane")
                     + ir.Var("mf_n") * ir.Lit(tpg, "uint"))
        per = ir.Lit(ks.qt * emax // tpg, "uint")
        out += [ir.ArrayDecl(f"mf_qr{i}", "float", ks.qt * emax // tpg),
                ir.For("mf_n", "uint", ir.Lit(0, "uint"), per, [
                    qi, *where, ir.Assign(reg, zero),
                    ir.If(valid, body + [ir.Assign(reg, value)])], unroll=True)]
        q_stores.append(ir.For("mf_n", "uint", ir.Lit(0, "uint"), per, [
            qi, ir.Assign(ir.Lane(ir.Var(name), ir.Var("mf_qi")), reg)], unroll=True))
    if not out[1:]:
        return [], q_stores
    # stage_kv: the first tile's barrier orders the stores before any read of them
    return (out if ctx.policy.stage_kv else out + [ir.Barrier()]), q_stores


def key_value(ctx: CallContext, ks: KernelState, low: ElementLowering) -> None:
    """Let `low` read the staged q and k/v registers instead of loading them."""
    low.values.update(ks.staged)
    slot = ir.Var("mf_u") * ir.Lit(ks.epl, "uint") + ir.Var("mf_j")
    low.values.update({n: ir.Lane(ir.Var(arr), slot) for n, arr in ctx.kv.items()})


def elements(ctx: CallContext, ks: KernelState, n: Node, body: list[ir.Stmt]) -> ir.Stmt:
    """`body` over the lane's E slots: all of them when `n` reads nothing along E but the
    staged registers (slots past E compute values nobody stores), else only those inside
    E (guarded loads)."""
    own = [m for m in topo_order([n]) if m.op in (Op.LOAD, Op.INDEX, Op.TAKE)
           and ctx.form.e in m.axes and m not in ks.staged and m not in ctx.kv]
    return lanes(ctx, ks, body) if own else slots(ctx, ks, body)


def zero_padded(ctx: CallContext, ks: KernelState, n: Node) -> bool:
    """Whether `n` is 0 past E without a guard: a product of staged registers."""
    if n in ks.staged or n in ctx.kv:
        return True
    if n.op == Op.CAST:
        return zero_padded(ctx, ks, n.args[0])
    return n.op == Op.BINARY and n.attr == BinaryOp.MUL and all(zero_padded(ctx, ks, a)
                                                         for a in n.args)


def load_keys(ctx: CallContext, ks: KernelState) -> list[ir.Stmt]:
    """Each key's E elements of k and v for this lane: `vw`-wide vector loads when E is a
    multiple of the width, else guarded scalar loads; 0 past E and past the keys. A gather
    (a paged cache) finds the key's row once, then loads it the same way."""
    out: list[ir.Stmt] = [ir.Comment("this lane's E elements of the step's keys and values, "
                                     "loaded once for all the tile's rows")]
    for n, arr in ctx.kv.items():
        if n not in ks.streamed:
            continue
        t = ctx.tensor_of(n)
        ct = compute_type(t.dtype)
        zero = ir.Lit(0.0, ct) if ct == "float" else ir.Lit(0, ct)
        slot = ir.Var("mf_u") * ir.Lit(ks.epl, "uint") + ir.Var("mf_j")
        find: list[ir.Stmt] = []
        moved: dict[str, ir.Expr] = {}
        if n.op == Op.TAKE:
            low = lowering(ctx, ks, f"{arr}_")
            find, pos = low.gather_position(n)
            ks.out.helpers |= low.helpers
            find.append(ir.Decl(f"mf_{arr}_row", IDX, pos))
            moved[n.attr[1]] = ir.Var(f"mf_{arr}_row")
        src = offset(ctx, ks, t.axes, moved)
        scalar = ir.If(ir.Cast(IDX, ir.Var("mf_e")) < ctx.size(ctx.form.e),
                       [ir.Assign(ir.Lane(ir.Var(arr), slot), ir.Cast(ct, ir.Load(
                           ctx.names[t.name], src)))],
                       [ir.Assign(ir.Lane(ir.Var(arr), slot), zero)])
        guarded: list[ir.Stmt] = [slots(ctx, ks, [
            ir.Decl("mf_e", "uint", ir.Var("mf_sub") * ir.Lit(ks.epl, "uint")
                    + ir.Var("mf_j")), scalar])]
        body = guarded
        if ctx.vw > 1 and t.axes[-1] == ctx.form.e:
            body = [ir.If(ir.Var("mf_vec_ok"), vector_load(ctx, ks, t, src, arr), guarded)]
        out += [ir.ArrayDecl(arr, ct, ctx.kps * ks.epl),
                keys(ctx, ks, find + body, [slots(ctx, ks, [ir.Assign(ir.Lane(ir.Var(arr), slot),
                                                              zero)])])]
    return out


def vector_load(ctx: CallContext, ks: KernelState, t: TensorParam, offset: ir.Expr,
                arr: str) -> list[ir.Stmt]:
    """The lane's reads_per_thread elements of one key as reads_per_thread / vw vector
    loads (the lane's chunk is inside E or wholly past it: E is a multiple of vw)."""
    ct, st, vw = compute_type(t.dtype), ctx.in_stype(t), ctx.vw
    c = ir.Var("mf_c")
    e0 = ir.Var("mf_sub") * ir.Lit(ks.epl, "uint") + c * ir.Lit(vw, "uint")
    slot = ir.Var("mf_u") * ir.Lit(ks.epl, "uint") + c * ir.Lit(vw, "uint") + ir.Var(
        "mf_x")
    elem = ir.Call("mf_lane8", (ir.Var("mf_vec"), ir.Var("mf_x"))) if vw == 8 else ir.Lane(
        ir.Var("mf_vec"), ir.Var("mf_x"))
    zero = ir.Lit(0.0, ct) if ct == "float" else ir.Lit(0, ct)
    if vw == 8:
        ks.out.helpers.add("mf_pack8_of")
    return [ir.For("mf_c", "uint", ir.Lit(0, "uint"), ir.Lit(ks.epl // vw, "uint"), [
        ir.Decl("mf_e", "uint", e0),
        ir.If(ir.Cast(IDX, ir.Var("mf_e")) < ctx.size(ctx.form.e), [
            ir.Decl("mf_vec", ir.vector_type(st, vw),
                    ir.Load(ctx.names[t.name], offset, vw, st)),
            ir.For("mf_x", "uint", ir.Lit(0, "uint"), ir.Lit(vw, "uint"), [
                ir.Assign(ir.Lane(ir.Var(arr), slot), ir.Cast(ct, elem))], unroll=True)],
            [ir.For("mf_x", "uint", ir.Lit(0, "uint"), ir.Lit(vw, "uint"), [
                ir.Assign(ir.Lane(ir.Var(arr), slot), zero)], unroll=True)])],
        unroll=True)]


def own_key_chunks(ctx: CallContext, ks: KernelState,
                   nodes: Sequence[Node]) -> tuple[list[ir.Stmt], list[ir.Stmt]]:
    """For lane scores: (once per key, per chunk) statements putting chunk mf_c (vw
    consecutive E elements from mf_c * vw) of the lane's own key mf_l of each of `nodes`
    into `mf_kc<i>[x]`: a vector load when E is a multiple of vw, else guarded scalar
    loads (0 past E). A gather finds the key's row once."""
    vw = ctx.vw
    find: list[ir.Stmt] = []
    chunk: list[ir.Stmt] = []
    c, x = ir.Var("mf_c"), ir.Var("mf_x")
    e0 = c * ir.Lit(vw, "uint")
    for n in nodes:
        arr = ctx.kv[n]
        t = ctx.tensor_of(n)
        ct, st = compute_type(t.dtype), ctx.in_stype(t)
        zero = ir.Lit(0.0, ct) if ct == "float" else ir.Lit(0, ct)
        moved: dict[str, ir.Expr] = {}
        if n.op == Op.TAKE:
            low = lowering(ctx, ks, f"{arr}_")
            found, pos = low.gather_position(n)
            ks.out.helpers |= low.helpers
            find += found + [ir.Decl(f"mf_{arr}_row", IDX, pos)]
            moved[n.attr[1]] = ir.Var(f"mf_{arr}_row")
        reg = ir.Lane(ir.Var(f"{arr}c"), x)
        scalar = ir.For("mf_x", "uint", ir.Lit(0, "uint"), ir.Lit(vw, "uint"), [
            ir.Decl("mf_e", "uint", e0 + x),
            ir.If(ir.Cast(IDX, ir.Var("mf_e")) < ctx.size(ctx.form.e),
                  [ir.Assign(reg, ir.Cast(ct, ir.Load(ctx.names[t.name],
                                                      offset(ctx, ks, t.axes, moved))))],
                  [ir.Assign(reg, zero)])], unroll=True)
        body: list[ir.Stmt] = [scalar]
        if vw > 1 and t.axes[-1] == ctx.form.e:
            elem = ir.Call("mf_lane8", (ir.Var("mf_vec"), x)) if vw == 8 else ir.Lane(
                ir.Var("mf_vec"), x)
            if vw == 8:
                ks.out.helpers.add("mf_pack8_of")
            body = [ir.If(ir.Var("mf_vec_ok"), [
                ir.Decl("mf_e", "uint", e0),
                ir.Decl("mf_vec", ir.vector_type(st, vw),
                        ir.Load(ctx.names[t.name], offset(ctx, ks, t.axes, moved), vw, st)),
                ir.For("mf_x", "uint", ir.Lit(0, "uint"), ir.Lit(vw, "uint"), [
                    ir.Assign(reg, ir.Cast(ct, elem))], unroll=True)], [scalar])]
        chunk += [ir.ArrayDecl(f"{arr}c", ct, vw)] + body
    return find, chunk
