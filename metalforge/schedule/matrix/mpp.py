"""The matrix block on Metal 4 tensor operations (MetalPerformancePrimitives' `matmul2d`: M5's
neural accelerators; MSL 4.0, the `apple10` and `cuda` targets).

Each simdgroup runs one `matmul2d<desc, execution_simdgroup>` with the descriptor (WM, WN, 16,
transpose_left = false, transpose_right = true, relaxed_precision = false,
multiply_accumulate): its operands are threadgroup tensors over its rows of each staged 16-wide
slice of A and B (`tile.staged`: a slice of a block of rows is one packed row-major matrix, so
the tensors need no strides), half or bfloat (float with relaxed_precision = true where the
launch asks for TF32: `Tile.relaxed`); B is k-inner, hence transpose_right. The
destination is a cooperative tensor of fp32 (mf_acc) that stays in registers across K, zeroed
element by element up to its `get_capacity()`. Padded staged rows (`Tile.pad`) make the
tensors strided (strides {1, 16 + pad}), and mark the loops over the capacity for unrolling
(it is a compile-time constant; an accumulator indexed at run time would live in memory).

The code assumes no element layout: the results are read through `is_valid_element(i)` and
`get_multidimensional_index(i)` ([column, row] in the simdgroup's block), so the same kernel is
right on every GPU family (M5's 16x16 fragments, the ALU layout of earlier families, the cuda
shim's mma fragments).
"""
from __future__ import annotations

from typing import Callable

from ... import ir
from ..fragments import u
from .tile import SLICE, Tile

HELPERS = ("mf_tensor_ops",)
Emit = Callable[[ir.Expr, ir.Expr, ir.Expr], list[ir.Stmt]]
EXTENTS = "dextents<int32_t, 2>"


def _i(v: int) -> ir.Lit:
    return ir.Lit(v, "int")


def _tensor(t: Tile) -> str:
    return f"tensor<threadgroup {t.operand}, {EXTENTS}, tensor_inline>"


def _operand(t: Tile, name: str, array: str, rows: int, block_rows: int, row0: ir.Expr,
             s: int) -> ir.Stmt:
    """A threadgroup tensor over rows row0.. (block_rows of them) of slice s of a staged tile:
    extents (16 values of K, block_rows)."""
    first = row0 if s == 0 else u(s * rows) + row0
    base = ir.Var(array) + first * u(t.stride)
    ext = ir.Call(EXTENTS, (_i(SLICE), _i(block_rows)))
    if not t.pad:
        return ir.Decl(name, "auto", ir.Call(_tensor(t), (base, ext)), const=False)
    strides = ir.Call("array<int32_t, 2>", (ir.Var(f"{{1, {t.stride}}}"),))
    return ir.Decl(name, "auto", ir.Call(_tensor(t), (base, ext, strides)), const=False)


def _method(obj: str, name: str, *args: ir.Expr) -> ir.Call:
    return ir.Call(f"{obj}.{name}", args)


def _capacity_loop(coop: str, body: list[ir.Stmt]) -> ir.Stmt:
    """`body` for each element index mf_c of cooperative tensor `coop`, up to its capacity: a
    compile-time constant, so the loop is marked for unrolling (an element indexed at run time
    would put the whole tensor in memory)."""
    return ir.For("mf_c", "int", _i(0), ir.Cast("int", _method(coop, "get_capacity")), body,
                  pragma_unroll=True)


def zeroed(coop: str) -> ir.Stmt:
    """Cooperative tensor `coop` set to 0, element by element."""
    return _capacity_loop(coop, [ir.Assign(ir.Lane(ir.Var(coop), ir.Var("mf_c")),
                                           ir.Lit(0.0, "float"))])


def each_element(coop: str, body: Emit) -> ir.Stmt:
    """`body(row, col, element)` for each valid element of cooperative tensor `coop` the lane
    holds (its place from get_multidimensional_index: [column, row]; no layout assumed)."""
    c, at = ir.Var("mf_c"), ir.Var("mf_at")
    return _capacity_loop(coop, [ir.If(_method(coop, "is_valid_element", c), [
        ir.Decl("mf_at", "auto", _method(coop, "get_multidimensional_index", c)),
        *body(ir.Cast("uint", ir.Lane(at, _i(1))), ir.Cast("uint", ir.Lane(at, _i(0))),
              ir.Lane(ir.Var(coop), c))])])


def accumulators(t: Tile, row0: ir.Expr, col0: ir.Expr) -> list[ir.Stmt]:
    """The descriptor, the op, the simdgroup's operand tensors (one pair per slice) and its
    zeroed fp32 destination."""
    slices = t.bk // SLICE
    desc = ir.Call("matmul2d_descriptor", (
        _i(t.wm), _i(t.wn), _i(SLICE), ir.Lit(False, "bool"), ir.Lit(True, "bool"),
        ir.Lit(t.relaxed, "bool"), ir.Var("matmul2d_descriptor::mode::multiply_accumulate")))
    out: list[ir.Stmt] = [
        ir.Comment(f"Metal 4 tensor ops: the simdgroup's {t.wm} x {t.wn} outputs += A ({t.wm} "
                   f"rows) x B^T ({t.wn} rows), {SLICE} values of K a run"),
        ir.Decl("mf_desc", "constexpr auto", desc, const=False),
        ir.Decl("mf_op", "matmul2d<mf_desc, execution_simdgroup>", None, const=False),
        ir.Comment(f"its operands: threadgroup tensors over its rows of each {SLICE}-wide "
                   "slice of the staged tiles")]
    for s in range(slices):
        out += [_operand(t, f"mf_left{s}", "mf_as", t.bm, t.wm, row0, s),
                _operand(t, f"mf_right{s}", "mf_bs", t.bn, t.wn, col0, s)]
    return out + [
        ir.Comment("the fp32 destination, in registers across K (a cooperative tensor)"),
        ir.Decl("mf_acc", "auto", ir.Call(
            "mf_op.get_destination_cooperative_tensor<decltype(mf_left0), "
            "decltype(mf_right0), float>", ()), const=False),
        zeroed("mf_acc")]


def products(t: Tile) -> list[ir.Stmt]:
    """acc += the step's slices (one op.run each)."""
    runs: list[ir.Stmt] = [
        ir.Eval(_method("mf_op", "run", ir.Var(f"mf_left{s}"), ir.Var(f"mf_right{s}"),
                        ir.Var("mf_acc"))) for s in range(t.bk // SLICE)]
    return [ir.Comment(f"acc += A x B^T over the step's {t.bk} values of K"), *runs]


def results(t: Tile, emit: Emit) -> list[ir.Stmt]:
    """`emit(row, col, value)` for each valid element of the lane's destination (its place
    from get_multidimensional_index: [column, row] in the simdgroup's block)."""
    return [ir.Comment("each element the lane holds: its place in the block, then its output"),
            each_element("mf_acc", emit)]
