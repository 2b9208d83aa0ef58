"""The contraction kernel: one threadgroup per tile of output rows x columns (of one batch
position), the matrix block (`schedule/matrix`) walking K, the epilogue per output element.

Phases, each commented in the generated code:
1. the tile: its first row mf_m0 and column mf_n0, its batch position, the simdgroup's block
   (rows mf_sm.., columns mf_sn.. of the tile) and its zeroed fp32 accumulators;
2. along K in steps of BK: both operand tiles staged in threadgroup memory in the operand type
   (the prologue computed per element; 0 past M, N or K), a barrier, the block's products, a
   barrier;
3. each accumulator element of the lane: the output at (mf_m, mf_n) where it exists, through
   the epilogue (the sum's value is the accumulator).
"""
from __future__ import annotations

from typing import Mapping

from ... import ir
from ...graph import Node, Op, topo_order
from .. import matrix
from ..base import IDX, make_kernel
from ..fragments import u
from ..lower import convert, ident
from .context import MatmulContext


def idx(v: int) -> ir.Lit:
    return ir.Lit(v, IDX)


def tile_place(ctx: MatmulContext) -> list[ir.Stmt]:
    """Phase 1: the threadgroup's tile and batch position, the thread's and simdgroup's place."""
    f, t = ctx.form, ctx.tile
    tile = ir.Var("mf_tile")
    out: list[ir.Stmt] = [
        ir.Comment(f"one threadgroup per tile of {t.bm} rows of '{f.rows}' x {t.bn} columns "
                   f"of '{f.cols}'" + (" (of one batch position)" if f.batch else "")),
        ir.Decl("mf_tile", IDX, ir.Cast(IDX, ir.Var("mf_group"))),
        ir.Decl("mf_col_tiles", IDX, (ctx.size(f.cols) + idx(t.bn - 1)) / idx(t.bn)),
        ir.Decl("mf_row_tiles", IDX, (ctx.size(f.rows) + idx(t.bm - 1)) / idx(t.bm)),
        ir.Decl("mf_n0", IDX, tile % ir.Var("mf_col_tiles") * idx(t.bn)),
        ir.Decl("mf_m0", IDX, tile / ir.Var("mf_col_tiles") % ir.Var("mf_row_tiles")
                * idx(t.bm))]
    if f.batch:
        out += [ir.Comment("the tile's position along the batch axes"),
                ir.Decl("mf_batch", IDX, tile / (ir.Var("mf_col_tiles") * ir.Var("mf_row_tiles")))]
        flat: ir.Expr = ir.Var("mf_batch")
        for a in reversed(f.batch):           # row-major: the last batch axis varies fastest
            out.append(ir.Decl(f"mf_pos_{ident(a)}", IDX, flat % ctx.size(a)))
            flat = flat / ctx.size(a)
    return out + [
        ir.Comment(f"the thread in the threadgroup; the simdgroup's block of {t.wm} x {t.wn} "
                   "outputs: rows mf_sm.., columns mf_sn.. of the tile"),
        ir.Decl("mf_t", "uint", ir.Var("mf_sg") * u(32) + ir.Var("mf_lane")),
        ir.Decl("mf_sm", "uint", ir.Var("mf_sg") / u(t.sg_cols) * u(t.wm)),
        ir.Decl("mf_sn", "uint", ir.Var("mf_sg") % u(t.sg_cols) * u(t.wn))]


def batch_at(ctx: MatmulContext) -> dict[str, ir.Expr]:
    """The batch axes' positions (declared by `tile_place`)."""
    return {a: ir.Var(f"mf_pos_{ident(a)}") for a in ctx.form.batch}


def staging(ctx: MatmulContext, node: Node, array: str, axis: str, first: str,
            rows: int, prefix: str) -> list[ir.Stmt]:
    """One operand tile: `rows` rows of `axis` from mf_<first> x the step's BK values of K,
    `node` computed per element (the prologue), 0 outside."""
    f = ctx.form
    at = {**batch_at(ctx), axis: ir.Var("mf_p"), f.axis: ir.Var("mf_k")}
    p = ir.Var(first) + ir.Cast(IDX, ir.Var("mf_r"))
    k = ir.Var("mf_k0") + ir.Cast(IDX, ir.Var("mf_kk"))

    def value(r: ir.Expr, kk: ir.Expr) -> tuple[list[ir.Stmt], ir.Expr]:
        el = ctx.lowering(at, prefix)
        stmts = el.lower([node])
        ctx.uses.helpers.update(el.helpers)
        return [ir.Decl("mf_p", IDX, p), ir.Decl("mf_k", IDX, k), *stmts], el.value(node)

    def live(r: ir.Expr, kk: ir.Expr) -> ir.Expr:
        return (p < ctx.size(axis)).and_(k < ctx.size(f.axis))
    k_inner = _k_inner(ctx, node)
    scalar = matrix.stage(ctx.tile, array, rows, k_inner, value, live)
    head = ir.Comment(f"{rows} rows of '{axis}' x {ctx.tile.bk} values of '{f.axis}', as "
                      f"{ctx.tile.operand} (0 outside)")
    if not vectored(ctx, node):
        return [head, *scalar]
    t, tensor = ctx.tile, ctx.graph.tensor(node.attr)
    vat = {**batch_at(ctx), axis: p, f.axis: k}

    def load(r: ir.Expr, kk: ir.Expr) -> ir.Expr:
        return ir.Load(ctx.names[tensor.name], ctx.offset(tensor.axes, vat), t.vec,
                       ctx.in_stype(tensor))
    if t.vec == 8:
        ctx.uses.helpers.add("mf_pack8_of")
    whole = (ir.Var("mf_k0") + idx(t.bk) <= ctx.size(f.axis)).and_(
        (ctx.size(f.axis) % idx(t.vec)).eq(idx(0)))
    return [head, ir.If(whole, [
        ir.Comment(f"a whole step, K a multiple of {t.vec}: 16-byte loads of {t.vec} values"),
        *matrix.stage_vectors(t, array, rows, load,
                              ir.vector_type(ctx.in_stype(tensor), t.vec),
                              p < ctx.size(axis))], scalar)]


def vectored(ctx: MatmulContext, node: Node) -> bool:
    """The operand is a tensor of the operand type, k-inner: its tile is read as 16-byte
    vectors where the step is whole and K a multiple of the vector."""
    if node.op != Op.LOAD:
        return False
    t = ctx.graph.tensor(node.attr)
    return t.axes[-1] == ctx.form.axis and t.dtype.msl == ctx.tile.operand


def _k_inner(ctx: MatmulContext, node: Node) -> bool:
    """Whether consecutive threads should take consecutive values of K: the operand's first
    tensor is k-inner in memory (else they take consecutive rows)."""
    loads = [n for n in topo_order([node]) if n.op == Op.LOAD and ctx.form.axis in n.axes]
    return not loads or ctx.graph.tensor(loads[0].attr).axes[-1] == ctx.form.axis


def k_loop(ctx: MatmulContext) -> ir.Stmt:
    """Phase 2: along K in steps of BK."""
    f, t = ctx.form, ctx.tile
    row0, col0 = ir.Var("mf_sm"), ir.Var("mf_sn")
    body = [*staging(ctx, f.a, "mf_as", f.rows, "mf_m0", t.bm, "mf_x"),
            *staging(ctx, f.b, "mf_bs", f.cols, "mf_n0", t.bn, "mf_y"),
            ir.Barrier(), *matrix.products(t, row0, col0), ir.Barrier()]
    return ir.For("mf_k0", IDX, idx(0), ctx.size(f.axis), body, step=idx(t.bk))


def epilogue(ctx: MatmulContext, row: ir.Expr, col: ir.Expr, v: ir.Expr) -> list[ir.Stmt]:
    """Phase 3, one accumulator element: its output position, and where it exists the
    epilogue's values and every output's store."""
    f, g = ctx.form, ctx.graph
    at: Mapping[str, ir.Expr] = {**batch_at(ctx), f.rows: ir.Var("mf_m"), f.cols: ir.Var("mf_n")}
    el = ctx.lowering(at, "mf_e")
    el.values[f.red] = ir.Var("mf_sum")
    stmts = el.lower([o.node for o in g.outputs])
    ctx.uses.helpers.update(el.helpers)
    stores: list[ir.Stmt] = [
        ir.Store(ctx.out_names[k], ctx.offset(o.axes, at),
                 ir.Cast(ctx.out_stype(k), convert(el.value(o.node), o.node.dtype, o.dtype)))
        for k, o in enumerate(g.outputs)]
    real = (ir.Var("mf_m") < ctx.size(f.rows)).and_(ir.Var("mf_n") < ctx.size(f.cols))
    return [ir.Decl("mf_m", IDX, ir.Var("mf_m0") + ir.Cast(IDX, ir.Var("mf_sm") + row)),
            ir.Decl("mf_n", IDX, ir.Var("mf_n0") + ir.Cast(IDX, ir.Var("mf_sn") + col)),
            ir.If(real, [ir.Decl("mf_sum", "float", v), *stmts, *stores])]


THREAD_INPUTS = (ir.ThreadInput("mf_group", "uint", "threadgroup_position_in_grid"),
                 ir.ThreadInput("mf_lane", "uint", "thread_index_in_simdgroup"),
                 ir.ThreadInput("mf_sg", "uint", "simdgroup_index_in_threadgroup"))


def kernel(ctx: MatmulContext) -> ir.LoweredKernel:
    """The contraction kernel (its parameters are set by `build`)."""
    f, t = ctx.form, ctx.tile
    body: list[ir.Stmt] = [
        ir.Comment("the staged operand tiles"), *matrix.arrays(t),
        *tile_place(ctx), *matrix.accumulators(t, ir.Var("mf_sm"), ir.Var("mf_sn")),
        ir.Comment(f"along '{f.axis}' in steps of {t.bk} values: stage both tiles, multiply"),
        k_loop(ctx),
        *matrix.results(t, lambda r, c, v: epilogue(ctx, r, c, v))]
    summary = (f"{ctx.graph.name} (matmul): sum over '{f.axis}' of a['{f.rows}', '{f.axis}'] x "
               f"b['{f.cols}', '{f.axis}'] and its epilogue; target {ctx.policy.target}: "
               + t.describe())
    return make_kernel(ctx.graph, ctx.index64, THREAD_INPUTS, body, summary, "mm",
                       max_threads=t.threads)
