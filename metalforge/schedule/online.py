"""The online-softmax building block the attention kernels share: a row's state (running max
m, running sum d, accumulators rescaled as the max grows) and the merge of several states.

    update by scores s:  m' = max(m, s);  c = exp(m - m');  p = exp(s - m');  d = d c + p
    merge of states:     M = max_s m_s;   d = sum_s d_s exp(m_s - M)   (acc likewise)

A state that has seen only masked keys has m = -inf, where exp(-inf - -inf) would be NaN; the
factors below treat it as the empty state it is (nothing to rescale, no weight)."""
from __future__ import annotations

from .. import ir

NEG_INF = ir.Lit(float("-inf"), "float")


def rescale(m: ir.Expr, m_new: ir.Expr) -> ir.Expr:
    """c = exp(m - m'): the factor of what was summed under the old max (1 while m' = -inf)."""
    return ir.Select(m_new.ne(NEG_INF), ir.Call("exp", (m - m_new,), precise=True),
                     ir.Lit(1.0, "float"))


def weight(s: ir.Expr, m_new: ir.Expr, fast: bool = False) -> ir.Expr:
    """p = exp(s - m'): a score's weight under the new max (0 while m' = -inf). `fast`: as
    `fast::exp` of an argument chosen without a branch (exp(-inf) = 0), for weights that
    become half or bfloat operands, whose rounding is far above the fast exp's few ulps (on
    CUDA one multiply and MUFU.EX2, where precise::exp is ten instructions and a branch)."""
    if fast:
        return ir.Call("fast::exp", (ir.Select(m_new.ne(NEG_INF), s - m_new, NEG_INF),))
    return ir.Select(m_new.ne(NEG_INF), ir.Call("exp", (s - m_new,), precise=True),
                     ir.Lit(0.0, "float"))


def share(m_s: ir.Expr, m_max: ir.Expr) -> ir.Expr:
    """exp(m_s - M): a state's factor in a merge under the largest max M (0 for an empty
    state, m_s = -inf)."""
    return ir.Select(m_s.ne(NEG_INF), ir.Call("exp", (m_s - m_max,), precise=True),
                     ir.Lit(0.0, "float"))
