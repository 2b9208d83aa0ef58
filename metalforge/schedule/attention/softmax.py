"""The online-softmax updates: empty states, one update per step of keys (`softmax_step`), per
simdgroup of lane scores (`lane_softmax`) and per staged tile (`tile_softmax`)."""
from __future__ import annotations

from typing import Mapping

from ... import ir
from ...graph import Node
from .. import online
from ..hardware import SIMD_WIDTH
from ..online import NEG_INF
from .context import CallContext, KernelState
from .loops import each_key, each_row, keys, slots
from .scores import score


def empty_states(ctx: CallContext, ks: KernelState) -> list[ir.Stmt]:
    """Empty online-softmax states for the tile's rows: m = -inf, d = 0, acc = 0."""
    t = ir.Var("mf_t")
    return [ir.ArrayDecl("mf_m", "float", ks.qt), ir.ArrayDecl("mf_d", "float", ks.qt),
            ir.ArrayDecl("mf_acc", "float", ks.qt * ks.epl),
            ir.For("mf_t", "uint", ir.Lit(0, "uint"), ir.Lit(ks.qt, "uint"), [
                ir.Assign(ir.Lane(ir.Var("mf_m"), t), NEG_INF),
                ir.Assign(ir.Lane(ir.Var("mf_d"), t), ir.Lit(0.0, "float")),
                slots(ctx, ks, [ir.Assign(ir.Lane(ir.Var("mf_acc"), t * ir.Lit(ks.epl, "uint")
                                              + ir.Var("mf_j")), ir.Lit(0.0, "float"))])],
                   unroll=True)]


def _row_state(ks: KernelState) -> tuple[ir.Lane, ir.Lane, ir.Var, ir.Var, ir.Lane]:
    """Row mf_t's online-softmax state: its max m and sum d, the step's new max and the
    correction of the old sums, and the row's accumulator at slot mf_j."""
    t = ir.Var("mf_t")
    m, d = ir.Lane(ir.Var("mf_m"), t), ir.Lane(ir.Var("mf_d"), t)
    acc = ir.Lane(ir.Var("mf_acc"), t * ir.Lit(ks.epl, "uint") + ir.Var("mf_j"))
    return m, d, ir.Var("mf_m_new"), ir.Var("mf_corr"), acc


def _no_scores(ks: KernelState, sc: ir.Expr) -> ir.Stmt:
    """Every row's score -inf: a key past the end weighs nothing."""
    return ir.For("mf_t", "uint", ir.Lit(0, "uint"), ir.Lit(ks.qt, "uint"),
                  [ir.Assign(sc, NEG_INF)], unroll=True)


def softmax_step(ctx: CallContext, ks: KernelState,
                 dot_of: Mapping[Node, ir.Expr]) -> list[ir.Stmt]:
    """The scores' elementwise work, then per row one online-softmax update for the step:
    its max, what was summed under the old max rescaled, the step's weights p added."""
    sc_at = ir.Var("mf_u") * ir.Lit(ks.qt, "uint") + ir.Var("mf_t")
    sc, p = ir.Lane(ir.Var("mf_sc"), sc_at), ir.Lane(ir.Var("mf_p"), sc_at)
    body, value = score(ctx, ks, dot_of)
    m, d, m_new, corr, acc = _row_state(ks)
    dead = _no_scores(ks, sc)
    return [
        ir.ArrayDecl("mf_sc", "float", ctx.kps * ks.qt),
        keys(ctx, ks, [each_row(ctx, ks, body + [ir.Assign(sc, value)])], [dead]),
        ir.Comment("online softmax, per row: the step's max, the old sums rescaled, the "
                   "step's weights p added"),
        ir.ArrayDecl("mf_p", "float", ctx.kps * ks.qt),
        each_row(ctx, ks, [
            ir.Decl("mf_m_new", "float", m, const=False),
            each_key(ctx, ks, [ir.Assign(m_new, ir.Call("mf_maximum", (m_new, sc)))]),
            ir.Decl("mf_corr", "float", online.rescale(m, m_new)),
            ir.Assign(d, d * corr),
            each_key(ctx, ks, [ir.Assign(p, online.weight(sc, m_new)), ir.Assign(d, d + p)]),
            ir.Assign(m, m_new),
            slots(ctx, ks, [ir.Assign(acc, acc * corr)])])]


def lane_softmax(ctx: CallContext, ks: KernelState,
                 dot_of: Mapping[Node, ir.Expr]) -> list[ir.Stmt]:
    """Lane scores: the scores' elementwise work for the lane's key, then per row one
    online-softmax update for the simdgroup's 32 keys: their max over the simdgroup (the
    same m in every lane), the lane's own weight p (kept in mf_ps for the values), its
    running sum d (lane-partial, summed at the end) and acc rescaled."""
    t = ir.Var("mf_t")
    sc, ps = ir.Lane(ir.Var("mf_sc"), t), ir.Lane(ir.Var("mf_ps"), t)
    body, value = score(ctx, ks, dot_of)
    ks.out.helpers.add("mf_simd_max")
    m, d, m_new, corr, acc = _row_state(ks)
    dead = _no_scores(ks, sc)
    return [
        ir.ArrayDecl("mf_sc", "float", ks.qt),
        ir.If(ir.Var("mf_l") < ir.Var("mf_l1"), [each_row(ctx, ks,
            body + [ir.Assign(sc, value)])], [dead]),
        ir.Comment("online softmax, per row: the max of the simdgroup's keys, the old sums "
                   "rescaled, this lane's weight p"),
        ir.ArrayDecl("mf_ps", "float", ks.qt),
        each_row(ctx, ks, [
            ir.Decl("mf_m_new", "float", ir.Call("mf_maximum", (m, ir.Call(
                "mf_simd_max", (sc,))))),
            ir.Decl("mf_corr", "float", online.rescale(m, m_new)),
            ir.Assign(ps, online.weight(sc, m_new)),
            ir.Assign(d, d * corr + ps),
            ir.Assign(m, m_new),
            slots(ctx, ks, [ir.Assign(acc, acc * corr)])])]


def tile_softmax(ctx: CallContext, ks: KernelState) -> list[ir.Stmt]:
    """Simdgroup mf_sg's row: one online-softmax update for the tile, a key a lane (two in
    the narrow kernel's 64-key tiles): the tile's max over the simdgroup, the old sums
    rescaled (the factor to `mf_tg_c[row]` for every simdgroup's accumulators), each key's
    weight p to `mf_tg_p[key * rows + row]` (a key's weights of all rows side by side) and
    into the lane-partial d."""
    mm, md, m_new, corr = (ir.Var(v) for v in ("mf_mm", "mf_md", "mf_m_new", "mf_corr"))
    lane, sg = ir.Var("mf_lane"), ir.Var("mf_sg")
    ks.out.helpers.add("mf_simd_max")
    per = ks.kt_max // SIMD_WIDTH                  # keys a lane
    sc = [ir.Var(f"mf_sc{i}") for i in range(per)]
    keys = [lane + ir.Lit(i * SIMD_WIDTH, "uint") if i else lane for i in range(per)]
    top: ir.Expr = sc[0]
    for v in sc[1:]:
        top = ir.Call("mf_maximum", (top, v))
    out: list[ir.Stmt] = [
        ir.Comment("online softmax of the simdgroup's row: the tile's max, the old sums' "
                   "factor, each key's weight p")]
    out += [ir.Decl(v.name, "float", ir.Select(k < ir.Var("mf_tn"), ir.Lane(
        ir.Var("mf_tg_s"), sg * ir.Lit(ks.kt_max, "uint") + k), NEG_INF))
        for v, k in zip(sc, keys)]
    out += [
        ir.Decl("mf_m_new", "float", ir.Call("mf_maximum", (mm, ir.Call(
            "mf_simd_max", (top,))))),
        ir.Decl("mf_corr", "float", online.rescale(mm, m_new)),
        ir.Assign(md, md * corr)]
    for v, k in zip(sc, keys):
        p = ir.Var(f"mf_p{v.name[5:]}")
        out += [ir.Decl(p.name, "float", online.weight(v, m_new)),
                ir.Assign(md, md + p),
                ir.Assign(ir.Lane(ir.Var("mf_tg_pf"), k * ir.Lit(ks.qt, "uint") + sg), p)]
    out += [ir.Assign(mm, m_new),
            ir.If(lane.eq(ir.Lit(0, "uint")), [
                ir.Assign(ir.Lane(ir.Var("mf_tg_c"), sg), corr)])]
    # a row past the tile's end: weights 0 and factor 1, so that tile_values may add its
    # p v and rescale it unguarded (to accumulators never used)
    past: list[ir.Stmt] = [ir.Assign(ir.Lane(ir.Var("mf_tg_pf"), k * ir.Lit(ks.qt, "uint")
                                             + sg), ir.Lit(0.0, "float")) for k in keys]
    past.append(ir.If(lane.eq(ir.Lit(0, "uint")), [
        ir.Assign(ir.Lane(ir.Var("mf_tg_c"), sg), ir.Lit(1.0, "float"))]))
    return [ir.If(sg < ir.Var("mf_nlive"), out, past)]
