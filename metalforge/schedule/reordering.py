"""What a schedule's kernels compute in another order than the reference (`Schedule.reordering`).

Facts about the kernels, no arithmetic: the float sums they accumulate in an order of their own
(every reduction family: lanes, simdgroups, slices and key blocks), the ones among them whose
elements a later reduction compares (attention's scores, which the softmax compares: rounding
that differs between two near-tied keys moves the result where a uniform shift would not), and
the key axis whose keys a mask bounds out of every row of a tile, which attention's kernels
never read. `metalforge.testing.slack` turns these facts into how far a correct kernel may stray
from its reference. A schedule with no float sum computes every element as the reference does:
None.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol

from ..graph import Graph, Node, ReduceOp, topo_order


@dataclass(frozen=True)
class Reordering:
    """The float sums a schedule's kernels accumulate in their own order, and what follows."""
    sums: tuple[Node, ...]                 # every float sum of the graph
    combined: frozenset[Node]              # those some later reduction compares elements of
    skipped_keys: Optional[str] = None     # the key axis whose masked-out keys go unread


class Scheduled(Protocol):
    """The part of a `Schedule` these facts are read from."""
    family: str
    graph: Graph


def float_sums(graph: Graph) -> tuple[Node, ...]:
    """The graph's sums of float values."""
    return tuple(n for n in graph.reductions() if n.attr[0] == ReduceOp.SUM and n.dtype.is_float)


def combined_again(graph: Graph, sums: tuple[Node, ...]) -> frozenset[Node]:
    """The sums some later reduction combines several elements of (one over an axis the sum
    keeps)."""
    return frozenset(n for m in graph.reductions() for n in topo_order(m.args)
                     if n in sums and m.attr[1] in n.axes)


def skipped_keys(schedule: Scheduled) -> Optional[str]:
    """Attention whose mask bounds the keys on their indices (causal, a sliding window): its
    key axis (a tile reads the union of its rows' keys, never the others); None for other
    schedules. Kept here, keyed by family, until the attention schedule says it itself
    (`reordering(self, self.axis if self.bounds else None)`)."""
    bounds: tuple[object, ...] = getattr(schedule, "bounds", ())
    if schedule.family != "attention" or not bounds:
        return None
    axis: str = getattr(schedule, "axis")
    return axis


def reordering(schedule: Scheduled, skipped: Optional[str] = None) -> Optional[Reordering]:
    """The schedule's `Reordering` (`skipped`: its key axis, where its kernels leave out the keys
    a mask bounds); None when the graph has no float sum (nothing reordered)."""
    sums = float_sums(schedule.graph)
    if not sums:
        return None
    return Reordering(sums, combined_again(schedule.graph, sums), skipped)
