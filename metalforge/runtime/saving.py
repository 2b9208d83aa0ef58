"""Whether a differentiable call's forward saves its logsumexps for the backward.

A backward that needs a row's logsumexp (cross-entropy's dx = (softmax(x) - one_hot) * g, that
is g * exp(x - lse) - ...) can recompute it (the backward's row kernel: one online pass over
the row for lse, then the pass that writes dx) or load it from an f32 buffer that the forward
writes beside its outputs (`autodiff.forward_saving`: 4 bytes a row more written by the
forward, read by the backward, which is then elementwise: one pass). Rows held in registers
are read once either way, so recomputing moves less (it moves no extra bytes); rows longer
than a threadgroup holds are read twice by the recomputing backward, so saving moves less.

`choose` measures it: the bytes the schedules of both plans count (`Schedule.traffic`: the
forward and every backward kernel at the call's sizes), cached per (graph, inputs, sizes,
launch); the plan that moves fewer bytes wins, recomputing on a tie.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

import torch

from .. import autodiff
from .. import schedule as sched_mod
from ..dtypes import F32
from ..graph import Graph, Node, Op, Output
from ..once import OnceMap
from ..shapes import bind_shapes, numel
from . import launcher
from .backends import current_backend
from .grad_launch import forward_options, options_for
from .show import schedule_of

_plans: OnceMap[tuple[object, ...], tuple[Graph, Optional[autodiff.Backward]]] = OnceMap()


def choose(graph: Graph, wrt: tuple[str, ...], values: Mapping[str, Any],
           launch: Optional[Mapping[str, Any]], backend: Optional[str] = None,
           deterministic: Optional[bool] = None) -> Optional[autodiff.Backward]:
    """The backward that loads the forward's saved logsumexps where that moves fewer bytes
    than recomputing them at these sizes, with the launch options the call's backend (`backend`,
    else that of the tensors) layers; None to recompute (or where nothing is saved).
    deterministic: the gathers' gradients sorted (None: as torch says at the call)."""
    if not wrt:
        return None
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    tensors = {t.name: values[t.name] for t in graph.tensors}
    sizes = bind_shapes(graph, tensors).sizes
    backend = backend or current_backend(tensors.values())
    key = (id(graph), wrt, deterministic, tuple(sorted(sizes.items())), backend,
           None if not launch else tuple(sorted(launch.items())))
    return _plans.get_or_build(
        key, lambda: (graph, _pick(graph, wrt, deterministic, sizes, launch, backend)),
        lambda p: p[0] is graph)[1]


def _pick(graph: Graph, wrt: tuple[str, ...], deterministic: bool, sizes: Mapping[str, int],
          launch: Optional[Mapping[str, Any]], backend: str) -> Optional[autodiff.Backward]:
    saving = autodiff.backward_of(graph, wrt, deterministic, saved=True)
    if not saving.saved:
        return None
    plain = autodiff.backward_of(graph, wrt, deterministic)
    recompute = moved(graph, plain.kernels, sizes, launch, backend)
    save = moved(forward_saving(graph, saving), saving.kernels, sizes, launch, backend)
    return saving if save < recompute else None


def moved(forward: Graph, kernels: tuple[Graph, ...], sizes: Mapping[str, int],
          launch: Optional[Mapping[str, Any]], backend: Optional[str] = None) -> int:
    """Bytes read and written by `forward` and the backward `kernels` at `sizes` (each with the
    options of `launch` its family takes, and those `backend` layers, where given)."""
    total = 0
    for g in (forward, *kernels):
        mine = forward_options(g, launch) if g is forward else options_for(g, launch)
        t = _schedule(g, sizes, mine, backend).traffic(sizes)
        total += t.read + t.written
    return total


def _schedule(graph: Graph, sizes: Mapping[str, int], launch: Optional[Mapping[str, Any]],
              backend: Optional[str]) -> sched_mod.Schedule:
    """The schedule a call at `sizes` on `backend` runs (`show.schedule_of` for sizes alone
    where no backend is given)."""
    if backend is None:
        return schedule_of(graph, sizes=sizes, launch=launch)
    spec = launcher.layered(graph, backend, launch, sizes)
    wide = all(a in sizes for a in spec.grid) and \
        sched_mod.needs_index64(sizes, numel(spec.grid, sizes))
    return spec.schedule(wide)


def forward_saving(graph: Graph, bw: autodiff.Backward) -> Graph:
    """The forward graph that also writes the row values `bw` loads (`bw.saved`, in order,
    f32, after the forward's own outputs), cached per (graph, backward)."""
    def build() -> tuple[Graph, autodiff.Backward, Graph]:
        saves = tuple(Output(n if n.dtype is F32 else Node(Op.CAST, (n,), F32, n.axes),
                             n.axes, F32) for _, n in bw.saved)
        return graph, bw, Graph(graph.name, graph.params, graph.outputs + saves,
                                consts=dict(graph.consts), dtype_vars=dict(graph.dtype_vars),
                                loc=graph.loc)
    return _saving.get_or_build((id(graph), id(bw)), build,
                                lambda v: v[0] is graph and v[1] is bw)[2]


_saving: OnceMap[tuple[int, int], tuple[Graph, autodiff.Backward, Graph]] = OnceMap()
