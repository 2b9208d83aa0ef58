"""The matrix block's geometry and staging: what a threadgroup's tile is, which lowering and
operand type a target and the operands' dtypes give it, and how its operands reach
threadgroup memory.

A threadgroup computes C[BM, BN] = sum over K of A[BM, k] * B[BN, k] (B's rows are C's
columns: both operands are k-inner, "A times B transposed", the form of `mf.sum(a * b,
axis="K")`, of attention's Q·K^T and of a linear layer's x·W^T), BK values of K a step. Its
simdgroups split C into a grid of `sg_rows` x `sg_cols` blocks of WM x WN outputs.

Staged layout: an operand tile of `rows` rows x BK values is held in threadgroup memory as
BK / 16 slices of rows x 16 values, each row-major: element (r, k) at
((k / 16) * rows + r) * 16 + k % 16. A 16-wide slice of any block of rows is then one dense
row-major matrix (what a Metal 4 tensor over threadgroup memory with packed extents reads, and
what simdgroup_load reads at a row stride of 16).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ... import ir
from ...dtypes import DType
from ...target import Target
from ..fragments import u

SLICE = 16                # values of K in one staged slice (and one tensor-op product)
BK = 32                   # values of K a step
MPP = "mpp"
SIMDGROUP = "simdgroup_matrix"
Value = Callable[[ir.Expr, ir.Expr], tuple[list[ir.Stmt], ir.Expr]]
# a vector load of VEC consecutive values of K from row r, value k (a multiple of VEC)
Vector = Callable[[ir.Expr, ir.Expr], ir.Expr]


@dataclass(frozen=True)
class Tile:
    """One threadgroup's tile of C += A·B^T: BM x BN outputs, BK values of K a step, its
    simdgroups `sg_rows` x `sg_cols` blocks of WM x WN outputs; operands staged as `operand`
    (MSL "half", "bfloat" or "float"), products by `lowering` (MPP or SIMDGROUP), fp32
    accumulation."""
    bm: int
    bn: int
    sg_rows: int
    sg_cols: int
    operand: str
    lowering: str
    bk: int = BK

    @property
    def wm(self) -> int:
        return self.bm // self.sg_rows

    @property
    def wn(self) -> int:
        return self.bn // self.sg_cols

    @property
    def simdgroups(self) -> int:
        return self.sg_rows * self.sg_cols

    @property
    def threads(self) -> int:
        return 32 * self.simdgroups

    @property
    def operand_bytes(self) -> int:
        return 4 if self.operand == "float" else 2

    @property
    def vec(self) -> int:
        """Values of K in one 16-byte vector load of an operand stored as the operand type."""
        return 16 // self.operand_bytes

    @property
    def threadgroup_bytes(self) -> int:
        return (self.bm + self.bn) * self.bk * self.operand_bytes

    def describe(self) -> str:
        how = ("Metal 4 tensor ops (matmul2d over threadgroup tensors, cooperative-tensor "
               "accumulators)" if self.lowering == MPP else "8x8 simdgroup_matrix products")
        return (f"tiles of {self.bm} x {self.bn} outputs, {self.bk} values of K a step staged "
                f"as {self.operand}, {self.simdgroups} simdgroups of {self.wm} x {self.wn}; "
                f"{how}; fp32 accumulation")


def operand_type(a: DType, b: DType, target: Target) -> str:
    """The staged operands' MSL type: the operands' own half or bfloat (both the same; bfloat
    where the target's Metal has it), else float (f32 keeps the fp32 path: no TF32)."""
    if a == b and a.name == "f16":
        return "half"
    if a == b and a.name == "bf16" and target.bfloat_matrices:
        return "bfloat"
    return "float"


def choose(target: Target, a: DType, b: DType, tile: int) -> Tile:
    """The tile a target and operand dtypes give: Metal 4 tensor ops where the target has them
    and the operands are half or bfloat, simdgroup_matrix products elsewhere; `tile` x `tile`
    outputs in 2 x 2 simdgroups."""
    op = operand_type(a, b, target)
    lowering = MPP if target.tensor_ops and op != "float" else SIMDGROUP
    return Tile(tile, tile, 2, 2, op, lowering)


def staged(rows: int, r: ir.Expr, k: ir.Expr) -> ir.Expr:
    """Element (r, k) of a staged operand tile of `rows` rows (the layout above)."""
    return (k / u(SLICE) * u(rows) + r) * u(SLICE) + k % u(SLICE)


def arrays(t: Tile) -> list[ir.Stmt]:
    """The staged tiles in threadgroup memory: mf_as (BM rows of A), mf_bs (BN rows of B)."""
    return [ir.ArrayDecl("mf_as", t.operand, t.bm * t.bk, "threadgroup"),
            ir.ArrayDecl("mf_bs", t.operand, t.bn * t.bk, "threadgroup")]


def stage(t: Tile, array: str, rows: int, k_inner: bool, value: Value,
          live: Callable[[ir.Expr, ir.Expr], ir.Expr]) -> list[ir.Stmt]:
    """Every thread's share of one operand tile: element (mf_r, mf_kk) of the tile is
    `value(mf_r, mf_kk)` (its statements and value) where `live` (inside the operand's bounds),
    else 0, converted to the operand type. Consecutive threads take consecutive values of K
    (`k_inner`: the tensors are k-inner in memory) or of the rows."""
    e = ir.Var("mf_i") * u(t.threads) + ir.Var("mf_t")
    if k_inner:
        r, k = e / u(t.bk), e % u(t.bk)
    else:
        r, k = e % u(rows), e / u(rows)
    rv, kv = ir.Var("mf_r"), ir.Var("mf_kk")
    stmts, v = value(rv, kv)
    at = staged(rows, rv, kv)
    return [ir.For("mf_i", "uint", u(0), u(rows * t.bk // t.threads), [
        ir.Decl("mf_r", "uint", r), ir.Decl("mf_kk", "uint", k),
        ir.If(live(rv, kv),
              stmts + [ir.Store(array, at, ir.Cast(t.operand, v), space="threadgroup")],
              [ir.Store(array, at, ir.Cast(t.operand, ir.Lit(0.0, "float")),
                        space="threadgroup")])])]


def stage_vectors(t: Tile, array: str, rows: int, load: Vector, vtype: str,
                  live: ir.Expr) -> list[ir.Stmt]:
    """Every thread's share of one operand tile read as 16-byte vectors (an operand that is a
    tensor of the operand type, k-inner, the step whole and aligned): vector mf_v of row mf_r
    holds values mf_kk.. mf_kk + VEC - 1 (`load(mf_r, mf_kk)`), stored element by element where
    `live` (the row exists), else zeros. `vtype`: the loaded vector's type."""
    per_row = t.bk // t.vec
    e = ir.Var("mf_i") * u(t.threads) + ir.Var("mf_t")
    rv, kv, j = ir.Var("mf_r"), ir.Var("mf_kk"), ir.Var("mf_j")
    at = staged(rows, rv, kv + j)
    lane = ir.Call("mf_lane8", (ir.Var("mf_vals"), j)) if t.vec == 8 else \
        ir.Lane(ir.Var("mf_vals"), j)
    zero = ir.Cast(t.operand, ir.Lit(0.0, "float"))
    return [ir.For("mf_i", "uint", u(0), u(max(1, rows * per_row // t.threads)), [
        ir.Decl("mf_r", "uint", e / u(per_row)),
        ir.Decl("mf_kk", "uint", e % u(per_row) * u(t.vec)),
        ir.If(live, [
            ir.Decl("mf_vals", vtype, load(rv, kv)),
            ir.For("mf_j", "uint", u(0), u(t.vec), [ir.Store(array, at, lane, space="threadgroup")],
                   unroll=True)],
              [ir.For("mf_j", "uint", u(0), u(t.vec), [ir.Store(array, at, zero,
                                                                 space="threadgroup")],
                      unroll=True)])])]
