"""The quantized matrix-matrix kernel (`qmm`): the quantized schedule's tiled variant for many
rows of x, where the matvec kernel (`qmv`) would stream the packed weights once per row.

Recognised when the reduction's argument is a product W * X of a weight factor W (over the
weight rows N and K: the unpacked words and their per-group scale and bias, any expression) and
a factor X over M and K without N (x, or any expression of the tensors the rows share):

    y[..., m, n] = sum_k W[n, k] * X[..., m, k]

One threadgroup of 256 threads (8 simdgroups) per tile of TILE_M rows of x by TILE_N weight
rows, walking K in steps of TILE_K values. Each thread stages a run of RUN consecutive values
of one row of each tile (a 4-bit word's: its word, scale and bias read once for the run),
W dequantized to fp32, and holds them in registers a step ahead: values past K (none where
K's derived dims make it a multiple of TILE_K) and rows past M are zero, rows past N repeat
row N - 1 (read in bounds, never stored). Each step

- stores the registers into the tiles in threadgroup memory;
- after a barrier, loads the next step's values into the registers (their loads in flight
  while the products run; after the last step, the last step's values again where every step
  is whole, so every read stays in bounds), then multiplies the tiles;
- a barrier before the next step overwrites the tiles.

The products (launch option `qmm_matrix`):
- on (the table's: Apple's matrix hardware): each simdgroup multiplies its two 8x8 blocks of
  the output tile as Metal simdgroup matrices (schedule/fragments.py): X's 8 rows of the block
  row times W^T's 8 columns, 8 values of k a product (W staged k-major, rows of TILE_N + 1
  floats, so W^T's blocks load as they are stored; X rows of TILE_K floats), fp32 throughout;
  each lane stores the outputs of its two elements of each of its blocks;
- off (the cuda backend's: it has no float 8x8 product in hardware, and moving each product's
  operands by shuffles took 80% of the kernel's time on the H100): plain FMAs on register
  tiles. Both tiles are staged k-major (rows of TILE_N + 4 floats, read as float4s), each
  thread sums a MICRO x MICRO block of outputs over one of K_SLICES slices of the step's k
  (two float4 reads for 16 FMAs a value of k), and after the last step the slices' sums meet
  in threadgroup memory, where each thread adds up and stores MICRO outputs of one row.

Each weight row is unpacked once per TILE_M rows of x instead of once per row; the epilogue
may use the sum like any row value.
"""
from __future__ import annotations

from typing import Optional

from ... import ir
from ...graph import Node
from ..base import IDX, make_kernel
from ..fragments import frag, lane_place, mat_load, mma, u, unrolled, zero
from ..hardware import FRAG
from ..lower import as_float
from .blocks import epilogue
from .context import QuantState
from .form import factors
from .params import (
    BLOCK_COLS,
    BLOCKS,
    K_SLICES,
    MICRO,
    MICRO_COLS,
    ROW_VECTORS,
    RUN,
    RUNS,
    SIMD,
    SLICE_K,
    THREADS,
    TILE_K,
    TILE_M,
    TILE_N,
    TILE_THREADS,
    TILE_VECTORS,
    W_STRIDE,
    X_VECTORS,
)
from .positions import idx, lowering


def origin(st: QuantState, tile_m: int, tile_n: int) -> list[ir.Stmt]:
    """The threadgroup's tile of `tile_m` rows of x by `tile_n` weight rows: its first weight
    row mf_n0, first row of x mf_m0 and the batch position of the other output axes."""
    ctx = st.ctx
    n_axis, m_axis = ctx.rows_axis, ctx.prefix[-1]
    n_tiles = (ctx.size(n_axis) + idx(tile_n - 1)) / idx(tile_n)
    m_tiles = (ctx.size(m_axis) + idx(tile_m - 1)) / idx(tile_m)
    tile = ir.Var("mf_tile")
    out: list[ir.Stmt] = [
        ir.Comment(f"one threadgroup per tile of {tile_m} rows of '{m_axis}' x {tile_n} rows "
                   f"of '{n_axis}'"),
        ir.Decl("mf_tile", IDX, ir.Cast(IDX, ir.Var("mf_group"))),
        ir.Decl("mf_n_tiles", IDX, n_tiles),
        ir.Decl("mf_m_tiles", IDX, m_tiles),
        ir.Decl("mf_n0", IDX, tile % ir.Var("mf_n_tiles") * idx(tile_n)),
        ir.Decl("mf_m0", IDX, tile / ir.Var("mf_n_tiles") % ir.Var("mf_m_tiles") * idx(tile_m))]
    if len(ctx.prefix) > 1:
        out += [ir.Comment("the flat position of the tile's batch along the other output axes"),
                ir.Decl("mf_outer", IDX, tile / (ir.Var("mf_n_tiles") * ir.Var("mf_m_tiles"))
                        * ctx.size(m_axis))]
    return out


def header(st: QuantState, matrix: bool) -> list[ir.Stmt]:
    """The threadgroup's tile (`origin`), the thread's place in it and its zeroed sums."""
    ctx = st.ctx
    m_axis = ctx.prefix[-1]
    out = origin(st, TILE_M, TILE_N)
    t = ir.Var("mf_t")
    out += [ir.Decl("mf_t", "uint", ir.Var("mf_sg") * SIMD + ir.Var("mf_lane")),
            ir.Comment(f"the thread's share of each tile: row mf_srow, values {RUN} mf_q.. "
                       f"{RUN} mf_q + {RUN - 1} of each step"),
            ir.Decl("mf_srow", "uint", t / u(RUNS)),
            ir.Decl("mf_q", "uint", t % u(RUNS))]
    if not matrix:
        return out + [
            ir.Comment(f"the thread's {MICRO} x {MICRO} sums: rows {MICRO} mf_tm + r of the "
                       f"tile of '{m_axis}', weight rows {MICRO} mf_tn + c, over slice mf_ks "
                       f"of each step's values of '{ctx.axis}'"),
            ir.Decl("mf_ks", "uint", t / u(TILE_THREADS)),
            ir.Decl("mf_tm", "uint", t % u(TILE_THREADS) / u(MICRO_COLS)),
            ir.Decl("mf_tn", "uint", t % u(MICRO_COLS)),
            ir.ArrayDecl("mf_acc", "float4", MICRO),
            unrolled("mf_r", MICRO, [ir.Assign(frag("mf_acc", ir.Var("mf_r")),
                                               ir.Call("float4", (ir.Lit(0.0, "float"),)))])]
    first = ir.Var("mf_sg") * u(BLOCKS)
    return out + lane_place(ir.Var("mf_lane")) + [
        ir.Comment(f"the simdgroup's {BLOCKS} blocks of 8x8 outputs: block row mf_bm, block "
                   f"columns mf_bn + j (j < {BLOCKS}); their sums"),
        ir.Decl("mf_bm", "uint", first / u(BLOCK_COLS)),
        ir.Decl("mf_bn", "uint", first % u(BLOCK_COLS)),
        ir.ArrayDecl("mf_acc", "float2", BLOCKS),
        unrolled("mf_j", BLOCKS, [ir.Assign(frag("mf_acc", ir.Var("mf_j")), zero())])]


def stage(st: QuantState, node: Node, into: str, row: ir.Stmt, start: Optional[ir.Expr],
          live: Optional[ir.Expr]) -> list[ir.Stmt]:
    """The thread's RUN values of one tile, into registers `into`[j]: of its row (`row`
    declares mf_n or mf_m) at k = start (None: 0) + RUN mf_q + j, whose word, scale and bias
    the lowering reads once for the run; `node` as fp32, 0 where not `live` (None:
    everywhere)."""
    ctx = st.ctx
    first = ir.Var("mf_kq")
    el = lowering(st, False, ir.Var("mf_k"), (first, RUN))
    body = el.lower([node])
    ctx.uses.helpers.update(el.helpers)
    target = frag(into, ir.Var("mf_j"))
    staged = as_float(el.value(node), node)
    compute = body + [ir.Assign(target, staged)] if live is None else [
        ir.Assign(target, ir.Lit(0.0, "float")), ir.If(live, body + [ir.Assign(target, staged)])]
    kq: ir.Expr = ir.Cast(IDX, ir.Var("mf_q") * u(RUN))
    return [row, ir.Decl("mf_kq", IDX, kq if start is None else start + kq),
            unrolled("mf_j", RUN, [ir.Decl("mf_k", IDX, first + ir.Cast(IDX, ir.Var("mf_j"))),
                                   *compute])]


def whole_steps(st: QuantState) -> bool:
    """Every step inside K: its derived dims make it a multiple of the step (K/GS, GS 64)."""
    return st.ctx.k_multiple % TILE_K == 0


def put(target: ir.Expr, values: str) -> ir.Stmt:
    """Registers `values`[j] into their tile at `target` (of mf_srow, mf_q and mf_j)."""
    return unrolled("mf_j", RUN, [ir.Assign(target, frag(values, ir.Var("mf_j")))])


def staging(st: QuantState, w: Node, x: Node, start: Optional[ir.Expr]) -> list[ir.Stmt]:
    """Both tiles' values of the step starting at `start` (None: 0), into registers mf_wn and
    mf_xn."""
    ctx = st.ctx
    n_axis, m_axis, K = ctx.rows_axis, ctx.prefix[-1], ctx.size(ctx.axis)
    in_k = None if whole_steps(st) else ir.Var("mf_k") < K
    in_m = ir.Var("mf_m") < ctx.size(m_axis)
    srow = ir.Cast(IDX, ir.Var("mf_srow"))
    n = ir.Call("min", (ir.Var("mf_n0") + srow, ctx.size(n_axis) - idx(1)))
    return [
        ir.Comment(f"the weight tile: {TILE_N} rows x {TILE_K} values, dequantized to fp32"),
        ir.Block(stage(st, w, "mf_wn", ir.Decl("mf_n", IDX, n), start, in_k)),
        ir.Comment(f"the tile of '{m_axis}' rows: {TILE_M} x {TILE_K} values"),
        ir.Block(stage(st, x, "mf_xn", ir.Decl("mf_m", IDX, ir.Var("mf_m0") + srow), start,
                       in_m if in_k is None else in_k.and_(in_m)))]


def matrix_products() -> list[ir.Stmt]:
    """Each simdgroup's blocks += X's 8 rows x W^T's 8 columns, TILE_K / 8 products a block."""
    kb, j = ir.Var("mf_kb"), ir.Var("mf_j")
    acc = frag("mf_acc", j)
    return [
        ir.Comment("each block += X's 8 rows x W^T's 8 columns, 8 values of k a product"),
        unrolled("mf_kb", TILE_K // FRAG, [
            ir.Decl("mf_a", "float2", mat_load("mf_xsf", TILE_K, kb * u(FRAG),
                                               ir.Var("mf_bm") * u(FRAG))),
            unrolled("mf_j", BLOCKS, [ir.Assign(acc, mma(ir.Var("mf_a"), mat_load(
                "mf_ws", W_STRIDE, (ir.Var("mf_bn") + j) * u(FRAG), kb * u(FRAG)), acc))])])]


def kmajor(k: ir.Expr, col4: ir.Expr, run: Optional[ir.Expr] = None) -> ir.Expr:
    """The float4 of a k-major staged tile (register tiles) at row k (of run k / RUN, if
    known), columns 4 col4..: rows of ROW_VECTORS, one float4 more after each RUN rows, so
    that the runs a simdgroup stores at once fall in different banks."""
    return k * u(ROW_VECTORS) + (k / u(RUN) if run is None else run) + col4


def register_products() -> list[ir.Stmt]:
    """Each thread's MICRO x MICRO sums += its rows of X times its weight rows, for each
    value of k of its slice: a float4 of each tile (k-major) and MICRO^2 FMAs."""
    kt, r, c = ir.Var("mf_kt"), ir.Var("mf_r"), ir.Var("mf_c")
    acc = frag("mf_acc", r, c)
    return [
        ir.Comment(f"the thread's sums += x[row] * w[weight row] over its slice's {SLICE_K} "
                   "values of k"),
        unrolled("mf_kk", SLICE_K, [
            ir.Decl("mf_kt", "uint", ir.Var("mf_ks") * u(SLICE_K) + ir.Var("mf_kk")),
            ir.Decl("mf_x4", "float4", frag("mf_tiles", u(TILE_VECTORS) + kmajor(
                kt, ir.Var("mf_tm")))),
            ir.Decl("mf_w4", "float4", frag("mf_tiles", kmajor(kt, ir.Var("mf_tn")))),
            unrolled("mf_r", MICRO, [unrolled("mf_c", MICRO, [ir.Assign(acc, ir.Call(
                "fma", (frag("mf_x4", r), frag("mf_w4", c), acc)))])])])]


def step(st: QuantState, w: Node, x: Node, matrix: bool) -> list[ir.Stmt]:
    """One step of TILE_K values along K: the tiles from registers into threadgroup memory,
    the next step's values loaded into registers, then every thread's sums."""
    ctx = st.ctx
    srow, q, j, K = ir.Var("mf_srow"), ir.Var("mf_q"), ir.Var("mf_j"), ctx.size(ctx.axis)
    k = q * u(RUN) + j                                   # the value's place in the step
    if matrix:           # W k-major (W^T's blocks load as stored), X row-major (RUN: float4s)
        w_at = ir.Lane(ir.Var("mf_ws"), k * u(W_STRIDE) + srow)
        x_at = ir.Lane(ir.Lane(ir.Var("mf_xs"), srow * u(X_VECTORS) + q * u(RUN // 4)
                               + j / u(4)), j % u(4))
    else:                # both k-major, rows of float4s
        at = kmajor(k, srow / u(4), q)
        w_at = ir.Lane(ir.Lane(ir.Var("mf_tiles"), at), srow % u(4))
        x_at = ir.Lane(ir.Lane(ir.Var("mf_tiles"), u(TILE_VECTORS) + at), srow % u(4))
    # after the last step: its values again where every step is whole (in bounds, unused),
    # else the values past K, which the staging zeroes
    nxt: ir.Expr = ir.Var("mf_k0") + idx(TILE_K)
    if whole_steps(st):
        nxt = ir.Call("min", (nxt, K - idx(TILE_K)))
    return [
        ir.Comment("this step's tiles, from registers"),
        put(w_at, "mf_wn"), put(x_at, "mf_xn"),
        ir.Barrier(),
        ir.Comment("the next step's values, loaded while this step's products run"),
        ir.Decl("mf_k1", IDX, nxt),
        *staging(st, w, x, ir.Var("mf_k1")),
        *(matrix_products() if matrix else register_products()),
        ir.Barrier()]


def store(st: QuantState, total: ir.Expr, row: ir.Expr, col: ir.Expr,
          loops: list[tuple[str, int]]) -> list[ir.Stmt]:
    """The thread's outputs: sum `total` at (row mf_m = m0 + row, weight row mf_n = n0 + col),
    where both exist, inside `loops` (unrolled, outermost first; total and col use them)."""
    ctx = st.ctx
    _, outputs = epilogue(st, [total])
    real = (ir.Var("mf_m") < ctx.size(ctx.prefix[-1])).and_(
        ir.Var("mf_n") < ctx.size(ctx.rows_axis))
    body: list[ir.Stmt] = [ir.Decl("mf_n", IDX, ir.Var("mf_n0") + ir.Cast(IDX, col)),
                           ir.If(real, outputs)]
    for var, n in reversed(loops):
        body = [unrolled(var, n, body)]
    return [ir.Decl("mf_m", IDX, ir.Var("mf_m0") + ir.Cast(IDX, row)), *body]


def matrix_store(st: QuantState) -> list[ir.Stmt]:
    """The lane's two elements of each of the simdgroup's blocks."""
    j, i = ir.Var("mf_j"), ir.Var("mf_i")
    row = ir.Var("mf_bm") * u(FRAG) + ir.Var("mf_mr")
    col = (ir.Var("mf_bn") + j) * u(FRAG) + ir.Var("mf_mc") + i
    return [ir.Comment("the lane's elements of its blocks: the outputs, where the row and "
                       "weight row exist"),
            *store(st, frag("mf_acc", j, i), row, col, [("mf_j", BLOCKS), ("mf_i", 2)])]


def register_store(st: QuantState) -> list[ir.Stmt]:
    """The slices' sums meet in threadgroup memory (where the tiles were, as float4s
    [slice][row][weight rows / 4]); thread t adds up MICRO outputs of row t / MICRO_COLS and
    stores them."""
    t, r = ir.Var("mf_t"), ir.Var("mf_r")
    slot = (ir.Var("mf_ks") * u(TILE_M) + ir.Var("mf_tm") * u(MICRO) + r) * u(MICRO_COLS) \
        + ir.Var("mf_tn")
    total = frag("mf_tiles", t)
    for s in range(1, K_SLICES):
        total = total + frag("mf_tiles", t + u(s * THREADS))
    return [
        ir.Comment(f"the {K_SLICES} slices' sums through threadgroup memory (the tiles' "
                   "place: the last step is done)"),
        unrolled("mf_r", MICRO, [ir.Assign(frag("mf_tiles", slot), frag("mf_acc", r))]),
        ir.Barrier(),
        ir.Comment(f"thread t: row t / {MICRO_COLS} of the tile, weight rows {MICRO} (t % "
                   f"{MICRO_COLS}) + i, summed over the slices: the outputs, where the row and "
                   "weight row exist"),
        ir.Decl("mf_sum", "float4", total),
        *store(st, frag("mf_sum", ir.Var("mf_i")), t / u(MICRO_COLS),
               t % u(MICRO_COLS) * u(MICRO) + ir.Var("mf_i"), [("mf_i", MICRO)])]


def body(st: QuantState, w: Node, x: Node) -> list[ir.Stmt]:
    """The kernel's statements (the kernel's M position is mf_m while they are lowered)."""
    ctx, v = st.ctx, st.v
    matrix = ctx.policy.qmm_matrix
    if matrix:
        ctx.uses.helpers.update({"mf_mma", "mf_mat_load"})
        v.tg_arrays.extend([ir.ArrayDecl("mf_ws", "float", TILE_K * W_STRIDE, "threadgroup"),
                            ir.ArrayDecl("mf_xs", "float4", TILE_M * X_VECTORS, "threadgroup")])
        head = header(st, True) + [ir.Decl("mf_xsf", "threadgroup float*", ir.Call(
            "reinterpret_cast<threadgroup float*>", (ir.Var("mf_xs"),)), const=False)]
    else:
        v.tg_arrays.append(ir.ArrayDecl("mf_tiles", "float4", 2 * TILE_VECTORS,
                                        "threadgroup"))
        head = header(st, False)
    loop = ir.For("mf_k0", IDX, idx(0), ctx.size(ctx.axis), step(st, w, x, matrix),
                  step=idx(TILE_K))
    finish = matrix_store(st) if matrix else register_store(st)
    first = [ir.Comment(f"each thread's {RUN} values of each tile, a step ahead"),
             ir.ArrayDecl("mf_wn", "float", RUN), ir.ArrayDecl("mf_xn", "float", RUN),
             *staging(st, w, x, None)]
    return list(v.tg_arrays) + head + v.pre + first + [
        ir.Comment(f"along '{ctx.axis}' in steps of {TILE_K} values"), loop, *finish]


THREAD_INPUTS = (ir.ThreadInput("mf_group", "uint", "threadgroup_position_in_grid"),
                 ir.ThreadInput("mf_lane", "uint", "thread_index_in_simdgroup"),
                 ir.ThreadInput("mf_sg", "uint", "simdgroup_index_in_threadgroup"))


def kernel(st: QuantState) -> ir.LoweredKernel:
    """The tiled kernel, for graphs of `form.factors`'s form."""
    ctx = st.ctx
    w, x = factors(ctx) or (ctx.red, ctx.red)
    summary = (f"{ctx.graph.name} (qmm): y = sum over '{ctx.axis}' of values "
               f"unpacked from {ctx.bits}-bit words times rows of "
               f"'{ctx.prefix[-1]}'; tiles of {TILE_M} x {TILE_N} outputs, "
               f"{TILE_K} values of '{ctx.axis}' per step staged in threadgroup "
               f"memory (weights dequantized once per tile), "
               + ("products as 8x8 simdgroup matrices" if ctx.policy.qmm_matrix else
                  f"each thread {MICRO} x {MICRO} sums in registers over a "
                  f"slice of each step")
               + "; fp32 accumulation")
    return make_kernel(ctx.graph, ctx.index64, THREAD_INPUTS, body(st, w, x), summary, "qmm")
