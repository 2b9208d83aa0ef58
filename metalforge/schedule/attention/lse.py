"""The per-row logsumexp output an attention kernel writes beside its outputs when asked (the
backward reads it: `metalforge.adjoints_attention`): an output `max(s, L) + log(sum(exp(s -
max), L))` over the query rows, built from the form's own max and denominator, so that the
kernels write it from their final state as `mf_mm + log(mf_md)` (the lane holding E element 0
stores it)."""
from __future__ import annotations

from typing import Sequence

from ...graph import BinaryOp, Node, Op, Output, UnaryOp, strip_casts
from .match import Form


def is_lse(form: Form, node: Node) -> bool:
    """Whether `node` is the row's logsumexp: max + log(denominator), casts aside."""
    n = strip_casts(node)
    if n.op != Op.BINARY or n.attr != BinaryOp.ADD:
        return False
    for a, b in (n.args, n.args[::-1]):
        a, b = strip_casts(a), strip_casts(b)
        if a is form.max and b.op == Op.UNARY and b.attr == UnaryOp.LOG \
                and strip_casts(b.args[0]) is form.denom:
            return True
    return False


def any_lse(form: Form, outputs: Sequence[Output]) -> bool:
    return any(is_lse(form, o.node) for o in outputs)
