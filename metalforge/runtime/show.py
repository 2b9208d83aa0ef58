"""Showing a specialisation without running it: its schedule, MSL and lowered IR for given
values (or axis sizes), and what a call would launch."""
from __future__ import annotations

from typing import Any, Mapping, Optional

import torch

from .. import ir as ir_mod
from .. import schedule as sched_mod
from ..graph import Graph
from ..shapes import bind_shapes, numel
from ..tuning.launch import merge
from . import launcher
from .backends import current_backend
from .launcher import render, specialisation


def schedule_of(graph: Graph, values: Optional[Mapping[str, Any]] = None, *,
                sizes: Optional[Mapping[str, int]] = None,
                launch: Optional[Mapping[str, Any]] = None) -> sched_mod.Schedule:
    """The schedule a call with these values (or axis sizes) uses: with tensors, the launch
    options the launcher layers for them too (`launcher.layered`: what their backend changes
    in the table, such as cuda's staged row kernel, and the autotune cache's choice for their
    sizes). Without sizes, the 32-bit-indexed variant."""
    spec = specialisation(graph, launch)
    bound: dict[str, int] = dict(sizes or {})
    tensors: dict[str, torch.Tensor] = {}
    if values is not None:
        tensors = {t.name: values[t.name] for t in graph.tensors
                   if isinstance(values.get(t.name), torch.Tensor)}
        whole = len(tensors) == len(graph.tensors)
        if whole:
            bound.update(bind_shapes(graph, tensors).sizes)
        if tensors:
            spec = launcher.layered(graph, current_backend(tensors.values()), launch,
                                    bound if whole else None)
    if not tensors:          # the target's layer without tensors (launcher.target_launch)
        layer = launcher.target_launch(current_backend(()), spec.family)
        if layer:
            spec = specialisation(graph, merge(layer, launch))
    index64 = False
    if all(a in bound for a in spec.grid):
        index64 = sched_mod.needs_index64(bound, numel(spec.grid, bound))
    return spec.schedule(index64)


def source(graph: Graph, values: Optional[Mapping[str, Any]] = None, *,
           sizes: Optional[Mapping[str, int]] = None,
           launch: Optional[Mapping[str, Any]] = None) -> str:
    """The MSL source of the kernel these values (or sizes) select."""
    return render(schedule_of(graph, values, sizes=sizes, launch=launch))


def ir(graph: Graph, values: Optional[Mapping[str, Any]] = None, *,
       sizes: Optional[Mapping[str, int]] = None,
       launch: Optional[Mapping[str, Any]] = None) -> str:
    """A readable dump of the lowered kernel."""
    s = schedule_of(graph, values, sizes=sizes, launch=launch)
    return "\n".join(ir_mod.dump(k) for k in s.kernels)


def launches(graph: Graph, values: Mapping[str, Any], backend: Optional[str] = None,
             launch: Optional[Mapping[str, Any]] = None) -> tuple[tuple[str, int, int], ...]:
    """What a call with these values would launch, without running it: (host name, threads,
    threadgroup size) per launch, in order; () when the outputs are empty. Every check of a
    call is made and the library compiled."""
    call = launcher.check_call(graph, values, backend, launch)
    return launcher.bind(call).plan if call.numel else ()
