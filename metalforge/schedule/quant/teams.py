"""The tiled kernel on the matrix block (`blocked`), assembled: its threadgroup memory, its
loop along K and its outputs, with the threadgroup's simdgroups in `qmm_splits` teams.

A team is the 4 simdgroups (128 threads) of one tile (`matrix.Tile`); with T teams a
threadgroup holds T of them on the same tile, team s taking steps s, s + T, s + 2T, ... of K
(each its own staged tiles, in one threadgroup array: `mf_as`, `mf_bs` point at the team's
part), so that a grid of few tiles (M = 64 rows of x: one tile of rows) still has T times the
simdgroups, each walking a T-th of K. Every team runs the same number of steps (a step past
K stages zeros: the barriers stay uniform). After the last step each simdgroup of teams 1..T-1
adds its sums into one tile of floats in threadgroup memory (where the staged tiles were: the
last step ended with a barrier), team T-1 first, one team at a time with a barrier after each,
element by element at the element's place in the tile (the same place whatever the lowering's
element layout); team 0 adds the parked sums to its own and stores the outputs through the
epilogue. One team (the default) is the plain kernel.
"""
from __future__ import annotations

from typing import Callable

from ... import ir
from ...errors import LaunchError
from ...graph import Node
from .. import matrix
from ..base import IDX, make_kernel
from ..fragments import u
from ..hardware import MAX_THREADGROUP_BYTES
from . import prefetch
from .blocked import BlockPlan, place, stage_w, stage_x
from .context import QuantState
from .form import factors
from .positions import idx
from .tiled import THREAD_INPUTS, store

SHARED = "mf_shared"
Emit = Callable[[ir.Expr, ir.Expr, ir.Expr], list[ir.Stmt]]
PARKED = "mf_parked"


def shared_bytes(pl: BlockPlan) -> int:
    """Threadgroup bytes: the teams' staged tiles, or the tile's sums parked as floats (with
    teams) if more."""
    t = pl.tile
    staged = pl.teams * (t.bm + t.bn) * t.bk * t.operand_bytes
    return staged if pl.teams == 1 else max(staged, t.bm * t.bn * 4)


def check(pl: BlockPlan) -> None:
    """A LaunchError where the plan's threadgroup memory is over Metal's limit."""
    need = shared_bytes(pl)
    if need > MAX_THREADGROUP_BYTES:
        t, (om, on, ok, osp) = pl.tile, pl.options
        raise LaunchError(
            f"quant launch policy: {om}={t.bm} x {on}={t.bn} x {ok}={t.bk} "
            f"with {osp}={pl.teams} needs {need} bytes of threadgroup memory (each team's "
            f"staged tiles, then the tile's sums parked as floats), over the "
            f"{MAX_THREADGROUP_BYTES}-byte limit; take smaller tiles or fewer splits")


def arrays(st: QuantState, pl: BlockPlan) -> tuple[list[ir.Stmt], list[ir.Stmt]]:
    """(the threadgroup arrays, declared first; the team's pointers mf_as, mf_bs into them,
    declared once the team is known)."""
    t = pl.tile
    if pl.teams == 1:
        decls = [a for a in matrix.arrays(t) if isinstance(a, ir.ArrayDecl)]
        st.v.tg_arrays.extend(decls)
        return list(decls), []
    per_team = (t.bm + t.bn) * t.bk
    decl = ir.ArrayDecl(SHARED, t.operand, shared_bytes(pl) // t.operand_bytes, "threadgroup")
    st.v.tg_arrays.append(decl)
    ptr = f"threadgroup {t.operand}*"
    return [ir.Comment(f"the {pl.teams} teams' staged tiles (A then B), later the tile's "
                       "sums parked as floats (mf_parked)"), decl], [
        ir.Comment("the team's staged tiles"),
        ir.Decl("mf_as", ptr, ir.Var(SHARED) + ir.Var("mf_team") * u(per_team), const=False),
        ir.Decl("mf_bs", ptr, ir.Var("mf_as") + u(t.bm * t.bk), const=False),
        ir.Decl(PARKED, "threadgroup float*", ir.Call("reinterpret_cast<threadgroup float*>",
                                                      (ir.Var(SHARED),)), const=False)]


def loop(st: QuantState, w: Node, x: Node, pl: BlockPlan) -> list[ir.Stmt]:
    """Along K: each team's step (from k0), staged, then its products; with `qmm_prefetch`
    the next step's loads issued before the products (`prefetch`), the first step's before
    the loop."""
    ctx, t = st.ctx, pl.tile
    row0, col0 = ir.Var("mf_sm"), ir.Var("mf_sn")
    first: list[ir.Stmt] = [] if pl.teams == 1 else [
        ir.Decl("mf_kt", IDX, prefetch.team_base(pl, ir.Var("mf_k0")))]
    products = [*matrix.products(t, row0, col0), ir.Barrier()]
    stride = idx(t.bk * pl.teams)
    if not ctx.policy.qmm_prefetch:
        body = [*first, *stage_x(st, x, pl), *stage_w(st, w, pl), ir.Barrier(), *products]
        return [ir.For("mf_k0", IDX, idx(0), ctx.size(ctx.axis), body, step=stride)]
    w_body, value, loads = prefetch.w_lowering(st, w)
    body = [*first, *prefetch.put_x(st, x, pl), *prefetch.put_w(st, pl, w_body, value),
            ir.Barrier(), ir.Comment("the next step's loads, in flight while the products run"),
            *prefetch.next_step(st, pl), *prefetch.fetch(st, x, pl, loads, ir.Var("mf_kn"),
                                                           False), *products]
    return [*prefetch.registers(st, x, pl, loads),
            ir.Comment("the first step's loads"),
            *prefetch.fetch(st, x, pl, loads, prefetch.team_base(pl, idx(0)), True),
            ir.For("mf_k0", IDX, idx(0), ctx.size(ctx.axis), body, step=stride)]


def outputs(st: QuantState, pl: BlockPlan) -> list[ir.Stmt]:
    """Each accumulator element: the output (where its row and weight row exist); with T > 1
    teams, teams T-1 .. 1 in turn add theirs into the parked sums (the first to come writes
    them), a barrier after each, and team 0 adds the parked sum to its own."""
    t = pl.tile
    row0, col0 = ir.Var("mf_sm"), ir.Var("mf_sn")

    def final(r: ir.Expr, c: ir.Expr, value: ir.Expr) -> list[ir.Stmt]:
        return store(st, value, row0 + r, col0 + c, [])
    if pl.teams == 1:
        return matrix.results(t, final)

    def at(r: ir.Expr, c: ir.Expr) -> ir.Expr:
        return (row0 + r) * u(t.bn) + col0 + c

    def park(first: bool) -> Emit:
        def emit(r: ir.Expr, c: ir.Expr, value: ir.Expr) -> list[ir.Stmt]:
            parked = ir.Lane(ir.Var(PARKED), at(r, c))
            return [ir.Store(PARKED, at(r, c), value if first else parked + value,
                             space="threadgroup")]
        return emit

    def total(r: ir.Expr, c: ir.Expr, value: ir.Expr) -> list[ir.Stmt]:
        return final(r, c, value + ir.Lane(ir.Var(PARKED), at(r, c)))
    out: list[ir.Stmt] = [ir.Comment(f"teams {pl.teams - 1} .. 1 in turn: their sums added "
                                     "into the parked ones, at their place in the tile")]
    for s_ in range(pl.teams - 1, 0, -1):
        out += [ir.If(ir.Var("mf_team").eq(u(s_)), matrix.results(t, park(s_ == pl.teams - 1))),
                ir.Barrier()]
    return out + [ir.Comment("team 0: its sums plus the parked ones, the outputs"),
                  ir.If(ir.Var("mf_team").eq(u(0)), matrix.results(t, total))]


def body(st: QuantState, w: Node, x: Node, pl: BlockPlan) -> list[ir.Stmt]:
    """The kernel's statements (its row of x is mf_m, its weight row mf_n)."""
    ctx = st.ctx
    ctx.uses.helpers.update(matrix.helpers(pl.tile))
    decls, pointers = arrays(st, pl)
    head = place(st, pl)
    k_loop = loop(st, w, x, pl)
    finish = outputs(st, pl)
    return [ir.Comment("the staged operand tiles"), *decls, *head, *pointers, *st.v.pre,
            *matrix.accumulators(pl.tile, ir.Var("mf_sm"), ir.Var("mf_sn")),
            ir.Comment(f"along '{ctx.axis}' in steps of {pl.tile.bk} values"
                       + (f", every {pl.teams}th a team's" if pl.teams > 1 else "")
                       + ": stage both tiles, multiply"), *k_loop,
            ir.Comment("the outputs, where the row of x and the weight row exist"), *finish]


def kernel(st: QuantState, pl: BlockPlan) -> ir.LoweredKernel:
    """The tiled kernel on the matrix block, for graphs of `form.factors`'s form."""
    ctx = st.ctx
    found = factors(ctx)
    assert found is not None
    check(pl)
    w, x = found
    teams = f", {pl.teams} teams of them splitting K" if pl.teams > 1 else ""
    summary = (f"{ctx.graph.name} ({st.name}): y = sum over '{ctx.axis}' of values unpacked from "
               f"{ctx.bits}-bit words times rows of '{ctx.prefix[-1]}'; target "
               f"{ctx.policy.target}: {pl.tile.describe()}{teams}; weights dequantized in "
               f"fp32 once per tile, rounded to {pl.tile.operand}")
    return make_kernel(ctx.graph, ctx.index64, THREAD_INPUTS, body(st, w, x, pl), summary,
                       st.name, max_threads=pl.threads)
