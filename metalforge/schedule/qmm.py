"""The quantized matrix-matrix kernel (`qmm`): the quantized schedule's tiled variant for many
rows of x, where the matvec kernel (`qmv`) would stream the packed weights once per row.

Recognised when the reduction's argument is a product W * X of a weight factor W (over the
weight rows N and K: the unpacked words and their per-group scale and bias, any expression) and
a factor X over M and K without N (x, or any expression of the tensors the rows share):

    y[..., m, n] = sum_k W[n, k] * X[..., m, k]

One threadgroup of 256 threads (8 simdgroups) per tile of TILE_M rows of x by TILE_N weight
rows. It walks K in steps of TILE_K values; each step

- stages W's tile into threadgroup memory as fp32 (dequantized once per tile: lanes of a
  simdgroup take TILE_K consecutive values of one weight row, so their words are consecutive
  too), and X's tile likewise; values past K (none where K's derived dims make it a multiple
  of TILE_K) and rows past M are zero, rows past N repeat row N - 1 (read in bounds, never
  stored);
- after a barrier, each simdgroup multiplies its two 8x8 blocks of the output tile as Metal
  simdgroup matrices (schedule/fragments.py): X's 8 rows of the block row times W^T's 8
  columns, 8 values of k a product (W is staged k-major, rows of TILE_N + 1 floats, so W^T's
  blocks load as they are stored; X rows of TILE_K floats), fp32 throughout;
- a barrier before the next step overwrites the tiles.

Each weight row is unpacked once per TILE_M rows of x instead of once per row. Each lane then
computes and stores the outputs of its two elements of each of its blocks (the epilogue may use
the sum like any row value).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from .. import ir
from ..graph import Node, Op, strip_casts, topo_order
from ..shapes import size_multiple
from . import reduce
from .base import IDX
from .fragments import FRAG, frag, lane_place, mat_load, mma, u, unrolled, zero
from .lower import as_float

if TYPE_CHECKING:
    from .quant import _Builder

TILE_M, TILE_N, TILE_K = 32, 32, 32
THREADS = 256                                   # 8 simdgroups
SIMDGROUPS = THREADS // 32
STAGE_TRIPS = TILE_N * TILE_K // THREADS        # tile values each thread stages (4)
W_STRIDE = TILE_N + 1                           # padded k-major weight rows: no bank conflicts
X_VECTORS = TILE_K // 4                         # float4s per staged row of x
BLOCKS = TILE_M * TILE_N // (FRAG * FRAG) // SIMDGROUPS   # 8x8 output blocks a simdgroup (2)
BLOCK_COLS = TILE_N // FRAG                     # 8x8 blocks across a tile row (4)


def factors(b: "_Builder") -> Optional[tuple[Node, Node]]:
    """(W, X) when the reduction's argument is W * X with W over the weight rows and no other
    output axis, X over the tile's M axis and not the weight rows; None otherwise."""
    if not b.prefix:
        return None
    arg = strip_casts(b.red.args[0])
    if arg.op != Op.BINARY or arg.attr != "mul":
        return None
    m_axis = b.prefix[-1]
    for w, x in (arg.args, arg.args[::-1]):
        if (b.rows_axis in w.axes and not any(a in w.axes for a in b.prefix)
                and m_axis in x.axes and b.rows_axis not in x.axes
                and not any(n.op in (Op.UNPACK, Op.REDUCE, Op.TAKE) for n in topo_order([x]))
                and not any(n.op in (Op.REDUCE, Op.TAKE) for n in topo_order([w]))):
            return w, x
    return None


def _i(v: int) -> ir.Lit:
    return ir.Lit(v, IDX)


def header(b: "_Builder") -> list[ir.Stmt]:
    """The threadgroup's tile (first weight row n0, first row of x m0, the batch position of
    the other output axes) and zeroed sums."""
    n_axis, m_axis = b.rows_axis, b.prefix[-1]
    n_tiles = (b.size(n_axis) + _i(TILE_N - 1)) / _i(TILE_N)
    m_tiles = (b.size(m_axis) + _i(TILE_M - 1)) / _i(TILE_M)
    tile = ir.Var("mf_tile")
    out: list[ir.Stmt] = [
        ir.Comment(f"one threadgroup per tile of {TILE_M} rows of '{m_axis}' x {TILE_N} rows "
                   f"of '{n_axis}'"),
        ir.Decl("mf_tile", IDX, ir.Cast(IDX, ir.Var("mf_group"))),
        ir.Decl("mf_n_tiles", IDX, n_tiles),
        ir.Decl("mf_m_tiles", IDX, m_tiles),
        ir.Decl("mf_n0", IDX, tile % ir.Var("mf_n_tiles") * _i(TILE_N)),
        ir.Decl("mf_m0", IDX, tile / ir.Var("mf_n_tiles") % ir.Var("mf_m_tiles") * _i(TILE_M))]
    if len(b.prefix) > 1:
        out += [ir.Comment("the flat position of the tile's batch along the other output axes"),
                ir.Decl("mf_outer", IDX, tile / (ir.Var("mf_n_tiles") * ir.Var("mf_m_tiles"))
                        * b.size(m_axis))]
    first = ir.Var("mf_sg") * u(BLOCKS)
    return out + lane_place(ir.Var("mf_lane")) + [
        ir.Comment(f"the simdgroup's {BLOCKS} blocks of 8x8 outputs: block row mf_bm, block "
                   f"columns mf_bn + j (j < {BLOCKS}); their sums"),
        ir.Decl("mf_bm", "uint", first / u(BLOCK_COLS)),
        ir.Decl("mf_bn", "uint", first % u(BLOCK_COLS)),
        ir.ArrayDecl("mf_acc", "float2", BLOCKS),
        unrolled("mf_j", BLOCKS, [ir.Assign(frag("mf_acc", ir.Var("mf_j")), zero())])]


def stage(b: "_Builder", node: Node, target: ir.Expr, row_decl: list[ir.Stmt],
          live: Optional[ir.Expr]) -> ir.Stmt:
    """Each thread's STAGE_TRIPS values of one tile: row mf_row = simdgroup + 8 j of the
    tile, value mf_lane of the step; `node` lowered at (row_decl's row, k), 0 where not
    `live` (None: everywhere live), stored as fp32 at `target` (of mf_row and mf_lane)."""
    k = ir.Var("mf_k")
    el = b.lowering(False, k)
    body = el.lower([node])
    b.helpers |= el.helpers
    value = ir.Var("mf_staged")
    staged = as_float(el.value(node), node)
    compute = body + [ir.Decl(value.name, "float", staged)] if live is None else [
        ir.Decl(value.name, "float", ir.Lit(0.0, "float"), const=False),
        ir.If(live, body + [ir.Assign(value, staged)])]
    return ir.For("mf_j", "uint", u(0), u(STAGE_TRIPS), [
        ir.Decl("mf_row", "uint", ir.Var("mf_sg") + u(SIMDGROUPS) * ir.Var("mf_j")),
        *row_decl,
        ir.Decl("mf_k", IDX, ir.Var("mf_k0") + ir.Cast(IDX, ir.Var("mf_lane"))),
        *compute,
        ir.Assign(target, value)], unroll=True)


def step(b: "_Builder", w: Node, x: Node) -> list[ir.Stmt]:
    """One step of TILE_K values along K: stage both tiles, then every thread's sums."""
    n_axis, m_axis, K = b.rows_axis, b.prefix[-1], b.size(b.axis)
    last = b.size(n_axis) - _i(1)
    # every step inside K where its derived dims make it a multiple of the step (K/GS, GS 64)
    in_k = None if size_multiple(b.graph.tensors, b.axis) % TILE_K == 0 else ir.Var("mf_k") < K
    in_m = ir.Var("mf_m") < b.size(m_axis)
    row, lane = ir.Var("mf_row"), ir.Var("mf_lane")
    stage_w = stage(b, w, ir.Lane(ir.Var("mf_ws"), lane * u(W_STRIDE) + row), [
        ir.Decl("mf_n", IDX, ir.Call("min", (ir.Var("mf_n0") + ir.Cast(IDX, ir.Var("mf_row")),
                                             last)))], in_k)
    x4 = ir.Lane(ir.Var("mf_xs"), row * u(X_VECTORS) + lane / u(4))
    stage_x = stage(b, x, ir.Lane(x4, lane % u(4)), [
        ir.Decl("mf_m", IDX, ir.Var("mf_m0") + ir.Cast(IDX, ir.Var("mf_row")))],
        in_m if in_k is None else in_k.and_(in_m))
    kb, j = ir.Var("mf_kb"), ir.Var("mf_j")
    acc = frag("mf_acc", j)
    return [
        ir.Comment(f"the weight tile: {TILE_N} rows x {TILE_K} values, dequantized to fp32"),
        stage_w,
        ir.Comment(f"the tile of '{m_axis}' rows: {TILE_M} x {TILE_K} values"),
        stage_x,
        ir.Barrier(),
        ir.Comment("each block += X's 8 rows x W^T's 8 columns, 8 values of k a product"),
        unrolled("mf_kb", TILE_K // FRAG, [
            ir.Decl("mf_a", "float2", mat_load("mf_xsf", TILE_K, kb * u(FRAG),
                                               ir.Var("mf_bm") * u(FRAG))),
            unrolled("mf_j", BLOCKS, [ir.Assign(acc, mma(ir.Var("mf_a"), mat_load(
                "mf_ws", W_STRIDE, (ir.Var("mf_bn") + j) * u(FRAG), kb * u(FRAG)), acc))])]),
        ir.Barrier()]


def store(b: "_Builder", v: reduce.Variant) -> list[ir.Stmt]:
    """The lane's two elements of each of the simdgroup's blocks: the outputs at (row mf_m,
    weight row mf_n), where both exist."""
    n_axis, m_axis = b.rows_axis, b.prefix[-1]
    j, i = ir.Var("mf_j"), ir.Var("mf_i")
    red = reduce.Reduction(b.red, "sum", b.axis, 1, acc_at=frag("mf_acc", j, i))
    rv = v.row_values
    rv.values[b.red] = red.acc_ref
    stmts = rv.lower([o.node for o in b.graph.outputs])
    stores: list[ir.Stmt] = []
    for k, o in enumerate(b.graph.outputs):
        off: ir.Expr = _i(0)
        for n, a in enumerate(o.axes):
            p = b.at(a, _i(0), False)
            off = p if n == 0 else off * b.size(a) + p
        stores.append(ir.Store(b.out_names[k], off, b.out_value(k, rv)))
    row = ir.Var("mf_bm") * u(FRAG) + ir.Var("mf_mr")
    col = (ir.Var("mf_bn") + j) * u(FRAG) + ir.Var("mf_mc") + i
    real = (ir.Var("mf_m") < b.size(m_axis)).and_(ir.Var("mf_n") < b.size(n_axis))
    return [ir.Comment("the lane's elements of its blocks: the outputs, where the row and "
                       "weight row exist"),
            ir.Decl("mf_m", IDX, ir.Var("mf_m0") + ir.Cast(IDX, row)),
            unrolled("mf_j", BLOCKS, [unrolled("mf_i", 2, [
                ir.Decl("mf_n", IDX, ir.Var("mf_n0") + ir.Cast(IDX, col)),
                ir.If(real, stmts + stores)])])]


def body(b: "_Builder", v: reduce.Variant, w: Node, x: Node) -> list[ir.Stmt]:
    """The kernel's statements (the builder's M position is mf_m while they are lowered)."""
    b.helpers |= {"mf_mma", "mf_mat_load"}
    v.tg_arrays += [ir.ArrayDecl("mf_ws", "float", TILE_K * W_STRIDE, "threadgroup"),
                    ir.ArrayDecl("mf_xs", "float4", TILE_M * X_VECTORS, "threadgroup")]
    head = header(b) + [ir.Decl("mf_xsf", "threadgroup float*", ir.Call(
        "reinterpret_cast<threadgroup float*>", (ir.Var("mf_xs"),)), const=False)]
    loop = ir.For("mf_k0", IDX, _i(0), b.size(b.axis), step(b, w, x), step=_i(TILE_K))
    finish = store(b, v)
    return list(v.tg_arrays) + head + v.pre + [
        ir.Comment(f"along '{b.axis}' in steps of {TILE_K} values"), loop, *finish]


THREAD_INPUTS = (ir.ThreadInput("mf_group", "uint", "threadgroup_position_in_grid"),
                 ir.ThreadInput("mf_lane", "uint", "thread_index_in_simdgroup"),
                 ir.ThreadInput("mf_sg", "uint", "simdgroup_index_in_threadgroup"))
