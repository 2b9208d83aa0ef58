"""The form of a several-axis reduction graph: which axes it reduces, in which order they are
flattened, and the graph with each chain of reductions collapsed into one node.

The frontend writes `mf.sum(x, axis=("C", "H", "W"))` as a chain of one-axis reductions, each
reducing the last's result (`sum_W(sum_H(sum_C(x)))`; float sums of f16/bf16 add in f32). A
*chain* is such a run of reductions of one kind whose inner results nothing else reads; the
kernel computes it as one reduction over the axes together, walking their flattened index. Every
chain of a kernel must reduce the same set of axes (group norm's mean and variance both over
(C, H, W)); a graph mixing sets (a max over H, then a sum over W of something else) is refused
with both sets named.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import Optional

from ...errors import UnsupportedConstruct, at
from ...graph import Graph, Node, Op


@dataclass(frozen=True)
class AxesForm:
    """What the multiaxis schedule of a graph is built from (no graph held: `collapse` makes
    the collapsed graph again)."""
    reduced: tuple[str, ...]      # the reduced axes, flattened in this order (outer to inner)
    outer: tuple[str, ...]        # every output axis but those: a row is one element of them

    @property
    def flat(self) -> str:
        """The name the collapsed reductions give their axis: "(C H W)"."""
        return "(" + " ".join(self.reduced) + ")"


def _strip(n: Node) -> Node:
    while n.op == Op.CAST and n.args[0].dtype == n.dtype:
        n = n.args[0]
    return n


def _users(graph: Graph) -> Counter[int]:
    uses: Counter[int] = Counter(id(o.node) for o in graph.outputs)
    for n in graph.nodes():
        for a in n.args:
            uses[id(a)] += 1
    return uses


def chains(graph: Graph) -> dict[Node, tuple[Node, list[str]]]:
    """{the last reduction of each chain: (the value the chain reduces, the axes, first to
    last)}: a reduction whose argument is a reduction of the same kind read by it alone
    continues that reduction's chain."""
    uses = _users(graph)
    inner: dict[Node, Node] = {}            # a reduction -> the chain reduction it continues
    for n in graph.nodes():
        if n.op != Op.REDUCE:
            continue
        a = _strip(n.args[0])
        if a.op == Op.REDUCE and a.attr[0] == n.attr[0] and uses[id(a)] == 1 and \
                all(uses[id(c)] == 1 for c in _casts(n.args[0], a)):
            inner[n] = a
    absorbed = set(inner.values())
    out: dict[Node, tuple[Node, list[str]]] = {}
    for n in graph.nodes():
        if n.op != Op.REDUCE or n in absorbed:
            continue
        axes = [n.attr[1]]
        m = n
        while m in inner:
            m = inner[m]
            axes.insert(0, m.attr[1])
        out[n] = (m.args[0], axes)
    return out


def _casts(n: Node, stop: Node) -> list[Node]:
    """The same-dtype casts between a reduction's argument `n` and the reduction `stop`."""
    out = []
    while n is not stop:
        out.append(n)
        n = n.args[0]
    return out


def match(graph: Graph) -> Optional[AxesForm]:
    """The form of a graph whose reductions are chains over one set of several axes, or a
    full reduction of one axis (`_whole`); None for other graphs of one-axis reductions; an
    error naming the construct for one this schedule
    cannot take (chains over different sets of axes, gathers, packed words)."""
    found = chains(graph)
    sets = {frozenset(axes) for _, axes in found.values()}
    if all(len(s) == 1 for s in sets) and not _whole(graph, found, sets):
        return None
    if len(sets) > 1:
        (a, (_, ax)), (b, (_, bx)) = _two_sets(found)
        raise UnsupportedConstruct(
            f"kernel '{graph.name}': reductions over different sets of axes, "
            f"mf.{a.attr[0]}(..., axis={_spelling(ax)}){at(a.loc)} and "
            f"mf.{b.attr[0]}(..., axis={_spelling(bx)}){at(b.loc)}; one kernel reduces one "
            f"axis, or several axes together (axis=(...)): split it into one kernel per set "
            f"of axes")
    for n in graph.nodes():
        if n.op in (Op.TAKE, Op.UNPACK):
            raise UnsupportedConstruct(
                f"kernel '{graph.name}'{at(n.loc)}: mf.{n.op} in a reduction over several axes "
                f"is not supported; reduce one axis, or gather in another kernel")
    reduced = _order(graph, next(iter(sets)))
    widest = max(graph.outputs, key=lambda o: len(o.axes)).axes
    outer = tuple(a for a in widest if a not in reduced)
    _check_axes(graph, reduced, outer)
    return AxesForm(reduced, outer)


def _whole(graph: Graph, found: dict[Node, tuple[Node, list[str]]],
           sets: set[frozenset[str]]) -> bool:
    """A full reduction of one axis (`mf.sum(x, axis=None)` of x: "T[N]"): every output one
    value, no argmax/argmin, no gathers or packed words (their families' own refusals and
    schedules stand). The row schedule would give the whole tensor one threadgroup; this
    one splits it into chunks."""
    return len(sets) == 1 and all(not o.axes for o in graph.outputs) and \
        all(n.attr[0] in ("sum", "prod", "max", "min") for n in found) and \
        not any(n.op in (Op.TAKE, Op.UNPACK) for n in graph.nodes())


def _spelling(axes: list[str]) -> str:
    return repr(axes[0]) if len(axes) == 1 else repr(tuple(axes))


def _two_sets(found: dict[Node, tuple[Node, list[str]]]
              ) -> tuple[tuple[Node, tuple[Node, list[str]]], ...]:
    items = list(found.items())
    first = items[0]
    other = next(i for i in items if set(i[1][1]) != set(first[1][1]))
    return first, other


def _order(graph: Graph, axes: frozenset[str]) -> tuple[str, ...]:
    """The reduced axes in the storage order of the input holding most of them (the innermost
    last, so neighbouring threads read neighbouring elements); any it lacks first, in the
    order of the kernel's axes."""
    best = max(graph.tensors, key=lambda t: len(axes & set(t.axes)), default=None)
    held = [a for a in best.axes if a in axes] if best is not None else []
    every = [a for t in graph.tensors for a in t.axes]
    rest = sorted(axes - set(held), key=lambda a: every.index(a) if a in every else len(every))
    return tuple(rest + held)


def _check_axes(graph: Graph, reduced: tuple[str, ...], outer: tuple[str, ...]) -> None:
    """Every output covers the same rows; every input axis is kept or reduced."""
    for o in graph.outputs:
        if set(o.axes) - set(reduced) != set(outer):
            raise UnsupportedConstruct(
                f"kernel '{graph.name}': outputs over axes {list(o.axes)} and "
                f"{list(outer) + list(reduced)}: every output of a reduction over "
                f"{tuple(reduced)} must cover the same rows {list(outer)}")
    used = {n.attr for n in graph.nodes() if n.op == Op.LOAD}
    for t in graph.tensors:
        extra = [a for a in t.axes if a not in outer and a not in reduced]
        if t.name in used and extra:
            raise UnsupportedConstruct(
                f"kernel '{graph.name}': input '{t.name}' has axis {extra[0]!r}, which no "
                f"output keeps and no reduction removes")


def collapse(graph: Graph, form: AxesForm) -> Graph:
    """`graph` with each chain one REDUCE node over `form.flat`, reducing the chain's value
    (what the reduction blocks of `reduce` take: one node, one accumulator)."""
    found = chains(graph)
    absorbed = {m for top, (v, _) in found.items() for m in _chain(top, v)} - set(found)
    new: dict[Node, Node] = {}
    for n in graph.nodes():
        if n in absorbed:
            continue
        if n in found:
            v = found[n][0]
            new[n] = Node(Op.REDUCE, (new[v],), n.dtype, n.axes, (n.attr[0], form.flat),
                          n.weak, n.loc)
            continue
        args = tuple(new[a] for a in n.args)
        new[n] = n if all(a is b for a, b in zip(args, n.args)) else replace(n, args=args)
    return replace(graph, outputs=tuple(replace(o, node=new[o.node]) for o in graph.outputs))


def _chain(top: Node, value: Node) -> list[Node]:
    """Every node from the chain's last reduction down to (not including) its value."""
    out = []
    n = top
    while n is not value:
        out.append(n)
        n = n.args[0]
    return out
