"""The reductions that ride along with another in one pass, found in the graph (`reduce.phases`
pairs them where a schedule asks):

- online pairs: sum(exp(a - max(a))) with its max (softmax's and logsumexp's two phases, one
  pass with a running max and a rescaled sum), and whether the max may skip NaN elements
  (`nan_in_sum`: every output that depends on it is NaN when the sum is);
- centered pairs: a sum of squares around a row value of a sum of the same elements with that
  sum (LayerNorm's variance around its mean; `schedule.centered` builds them).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from ..graph import BinaryOp, Graph, Node, Op, ReduceOp, UnaryOp, topo_order
from . import centered

if TYPE_CHECKING:
    from .reduce import Reduction


def strip_cast(n: Node) -> Node:
    """n without the casts to its own dtype around it."""
    while n.op == Op.CAST and n.args[0].dtype == n.dtype:
        n = n.args[0]
    return n


def exp_sum_pairs(reds: list[Reduction], by_node: dict[Node, Reduction]
                  ) -> list[tuple[Reduction, Reduction]]:
    """(max, sum) pairs of float reductions over one axis where the sum is sum(exp(a - max))
    of the max's own argument a: softmax's and logsumexp's two phases."""
    pairs = []
    for r in reds:
        if r.kind != ReduceOp.SUM or not r.is_float:
            continue
        e = strip_cast(r.arg)
        if not (e.op == Op.UNARY and e.attr == UnaryOp.EXP):
            continue
        d = strip_cast(e.args[0])
        if not (d.op == Op.BINARY and d.attr == BinaryOp.SUB):
            continue
        a, m = d.args[0], strip_cast(d.args[1])
        safe = safe_max(m)
        mr = by_node.get(safe if safe is not None else m)
        if mr is not None and mr.kind == ReduceOp.MAX and mr.axis == r.axis and mr.arg is a \
                and mr.is_float:
            r.safe_shift = safe is not None
            pairs.append((mr, r))
    return pairs


def centered_pairs(reds: list[Reduction], by_node: dict[Node, Reduction]) -> None:
    """Pair each float sum of squares around a row value of a float sum of the same elements
    over the same axis with that sum (`centered.pair`), one pair a sum."""
    for r in reds:
        if r.kind != ReduceOp.SUM or not r.is_float or r.online_max is not None:
            continue

        def sums_of(x: Node, axis: str = r.axis) -> list[Node]:
            return [m.node for m in reds if m.kind == ReduceOp.SUM and m.axis == axis
                    and m.is_float and strip_cast(m.arg) is strip_cast(x)
                    and m.squares is None and m.squares_of is None and m.online_max is None]
        found = centered.pair(strip_cast(r.arg), r.axis, sums_of)
        if found is not None:
            s = by_node[found[0]]
            s.squares, r.squares_of, r.center = r, s, found[1]


def safe_max(n: Node) -> Optional[Node]:
    """m when n is logsumexp's shift `where(abs(m) == inf, 0, m)` (mf.logsumexp), else None."""
    if not (n.op == Op.WHERE and n.args[1].op == Op.CONST and n.args[1].attr == 0):
        return None
    c, m = n.args[0], strip_cast(n.args[2])
    if not (c.op == Op.BINARY and c.attr == BinaryOp.EQ):
        return None
    a, b = c.args
    if b.op != Op.CONST and a.op == Op.CONST:
        a, b = b, a
    if b.op == Op.CONST and b.attr == float("inf") and a.op == Op.UNARY and \
            a.attr == UnaryOp.ABS and strip_cast(a.args[0]) is m:
        return m
    return None


# elementwise ops whose result is NaN when an operand is (pow is not: pow(NaN, 0) = 1;
# comparisons, where and integer casts are not either)
_NAN_STRICT: dict[Op, set[str]] = {
    Op.UNARY: {UnaryOp.NEG, UnaryOp.EXP, UnaryOp.EXP2, UnaryOp.LOG, UnaryOp.LOG2, UnaryOp.SQRT,
               UnaryOp.RSQRT, UnaryOp.SIN, UnaryOp.COS, UnaryOp.TANH, UnaryOp.SIGMOID, UnaryOp.ERF,
               UnaryOp.ABS, UnaryOp.FLOOR, UnaryOp.CEIL},
    Op.BINARY: {BinaryOp.ADD, BinaryOp.SUB, BinaryOp.MUL, BinaryOp.DIV, BinaryOp.MAXIMUM,
                BinaryOp.MINIMUM}}


def nan_in_sum(graph: Graph, mx: Node, s: Node) -> bool:
    """Whether max `mx` may skip NaN elements: every output that depends on it is NaN when
    the sum `s` = sum(exp(a - mx)) is. A NaN element of a makes its term exp(NaN - mx) NaN
    whatever mx is, so s is NaN, and so is every such output: the max's own NaN would change
    nothing. (All -inf rows are unaffected: the max is -inf either way.)"""
    strict: dict[Node, bool] = {s: True}

    def nan_if_s(n: Node) -> bool:
        if n not in strict:
            ops = _NAN_STRICT.get(n.op, set())
            arith = n.attr in ops or (n.op == Op.CAST and n.dtype.is_float)
            strict[n] = arith and any(nan_if_s(a) for a in n.args)
        return strict[n]
    return all(nan_if_s(o.node) or mx not in topo_order([o.node]) for o in graph.outputs)
