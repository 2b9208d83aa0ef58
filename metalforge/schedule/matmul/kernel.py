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

from typing import Callable, Mapping

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
        *_tile_origin(ctx, tile)]
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


def _tile_origin(ctx: MatmulContext, tile: ir.Expr) -> list[ir.Stmt]:
    """mf_m0, mf_n0 of the tile: row-major over the tiles of a batch position, or (launch
    option tile_groups = G) column by column within bands of G rows of tiles, so that the
    threadgroups running at once share their rows of A and columns of B in the L2 cache."""
    t, g = ctx.tile, ctx.policy.tile_groups
    cols, rows = ir.Var("mf_col_tiles"), ir.Var("mf_row_tiles")
    if not g:
        return [ir.Decl("mf_n0", IDX, tile % cols * idx(t.bn)),
                ir.Decl("mf_m0", IDX, tile / cols % rows * idx(t.bm))]
    at = ir.Var("mf_at_tile")
    band = ir.Var("mf_band")
    return [
        ir.Comment(f"bands of {g} rows of tiles, walked column by column (L2 reuse)"),
        ir.Decl("mf_at_tile", IDX, tile % (cols * rows)),
        ir.Decl("mf_band", IDX, at / (cols * idx(g)) * idx(g)),
        ir.Decl("mf_band_rows", IDX, ir.Call("min", (rows - band, ir.Cast(IDX, idx(g))))),
        ir.Decl("mf_m0", IDX, (band + at % (cols * idx(g)) % ir.Var("mf_band_rows"))
                * idx(t.bm)),
        ir.Decl("mf_n0", IDX, at % (cols * idx(g)) / ir.Var("mf_band_rows") * idx(t.bn))]


def batch_at(ctx: MatmulContext) -> dict[str, ir.Expr]:
    """The batch axes' positions (declared by `tile_place`)."""
    return {a: ir.Var(f"mf_pos_{ident(a)}") for a in ctx.form.batch}


def _scalar_stage(ctx: MatmulContext, node: Node, array: str, axis: str, first: str,
                  rows: int, prefix: str) -> list[ir.Stmt]:
    """One operand tile element by element (`matrix.stage`), `node` computed per element."""
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
    return matrix.stage(ctx.tile, array, rows, _k_inner(ctx, node), value, live)


def _vector_load(ctx: MatmulContext, node: Node, axis: str, first: str,
                 k0: ir.Expr) -> matrix.Vector:
    """A 16-byte load of the operand tensor `node` at row r of the tile from mf_<first>, value
    kk of the step at k0."""
    t, tensor = ctx.tile, ctx.graph.tensor(node.attr)
    if t.vec == 8:
        ctx.uses.helpers.add("mf_pack8_of")

    def load(r: ir.Expr, kk: ir.Expr) -> ir.Expr:
        vat = {**batch_at(ctx), axis: ir.Var(first) + ir.Cast(IDX, r),
               ctx.form.axis: k0 + ir.Cast(IDX, kk)}
        return ir.Load(ctx.names[tensor.name], ctx.offset(tensor.axes, vat), t.vec,
                       ctx.in_stype(tensor))
    return load


def whole(ctx: MatmulContext, k0: ir.Expr) -> ir.Expr:
    """The step at k0 is whole and K a multiple of the vector (16-byte loads)."""
    t, k = ctx.tile, ctx.size(ctx.form.axis)
    return (k0 + idx(t.bk) <= k).and_((k % idx(t.vec)).eq(idx(0)))


def _vtype(ctx: MatmulContext, node: Node) -> str:
    return ir.vector_type(ctx.in_stype(ctx.graph.tensor(node.attr)), ctx.tile.vec)


def staging(ctx: MatmulContext, node: Node, array: str, axis: str, first: str,
            rows: int, prefix: str) -> list[ir.Stmt]:
    """One operand tile: `rows` rows of `axis` from mf_<first> x the step's BK values of K,
    `node` computed per element (the prologue), 0 outside."""
    t = ctx.tile
    scalar = _scalar_stage(ctx, node, array, axis, first, rows, prefix)
    head = ir.Comment(f"{rows} rows of '{axis}' x {t.bk} values of '{ctx.form.axis}', as "
                      f"{t.operand} (0 outside)")
    if not vectored(ctx, node):
        return [head, *scalar]
    load = _vector_load(ctx, node, axis, first, ir.Var("mf_k0"))
    live = ir.Var(first) + ir.Cast(IDX, ir.Var("mf_r")) < ctx.size(axis)
    return [head, ir.If(whole(ctx, ir.Var("mf_k0")), [
        ir.Comment(f"a whole step, K a multiple of {t.vec}: 16-byte loads of {t.vec} values"),
        *matrix.stage_vectors(t, array, rows, load, _vtype(ctx, node), live)], scalar)]


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


def k_loop(ctx: MatmulContext) -> list[ir.Stmt]:
    """Phase 2: along K in steps of BK."""
    if any(prefetched(ctx, n) for n in (ctx.form.a, ctx.form.b)):
        return prefetched_loop(ctx)
    return [_plain_loop(ctx)]


def _plain_loop(ctx: MatmulContext) -> ir.Stmt:
    f, t = ctx.form, ctx.tile
    row0, col0 = ir.Var("mf_sm"), ir.Var("mf_sn")
    body = [*staging(ctx, f.a, "mf_as", f.rows, "mf_m0", t.bm, "mf_x"),
            *staging(ctx, f.b, "mf_bs", f.cols, "mf_n0", t.bn, "mf_y"),
            ir.Barrier(), *matrix.products(t, row0, col0), ir.Barrier()]
    return ir.For("mf_k0", IDX, idx(0), ctx.size(f.axis), body, step=idx(t.bk))


def prefetched(ctx: MatmulContext, node: Node) -> bool:
    """The operand's tile is read a step ahead (launch option `prefetch`): a vectored operand
    (`vectored`) of a padded tile (`stage_pad`)."""
    return ctx.policy.prefetch and ctx.tile.pad > 0 and vectored(ctx, node)


def _operands(ctx: MatmulContext) -> list[tuple[Node, str, str, str, int, str, str]]:
    """(node, staged array, axis, its first row's variable, rows, prefix, registers) of A and
    B."""
    f, t = ctx.form, ctx.tile
    return [(f.a, "mf_as", f.rows, "mf_m0", t.bm, "mf_x", "mf_pa"),
            (f.b, "mf_bs", f.cols, "mf_n0", t.bn, "mf_y", "mf_pb")]


def _fetch(ctx: MatmulContext, k0: ir.Expr) -> list[ir.Stmt]:
    """The prefetched operands' vectors of the step at k0 into their registers."""
    out: list[ir.Stmt] = []
    for node, _, axis, first, rows, _, regs in _operands(ctx):
        if prefetched(ctx, node):
            out += matrix.fetch_vectors(ctx.tile, rows, regs,
                                        _vector_load(ctx, node, axis, first, k0),
                                        _row_live(ctx, axis, first))
    return out


def _row_live(ctx: MatmulContext, axis: str, first: str) -> Callable[[ir.Expr], ir.Expr]:
    """Whether row r of the tile from mf_<first> is a row of the operand."""
    return lambda r: ir.Var(first) + ir.Cast(IDX, r) < ctx.size(axis)


def prefetched_loop(ctx: MatmulContext) -> list[ir.Stmt]:
    """Phase 2 with the prefetched operands' tiles read a step ahead: their 16-byte vectors
    for step k + 1 are loaded into registers before the products of step k (their latency
    hidden behind the products) and stored into the staged tiles at the top of step k + 1."""
    f, t = ctx.form, ctx.tile
    k0 = ir.Var("mf_k0")
    regs: list[ir.Stmt] = []
    body: list[ir.Stmt] = []
    for node, array, axis, first, rows, prefix, reg in _operands(ctx):
        if not prefetched(ctx, node):
            body += staging(ctx, node, array, axis, first, rows, prefix)
            continue
        regs.append(ir.ArrayDecl(reg, _vtype(ctx, node), matrix.vectors(t, rows)))
        body += [ir.Comment(f"{rows} rows of '{axis}' x {t.bk} values of '{f.axis}', as "
                            f"{t.operand}: from the registers loaded a step ahead (0 outside)"),
                 ir.If(whole(ctx, k0), matrix.put_vectors(
                     t, array, rows, reg, _vtype(ctx, node), _row_live(ctx, axis, first)),
                     _scalar_stage(ctx, node, array, axis, first, rows, prefix))]
    nxt = k0 + idx(t.bk)
    body += [ir.Barrier(),
             ir.Comment("the next step's vectors, loaded while this step's products run"),
             ir.If(whole(ctx, nxt), _fetch(ctx, nxt)),
             *matrix.products(t, ir.Var("mf_sm"), ir.Var("mf_sn")), ir.Barrier()]
    return [ir.Comment("registers for the tiles read a step ahead: the first step's now"),
            *regs, ir.If(whole(ctx, idx(0)), _fetch(ctx, idx(0))),
            ir.For("mf_k0", IDX, idx(0), ctx.size(f.axis), body, step=idx(t.bk))]


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
        *k_loop(ctx),
        *matrix.results(t, lambda r, c, v: epilogue(ctx, r, c, v))]
    summary = (f"{ctx.graph.name} (matmul): sum over '{f.axis}' of a['{f.rows}', '{f.axis}'] x "
               f"b['{f.cols}', '{f.axis}'] and its epilogue; target {ctx.policy.target}: "
               + t.describe())
    return make_kernel(ctx.graph, ctx.index64, THREAD_INPUTS, body, summary, "mm",
                       max_threads=t.threads)
