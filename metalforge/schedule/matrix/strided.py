"""The matrix block over operands already in threadgroup memory as row-major matrices with a
row stride (not `tile.staged`'s slices): one simdgroup's 16 x 16 fp32 block of C += A·B over 16
values of K a product, where A's rows are C's rows (K contiguous) and B is either k-inner (its
rows are C's columns, K contiguous: B transposed, Q·K^T's key tile) or k-outer (its rows are K,
C's columns contiguous: P·V's value tile).

    blk = Blocks("mf_oacc", lowering, "half", k_inner=False)
    declare(blk, 4)                                  # the op (mpp) and 4 zeroed blocks
    multiply(blk, 2, a_ptr, a_stride, b_ptr, b_stride)  # block 2 += A(16 x 16) B(16 x 16)
    each(blk, 2, lambda row, col, ref: [...])         # per element the lane holds
    clear(blk, 2)

The pointers are any threadgroup address expressions of the operand type (the caller offsets
them to the block's rows and the slice of K); the 16 x 16 operand blocks are read whole (the
caller zero-fills what lies past its data). Lowerings (`tile.MPP`, `tile.SIMDGROUP`):

- mpp: matmul2d(16, 16, 16, transpose_left = false, transpose_right = k_inner) over
  threadgroup tensors made in place with strides {1, stride} (helper mf_strides), the
  destination a cooperative fp32 tensor per block; elements through is_valid_element /
  get_multidimensional_index (no layout assumed);
- simdgroup_matrix: helper mf_mma16 (two 8-wide steps of K, 2 x 2 fragments, operands loaded in
  their own type, transposed for a k-inner B), each block the lane's four float2
  (thread_elements(), Apple's layout: `fragments.lane_place`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ... import ir
from ..fragments import u, zero
from .mpp import each_element, zeroed
from .tile import MPP

SIDE = 16
EXTENTS = "dextents<int32_t, 2>"
# (row, col in the block, the element as an lvalue: read or assigned) -> statements
Body = Callable[[ir.Expr, ir.Expr, ir.Expr], list[ir.Stmt]]


def threadgroup_tensor(operand: str) -> str:
    """The type of a 2-D Metal 4 tensor over threadgroup values of MSL type `operand`."""
    return f"tensor<threadgroup {operand}, {EXTENTS}, tensor_inline>"


class OpNames:
    """What the holders of a matmul2d op's operands and results share: the op is `name`_op,
    its operands of MSL type `operand` are threadgroup tensors of type `tensor`."""
    name: str
    operand: str

    @property
    def op(self) -> str:
        return f"{self.name}_op"

    @property
    def tensor(self) -> str:
        return threadgroup_tensor(self.operand)


@dataclass(frozen=True)
class Blocks(OpNames):
    """Blocks `name`0, `name`1, ... of 16 x 16 fp32 outputs of one simdgroup: operands of MSL
    type `operand` ("half", "bfloat", "float"), products by `lowering`, B k-inner or not."""
    name: str
    lowering: str
    operand: str
    k_inner: bool

    def var(self, i: int) -> ir.Var:
        return ir.Var(f"{self.name}{i}")


def helpers(b: Blocks) -> set[str]:
    return {"mf_tensor_ops", "mf_strides"} if b.lowering == MPP else {"mf_mma16"}


def _i(v: int) -> ir.Lit:
    return ir.Lit(v, "int")


def declare(b: Blocks, count: int) -> list[ir.Stmt]:
    """The op (mpp) and `count` zeroed blocks."""
    if b.lowering != MPP:
        out: list[ir.Stmt] = [ir.ArrayDecl(b.var(i).name, "float2", 4) for i in range(count)]
        return out + [s for i in range(count) for s in clear(b, i)]
    desc = ir.Call("matmul2d_descriptor", (
        _i(SIDE), _i(SIDE), _i(SIDE), ir.Lit(False, "bool"), ir.Lit(b.k_inner, "bool"),
        ir.Lit(False, "bool"), ir.Var("matmul2d_descriptor::mode::multiply_accumulate")))
    dest = ir.Call(f"{b.op}.get_destination_cooperative_tensor<{b.tensor}, {b.tensor}, "
                   "float>", ())
    out = [ir.Decl(f"{b.op}_desc", "constexpr auto", desc, const=False),
           ir.Decl(b.op, f"matmul2d<{b.op}_desc, execution_simdgroup>", None, const=False)]
    out += [ir.Decl(b.var(i).name, "auto", dest, const=False) for i in range(count)]
    return out + [s for i in range(count) for s in clear(b, i)]


def clear(b: Blocks, i: int) -> list[ir.Stmt]:
    """Blocks i = 0."""
    if b.lowering != MPP:
        return [ir.For("mf_f", "uint", u(0), u(4), [
            ir.Assign(ir.Lane(b.var(i), ir.Var("mf_f")), zero())], unroll=True)]
    return [zeroed(b.var(i).name)]


def _operand(b: Blocks, ptr: ir.Expr, stride: ir.Expr) -> ir.Expr:
    return ir.Call(b.tensor, (ptr, ir.Call(EXTENTS, (_i(SIDE), _i(SIDE))),
                              ir.Call("mf_strides", (ir.Cast("int32_t", stride),))))


def multiply(b: Blocks, i: int, a: ir.Expr, a_stride: ir.Expr, bm: ir.Expr,
             b_stride: ir.Expr) -> list[ir.Stmt]:
    """Blocks i += A(16 rows x 16 values of K at `a`) x B(16 values of K x 16 columns at
    `bm`), every lane of the simdgroup together."""
    if b.lowering == MPP:
        return [ir.Eval(ir.Call(f"{b.op}.run", (_operand(b, a, a_stride),
                                                _operand(b, bm, b_stride), b.var(i))))]
    fn = f"mf_mma16<{b.operand}, {'true' if b.k_inner else 'false'}>"
    return [ir.Eval(ir.Call(fn, (b.var(i), a, a_stride, bm, b_stride)))]


def each(b: Blocks, i: int, body: Body) -> list[ir.Stmt]:
    """`body(row, col, element)` for each element of block i the lane holds (row, col in the
    block; mpp: from get_multidimensional_index, [column, row]; simdgroup_matrix: the lane's
    place mf_mr, mf_mc, which the caller declares with `fragments.lane_place`)."""
    if b.lowering == MPP:
        return [each_element(b.var(i).name, body)]
    f, e = ir.Var("mf_f"), ir.Var("mf_x")
    row = f / u(2) * u(8) + ir.Var("mf_mr")
    col = f % u(2) * u(8) + ir.Var("mf_mc") + e
    return [ir.For("mf_f", "uint", u(0), u(4), [ir.For("mf_x", "uint", u(0), u(2), body(
        row, col, ir.Lane(ir.Lane(b.var(i), f), e)), unroll=True)], unroll=True)]
