"""The centered-sum building block the streamed reductions share: a sum S = sum(x) and a sum of
squares V = sum((x - c)^2) around a row value c computed from S (LayerNorm's mean and
variance: c = S / D), in one pass over the row instead of two.

S is folded as any compensated sum. V keeps a state per thread: the count n of its elements,
a shift k (the thread's first element), the sum t of x - k and the sum u of (x - k)^2, two adds
an element; after the thread's loop, q = u - t^2 / n is the sum of squares around the thread's
mean (shifted by one of its own values it loses at most log10(n + 1) digits; around 0 a mean
far from 0 would take them all). A simdgroup's lanes sum their moments about one shift, the
largest of their means, by simd_sum (`mf_simd_centered`); a threadgroup's simdgroups do the
same through threadgroup memory, and a split row's slices merge their (n, k, t, q) by Chan et
al.'s formula (`mf_centered_merge`). Once the row's state is known, c is computed from S as
the graph says, and

    V = q + n (k + t / n - c)^2

which is sum((x - c)^2) exactly (the squares around the mean plus n times the square of the
mean's distance from c), for any c: the mean itself, its rounding to half, or another value.
Where the row holds an inf or NaN, S and c are one too, and V is NaN as the two-pass sum is (the
one case that differs: finite elements whose f32 sum overflows give NaN for the two-pass inf).
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

from .. import ir
from ..graph import BinaryOp, Node, Op, topo_order

HELPERS = frozenset({"mf_centered_add", "mf_centered_add_chunk", "mf_centered_done",
                     "mf_centered_merge", "mf_simd_centered"})


def state(i: int) -> tuple[ir.Var, ir.Var, ir.Var]:
    """(count, shift, shifted sum) of the squares' reduction number i."""
    return ir.Var(f"mf_n{i}"), ir.Var(f"mf_k{i}"), ir.Var(f"mf_t{i}")


STATE = ("n", "k", "t")            # the state's threadgroup arrays: mf_tg<letter><i>


def squared(n: Node) -> Optional[tuple[Node, Node]]:
    """(x, c) when n is (x - c) * (x - c) (two subtractions of the same operands, or one
    squared) or (x - c) ** 2; else None."""
    if n.op != Op.BINARY:
        return None
    if n.attr == BinaryOp.MUL:
        a, b = n.args
    elif n.attr == BinaryOp.POW and n.args[1].op == Op.CONST and n.args[1].attr == 2:
        a = b = n.args[0]
    else:
        return None
    if not (a.op == b.op == Op.BINARY and a.attr == b.attr == BinaryOp.SUB):
        return None
    if a.args[0] is not b.args[0] or a.args[1] is not b.args[1]:
        return None
    return a.args[0], a.args[1]


def pair(v_arg: Node, axis: str, sums: Callable[[Node], list[Node]]
         ) -> Optional[tuple[Node, Node]]:
    """(the sum S, the center c) when a sum over `axis` of `v_arg` is one of squares around a
    row value c that S's result feeds: v_arg = (x - c)^2, S one of `sums(x)` (the sums of x
    over `axis` still unpaired), c without `axis`; else None."""
    sq = squared(v_arg)
    if sq is None or axis in sq[1].axes:
        return None
    x, c = sq
    feeding = set(topo_order([c]))
    s = next((s for s in sums(x) if s in feeding), None)
    return None if s is None else (s, c)


def declare(i: int) -> list[ir.Stmt]:
    return [ir.Decl(v.name, "float", ir.Lit(0.0, "float"), const=False) for v in state(i)]


def update(i: int, q: ir.Expr, s: ir.Expr, cmp: ir.Expr, x: ir.Expr) -> list[ir.Stmt]:
    """Fold one element x into squares number i's state and q, and into the sum s (compensated
    by cmp)."""
    return [ir.Assign(q, ir.Call("mf_centered_add", (*state(i), s, cmp, q, x)))]


def update_chunk(i: int, q: ir.Expr, s: ir.Expr, cmp: ir.Expr, values: str, n: int
                 ) -> list[ir.Stmt]:
    """Fold a chunk of n element values (the register array `values`) into them at once."""
    return [ir.Assign(q, ir.Call("mf_centered_add_chunk", (
        *state(i), s, cmp, q, ir.Var(values), ir.Lit(n, "uint"))))]


def done(i: int, q: ir.Expr) -> list[ir.Stmt]:
    """After the thread's loop: its sum of squared distances from its shift as the squares
    around its mean."""
    n, _, t = state(i)
    return [ir.Assign(q, ir.Call("mf_centered_done", (n, t, q)))]


def simd_combine(i: int, q: ir.Expr) -> list[ir.Stmt]:
    return [ir.Assign(q, ir.Call("mf_simd_centered", (*state(i), q)))]


def merge(i: int, q: ir.Expr, other: Sequence[ir.Expr]) -> list[ir.Stmt]:
    """Merge another thread's (or slice's) state and squares, `other` = [q2, n2, k2, t2]."""
    q2, n2, k2, t2 = other
    return [ir.Assign(q, ir.Call("mf_centered_merge", (*state(i), q, n2, k2, t2, q2)))]


def squares(i: int, q: ir.Expr, c: ir.Expr, name: str) -> list[ir.Stmt]:
    """Declare `name` = V = q + n (k + t / n - c)^2 from the row's state and the center c (q,
    0, for an empty row)."""
    n, k, t = state(i)
    d = ir.Var(f"{name}_d")
    return [ir.Decl(d.name, "float", (k - c) + t / n),
            ir.Decl(name, "float", ir.Select(n.eq(ir.Lit(0.0, "float")), q, q + n * (d * d)))]
