"""The reductions that ride along with another in one pass, found in the graph (`reduce.phases`
pairs them where a schedule asks):

- online pairs: sum(exp(a - max(a))) with its max (softmax's and logsumexp's two phases, one
  pass with a running max and a rescaled sum), and whether the max may skip NaN elements
  (`nan_in_sum`: every output that depends on it is NaN when the sum is);
- centered pairs: a sum of squares around a row value of a sum of the same elements with that
  sum (LayerNorm's variance around its mean; `schedule.centered` builds them).
"""
from __future__ import annotations

from typing import Optional

from ..graph import BinaryOp, Graph, Node, Op, ReduceOp, UnaryOp, topo_order
from . import centered


def strip_cast(n: Node) -> Node:
    """n without the casts to its own dtype around it."""
    while n.op == Op.CAST and n.args[0].dtype == n.dtype:
        n = n.args[0]
    return n


def _float_sum(n: Node) -> bool:
    return n.attr[0] == ReduceOp.SUM and n.args[0].dtype.is_float


def exp_sum_pairs(reduces: list[Node]) -> list[tuple[Node, Node, bool]]:
    """(max, sum, whether the shift is logsumexp's safe max) of the float reductions
    `reduces` over one axis where the sum is sum(exp(a - max)) of the max's own argument a:
    softmax's and logsumexp's two phases."""
    known = set(reduces)
    pairs = []
    for r in reduces:
        if not _float_sum(r):
            continue
        e = strip_cast(r.args[0])
        if not (e.op == Op.UNARY and e.attr == UnaryOp.EXP):
            continue
        d = strip_cast(e.args[0])
        if not (d.op == Op.BINARY and d.attr == BinaryOp.SUB):
            continue
        a, m = d.args[0], strip_cast(d.args[1])
        safe = safe_max(m)
        mx = safe if safe is not None else m
        if mx in known and mx.attr[0] == ReduceOp.MAX and mx.attr[1] == r.attr[1] and \
                mx.args[0] is a and a.dtype.is_float:
            pairs.append((mx, r, safe is not None))
    return pairs


def centered_pairs(reduces: list[Node], online: set[Node]) -> list[tuple[Node, Node, Node]]:
    """(sum, its squares, the center) for each float sum of squares around a row value (the
    center) of a float sum of the same elements over the same axis among `reduces`
    (`centered.pair`), one pair a sum; sums in `online` (an online pair's) take no part."""
    paired: set[Node] = set()
    out = []
    for r in reduces:
        if not _float_sum(r) or r in online:
            continue

        def sums_of(x: Node, axis: str = r.attr[1]) -> list[Node]:
            return [m for m in reduces if _float_sum(m) and m.attr[1] == axis
                    and strip_cast(m.args[0]) is strip_cast(x)
                    and m not in paired and m not in online]
        found = centered.pair(strip_cast(r.args[0]), r.attr[1], sums_of)
        if found is not None:
            out.append((found[0], r, found[1]))
            paired.update((found[0], r))
    return out


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
