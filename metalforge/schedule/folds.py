"""How a thread folds a step's element values into its accumulators, in the column kernels
and the row kernels that stream a row in chunks.

A split or wide column thread loads reads_per_thread rows of its column(s) at once (register
arrays mf_e<i>[reads]), a looped or split row thread one chunk of its row; then it folds them
in order. Folding each value on its own made the loops ALU-bound on an H200 (f16 column sums:
the compensated add's ten or so instructions a value; maxima: `mf_maximum`'s NaN tests and
early returns), so a step's values of a compensated sum or a float max / min are combined
among themselves first (`block_value`) and folded once, and a float max / min folds without
branches (`extreme`). Deterministic: the same elements combine in the same order on every call.
"""
from __future__ import annotations

from .. import ir
from ..graph import ReduceOp
from . import reduce


def blocked(r: reduce.Reduction) -> bool:
    """Whether a step's values of `r` are combined among themselves before one fold into the
    accumulator: a compensated sum's (not an online pair's) and a float max / min's."""
    if r.online_sum is not None or r.online_max is not None:
        return False
    if r.kind == ReduceOp.SUM:
        return r.compensated
    return r.kind in (ReduceOp.MAX, ReduceOp.MIN) and r.is_float


def block_value(r: reduce.Reduction, e: ir.Var, b: ir.Var, reads: int) -> list[ir.Stmt]:
    """mf_b<i>: the step's `reads` values of `r` (mf_e<i>[]) combined in row order. A sum's in
    plain fp32; a max / min's with Metal's one-instruction, NaN-skipping fmax / fmin, a NaN
    among them (mf_n<i>, the last one seen) put back after."""
    u, first = ir.Var("mf_u"), ir.Lane(e, ir.Lit(0, "uint"))
    if r.kind == ReduceOp.SUM:
        return [ir.Decl(b.name, r.acc_type, first, const=False),
                ir.For("mf_u", "uint", ir.Lit(1, "uint"), ir.Lit(reads, "uint"),
                       [ir.Assign(b, b + ir.Lane(e, u))], unroll=True)]
    n, v = ir.Var(f"mf_n{r.i}"), ir.Lane(e, u)
    return [ir.Decl(b.name, r.acc_type, first, const=False),
            ir.Decl(n.name, r.acc_type, first, const=False),
            ir.For("mf_u", "uint", ir.Lit(1, "uint"), ir.Lit(reads, "uint"), [
                ir.Assign(b, ir.Call(f"f{r.kind}", (b, v))),
                ir.Assign(n, ir.Select(v.ne(v), v, n))], unroll=True),
            ir.Assign(b, ir.Select(n.ne(n), n, b))]


def extreme(r: reduce.Reduction, v: ir.Expr) -> list[ir.Stmt] | None:
    """A float max / min folding `v` into its accumulator without branches: `acc` kept where
    it is the greater (smaller) or NaN, else `v` (a NaN `v` taken): torch's NaN-propagating
    amax / amin, as `mf_maximum` / `mf_minimum`, whose two early returns made the column
    kernels' loops slower on an H200 (max f16 4096x4096 10.1 -> 8.2 us split kernel,
    4096x128 3.0 -> 1.9 us). None: any other reduction (`reduce.update` / `reduce.merge`)."""
    if r.kind not in (ReduceOp.MAX, ReduceOp.MIN) or not r.is_float or r.nan_via_sum \
            or r.online_sum is not None or r.online_max is not None:
        return None
    acc = ir.Var(r.acc)
    kept = acc > v if r.kind == ReduceOp.MAX else acc < v
    return [ir.Assign(acc, ir.Select(kept.or_(acc.ne(acc)), acc, v))]


def fold(r: reduce.Reduction, v: ir.Expr, k: ir.Expr) -> list[ir.Stmt]:
    """`reduce.update`, a float max / min branch-free (`extreme`)."""
    own = extreme(r, v)
    return own if own is not None else reduce.update(r, v, k)


def fold_block(r: reduce.Reduction, e: ir.Var, reads: int, k: ir.Expr) -> list[ir.Stmt]:
    """A block of `reads` values of a `blocked` reduction (the register array `e`) folded
    once: combined among themselves (`block_value`, into mf_b<i>), then into the accumulator
    (`fold`, `k`: the block's first position)."""
    b = ir.Var(f"mf_b{r.i}")
    return [*block_value(r, e, b, reads), *fold(r, b, k)]


def step_folds(rs: list[reduce.Reduction], k: ir.Expr, reads: int) -> list[ir.Stmt]:
    """Fold a step's `reads` element values (register arrays mf_e<i>[reads], rows in order,
    the first at position `k`) into `rs`. A compensated sum adds the step's values in plain
    fp32 first, in row order, then that block sum into its accumulator with one compensated
    add (the rounding of a block of reads values is a few ulp of its magnitudes; the long
    sum over the blocks stays compensated); a float max / min takes the block's extreme
    first (`block_value`), then one NaN-propagating fold: per element, the compensation's
    ten or so instructions (the NaN tests' six) made f16 column sums (maxima) ALU-bound on an
    H200. Others fold each value in row order (argmax keeps the first index)."""
    out: list[ir.Stmt] = []
    for r in rs:
        if not blocked(r) or reads == 1:
            continue
        out += fold_block(r, ir.Var(f"mf_e{r.i}"), reads, k)
    each = [r for r in rs if not blocked(r) or reads == 1]
    if not each:
        return [ir.Comment(f"the step's {reads} values of each reduction combined first, then "
                           f"folded once"), ir.Block(out)]
    folds: list[ir.Stmt] = [ir.Decl("mf_k", "uint", k)] if any(r.has_index for r in each) \
        else []
    for r in each:
        folds += fold(r, ir.Lane(ir.Var(f"mf_e{r.i}"), ir.Var("mf_u")), ir.Var("mf_k"))
    return out + [ir.For("mf_u", "uint", ir.Lit(0, "uint"), ir.Lit(reads, "uint"), folds,
                         unroll=True)]
