"""The online-softmax building block the attention kernels share: a row's state (running max
m, running sum d, accumulators rescaled as the max grows) and the merge of several states.

    update by scores s:  m' = max(m, s);  c = exp(m - m');  p = exp(s - m');  d = d c + p
    merge of states:     M = max_s m_s;   d = sum_s d_s exp(m_s - M)   (acc likewise)

A state that has seen only masked keys has m = -inf, where exp(-inf - -inf) would be NaN; the
factors below treat it as the empty state it is (nothing to rescale, no weight). Any m that d
and the accumulators share gives the same quotient: a lazy max (`raise_lazily`) moves only when
a tile's exceeds it by more than LAZY, so that most tiles rescale nothing."""
from __future__ import annotations

from .. import ir

NEG_INF = ir.Lit(float("-inf"), "float")
LOG2E = 1.4426950408889634
LAZY = 8.0          # a lazy max moves only when a tile's exceeds it by more than this


def rescale(m: ir.Expr, m_new: ir.Expr) -> ir.Expr:
    """c = exp(m - m'): the factor of what was summed under the old max (1 while m' = -inf)."""
    return ir.Select(m_new.ne(NEG_INF), ir.Call("exp", (m - m_new,), precise=True),
                     ir.Lit(1.0, "float"))


def weight(s: ir.Expr, m_new: ir.Expr) -> ir.Expr:
    """p = exp(s - m'): a score's weight under the new max (0 while m' = -inf); `fast2` for
    weights that become half or bfloat operands."""
    return ir.Select(m_new.ne(NEG_INF), ir.Call("exp", (s - m_new,), precise=True),
                     ir.Lit(0.0, "float"))


def share(m_s: ir.Expr, m_max: ir.Expr) -> ir.Expr:
    """exp(m_s - M): a state's factor in a merge under the largest max M (0 for an empty
    state, m_s = -inf)."""
    return ir.Select(m_s.ne(NEG_INF), ir.Call("exp", (m_s - m_max,), precise=True),
                     ir.Lit(0.0, "float"))


def raise_lazily(m: ir.Var, t: ir.Expr, up: str, c: str) -> list[ir.Stmt]:
    """A lazy max (FlashAttention-4's rescale threshold): m becomes the tile's max t (a max
    that ignores NaN) only where t exceeds it by more than LAZY; `up` says whether it moved,
    `c` is the factor of what was summed under the old max (1 where it stayed, 0 from the
    empty state). Any max that the sum and the accumulators share gives the same quotient;
    under one that stayed a weight is at most e^LAZY (~3000: half and bfloat operands and
    fp32 sums hold it), and the tiles whose rows' maxes all stayed rescale nothing."""
    return [ir.Decl(up, "bool", t > m + ir.Lit(LAZY, "float")),
            ir.Decl(c, "float", ir.Select(ir.Var(up), ir.Call("exp", (m - t,), precise=True),
                                          ir.Lit(1.0, "float"))),
            ir.Assign(m, ir.Select(ir.Var(up), t, m))]


def safe_max(m: ir.Expr) -> ir.Expr:
    """m, 0 for the empty state (every score then -inf, every weight 0): `fast2`'s max."""
    return ir.Select(m.ne(NEG_INF), m, ir.Lit(0.0, "float"))


def fast2(s: ir.Expr, m_safe: ir.Expr) -> ir.Expr:
    """p = exp(s - m) as `fast::exp2((s - m) log2 e)` (`safe_max`: no branch), for weights
    that become half or bfloat operands (their rounding is far above the fast exp2's error).
    The difference first: s log2 e - m log2 e in one fused multiply-add would lose s - m to
    the rounding of m log2 e where |m| is large."""
    return ir.Call("fast::exp2", ((s - m_safe) * ir.Lit(LOG2E, "float"),))
