"""Graph → schedule: recognise the kernel's family, pick its launch policy, lower it to IR.

Families: elementwise maps (`elementwise`), reductions over the innermost axis (`row`) and over
another axis (`column`; both build on `reduce`), quantized matvecs (`quant`, its tiled kernel
in `qmm`) and online-softmax attention (`attention`, its simdgroup_matrix prefill in
`attention_matrix`). Each is an entry of `_BUILDERS` and of `policy.POLICIES` and produces a
`Schedule` (`base`), whose kernels come from `base.make_kernel`. A new family is one more
module and one more entry in each.

Building blocks the families share: `lower` (element values as IR, packed-word unpacking),
`gather` (mf.take), `reduce` (reduction state, simd → threadgroup → simd combines, positions
of the thread's unit), `online` (online-softmax factors and merges), `fragments` (8x8
simdgroup_matrix fragments), `policy` (launch tables and their checks).
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

from ..errors import LaunchError, UnsupportedConstruct, at
from ..graph import Graph, Op
from . import attention, column, elementwise, quant, row
from .base import Schedule, Traffic
from .policy import LaunchPolicy, resolve

__all__ = ["Schedule", "Traffic", "LaunchPolicy", "LaunchError", "UnsupportedConstruct",
           "family", "plan", "needs_index64", "INDEX32_LIMIT"]

INDEX32_LIMIT = 2 ** 31          # sizes and element counts below this use 32-bit indexing
_BUILDERS = {"elementwise": elementwise.build, "row": row.build, "column": column.build,
             "quant": quant.build, "attention": attention.build}


def family(graph: Graph) -> str:
    """The schedule family of a graph, or an error naming the construct it cannot handle."""
    reds = graph.reductions()
    if quant.is_quant(graph):
        return "quant"
    if len({n.attr[1] for n in reds}) > 1 and attention.is_attention(graph):
        return "attention"
    if reds:
        _no_derived_broadcast(graph)
        axes = list(dict.fromkeys(n.attr[1] for n in reds))
        if len(axes) > 1:
            n = next(n for n in reds if n.attr[1] == axes[1])
            raise UnsupportedConstruct(
                f"kernel '{graph.name}': reductions over several axes ({', '.join(axes)}), "
                f"e.g. mf.{n.attr[0]}(..., axis={axes[1]!r}){at(n.loc)}; one kernel reduces one "
                f"axis: split it into one kernel per axis")
        return "row" if row.is_row(graph, axes[0]) else "column"
    return "elementwise"


def _no_derived_broadcast(graph: Graph) -> None:
    """Reductions read derived axes (K/GS) against their base only in the quantized family."""
    for n in graph.nodes():
        for a in n.args:
            lost = [x for x in a.axes if x not in n.axes and n.op != Op.REDUCE]
            if lost:
                raise UnsupportedConstruct(
                    f"kernel '{graph.name}'{at(n.loc)}: axis '{lost[0]}' broadcast against "
                    f"its base inside a reduction kernel: only kernels that unpack words "
                    f"(mf.unpack, the quantized matvec) read derived axes by k // d there")


def needs_index64(sizes: Mapping[str, int], numel: int) -> bool:
    return numel >= INDEX32_LIMIT or any(s >= INDEX32_LIMIT for s in sizes.values())


def plan(graph: Graph, launch: Optional[Mapping[str, Any]] = None, *,
         index64: bool = False) -> Schedule:
    """The schedule of `graph` with `launch` overrides; index64 picks 64-bit indexing (a
    policy's explicit index64 wins)."""
    fam = family(graph)
    policy = resolve(fam, launch)
    if policy.index64 is not None:
        index64 = policy.index64
    return _BUILDERS[fam](graph, policy, index64)
