"""`build`: the scan schedule of a graph (its row or column kernel, one parameter list)."""
from __future__ import annotations

from dataclasses import replace

from ...graph import Graph
from .. import reduce
from ..policy import LaunchPolicy
from .context import (
    column_context,
    is_inner,
    match,
    reads,
    row_context,
    scans_of,
    vector_width,
)
from .kernels import column, row
from .plan import ScanSchedule


def build(graph: Graph, policy: LaunchPolicy, index64: bool) -> ScanSchedule:
    """The scan schedule of `graph` (checked): the row kernel where the scan axis is
    innermost in every tensor and output that has it, else the column kernel."""
    axis = match(graph)
    assert axis is not None, f"kernel '{graph.name}' has no scan"
    scans = scans_of(graph)
    if is_inner(graph, axis):
        rctx = row_context(graph, policy, index64, axis)
        kernels, _, tg = reduce.build_variants(rctx, ("row",), lambda name: row(rctx, scans))
        vw, r = vector_width(rctx), reads(rctx)
        vector = tuple(t.name for t in rctx.inputs if axis in t.axes and vw > 1)
        return ScanSchedule("scan", graph, replace(policy, threadgroup_bytes=tg, uses_simd=True,
                                                   vector_width=vw),
                            kernels["row"], tuple(rctx.outer) + (axis,), vector, index64,
                            axis=axis, rows=rctx.outer, inner=True, reads=r)
    cctx = column_context(graph, policy, index64, axis)
    kernels, _, _ = reduce.build_variants(cctx, ("column",), lambda name: column(cctx, scans))
    return ScanSchedule("scan", graph, replace(policy, vector_width=1), kernels["column"],
                        tuple(cctx.outer) + (axis,), (), index64, axis=axis, rows=cctx.outer,
                        inner=False, reads=1)
