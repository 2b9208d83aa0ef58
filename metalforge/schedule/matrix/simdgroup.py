"""The matrix block on Metal's 8x8 simdgroup matrices (every Apple GPU from the Apple7 family).

Each simdgroup holds its WM x WN block of C as (WM / 8) x (WN / 8) `simdgroup_float8x8`
accumulators (mf_acc, row-major over the block's fragments). Each step, for every 8 values of
K, it loads its WM / 8 fragments of A and WN / 8 of B^T from the staged tiles in the operand
type (`simdgroup_half8x8` / `simdgroup_bfloat8x8` / `simdgroup_float8x8`; B^T by a transposed
load: B's rows are k-inner) and multiplies-accumulates every pair into fp32
(`simdgroup_multiply_accumulate` with half or bfloat operands and float accumulators, as
llama.cpp's and MLX's Metal GEMMs do). The lane's two elements of each accumulator are at row
mf_mr, columns mf_mc and mf_mc + 1 of its fragment (`fragments.lane_place`).
"""
from __future__ import annotations

from typing import Callable

from ... import ir
from ..fragments import lane_place, u, unrolled
from .tile import SLICE, Tile

FRAG = 8
Emit = Callable[[ir.Expr, ir.Expr, ir.Expr], list[ir.Stmt]]


def _mat(t: Tile) -> str:
    return f"simdgroup_matrix<{t.operand}, 8, 8>"


def _frags(t: Tile) -> tuple[int, int]:
    return t.wm // FRAG, t.wn // FRAG


def accumulators(t: Tile) -> list[ir.Stmt]:
    """The simdgroup's zeroed fp32 accumulators."""
    fm, fn = _frags(t)
    return [ir.Comment(f"the simdgroup's {t.wm} x {t.wn} outputs: {fm} x {fn} 8x8 fp32 "
                       "accumulators"),
            ir.ArrayDecl("mf_acc", "simdgroup_float8x8", fm * fn),
            unrolled("mf_f", fm * fn, [ir.Assign(ir.Lane(ir.Var("mf_acc"), ir.Var("mf_f")),
                                                 ir.Call("make_filled_simdgroup_matrix<float, "
                                                         "8, 8>", (ir.Lit(0.0, "float"),)))])]


def _load(mat: ir.Expr, array: str, rows: int, k8: ir.Expr, row: ir.Expr,
          transpose: bool, stride: int = SLICE) -> ir.Stmt:
    """simdgroup_load of the 8x8 block at value k8 (a multiple of 8) of K and row `row` of a
    staged tile (its rows `stride` apart inside the slice of k8); transposed: the block's
    K^T."""
    base = ir.Var(array) + k8 / u(SLICE) * u(rows * stride)
    origin = ir.Call("ulong2", (k8 % u(SLICE), row))
    return ir.Eval(ir.Call("simdgroup_load", (mat, base, ir.Lit(stride, "uint"), origin,
                                              ir.Lit(transpose, "bool"))))


def products(t: Tile, row0: ir.Expr, col0: ir.Expr) -> list[ir.Stmt]:
    """acc += A[row0.., k] B[col0.., k]^T over the step's BK values (the simdgroup's block at
    rows row0, columns col0 of the tile)."""
    fm, fn = _frags(t)
    i, j, k8 = ir.Var("mf_fi"), ir.Var("mf_fj"), ir.Var("mf_k8")
    acc = ir.Lane(ir.Var("mf_acc"), i * u(fn) + j)
    return [
        ir.Comment(f"acc += A's {fm} fragments x B^T's {fn} fragments, 8 values of K a product"),
        ir.For("mf_k8", "uint", u(0), u(t.bk), [
            ir.ArrayDecl("mf_fa", _mat(t), fm), ir.ArrayDecl("mf_fb", _mat(t), fn),
            unrolled("mf_fi", fm, [_load(ir.Lane(ir.Var("mf_fa"), i), "mf_as", t.bm, k8,
                                         row0 + i * u(FRAG), False, t.stride)]),
            unrolled("mf_fj", fn, [_load(ir.Lane(ir.Var("mf_fb"), j), "mf_bs", t.bn, k8,
                                         col0 + j * u(FRAG), True, t.stride)]),
            unrolled("mf_fi", fm, [unrolled("mf_fj", fn, [ir.Eval(ir.Call(
                "simdgroup_multiply_accumulate",
                (acc, ir.Lane(ir.Var("mf_fa"), i), ir.Lane(ir.Var("mf_fb"), j), acc)))])])],
            unroll=True, step=u(FRAG))]


def results(t: Tile, emit: Emit) -> list[ir.Stmt]:
    """`emit(row, col, value)` for each of the lane's accumulator elements (row and col in the
    simdgroup's block, value fp32)."""
    fm, fn = _frags(t)
    i, j, e = ir.Var("mf_fi"), ir.Var("mf_fj"), ir.Var("mf_e")
    row = i * u(FRAG) + ir.Var("mf_mr")
    col = j * u(FRAG) + ir.Var("mf_mc") + e
    elems = ir.Call("mf_mat_elements", (ir.Lane(ir.Var("mf_acc"), i * u(fn) + j),))
    return lane_place(ir.Var("mf_lane")) + [
        ir.Comment("each accumulator element of the lane: its output"),
        unrolled("mf_fi", fm, [unrolled("mf_fj", fn, [
            ir.Decl("mf_c2", "float2", elems),
            unrolled("mf_e", 2, emit(row, col, ir.Lane(ir.Var("mf_c2"), e)))])])]


HELPERS = ("mf_mat_elements",)
