"""The gradients' accumulators as ONE 16 x MAT_E cooperative destination each (tensor ops:
`matrix.resident.Rows`, matmul2d(16, MAT_E, 16)): a step's dV += P^T dO (or dK, dQ) one run
instead of MAT_E / 16 runs of 16 x 16, the P / dS fragment read once. The runs read MAT_E
values of every staged row, so the rows are ROW apart (`blocks.head(whole=True)`) and zeroed
once past E (`zero`)."""
from __future__ import annotations

from typing import Callable

from ... import ir
from ..base import IDX
from ..fragments import UINT, u
from ..hardware import SIMD_WIDTH
from ..matrix import resident
from .blocks import PS, ROW
from .kernels import Ctx, store
from .matrix import MAT_E


def rows(op: str) -> resident.Rows:
    return resident.Rows("mf_racc", op, MAT_E)


def zero(arrs: tuple[tuple[str, int], ...], op: str, sgs: int) -> list[ir.Stmt]:
    """The staged arrays (name, rows) zeroed whole (a run reads MAT_E values of a row;
    staging writes only up to E's last 16-block), then a barrier."""
    tid = ir.Var("mf_tid")
    return [ir.Comment(f"the staged rows zeroed once: the runs read {MAT_E} values of each"),
            *(ir.For("mf_z", UINT, tid, u(n * ROW), [
                ir.Store(a, ir.Var("mf_z"), ir.Cast(op, ir.Lit(0.0, "float")),
                         space="threadgroup")], step=u(SIMD_WIDTH * sgs)) for a, n in arrs),
            ir.Barrier()]


def accumulate(racc: resident.Rows, terms: tuple[tuple[str, str, ir.Expr], ...],
               coops: bool = False) -> list[ir.Stmt]:
    """dest += the simdgroup's scratch (16 x 16; with `coops` the left input cooperative
    tensor of that name) x 16 staged rows (MAT_E each, from row `first` of the array) for
    each (dest, scratch, (array, first)) of `terms`."""
    out: list[ir.Stmt] = []
    for d, a, b in terms:
        out.append(resident.multiply_rows_left(racc, d, a, b, ir.Var("mf_rs")) if coops else
                   resident.multiply_rows(racc, d, ir.Var(a) + ir.Var("mf_sp"), u(PS), b,
                                          ir.Var("mf_rs")))
    return out


def put(ctx: Ctx, dest: str, kind: str, where: Callable[[ir.Expr], list[ir.Stmt]],
        live: Callable[[ir.Expr], ir.Expr]) -> list[ir.Stmt]:
    """Output `kind` from `dest`: element (i, j) is E element j of the simdgroup's row or
    key i (`where(i)` declares its positions, `live(i)` inside)."""
    if kind not in ctx.roles.outputs:
        return []

    def one(i: ir.Expr, j: ir.Expr, ref: ir.Expr) -> list[ir.Stmt]:
        return [ir.Decl("mf_e", UINT, j), ir.If(
            live(i).and_(ir.Cast(IDX, ir.Var("mf_e")) < ctx.size(ctx.roles.e)),
            [*where(i), *store(ctx, kind, ref)])]
    return resident.each_row(dest, one)
