"""Building blocks for kernels on Metal's 8x8 simdgroup matrices, as the generated code holds
them: a matrix is each lane's two elements (`thread_elements()`), a `float2` value, so that the
IR and the printers need no matrix type and elementwise work on a product is plain code.

    lane's place     row mf_mr, columns mf_mc and mf_mc + 1 (Apple's layout, as the simulator)
    mma(a, b, c)     a x b + c over fp32 matrices (helper mf_mma; a simdgroup collective)
    mat_load(...)    the lane's elements of an 8x8 block of a threadgroup float array
                     (helper mf_mat_load: simdgroup_load at an origin and row stride)

Every lane of a simdgroup must reach a product or a load together (they are collectives), so
the loops around them are uniform over the simdgroup.
"""
from __future__ import annotations

from .. import ir

UINT = "uint"


def u(v: int) -> ir.Lit:
    return ir.Lit(v, UINT)


def lane_place(lane: ir.Expr) -> list[ir.Stmt]:
    """mf_mr, mf_mc: the row and first column of the lane's two elements of an 8x8 matrix."""
    return [
        ir.Comment("the lane's place in an 8x8 matrix (Apple's layout): row mf_mr, columns "
                   "mf_mc and mf_mc + 1"),
        ir.Decl("mf_mr", UINT, (lane / u(4) & u(4)) + lane / u(2) % u(4)),
        ir.Decl("mf_mc", UINT, (lane / u(4) & u(2)) * u(2) + lane % u(2) * u(2))]


def mma(a: ir.Expr, b: ir.Expr, c: ir.Expr) -> ir.Expr:
    """a x b + c (8x8, fp32), each the lane's float2; needs helper mf_mma."""
    return ir.Call("mf_mma", (a, b, c))


def mat_load(array: str, stride: int, x: ir.Expr, y: ir.Expr) -> ir.Expr:
    """The lane's elements of the 8x8 block at column x, row y of threadgroup float array
    `array` (`stride` floats a row); needs helper mf_mat_load."""
    return ir.Call("mf_mat_load", (ir.Var(array), u(stride), x, y))


def frag(name: str, *at: ir.Expr) -> ir.Expr:
    """Element `at` of fragment array `name` (and of its float2: the lane's element)."""
    e: ir.Expr = ir.Var(name)
    for i in at:
        e = ir.Lane(e, i)
    return e


def unrolled(var: str, n: int, body: list[ir.Stmt]) -> ir.For:
    return ir.For(var, UINT, u(0), u(n), body, unroll=True)


def zero() -> ir.Expr:
    return ir.Call("float2", (ir.Lit(0.0, "float"),))
