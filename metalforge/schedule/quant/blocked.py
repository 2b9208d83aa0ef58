"""The quantized matrix-matrix kernel (`qmm`) on the matrix block (schedule/matrix): half or
bfloat operands on the target's matrix hardware, fp32 accumulation.

Built where x (the factor X over the rows of x, `form.factors`) holds half or bfloat values
(a tensor read or an explicit cast: `held`) and the launch option `qmm_fp32` is off; f32 or
computed x keep the fp32 kernel of `tiled`. A threadgroup of 4 simdgroups (2 x 2) computes a
tile of `qmm_tile_m` rows of x by `qmm_tile_n` weight rows (launch options: 32, 64 or 128
each), walking K in steps of 32 values (`matrix.BK`); the library may hold a second such
kernel, `qmm_wide`, of the `qmm_wide_tile_m` x `qmm_wide_tile_n` tile in `qmm_wide_splits`
teams (`plan_of(..., wide=True)`), which the host runs from `qmm_wide_rows` rows of x. Each
step:

- A, x's tile: its rows x 32 values in x's own type (16-byte vector loads where x is a
  k-inner tensor of that type and the step is whole, else element by element), 0 past M or K;
- B, the weight tile: each thread dequantizes runs of 8 consecutive values of a weight row (a
  4-bit word's: its word, scale and bias read once for the run) in fp32, the user's expression
  as written (q * scale + bias), and rounds each value once to x's type as it stores it; rows
  past N repeat row N - 1 (read in bounds, never stored), values past K are 0;
- a barrier, the block's products (`matrix.products`: Metal 4 matmul2d where the target has
  tensor ops, apple10 and cuda whose shim runs them on tensor cores; simdgroup_matrix
  products elsewhere), a barrier.

Then each accumulator element of a lane is an output (`matrix.results`) through the family's
epilogue (bias, residual, activation, several outputs: `tiled.store`), where its row and
weight row exist. Rounding the dequantized weight to half or bfloat is what the matrix
hardware multiplies (as MLX's and llama.cpp's quantized GEMMs do); the sum stays fp32.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from ... import ir
from ...dtypes import DType
from ...graph import Node, Op
from ...target import SIM_DEFAULT, get_target
from .. import matrix
from ..base import IDX
from ..fragments import u, unrolled
from ..lower import as_float
from ..matrix import Tile
from .context import QuantContext, QuantState
from .form import factors
from .positions import idx, lowering, prefix_position
from .tiled import origin

RUN = 8                     # consecutive values of K a thread dequantizes at once (a word's)


def held(n: Node) -> DType:
    """The dtype x's values are exactly: a tensor read's or an explicit cast's own, else its
    compute type (a computed x is an fp32 value: the fp32 kernel)."""
    return n.dtype if n.op in (Op.LOAD, Op.CAST) else n.dtype.compute


@dataclass(frozen=True)
class BlockPlan:
    """The tiled kernel on the matrix block: its tile (of one team of 4 simdgroups) and its
    teams, each taking every `teams`-th step of K (`teams`)."""
    tile: Tile
    teams: int
    wide: bool = False          # the second tiled kernel's (qmm_wide: its own launch options)

    @property
    def options(self) -> tuple[str, str, str, str]:
        """The launch options that set the plan: rows of x, weight rows, K a step, teams."""
        pre = "qmm_wide" if self.wide else "qmm"
        return f"{pre}_tile_m", f"{pre}_tile_n", "qmm_tile_k", f"{pre}_splits"

    @property
    def threads(self) -> int:
        return self.tile.threads * self.teams

    @property
    def k0(self) -> ir.Var:
        """The first value of K of the team's step."""
        return ir.Var("mf_k0" if self.teams == 1 else "mf_kt")


def plan_of(ctx: QuantContext, wide: bool = False) -> Optional[BlockPlan]:
    """The matrix block's plan for the call's tiled kernel (`wide`: the second one, qmm_wide,
    of the qmm_wide_* options), or None where the fp32 kernel runs (x of f32 or computed
    values, or `qmm_fp32`)."""
    found = factors(ctx)
    if found is None or ctx.policy.qmm_fp32:
        return None
    p = ctx.policy
    dt = held(found[1])
    t = matrix.choose(get_target(p.target or SIM_DEFAULT), dt, dt, 64)
    if t.operand == "float":
        return None
    if wide:
        return BlockPlan(replace(t, bm=p.qmm_wide_tile_m, bn=p.qmm_wide_tile_n,
                                 bk=p.qmm_tile_k), p.qmm_wide_splits, True)
    return BlockPlan(replace(t, bm=p.qmm_tile_m, bn=p.qmm_tile_n, bk=p.qmm_tile_k), p.qmm_splits)


def place(st: QuantState, pl: BlockPlan) -> list[ir.Stmt]:
    """The tile (`tiled.origin`), the thread in its team and its simdgroup's block."""
    t = pl.tile
    sg: ir.Expr = ir.Var("mf_sg")
    team: list[ir.Stmt] = []
    if pl.teams > 1:
        team = [ir.Comment(f"the simdgroup's team (of {pl.teams}: each takes every "
                           f"{pl.teams}th step of K) and its place in it"),
                ir.Decl("mf_team", "uint", sg / u(t.simdgroups)),
                ir.Decl("mf_tsg", "uint", sg % u(t.simdgroups))]
        sg = ir.Var("mf_tsg")
    return origin(st, t.bm, t.bn) + team + [
        ir.Comment(f"the thread in its team; the simdgroup's block of {t.wm} x {t.wn} "
                   "outputs: rows mf_sm.. of x's tile, weight rows mf_sn.."),
        ir.Decl("mf_t", "uint", sg * u(32) + ir.Var("mf_lane")),
        ir.Decl("mf_sm", "uint", sg / u(t.sg_cols) * u(t.wm)),
        ir.Decl("mf_sn", "uint", sg % u(t.sg_cols) * u(t.wn))]


def _k(base: ir.Expr, kk: ir.Expr) -> ir.Expr:
    """Value kk of the step from `base`."""
    return base + ir.Cast(IDX, kk)


def _m(r: ir.Expr) -> ir.Expr:
    return ir.Var("mf_m0") + ir.Cast(IDX, r)


def vector_offset(st: QuantState, x: Node, pl: BlockPlan,
                  base: Optional[ir.Expr] = None) -> Optional[ir.Expr]:
    """The offset of x's row mf_m0 + mf_r, value base (the team's k0) + mf_kk where x's tile
    can be read as 16-byte vectors (a k-inner tensor of the operand type over the other output
    axes and K), else None."""
    ctx = st.ctx
    if x.op != Op.LOAD:
        return None
    tensor = ctx.graph.tensor(x.attr)
    if tensor.axes[-1] != ctx.axis or tensor.dtype.msl != pl.tile.operand \
            or not all(a in ctx.prefix or a == ctx.axis for a in tensor.axes):
        return None
    m_axis = ctx.prefix[-1]
    e: ir.Expr = idx(0)
    for i, a in enumerate(tensor.axes):
        k = _k(base or pl.k0, ir.Var("mf_kk"))
        p = k if a == ctx.axis else _m(ir.Var("mf_r")) if a == m_axis \
            else prefix_position(st, a)
        e = p if i == 0 else e * ctx.size(a) + p
    return e


def scalar_x(st: QuantState, x: Node, pl: BlockPlan) -> list[ir.Stmt]:
    """A, x's tile element by element (any x; the step may be partial), 0 past M or K."""
    ctx, t = st.ctx, pl.tile
    M, K = ctx.size(ctx.prefix[-1]), ctx.size(ctx.axis)

    def value(r: ir.Expr, kk: ir.Expr) -> tuple[list[ir.Stmt], ir.Expr]:
        el = lowering(st, False, ir.Var("mf_k"))
        stmts = el.lower([x])
        ctx.uses.helpers.update(el.helpers)
        return [ir.Decl("mf_m", IDX, _m(r)), ir.Decl("mf_k", IDX, _k(pl.k0, kk)),
                *stmts], el.value(x)

    def live(r: ir.Expr, kk: ir.Expr) -> ir.Expr:
        return (_m(r) < M).and_(_k(pl.k0, kk) < K)
    tensor = ctx.graph.tensor(x.attr) if x.op == Op.LOAD else None
    k_inner = tensor is None or tensor.axes[-1] == ctx.axis
    return matrix.stage(t, "mf_as", t.bm, k_inner, value, live)


def whole_x(st: QuantState, pl: BlockPlan, base: ir.Expr) -> ir.Expr:
    """The step from `base` is whole and K a multiple of the vector: x read as vectors."""
    K, t = st.ctx.size(st.ctx.axis), pl.tile
    return (base + idx(t.bk) <= K).and_((K % idx(t.vec)).eq(idx(0)))


def stage_x(st: QuantState, x: Node, pl: BlockPlan) -> list[ir.Stmt]:
    """A: x's tile, bm rows x BK values in the operand type, 0 past M or K."""
    ctx, t = st.ctx, pl.tile
    M = ctx.size(ctx.prefix[-1])
    head = ir.Comment(f"A: {t.bm} rows of x x {t.bk} values of '{ctx.axis}', as {t.operand} "
                      "(0 past the rows or K)")
    at = vector_offset(st, x, pl)
    if at is None:
        return [head, *scalar_x(st, x, pl)]
    tensor = ctx.graph.tensor(x.attr)
    if t.vec == 8:
        ctx.uses.helpers.add("mf_pack8_of")
    stype = ctx.in_stype(tensor)

    def load(r: ir.Expr, kk: ir.Expr) -> ir.Expr:
        return ir.Load(ctx.names[tensor.name], at, t.vec, stype)
    return [head, ir.If(whole_x(st, pl, pl.k0), [
        ir.Comment(f"a whole step, K a multiple of {t.vec}: 16-byte loads of {t.vec} values"),
        *matrix.stage_vectors(t, "mf_as", t.bm, load, ir.vector_type(stype, t.vec),
                              _m(ir.Var("mf_r")) < M)], scalar_x(st, x, pl))]


def guarded(st: QuantState, pl: BlockPlan, body: list[ir.Stmt], zero: list[ir.Stmt],
            always: bool = False) -> list[ir.Stmt]:
    """`body` for each value mf_j of the run from mf_kq (mf_k declared), `zero` for those past
    K: no test where every team's step is inside K (K's derived dims make it a multiple of the
    teams' steps; `always`: test anyway), one per run where runs are whole (K a multiple of
    RUN), else one per value."""
    ctx = st.ctx
    K = ctx.size(ctx.axis)
    at = ir.Decl("mf_k", IDX, ir.Var("mf_kq") + ir.Cast(IDX, ir.Var("mf_j")))
    if ctx.k_multiple % (pl.tile.bk * pl.teams) == 0 and not always:
        return [unrolled("mf_j", RUN, [at, *body])]
    if ctx.k_multiple % RUN == 0:
        return [ir.If(ir.Var("mf_kq") < K, [unrolled("mf_j", RUN, [at, *body])],
                      [unrolled("mf_j", RUN, zero)] if zero else [])]
    return [unrolled("mf_j", RUN, [at, *zero, ir.If(ir.Var("mf_k") < K, body)])]


def dequantized(st: QuantState, w: Node, pl: BlockPlan) -> list[ir.Stmt]:
    """The run's RUN values of W in fp32 into registers mf_wv, 0 past K (`guarded`)."""
    el = lowering(st, False, ir.Var("mf_k"), (ir.Var("mf_kq"), RUN))
    body = el.lower([w])
    st.ctx.uses.helpers.update(el.helpers)
    value = ir.Lane(ir.Var("mf_wv"), ir.Var("mf_j"))
    return guarded(st, pl, [*body, ir.Assign(value, as_float(el.value(w), w))],
                   [ir.Assign(value, ir.Lit(0.0, "float"))])


def stage_w(st: QuantState, w: Node, pl: BlockPlan) -> list[ir.Stmt]:
    """B: the weight tile, bn weight rows x BK values: thread mf_t + 128 i dequantizes the
    run of RUN values mf_q of row mf_wr in fp32 into registers (the run's word, scale and bias
    loads alike in every value: one each once unrolled, no store between them), then stores
    each rounded once to the operand type."""
    ctx, t = st.ctx, pl.tile
    N = ctx.size(ctx.rows_axis)
    runs = t.bk // RUN
    j = ir.Var("mf_j")
    slot = matrix.staged(t.bn, ir.Var("mf_wr"), ir.Var("mf_q") * u(RUN) + j)
    e = ir.Var("mf_i") * u(t.threads) + ir.Var("mf_t")
    return [
        ir.Comment(f"B: {t.bn} weight rows x {t.bk} values, dequantized in fp32 a run of "
                   f"{RUN} at a time (0 past K), each rounded once to {t.operand}"),
        ir.For("mf_i", "uint", u(0), u(t.bn * runs // t.threads), [
            ir.Decl("mf_wr", "uint", e / u(runs)),
            ir.Decl("mf_q", "uint", e % u(runs)),
            ir.Decl("mf_n", IDX, ir.Call("min", (ir.Var("mf_n0") + ir.Cast(IDX, ir.Var("mf_wr")),
                                                 N - idx(1)))),
            ir.Decl("mf_kq", IDX, _k(pl.k0, ir.Var("mf_q") * u(RUN))),
            ir.ArrayDecl("mf_wv", "float", RUN),
            *dequantized(st, w, pl),
            unrolled("mf_j", RUN, [ir.Store("mf_bs", slot, ir.Cast(
                t.operand, ir.Lane(ir.Var("mf_wv"), j)), space="threadgroup")])])]
