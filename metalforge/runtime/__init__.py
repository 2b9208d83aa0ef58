"""Runtime: run a graph specialisation on a backend; show its MSL or IR.

    run(graph, values, backend=None, launch=None)   checks, allocates, compiles (cached), launches
    source(graph, values=None, sizes=None, launch=None) -> str     the MSL
    ir(graph, values=None, sizes=None, launch=None) -> str         the lowered kernel, as text
    schedule_of(graph, values=None, sizes=None, launch=None)       the Schedule (traffic, launch)
    backend("sim") / current_backend(tensors)                      selection and override
    mlx                 the MLX backend: the same kernels through mx.fast.metal_kernel

The stages themselves (plan → render → compile → bind → dispatch) are in `launcher`.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

import torch

from .. import ir as ir_mod
from .. import schedule as sched_mod
from ..graph import Graph
from ..shapes import bind_shapes
from . import launcher, mlx
from .backends import BACKENDS, backend, check_name, clear_caches, current_backend
from .launcher import DeviceError, compiled, render, specialisation

__all__ = ["run", "source", "ir", "schedule_of", "backend", "current_backend", "BACKENDS",
           "DeviceError", "clear_caches", "compiled"]


def run(graph: Graph, values: Mapping[str, Any], *, backend: Optional[str] = None,
        launch: Optional[Mapping[str, Any]] = None):
    """Run one specialisation. values: every tensor and runtime scalar by name.
    Returns the output tensor, or a tuple of them for several outputs."""
    if backend is not None:
        check_name(backend)
    if any(mlx.is_array(v) for v in values.values()):
        return mlx.run(graph, values, backend, launch)
    if (backend or current_backend()) == "mlx":
        raise DeviceError(f"kernel '{graph.name}': backend 'mlx' runs on mlx.core.array "
                          "arguments, got torch tensors; convert them with mx.array(...) or "
                          "choose backend 'mps' or 'sim'")
    return launcher.run(graph, values, backend, launch)


def schedule_of(graph: Graph, values: Optional[Mapping[str, Any]] = None, *,
                sizes: Optional[Mapping[str, int]] = None,
                launch: Optional[Mapping[str, Any]] = None) -> sched_mod.Schedule:
    """The schedule a call with these values (or axis sizes) uses: with tensors, the launch
    options the launcher layers for them too (`launcher.layered`: what their backend changes
    in the table, such as cuda's staged row kernel, and the autotune cache's choice for their
    sizes). Without sizes, the 32-bit-indexed variant."""
    spec = specialisation(graph, launch)
    bound: dict[str, int] = dict(sizes or {})
    if values is not None:
        tensors = {t.name: values[t.name] for t in graph.tensors
                   if isinstance(values.get(t.name), torch.Tensor)}
        whole = len(tensors) == len(graph.tensors)
        if whole:
            bound.update(bind_shapes(graph, tensors).sizes)
        if tensors:
            spec = launcher.layered(graph, current_backend(tensors.values()), launch,
                                    bound if whole else None)
    index64 = False
    if all(a in bound for a in spec.grid):
        numel = 1
        for a in spec.grid:
            numel *= bound[a]
        index64 = sched_mod.needs_index64(bound, numel)
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
