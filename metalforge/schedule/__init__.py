"""Graph → schedule: recognise the kernel's family, pick its launch policy, lower it to IR.

Families, each a package (or module) of named blocks with one module per kernel: elementwise
maps (`elementwise`), reductions over the innermost axis (`rows/`) and over another axis
(`column`; both build on `reduce`), quantized matvecs (`quant/`: matvec and tiled kernels) and
online-softmax attention (`attention/`: decode, staged, prefill and merge kernels). Each is a
pattern of `families.PATTERNS` (the ordered table that recognises a graph's family, once per
graph, and hands its form to the builder) and an entry of `policy.POLICIES`, and produces a
`Schedule` (`base`), whose kernels come from `base.make_kernel`. A new family is one more
package and one more entry in each.

Building blocks the families share: `lower` (element values as IR, packed-word unpacking),
`gather` (mf.take), `reduce` (reduction state, simd → threadgroup → simd combines, positions
of the thread's unit), `online` (online-softmax factors and merges), `fragments` (8x8
simdgroup_matrix fragments), `policy` (launch tables and their checks), `hardware` (the GPU's
facts as frozen data), `reordering` (which float sums a schedule reorders, for the checker's
slack).
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

from ..errors import LaunchError, UnsupportedConstruct
from ..graph import Graph, Op
from .base import Schedule, Traffic
from .families import PATTERNS, Match, recognise
from .lower import value_gather_refused
from .policy import LaunchPolicy, resolve

__all__ = ["Schedule", "Traffic", "LaunchPolicy", "LaunchError", "UnsupportedConstruct",
           "Match", "PATTERNS", "recognise", "family", "plan", "needs_index64",
           "INDEX32_LIMIT"]

INDEX32_LIMIT = 2 ** 31          # sizes and element counts below this use 32-bit indexing


def family(graph: Graph) -> str:
    """The schedule family of a graph, or an error naming the construct it cannot handle
    (`recognise(graph).family`: matched once per graph)."""
    return recognise(graph).family


def needs_index64(sizes: Mapping[str, int], numel: int) -> bool:
    return numel >= INDEX32_LIMIT or any(s >= INDEX32_LIMIT for s in sizes.values())


def plan(graph: Graph, launch: Optional[Mapping[str, Any]] = None, *,
         index64: bool = False) -> Schedule:
    """The schedule of `graph` with `launch` overrides; index64 picks 64-bit indexing (a
    policy's explicit index64 wins)."""
    m = recognise(graph)
    taken = next((n for n in graph.nodes() if n.op == Op.TAKE_VALUE), None)
    if taken is not None and m.family != "quant":     # only its epilogue gathers its results
        raise value_gather_refused(taken)
    policy = resolve(m.family, launch)
    if policy.index64 is not None:
        index64 = policy.index64
    return m.build(graph, policy, index64)
