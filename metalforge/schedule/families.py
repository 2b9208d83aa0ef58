"""Family recognition: one ordered table of graph patterns, matched once per graph.

A `Pattern` names a family, says from the graph's `Facts` (its reductions and their axes,
gathered in one walk) whether the family can apply, finds the family's form in the graph (the
data its builder takes: attention's `AxesForm`, the quantized sum, the reduced axis; None when the
graph is not of the family) and builds the schedule from that form. A pattern raises
`UnsupportedConstruct` for a graph of its kind that no schedule handles (reductions over
different sets of axes). `recognise` tries `PATTERNS` in order and keeps the first `Match` for each
graph object, so the runtime asking for a specialisation's family and `plan` building its
schedules at each index width match the graph once.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Callable, Optional

from ..errors import UnsupportedConstruct, at
from ..graph import Graph, Node, Op
from ..once import OnceMap
from . import (
    attention,
    attention_grad,
    column,
    elementwise,
    matmul,
    multiaxis,
    quant,
    rows,
    scan,
    scatter,
)
from .base import Schedule
from .policy import LaunchPolicy


@dataclass(frozen=True)
class Facts:
    """What the patterns ask of every graph, from one walk of its nodes."""
    reductions: tuple[Node, ...]
    axes: tuple[str, ...]                     # the reduced axes, in order of first use
    lost: Optional[tuple[Node, str]]          # the first node reading an axis it drops

    @classmethod
    def of(cls, graph: Graph) -> "Facts":
        reds: list[Node] = []
        lost: Optional[tuple[Node, str]] = None
        for n in graph.nodes():
            if n.op == Op.REDUCE:
                reds.append(n)
            elif lost is None:
                lost = next(((n, x) for a in n.args for x in a.axes if x not in n.axes), None)
        return cls(tuple(reds), tuple(dict.fromkeys(n.attr[1] for n in reds)), lost)


Builder = Callable[[Graph, LaunchPolicy, bool, Any], Schedule]


@dataclass(frozen=True)
class Pattern:
    """One family: `when` it can apply, how to `find` its form, how to `build` from that."""
    family: str
    when: Callable[[Facts], bool]
    find: Callable[[Graph, Facts], Optional[Any]]
    build: Builder


@dataclass(frozen=True)
class Match:
    """The pattern a graph matched and the form it found (what `plan` hands the builder)."""
    pattern: Pattern
    form: Any

    @property
    def family(self) -> str:
        return self.pattern.family

    def build(self, graph: Graph, policy: LaunchPolicy, index64: bool) -> Schedule:
        return self.pattern.build(graph, policy, index64, self.form)


def _reduced_axis(graph: Graph, facts: Facts) -> str:
    """The one axis a row or column kernel reduces, or an error naming the construct."""
    if facts.lost is not None:
        n, axis = facts.lost
        raise UnsupportedConstruct(
            f"kernel '{graph.name}'{at(n.loc)}: axis '{axis}' broadcast against "
            f"its base inside a reduction kernel: only kernels that unpack words "
            f"(mf.unpack, the quantized matvec) read derived axes by k // d there")
    if len(facts.axes) > 1:
        n = next(n for n in facts.reductions if n.attr[1] == facts.axes[1])
        raise UnsupportedConstruct(
            f"kernel '{graph.name}': reductions over several axes ({', '.join(facts.axes)}), "
            f"e.g. mf.{n.attr[0]}(..., axis={facts.axes[1]!r}){at(n.loc)}; one kernel reduces "
            f"one axis: split it into one kernel per axis")
    return facts.axes[0]


def _row(graph: Graph, facts: Facts) -> Optional[str]:
    axis = _reduced_axis(graph, facts)
    return axis if rows.is_row(graph, axis) else None


def _build_row(graph: Graph, policy: LaunchPolicy, index64: bool, axis: str) -> Schedule:
    return rows.build(graph, policy, index64)


def _build_column(graph: Graph, policy: LaunchPolicy, index64: bool, axis: str) -> Schedule:
    return column.build(graph, policy, index64)


def _build_scan(graph: Graph, policy: LaunchPolicy, index64: bool, axis: str) -> Schedule:
    return scan.build(graph, policy, index64)


def _multiaxis(graph: Graph, facts: Facts) -> Optional[multiaxis.AxesForm]:
    """The form of a graph reducing several axes together (None: one axis per reduction)."""
    if facts.lost is not None:
        _reduced_axis(graph, facts)                 # the derived-axis error
    return multiaxis.match(graph)


def _build_multiaxis(graph: Graph, policy: LaunchPolicy, index64: bool,
                     form: multiaxis.AxesForm) -> Schedule:
    return multiaxis.build(graph, policy, index64, form)


def _build_elementwise(graph: Graph, policy: LaunchPolicy, index64: bool,
                       outputs: object) -> Schedule:
    return elementwise.build(graph, policy, index64)


# In order: the first pattern whose `when` holds and whose `find` finds a form is the family.
PATTERNS: tuple[Pattern, ...] = (
    # an mf.scatter_add output: zeroed, added to at computed positions
    Pattern("scatter", lambda f: True, lambda g, f: scatter.match(g), scatter.build),
    # scans along one axis (mf.cumsum...), with elementwise work around them; a scan with a
    # reduction is refused here, clearly (scan.match)
    Pattern("scan", lambda f: True, lambda g, f: scan.match(g), _build_scan),
    # a sum over the weight rows of words unpacked along a kept axis (the quantized matvec's
    # gradient with respect to x): a column reduction (`quant.transposed`)
    Pattern("column", lambda f: len(f.axes) == 1, lambda g, f: quant.transposed(g),
            _build_column),
    # a reduction whose argument unpacks packed words
    Pattern("quant", lambda f: bool(f.reductions), lambda g, f: quant.match(g), quant.build),
    # the backward graphs of an attention kernel (registered with their roles by autodiff)
    Pattern("attention_grad", lambda f: len(f.axes) > 1,
            lambda g, f: attention_grad.roles_of(g), attention_grad.build),
    # sum(softmax(s, L) * V, L) with s summed products over another axis E
    Pattern("attention", lambda f: len(f.axes) > 1, lambda g, f: attention.match(g),
            attention.build),
    # a contraction: sum over K of a[..., M, K] * b[..., N, K], elementwise prologue and
    # epilogue (the matrix block: tensor ops or simdgroup_matrix, by target)
    Pattern("matmul", lambda f: len(f.reductions) == 1 and f.lost is None,
            lambda g, f: matmul.match(g), matmul.build),
    # several axes reduced together (mf.sum(x, axis=("C", "H", "W"))): chains of reductions
    # (and a full reduction of one axis: every output one value)
    Pattern("multiaxis", lambda f: bool(f.reductions), _multiaxis, _build_multiaxis),
    # one reduced axis, innermost in every tensor and output that has it
    Pattern("row", lambda f: bool(f.reductions), _row, _build_row),
    # one reduced axis, outer somewhere
    Pattern("column", lambda f: bool(f.reductions), _reduced_axis, _build_column),
    # no reduction: each output element on its own (the form is the outputs)
    Pattern("elementwise", lambda f: not f.reductions, lambda g, f: g.outputs,
            _build_elementwise),
)


def _recognise(graph: Graph) -> Match:
    facts = Facts.of(graph)
    for p in PATTERNS:
        if p.when(facts):
            form = p.find(graph, facts)
            if form is not None:
                return Match(p, form)
    raise AssertionError(f"kernel '{graph.name}': no schedule family pattern matched")


# graph id -> its match, dropped when the graph is collected (a Match holds no graph)
_MATCHES: OnceMap[int, Match] = OnceMap()


def recognise(graph: Graph) -> Match:
    """The family of `graph` and its form (matched once per graph object), or an error naming
    the construct no family handles."""
    def first() -> Match:
        m = _recognise(graph)
        weakref.finalize(graph, _MATCHES.pop, id(graph), None)
        return m
    return _MATCHES.get_or_build(id(graph), first)
