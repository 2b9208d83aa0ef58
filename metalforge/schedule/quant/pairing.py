"""Row pairing for a matvec epilogue that gathers its own results at a fixed distance: RoPE's
partner `mf.where(i < half, i + half, i - half)` is row i + Q or i - Q, Q = `half`.

`period` proves it: an interval analysis (`ranges.Analysis`) in which the row's position i is
a symbol of its own and the size expression the offset is made of (`half`) another, so that
every case of the index (each branch of its `where`s) has an exact value; each must be i, i + Q
or i - Q for one Q of all the kernel's gathers. The index being in [0, size) too (`gathers`),
wherever size = 2 Q a row i < Q gathers i or i + Q and a row i >= Q gathers i or i - Q.

The paired kernel `qmv_paired` is qmv with its rows_per_group rows R taken in two halves: a
simdgroup holds rows u0 .. u0 + R/2 - 1 and their partners u0 + Q .. (`rows`). Each row's
partner is then one of the simdgroup's own sums (every lane holds each after `simd_sum`): the
grid, loads and loop are qmv's, and the partner is read from registers (`slot_value`). A call
whose sizes make size != 2 Q (an odd E) runs the staged kernel instead (`QuantSchedule.variant`
evaluates Q at the call's sizes).
"""
from __future__ import annotations

from fractions import Fraction
from typing import Mapping, Optional

from ... import ir
from ...graph import Graph, Node, Op, topo_order
from .. import ranges
from ..base import IDX
from .context import QuantContext, QuantState
from .gathers import value_gathers
from .positions import numbered

POSITION = "@i"                 # the row's own position, a symbol of the analysis
_LEAVES = (Op.SIZE, Op.CONST)


class _Relative(ranges.Analysis):
    """The analysis with the row's position and size expressions as symbols: a value exact in
    them (i + half) keeps its exact form."""

    def __init__(self, sizes: ranges.SizeFacts, axis: str) -> None:
        super().__init__(sizes)
        self.axis = axis
        self.opaque: dict[str, Node] = {}
        self.names: dict[object, str] = {}

    def _node(self, n: Node, env: ranges.Env) -> ranges.Range:
        if n.op == Op.INDEX and n.attr == self.axis and n.dtype.kind == "int":
            return (ranges.Case.exact(ranges.SizeForm.size(POSITION)),)
        if n.op not in _LEAVES and n.dtype.kind == "int" and all(
                m.op in (*_LEAVES, Op.BINARY, Op.UNARY, Op.CAST) for m in topo_order([n])):
            k = ranges.key(n)                       # a size expression: one symbol per value
            name = self.names.setdefault(k, f"@q{len(self.names)}")
            self.opaque[name] = n
            return (ranges.Case.exact(ranges.SizeForm.size(name)),)
        return super()._node(n, env)


def _offset(an: _Relative, case: ranges.Case) -> Optional[tuple[int, Optional[str]]]:
    """(sign, symbol) with the case's value i + sign * symbol (sign 0: i itself); None when
    the case is not exactly that."""
    f = case.exact_form()
    if f is None:
        return None
    d = f + ranges.SizeForm.size(POSITION).scale(Fraction(-1))
    terms = dict(d.terms)
    if d.const or len(terms) > 1:
        return None
    if not terms:
        return 0, None
    (name, c), = terms.items()
    if abs(c) != 1 or name not in an.opaque:
        return None
    return int(c), name


def period(ctx: QuantContext) -> Optional[Node]:
    """Q, where every gather of the kernel's results reads row i, i + Q or i - Q (one size
    expression Q for all); None otherwise, or with rows_per_group odd."""
    rows = ctx.policy.rows_per_group
    if rows % 2:
        return None
    found: Optional[Node] = None
    for n in value_gathers(ctx.graph):
        idx = n.args[1]
        an = _Relative(ranges.SizeFacts(ctx.graph, frozenset()), ctx.rows_axis)
        for case in an.range(idx):
            off = _offset(an, case)
            if off is None:
                return None
            if off[1] is None:
                continue
            q = an.opaque[off[1]]
            if found is not None and ranges.key(found) != ranges.key(q):
                return None
            found = q
    return found


def fits(graph: Graph, q: Node, rows_axis: str, sizes: Mapping[str, int]) -> bool:
    """Whether the call's sizes pair every row: size(rows axis) = 2 Q."""
    from ...reference import evaluate_expressions  # (torch: only on the host side)
    value = int(evaluate_expressions(graph, [q], sizes, {}, ())[0])
    return value > 0 and 2 * value == sizes[rows_axis]


# ---------------------------------------------------------------- the kernel's rows

def is_paired(st: QuantState) -> bool:
    """Whether the kernel is qmv_paired (or its _split kernel)."""
    return st.name.startswith("qmv_paired")


def q_value(st: QuantState) -> list[ir.Stmt]:
    """mf_q: Q, declared in the kernel's header."""
    assert st.ctx.period is not None
    rv = st.v.row_values
    stmts = rv.lower([st.ctx.period])
    return stmts + [ir.Decl("mf_q", IDX, ir.Cast(IDX, rv.value(st.ctx.period)))]


def half(st: QuantState) -> int:
    return st.ctx.policy.rows_per_group // 2


def row(st: QuantState, clamp: bool) -> ir.Expr:
    """Row mf_r of the simdgroup: u0 + mf_r % (R/2), plus Q in the second half (with `clamp`,
    u past Q - 1 repeats Q - 1: in bounds, never stored)."""
    h = ir.Lit(half(st), "uint")
    u: ir.Expr = ir.Var("mf_n0") + ir.Cast(IDX, ir.Var("mf_r") % h)
    if clamp:
        u = ir.Call("min", (u, ir.Var("mf_q") - ir.Lit(1, IDX)))
    return u + ir.Cast(IDX, ir.Var("mf_r") / h) * ir.Var("mf_q")


def real(st: QuantState) -> ir.Expr:
    """Row mf_r is a row of the head (u < Q)."""
    h = ir.Lit(half(st), "uint")
    return (ir.Var("mf_n0") + ir.Cast(IDX, ir.Var("mf_r") % h)) < ir.Var("mf_q")


def slot_value(st: QuantState, i: int, p: ir.Expr) -> ir.Expr:
    """Sum i of row p, p one of the simdgroup's rows (mf_r's partner: the same u, either
    half): its slot (p >= Q) R/2 + mf_r % (R/2), read by a chain of selects (register
    arrays stay statically indexed)."""
    h = half(st)
    slot = ir.Select(p >= ir.Var("mf_q"), ir.Lit(h, "uint"), ir.Lit(0, "uint")) \
        + ir.Var("mf_r") % ir.Lit(h, "uint")
    arr = ir.Var(numbered("mf_acc", i))
    value: ir.Expr = ir.Lane(arr, ir.Lit(2 * h - 1, "uint"))
    for s in range(2 * h - 2, -1, -1):
        value = ir.Select(slot.eq(ir.Lit(s, "uint")), ir.Lane(arr, ir.Lit(s, "uint")), value)
    return value
