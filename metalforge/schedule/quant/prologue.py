"""A staged prologue: `qmv_prologue`, for a projection of a computed x (an activation fused
into the projection that reads it: the down projection of `silu(gate) * up`),

    y = mf.sum((mf.unpack(wq, bits=4) * s + b) * (g * mf.sigmoid(g) * u), axis="F")

qmv computes x's chunk in every simdgroup, once per block of rows_per_group weight rows: the
activation's exp and divisions N / rows_per_group times over. Here the threadgroup's threads
compute each stretch of x once (1024 values: one chunk for each lane) into threadgroup memory,
and every simdgroup of the group reads its lanes' chunks from there; x is computed
N / (rows_per_group x simdgroups per group) times.

- Each stretch: thread t computes positions s0 + t, s0 + t + T, ... (T threads: consecutive
  loads) and stores value (j, l) (element j of lane l's chunk) at slot j x 33 + l (the pad
  keeps both the stores and the lanes' reads on distinct banks); a barrier; each simdgroup sums
  the chunk of each lane from threadgroup memory (the guarded element path, at K's end or for
  unaligned rows, computes its values itself); a barrier before the next stretch.
- Every simdgroup of a group works at one row of x: each row of x's blocks are padded to a
  whole number of groups; simdgroups past the blocks stage with the others and store nothing.

It replaces the matvec kernels where the affine form's x applies a transcendental function
(`wanted`); kernels of a plain x (a tensor, a cast, arithmetic) keep qmv.
"""
from __future__ import annotations

from ... import ir
from ...graph import Op, UnaryOp, topo_order
from ..base import IDX
from ..hardware import SIMD_WIDTH
from ..lower import as_float
from .context import QuantContext, QuantState
from .form import affines
from .gathers import value_gathers
from .positions import idx, lowering

PAD = SIMD_WIDTH + 1                 # staged floats per element of a chunk: 32 lanes + 1
_COSTLY = (UnaryOp.EXP, UnaryOp.EXP2, UnaryOp.LOG, UnaryOp.LOG2, UnaryOp.SIGMOID, UnaryOp.TANH,
           UnaryOp.ERF, UnaryOp.SIN, UnaryOp.COS)


def wanted(ctx: QuantContext) -> bool:
    """Whether x is worth staging: the affine form, one x for every sum, x applying a
    transcendental function (and no sums of x alone, no gathers of results)."""
    forms = affines(ctx)
    if forms is None or ctx.xsums or value_gathers(ctx.graph):
        return False
    return any(n.op == Op.UNARY and n.attr in _COSTLY for n in topo_order([forms[0].x]))


def groups(ctx: QuantContext) -> int:
    """Simdgroups per threadgroup."""
    return max(1, ctx.policy.threads_per_group // SIMD_WIDTH)


def stretch(ctx: QuantContext) -> int:
    """Values of K per stretch: one chunk per lane."""
    return SIMD_WIDTH * ctx.chunk


def header(st: QuantState) -> list[ir.Stmt]:
    """The simdgroup's block (of its row of x's blocks, padded to whole groups) and whether it
    is one (`mf_live`)."""
    ctx = st.ctx
    rows, G = ctx.policy.rows_per_group, groups(ctx)
    return [
        ir.Comment(f"one simdgroup per block of {rows} rows of '{ctx.rows_axis}'; a row of "
                   f"x's blocks padded to whole groups of {G} (a group shares its x)"),
        ir.Decl("mf_task", IDX, ir.Cast(IDX, ir.Var("mf_tid") / ir.Lit(SIMD_WIDTH, "uint"))),
        ir.Decl("mf_blocks", IDX, (ctx.size(ctx.rows_axis) + idx(rows - 1)) / idx(rows)),
        ir.Decl("mf_padded", IDX, (ir.Var("mf_blocks") + idx(G - 1)) / idx(G) * idx(G)),
        ir.Decl("mf_outer", IDX, ir.Var("mf_task") / ir.Var("mf_padded")),
        ir.Decl("mf_blk", IDX, ir.Var("mf_task") % ir.Var("mf_padded")),
        ir.Decl("mf_live", "bool", ir.Var("mf_blk") < ir.Var("mf_blocks")),
        ir.Decl("mf_n0", IDX, ir.Call("min", (ir.Var("mf_blk"), ir.Var("mf_blocks")
                                              - idx(1))) * idx(rows))]


def stage(st: QuantState) -> list[ir.Stmt]:
    """The group's threads compute the stretch's x into threadgroup memory (zero past K)."""
    ctx = st.ctx
    forms = affines(ctx)
    assert forms is not None
    S, T = stretch(ctx), groups(ctx) * SIMD_WIDTH
    st.v.tg_arrays.append(ir.ArrayDecl("mf_xstaged", "float", ctx.chunk * PAD, "threadgroup"))
    k = ir.Var("mf_pk")
    el = lowering(st, False, k=k)
    body = el.lower([forms[0].x])
    ctx.uses.helpers.update(el.helpers)
    off = ir.Var("mf_poff")
    slot = (off % idx(ctx.chunk)) * idx(PAD) + off / idx(ctx.chunk)
    store = ir.Assign(ir.Lane(ir.Var("mf_xstaged"), slot), as_float(el.value(forms[0].x),
                                                                     forms[0].x))
    zero = ir.Assign(ir.Lane(ir.Var("mf_xstaged"), slot), ir.Lit(0.0, "float"))
    return [
        ir.Comment(f"the stretch's x, computed once by the group: thread t takes positions "
                   f"t, t + {T}, ...; element j of lane l's chunk at slot j * {PAD} + l"),
        ir.For(off.name, IDX, ir.Cast(IDX, ir.Var("mf_lid")), idx(S), [
            ir.Decl(k.name, IDX, ir.Var("mf_s0") + off),
            ir.If(k < ctx.size(ctx.axis), body + [store], [zero])], step=idx(T)),
        ir.Barrier()]


def staged_x(st: QuantState) -> list[ir.Stmt]:
    """Lane mf_lane's chunk of x from threadgroup memory, and its sum (the affine form's)."""
    C = st.ctx.chunk
    xe = ir.Lane(ir.Var("mf_xe"), ir.Var("mf_j"))
    return [ir.ArrayDecl("mf_xe", "float", C),
            ir.Decl("mf_xsum", "float", ir.Lit(0.0, "float"), const=False),
            ir.For("mf_j", "uint", ir.Lit(0, "uint"), ir.Lit(C, "uint"), [
                ir.Assign(xe, ir.Lane(ir.Var("mf_xstaged"), ir.Var("mf_j") * ir.Lit(PAD, "uint")
                                      + ir.Var("mf_lane"))),
                ir.Assign(ir.Var("mf_xsum"), ir.Var("mf_xsum") + xe)], unroll=True)]


def loop(st: QuantState, chunk: list[ir.Stmt]) -> ir.Stmt:
    """The stretches along K: stage x, then (live simdgroups) lane l's chunk `chunk`, then a
    barrier before the stretch is overwritten."""
    ctx = st.ctx
    S = stretch(ctx)
    k0 = ir.Var("mf_s0") + ir.Cast(IDX, ir.Var("mf_lane") * ir.Lit(ctx.chunk, "uint"))
    work = ir.If(ir.Var("mf_live").and_(k0 < ctx.size(ctx.axis)),
                 [ir.Decl("mf_k0", IDX, k0)] + chunk)
    return ir.For("mf_s0", IDX, idx(0), ctx.size(ctx.axis), stage(st) + [work, ir.Barrier()],
                  step=idx(S))
