"""The tiled kernel on the matrix block with its loads a step ahead (launch option
`qmm_prefetch`, on by default): the global loads of the team's next step are issued into
registers after the barrier that publishes this step's tiles, so they are in flight while this
step's products run, and only used (dequantized, converted, stored into the tiles) at the start
of the next step. Without it each step waits on its loads between two barriers (the latency of
a global load a step: bench/README.md measured ~1.2 us a step for the fp32 kernel before it
loaded ahead).

What is held: x's 16-byte vectors of the step (where x is a k-inner tensor of the operand type
and the step is whole; a partial step, or another x, is staged element by element when it is
used, as without prefetch), and every load the weight expression makes for each value of the
thread's runs (its packed word, scale and bias: the lowering's loads, `mf_pf<i>` registers,
the same address for every value of a run where the run is in one word and group, which the
compiler loads once). The arithmetic (unpack, q * scale + bias in fp32, the rounding to the
operand type) runs when they are stored.

The step after the last: where every team's step is inside K (no test in the loop) the last
step again (in bounds, unused); elsewhere the loads past K are not made (the same tests as the
values').
"""
from __future__ import annotations

from ... import ir
from ...graph import Node
from .. import matrix
from ..base import IDX
from ..fragments import u, unrolled
from ..lower import as_float, compute_type
from .blocked import RUN, BlockPlan, _k, _m, guarded, scalar_x, vector_offset, whole_x
from .context import QuantState
from .positions import idx, lowering

Loads = list[tuple[str, str, ir.Expr]]          # (register array, its type, the load)


def w_runs(pl: BlockPlan) -> int:
    """Runs of RUN values of the weight tile a thread takes each step."""
    return pl.tile.bn * (pl.tile.bk // RUN) // pl.tile.threads


def x_vectors(pl: BlockPlan) -> int:
    """16-byte vectors of x's tile a thread takes each step."""
    return max(1, pl.tile.bm * (pl.tile.bk // pl.tile.vec) // pl.tile.threads)


def run_place(st: QuantState, pl: BlockPlan, base: ir.Expr) -> list[ir.Stmt]:
    """Run mf_i of the thread: row mf_wr of the weight tile (weight row mf_n, N - 1 past N),
    values RUN mf_q.. of the step from `base` (mf_kq)."""
    t, runs = pl.tile, pl.tile.bk // RUN
    e = ir.Var("mf_i") * u(t.threads) + ir.Var("mf_t")
    return [ir.Decl("mf_wr", "uint", e / u(runs)), ir.Decl("mf_q", "uint", e % u(runs)),
            ir.Decl("mf_n", IDX, ir.Call("min", (
                ir.Var("mf_n0") + ir.Cast(IDX, ir.Var("mf_wr")),
                st.ctx.size(st.ctx.rows_axis) - idx(1)))),
            ir.Decl("mf_kq", IDX, _k(base, ir.Var("mf_q") * u(RUN)))]


def per_value(e: ir.Expr) -> bool:
    """Whether a load's address differs between the values of a run (else one register a
    run: the run's word, scale and bias where it is in one word and group)."""
    probe = [ir.Decl("mf_probe", "auto", e)]
    return ir.mentions(probe, "mf_j") or ir.mentions(probe, "mf_k")


def slot(e: ir.Expr) -> ir.Expr:
    """The register of load `e` for value mf_j of run mf_i."""
    i = ir.Var("mf_i")
    return i * u(RUN) + ir.Var("mf_j") if per_value(e) else i


def w_lowering(st: QuantState, w: Node) -> tuple[list[ir.Stmt], ir.Expr, Loads]:
    """W's value from registers: (its statements, its value, the loads they read instead, each
    into its register array at `slot`)."""
    el = lowering(st, False, ir.Var("mf_k"), (ir.Var("mf_kq"), RUN))
    loads: Loads = []
    direct = el.load

    def load(n: Node) -> ir.Expr:
        t = st.ctx.graph.tensor(n.attr)
        name, e = f"mf_pf{len(loads)}", direct(n)
        loads.append((name, compute_type(t.dtype), e))
        return ir.Lane(ir.Var(name), slot(e))
    el.load = load
    body = el.lower([w])
    st.ctx.uses.helpers.update(el.helpers)
    return body, as_float(el.value(w), w), loads


def fetch(st: QuantState, x: Node, pl: BlockPlan, loads: Loads, base: ir.Expr,
          always: bool) -> list[ir.Stmt]:
    """The loads of the team's step from `base` into registers: the weight's for each value of
    each run, x's vectors where the step is whole (`always`: test K even where every step is
    inside it)."""
    ctx, t = st.ctx, pl.tile
    w_loads: list[ir.Stmt] = [ir.Assign(ir.Lane(ir.Var(r), slot(e)), e) for r, _, e in loads]
    out: list[ir.Stmt] = [unrolled("mf_i", w_runs(pl), [
        *run_place(st, pl, base), *guarded(st, pl, w_loads, [], always)])]
    at = vector_offset(st, x, pl, base)
    if at is None:
        return out
    tensor = ctx.graph.tensor(x.attr)
    per_row = t.bk // t.vec
    e = ir.Var("mf_i") * u(t.threads) + ir.Var("mf_t")
    vec = ir.Load(ctx.names[tensor.name], at, t.vec, ctx.in_stype(tensor))
    return out + [ir.If(whole_x(st, pl, base), [unrolled("mf_i", x_vectors(pl), [
        ir.Decl("mf_r", "uint", e / u(per_row)),
        ir.Decl("mf_kk", "uint", e % u(per_row) * u(t.vec)),
        ir.If(_m(ir.Var("mf_r")) < ctx.size(ctx.prefix[-1]),
              [ir.Assign(ir.Lane(ir.Var("mf_xv"), ir.Var("mf_i")), vec)])])])]


def put_w(st: QuantState, pl: BlockPlan, body: list[ir.Stmt], value: ir.Expr) -> list[ir.Stmt]:
    """B from the registers: each run's values dequantized in fp32 (0 past K), rounded once to
    the operand type and stored."""
    t = pl.tile
    wv = ir.Lane(ir.Var("mf_wv"), ir.Var("mf_j"))
    slot = matrix.staged(t.bn, ir.Var("mf_wr"), ir.Var("mf_q") * u(RUN) + ir.Var("mf_j"))
    return [ir.Comment(f"B from the registers: {t.bn} weight rows x {t.bk} values "
                       f"dequantized in fp32, each rounded once to {t.operand}"),
            unrolled("mf_i", w_runs(pl), [
                *run_place(st, pl, pl.k0), ir.ArrayDecl("mf_wv", "float", RUN),
                *guarded(st, pl, [*body, ir.Assign(wv, value)],
                         [ir.Assign(wv, ir.Lit(0.0, "float"))]),
                unrolled("mf_j", RUN, [ir.Store("mf_bs", slot, ir.Cast(t.operand, wv),
                                                space="threadgroup")])])]


def put_x(st: QuantState, x: Node, pl: BlockPlan) -> list[ir.Stmt]:
    """A from the registers where the step is whole (0 past M), else element by element."""
    ctx, t = st.ctx, pl.tile
    if vector_offset(st, x, pl) is None:
        return [ir.Comment("A: x's tile, element by element"), *scalar_x(st, x, pl)]
    per_row = t.bk // t.vec
    e = ir.Var("mf_i") * u(t.threads) + ir.Var("mf_t")
    j = ir.Var("mf_j")
    at = matrix.staged(t.bm, ir.Var("mf_r"), ir.Var("mf_kk") + j)
    lane = ir.Call("mf_lane8", (ir.Lane(ir.Var("mf_xv"), ir.Var("mf_i")), j)) if t.vec == 8 \
        else ir.Lane(ir.Lane(ir.Var("mf_xv"), ir.Var("mf_i")), j)
    zero = ir.Cast(t.operand, ir.Lit(0.0, "float"))
    return [ir.Comment(f"A from the registers: {t.bm} rows of x x {t.bk} values (0 past the "
                       "rows), or element by element where the step is partial"),
            ir.If(whole_x(st, pl, pl.k0), [unrolled("mf_i", x_vectors(pl), [
                ir.Decl("mf_r", "uint", e / u(per_row)),
                ir.Decl("mf_kk", "uint", e % u(per_row) * u(t.vec)),
                ir.If(_m(ir.Var("mf_r")) < ctx.size(ctx.prefix[-1]),
                      [unrolled("mf_j", t.vec, [ir.Store("mf_as", at, lane,
                                                         space="threadgroup")])],
                      [unrolled("mf_j", t.vec, [ir.Store("mf_as", at, zero,
                                                         space="threadgroup")])])])],
                  scalar_x(st, x, pl))]


def registers(st: QuantState, x: Node, pl: BlockPlan, loads: Loads) -> list[ir.Stmt]:
    """The registers a step ahead: the weight's loads, x's vectors."""
    ctx, t = st.ctx, pl.tile
    out: list[ir.Stmt] = [ir.Comment("the registers holding the next step's loads")]
    out += [ir.ArrayDecl(r, typ, w_runs(pl) * (RUN if per_value(e) else 1))
            for r, typ, e in loads]
    if vector_offset(st, x, pl) is not None:
        tensor = ctx.graph.tensor(x.attr)
        if t.vec == 8:
            ctx.uses.helpers.add("mf_pack8_of")
        out.append(ir.ArrayDecl("mf_xv", ir.vector_type(ctx.in_stype(tensor), t.vec),
                                x_vectors(pl)))
    return out


def whole_steps(st: QuantState, pl: BlockPlan) -> bool:
    """Every team's step is inside K (K's derived dims make it a multiple of the teams')."""
    return st.ctx.k_multiple % (pl.tile.bk * pl.teams) == 0


def team_base(pl: BlockPlan, start: ir.Expr) -> ir.Expr:
    """The team's step of the threadgroup's steps from `start`."""
    return start if pl.teams == 1 else \
        start + ir.Cast(IDX, ir.Var("mf_team") * u(pl.tile.bk))


def next_step(st: QuantState, pl: BlockPlan) -> list[ir.Stmt]:
    """mf_kn: the team's next step (after the last, the last again where every step is
    inside K: its loads stay in bounds)."""
    K = st.ctx.size(st.ctx.axis)
    stride = idx(pl.tile.bk * pl.teams)
    nxt: ir.Expr = ir.Var("mf_k0") + stride
    if whole_steps(st, pl):
        nxt = ir.Call("min", (nxt, K - stride))
    return [ir.Decl("mf_kn", IDX, team_base(pl, nxt))]
