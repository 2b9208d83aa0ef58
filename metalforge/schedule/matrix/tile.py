"""The matrix block's geometry and staging: what a threadgroup's tile is, which lowering and
operand type a target and the operands' dtypes give it, and how its operands reach
threadgroup memory.

A threadgroup computes C[BM, BN] = sum over K of A[BM, k] * B[BN, k] (B's rows are C's
columns: both operands are k-inner, "A times B transposed", the form of `mf.sum(a * b,
axis="K")`, of attention's Q·K^T and of a linear layer's x·W^T), BK values of K a step. Its
simdgroups split C into a grid of `sg_rows` x `sg_cols` blocks of WM x WN outputs.

Staged layout: an operand tile of `rows` rows x BK values is held in threadgroup memory as
BK / 16 slices of rows x 16 values, each row-major with a row stride of 16 + `pad` values:
element (r, k) at ((k / 16) * rows + r) * (16 + pad) + k % 16. A 16-wide slice of any block of
rows is then one row-major matrix (what a Metal 4 tensor over threadgroup memory reads: packed
extents where pad is 0, strides {1, 16 + pad} else; and what simdgroup_load reads at that row
stride).

Padded rows (`Tile.pad` = 8 values of a 2-byte operand: 48-byte rows) put the 8 rows that one
phase of a fragment load reads (CUDA's ldmatrix; the cuda shim's matmul2d) in 8 distinct sets
of banks, where 32-byte rows put rows r and r + 4 in the same banks (a 2-way conflict). Padded
tiles are also staged with 16-byte threadgroup stores, 8 consecutive threads on 8 consecutive
rows of the same 16 bytes of K (no bank conflict either), and can be loaded a step ahead
(`fetch_vectors` into registers, `put_vectors` after the products of the step before).
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
    pad: int = 0                # values after each staged row of 16 (the layout above)
    relaxed: bool = False       # float operands on tensor ops at reduced precision (TF32)

    @property
    def stride(self) -> int:
        """The staged rows' stride, in values."""
        return SLICE + self.pad

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
        return (self.bm + self.bn) * self.bk * self.stride // SLICE * self.operand_bytes

    def describe(self) -> str:
        how = ("Metal 4 tensor ops (matmul2d over threadgroup tensors, cooperative-tensor "
               "accumulators)" if self.lowering == MPP else "8x8 simdgroup_matrix products")
        pad = f" (rows padded by {self.pad})" if self.pad else ""
        tf32 = " (relaxed precision: TF32 products)" if self.relaxed else ""
        return (f"tiles of {self.bm} x {self.bn} outputs, {self.bk} values of K a step staged "
                f"as {self.operand}{pad}, {self.simdgroups} simdgroups of {self.wm} x "
                f"{self.wn}; {how}{tf32}; fp32 accumulation")


def operand_type(a: DType, b: DType, target: Target) -> str:
    """The staged operands' MSL type: the operands' own half or bfloat (both the same; bfloat
    where the target's Metal has it), else float (exact fp32 products unless a launch asks
    for TF32: `choose`)."""
    if a == b and a.name == "f16":
        return "half"
    if a == b and a.name == "bf16" and target.bfloat_matrices:
        return "bfloat"
    return "float"


def choose(target: Target, a: DType, b: DType, tile: int, bk: int = BK, pad: int = 0,
           simdgroups: int = 4, tf32: bool = False) -> Tile:
    """The tile a target and operand dtypes give: Metal 4 tensor ops where the target has them
    and the operands are half or bfloat (float ones too with `tf32`: matmul2d's
    relaxed_precision, TF32 products), simdgroup_matrix products elsewhere (exact fp32 for
    float); `tile` x `tile` outputs in 2 x 2 simdgroups (8: 2 x 4), `bk` values of K a step,
    staged rows padded by `pad` values (2-byte operands only: a float tile keeps 16)."""
    op = operand_type(a, b, target)
    relaxed = op == "float" and tf32 and target.tensor_ops
    lowering = MPP if target.tensor_ops and (op != "float" or relaxed) else SIMDGROUP
    cols = simdgroups // 2
    return Tile(tile, tile, 2, cols, op, lowering, bk, pad if op != "float" else 0, relaxed)


def staged(rows: int, r: ir.Expr, k: ir.Expr, pad: int = 0) -> ir.Expr:
    """Element (r, k) of a staged operand tile of `rows` rows (the layout above)."""
    return (k / u(SLICE) * u(rows) + r) * u(SLICE + pad) + k % u(SLICE)


def arrays(t: Tile) -> list[ir.Stmt]:
    """The staged tiles in threadgroup memory: mf_as (BM rows of A), mf_bs (BN rows of B)."""
    per_row = t.bk // SLICE * t.stride
    return [ir.ArrayDecl("mf_as", t.operand, t.bm * per_row, "threadgroup"),
            ir.ArrayDecl("mf_bs", t.operand, t.bn * per_row, "threadgroup")]


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
    at = staged(rows, rv, kv, t.pad)
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
    holds values mf_kk.. mf_kk + VEC - 1 (`load(mf_r, mf_kk)`), stored whole (one 16-byte
    threadgroup store: VEC divides a slice's 16 values, so they stay adjacent) where `live`
    (the row exists), else zeros. `vtype`: the loaded vector's type."""
    if t.pad:
        return [s for i in range(_vectors(t, rows)) for s in _put_vector(
            t, array, rows, i, [ir.Decl("mf_vals", vtype, load(ir.Var("mf_r"),
                                                                ir.Var("mf_kk")))], live)]
    per_row = t.bk // t.vec
    e = ir.Var("mf_i") * u(t.threads) + ir.Var("mf_t")
    rv, kv = ir.Var("mf_r"), ir.Var("mf_kk")
    at = staged(rows, rv, kv)
    return [ir.For("mf_i", "uint", u(0), u(max(1, rows * per_row // t.threads)), [
        ir.Decl("mf_r", "uint", e / u(per_row)),
        ir.Decl("mf_kk", "uint", e % u(per_row) * u(t.vec)),
        ir.If(live, [
            ir.Decl("mf_vals", vtype, load(rv, kv)),
            ir.Store(array, at, ir.Var("mf_vals"), t.vec, t.operand, "threadgroup")],
              [ir.Store(array, at, ir.Call(ir.vector_type(t.operand, t.vec), ()), t.vec,
                        t.operand, "threadgroup")])])]


# -- padded tiles: 16-byte stores, and loads a step ahead ----------------------------------------

def _vectors(t: Tile, rows: int) -> int:
    """16-byte vectors of a `rows`-row tile each thread moves (at least 1: the tile may be
    smaller than the threadgroup's one vector each, some threads then fetch a row twice)."""
    return max(1, rows * t.bk // t.vec // t.threads)


def _vector_place(t: Tile, i: int) -> tuple[ir.Expr, ir.Expr]:
    """(row, value of K) of the thread's vector i: 8 consecutive threads take 8 consecutive
    rows at one 16-byte run of K (distinct banks when staged), a simdgroup 8 rows whole."""
    per_row = t.bk // t.vec
    e = u(i * t.threads) + ir.Var("mf_t")
    return e / u(8 * per_row) * u(8) + e % u(8), e / u(8) % u(per_row) * u(t.vec)


def _put_vector(t: Tile, array: str, rows: int, i: int, value: list[ir.Stmt],
                live: ir.Expr) -> list[ir.Stmt]:
    """The thread's vector i stored whole (one 16-byte store) at its place, zeros where not
    `live` (over mf_r, mf_kk: the vector's row and first value of K, declared here);
    `value` declares mf_vals (the vector)."""
    r, k = _vector_place(t, i)
    at = staged(rows, ir.Var("mf_r"), ir.Var("mf_kk"), t.pad)
    pack = ir.vector_type(t.operand, t.vec)
    return [ir.Block([
        ir.Decl("mf_r", "uint", r), ir.Decl("mf_kk", "uint", k),
        ir.If(live, [*value, ir.Store(array, at, ir.Var("mf_vals"), t.vec, t.operand,
                                      "threadgroup")],
              [ir.Store(array, at, ir.Call(pack, ()), t.vec, t.operand, "threadgroup")])])]


def fetch_vectors(t: Tile, rows: int, regs: str, load: Vector,
                  live: Callable[[ir.Expr], ir.Expr]) -> list[ir.Stmt]:
    """Every thread's share of a padded operand tile read into registers `regs` (an array of
    the loaded vectors the caller declares, `vectors(t, rows)` long): vector i at its place
    (`_vector_place`) where `live(row)` (the caller guards the step: whole, K a multiple of
    the vector); `put_vectors` stores them."""
    out: list[ir.Stmt] = []
    rv, kv = ir.Var("mf_r"), ir.Var("mf_kk")
    for i in range(_vectors(t, rows)):
        r, k = _vector_place(t, i)
        out.append(ir.Block([ir.Decl("mf_r", "uint", r), ir.Decl("mf_kk", "uint", k), ir.If(
            live(rv), [ir.Assign(ir.Lane(ir.Var(regs), ir.Lit(i, "uint")), load(rv, kv))])]))
    return out


def put_vectors(t: Tile, array: str, rows: int, regs: str, vtype: str,
                live: Callable[[ir.Expr], ir.Expr]) -> list[ir.Stmt]:
    """The registers of `fetch_vectors` stored into the staged tile (zeros where not
    `live(row)`)."""
    out: list[ir.Stmt] = []
    for i in range(_vectors(t, rows)):
        out += _put_vector(t, array, rows, i, [ir.Decl("mf_vals", vtype, ir.Lane(
            ir.Var(regs), ir.Lit(i, "uint")))], live(ir.Var("mf_r")))
    return out


def vectors(t: Tile, rows: int) -> int:
    """The length of `fetch_vectors`' register array for a `rows`-row tile."""
    return _vectors(t, rows)
