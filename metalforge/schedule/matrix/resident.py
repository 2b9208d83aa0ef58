"""Left operands resident in a simdgroup's registers: 16 rows x K (static) of half / bfloat held
as matmul2d's left input cooperative tensors across a loop, each product a whole
C(16 x 16) += A(16 x K) B^T with B k-inner in threadgroup memory (its rows are C's columns, K
contiguous, row stride given), fp32 destinations (the `strided.Blocks` naming, so that
`strided.each` / `strided.clear` read them). Metal 4 tensor ops only (tile.MPP).

    res = Resident("mf_sres", "half", 128)
    declare_op(res)                           # matmul2d(16, 16, 128), B transposed
    declare(res, "mf_kc")                     # a left input cooperative tensor
    load(res, "mf_kc", ptr, stride)           # its 16 rows x K from threadgroup memory
    destinations(res, "mf_kc", blk, 2)        # blk's blocks 0, 1 (zeroed)
    multiply(res, "mf_kc", blk, 0, b_ptr, b_stride)

The rows are read whole (16 x K from `ptr` and `b_ptr`): the caller zero-fills what lies past
its data. The layout of the cooperative tensor is the target's (load / run only).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ... import ir
from .mpp import each_element, zeroed
from .strided import EXTENTS, SIDE, Blocks, OpNames, clear


@dataclass(frozen=True)
class Resident(OpNames):
    """The op `name`_op of left operands of MSL type `operand`, K = `k` (a multiple of 16)."""
    name: str
    operand: str
    k: int


def _i(v: int) -> ir.Lit:
    return ir.Lit(v, "int")


def view(tensor: str, ptr: ir.Expr, cols: int, stride: ir.Expr, rows: int = SIDE) -> ir.Expr:
    """`rows` rows x `cols` at `ptr` (a threadgroup tensor of type `tensor`), the columns
    contiguous (dimension 0), `stride` between rows."""
    return ir.Call(tensor, (ptr, ir.Call(EXTENTS, (_i(cols), _i(rows))),
                            ir.Call("mf_strides", (ir.Cast("int32_t", stride),))))


def declare_matmul(op: str, m: int, n: int, k: int, transpose_right: bool) -> list[ir.Stmt]:
    """The multiply-accumulate matmul2d `op` (one simdgroup) of M x N x K."""
    desc = ir.Call("matmul2d_descriptor", (
        _i(m), _i(n), _i(k), ir.Lit(False, "bool"), ir.Lit(transpose_right, "bool"),
        ir.Lit(False, "bool"), ir.Var("matmul2d_descriptor::mode::multiply_accumulate")))
    return [ir.Decl(f"{op}_desc", "constexpr auto", desc, const=False),
            ir.Decl(op, f"matmul2d<{op}_desc, execution_simdgroup>", None, const=False)]


def declare_op(res: Resident) -> list[ir.Stmt]:
    return declare_matmul(res.op, SIDE, SIDE, res.k, True)


def declare(ops: OpNames, var: str) -> ir.Stmt:
    """`var`: a left input cooperative tensor of the op of `ops` (a Resident's or a Rows')."""
    t = ops.operand
    return ir.Decl(var, "auto", ir.Call(
        f"{ops.op}.get_left_input_cooperative_tensor<{t}, {t}, float>", ()), const=False)


def load(res: Resident, var: str, ptr: ir.Expr, stride: ir.Expr) -> ir.Stmt:
    """The cooperative tensor `var` = the 16 rows x K at `ptr` (every lane together)."""
    return ir.Eval(ir.Call(f"{var}.load", (view(res.tensor, ptr, res.k, stride),)))


def destinations(res: Resident, var: str, blk: Blocks, count: int) -> list[ir.Stmt]:
    """`blk`'s blocks 0 .. count - 1 as this op's destinations (zeroed)."""
    dest = ir.Call(f"{res.op}.get_destination_cooperative_tensor<decltype({var}), "
                   f"{res.tensor}, float>", ())
    out: list[ir.Stmt] = [ir.Decl(blk.var(i).name, "auto", dest, const=False)
                          for i in range(count)]
    return out + [s for i in range(count) for s in clear(blk, i)]


def multiply(res: Resident, var: str, blk: Blocks, i: int, b: ir.Expr, b_stride: ir.Expr
             ) -> ir.Stmt:
    """Block i += `var` (16 x K) x B^T (B: 16 rows x K at `b`, K contiguous)."""
    return ir.Eval(ir.Call(f"{res.op}.run", (ir.Var(var), view(res.tensor, b, res.k, b_stride),
                                             blk.var(i))))


@dataclass(frozen=True)
class Rows(OpNames):
    """A simdgroup's 16 x n fp32 destinations, each ONE cooperative tensor (`name`_op:
    matmul2d(16, n, 16)), of C += A (16 x 16 in threadgroup memory, K contiguous) x B (16
    rows of K, n values each, contiguous): one run where 16 x 16 blocks take n / 16, the A
    fragment read once."""
    name: str
    operand: str
    n: int


def declare_rows(rows: Rows, dests: tuple[str, ...]) -> list[ir.Stmt]:
    """The op and the destinations `dests` (zeroed)."""
    dest = ir.Call(f"{rows.op}.get_destination_cooperative_tensor<{rows.tensor}, "
                   f"{rows.tensor}, float>", ())
    out = declare_matmul(rows.op, SIDE, rows.n, SIDE, False)
    for d in dests:
        out += [ir.Decl(d, "auto", dest, const=False), zeroed(d)]
    return out


def multiply_rows(rows: Rows, dest: str, a: ir.Expr, a_stride: ir.Expr, b: ir.Expr,
                  b_stride: ir.Expr) -> ir.Stmt:
    """`dest` += A (16 x 16 at `a`) x B (16 rows x n at `b`)."""
    return ir.Eval(ir.Call(f"{rows.op}.run", (view(rows.tensor, a, SIDE, a_stride),
                                              view(rows.tensor, b, rows.n, b_stride),
                                              ir.Var(dest))))


def multiply_rows_left(rows: Rows, dest: str, left: str, b: ir.Expr, b_stride: ir.Expr
                       ) -> ir.Stmt:
    """`dest` += `left` (a left input cooperative tensor: `declare`) x B (16 rows x n at `b`)."""
    return ir.Eval(ir.Call(f"{rows.op}.run", (ir.Var(left), view(rows.tensor, b, rows.n,
                                                                     b_stride), ir.Var(dest))))


def each_row(dest: str, body: Callable[[ir.Expr, ir.Expr, ir.Expr], list[ir.Stmt]]
             ) -> list[ir.Stmt]:
    """`body(row, col, element)` for each element of `dest` the lane holds (row 0 .. 15, col
    0 .. n - 1, from get_multidimensional_index)."""
    return [each_element(dest, body)]


def tensor_destinations(res: Resident, blk: Blocks, count: int) -> list[ir.Stmt]:
    """`blk`'s blocks 0 .. count - 1 as destinations of this op with both operands in
    threadgroup memory (`multiply_tensors`), zeroed."""
    dest = ir.Call(f"{res.op}.get_destination_cooperative_tensor<{res.tensor}, {res.tensor}, "
                   "float>", ())
    out: list[ir.Stmt] = [ir.Decl(blk.var(i).name, "auto", dest, const=False)
                          for i in range(count)]
    return out + [s for i in range(count) for s in clear(blk, i)]


def multiply_tensors(res: Resident, blk: Blocks, i: int, a: ir.Expr, a_stride: ir.Expr,
                     b: ir.Expr, b_stride: ir.Expr) -> ir.Stmt:
    """Block i += A (16 rows x K at `a`) x B^T (16 rows x K at `b`), both in threadgroup
    memory, K contiguous: one run over the whole K."""
    return ir.Eval(ir.Call(f"{res.op}.run", (view(res.tensor, a, res.k, a_stride),
                                             view(res.tensor, b, res.k, b_stride),
                                             blk.var(i))))
