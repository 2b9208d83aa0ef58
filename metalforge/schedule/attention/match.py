"""Recognising an attention graph: `match` finds the pieces (`Form`) of sum(softmax(s, L) * V, L)
with scores s that are elementwise work on contractions over another axis E."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ...graph import BinaryOp, Graph, Node, Op, ReduceOp, UnaryOp, strip_casts, topo_order


@dataclass(frozen=True)
class Form:
    """The pieces of an attention graph."""
    out: Node                  # sum(P * V, axis=L)
    values: Node               # V: the factor of P (over L and E)
    scores: Node               # s: what the softmax is over
    max: Node                  # max(s, L)
    denom: Node                # sum(exp(s - max), L)
    contractions: tuple[Node, ...]   # the sums over E inside the scores
    key: str                   # L: the softmax / key axis
    e: str                     # E: the contracted / output axis


def _reductions_in(n: Node) -> list[Node]:
    return [m for m in topo_order([n]) if m.op == Op.REDUCE]


def match(graph: Graph) -> Optional[Form]:
    """The attention form of `graph`, or None when it is not one."""
    outs = [r for o in graph.outputs for r in _reductions_in(o.node)
            if r.attr[0] == ReduceOp.SUM and strip_casts(r.args[0]).op == Op.BINARY
            and strip_casts(r.args[0]).attr == BinaryOp.MUL]
    for out in outs:
        l_axis = out.attr[1]
        prod = strip_casts(out.args[0])
        for p, v in (prod.args, prod.args[::-1]):
            form = _softmax(strip_casts(p), l_axis)
            if form is None or _reductions_in(v):
                continue
            scores, mx, denom = form
            contractions = tuple(r for r in _reductions_in(scores))
            axes = {r.attr[1] for r in contractions}
            if not contractions or len(axes) != 1 or l_axis in axes or any(
                    r.attr[0] != ReduceOp.SUM or _reductions_in(r.args[0]) for r in contractions):
                continue
            e_axis = axes.pop()
            if e_axis not in out.axes:
                continue
            return Form(out, v, scores, mx, denom, contractions, l_axis, e_axis)
    return None


def _normalised(p: Node) -> Optional[tuple[Node, Node]]:
    """(e, d) when p is e / d or e * (1 / d), in either order (mf.softmax's own form)."""
    if p.op == Op.BINARY and p.attr == BinaryOp.DIV:
        return strip_casts(p.args[0]), strip_casts(p.args[1])
    if p.op != Op.BINARY or p.attr != BinaryOp.MUL:
        return None
    for e, r in (p.args, p.args[::-1]):
        r = strip_casts(r)
        if r.op == Op.BINARY and r.attr == BinaryOp.DIV:
            one = strip_casts(r.args[0])
            if one.op == Op.CONST and one.attr == 1:
                return strip_casts(e), strip_casts(r.args[1])
    return None


def _softmax(p: Node, axis: str) -> Optional[tuple[Node, Node, Node]]:
    """(s, max(s), sum(exp(s - max))) when p is exp(s - max(s, axis)) / sum(..., axis) (or
    times 1 / sum)."""
    pair = _normalised(p)
    if pair is None:
        return None
    e, denom = pair
    if (denom.op != Op.REDUCE or denom.attr != (ReduceOp.SUM, axis)
            or strip_casts(denom.args[0]) is not e):
        return None
    if e.op != Op.UNARY or e.attr != UnaryOp.EXP:
        return None
    diff = strip_casts(e.args[0])
    if diff.op != Op.BINARY or diff.attr != BinaryOp.SUB:
        return None
    s, mx = (strip_casts(a) for a in diff.args)
    if mx.op != Op.REDUCE or mx.attr != (ReduceOp.MAX, axis) or strip_casts(mx.args[0]) is not s:
        return None
    return s, mx, denom


def is_attention(graph: Graph) -> bool:
    return match(graph) is not None

