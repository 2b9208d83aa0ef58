"""`build`: the scan schedule of a graph (its row kernel, with the totals kernel where few
long rows may split; or its column kernel), one parameter list."""
from __future__ import annotations

from dataclasses import replace

from ...graph import Graph
from .. import reduce
from ..policy import LaunchPolicy
from .context import (
    Scan,
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
from .segments import extra_params


def build(graph: Graph, policy: LaunchPolicy, index64: bool) -> ScanSchedule:
    """The scan schedule of `graph` (checked): the row kernels where the scan axis is
    innermost in every tensor and output that has it, else the column kernel; with the
    totals kernel of split calls where every scan is of floats and fill_groups asks for
    splits."""
    axis = match(graph)
    assert axis is not None, f"kernel '{graph.name}' has no scan"
    scans = scans_of(graph)
    if is_inner(graph, axis):
        rctx = row_context(graph, policy, index64, axis)
        split = policy.fill_groups > 0 and splits(scans)
        names: tuple[str, ...] = ("row", "simd", "totals") if split else ("row", "simd")
        kernels, passes, tg = reduce.build_variants(
            rctx, names, lambda name: row(rctx, scans, name, split=split and name != "simd"))
        if split:
            extra = extra_params(len(kernels["row"].params))
            kernels = {n: replace(k, params=k.params + extra) for n, k in kernels.items()}
        vw, r = vector_width(rctx), reads(rctx)
        vector = tuple(t.name for t in rctx.inputs if axis in t.axes and vw > 1)
        return ScanSchedule("scan", graph, replace(policy, threadgroup_bytes=tg, uses_simd=True,
                                                   vector_width=vw),
                            kernels["row"], tuple(rctx.outer) + (axis,), vector, index64,
                            axis=axis, rows=rctx.outer, inner=True, reads=r, variants=kernels,
                            scans=sum(s.floats for s in scans), passes=passes)
    cctx = column_context(graph, policy, index64, axis)
    split = policy.fill_groups > 0 and splits(scans)
    cnames: tuple[str, ...] = ("column", "col_totals") if split else ("column",)
    kernels, passes, _ = reduce.build_variants(
        cctx, cnames, lambda name: column(cctx, scans, name, split))
    if split:
        extra = extra_params(len(kernels["column"].params))
        kernels = {n: replace(k, params=k.params + extra) for n, k in kernels.items()}
    return ScanSchedule("scan", graph, replace(policy, vector_width=1), kernels["column"],
                        tuple(cctx.outer) + (axis,), (), index64, axis=axis, rows=cctx.outer,
                        inner=False, reads=1, variants=kernels, scans=sum(s.floats for s in scans),
                        passes={"row": passes["column"], "totals": passes.get("col_totals", {})})


def splits(scans: list[Scan]) -> bool:
    """Whether a call may split rows (columns) over several launches: float scans (their
    segments' totals fp32 in scratch; a segmented cumsum's pair, two floats)."""
    return all(s.is_float for s in scans)
