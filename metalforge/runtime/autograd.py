"""Autograd beside the call path: a call on tensors that require grad runs its forward through
`runs.run` inside a `torch.autograd.Function` whose backward runs the kernels
`metalforge.autodiff` derives (also through `runs.run`); `backward_source` shows them."""
from __future__ import annotations

from functools import partial
from typing import Any, Mapping, Optional

import torch

from .. import autodiff, schedule
from ..autodiff import NotDifferentiable
from ..errors import kernel_at
from ..graph import Graph
from ..schedule.policy import TUNABLE
from .runs import run
from .show import source

# how a differentiable call runs its kernels: (backend, launch overrides)
How = tuple[Optional[str], Optional[Mapping[str, Any]]]


def run_backward(bw: autodiff.Backward, values: Mapping[str, Any], dys: Any,
                 backend: Optional[str], launch: Optional[Mapping[str, Any]],
                 saved: Optional[tuple[torch.Tensor, ...]] = None) -> dict[str, torch.Tensor]:
    """`autodiff.run_backward` through the runtime, on `backend` under `launch` (where the
    backward's first kernel is the forward's own, `bw.forward`, the other kernels take the
    options of `launch` their family has: the user tuned the forward)."""
    if not (bw.forward and launch):
        return autodiff.run_backward(bw, values, dys,
                                     partial(run, backend=backend, launch=launch), saved)

    def each(k: Graph, kv: Mapping[str, Any]) -> Any:
        mine = launch if k is bw.kernels[0] else {
            key: v for key, v in launch.items() if key in TUNABLE[schedule.family(k)]}
        return run(k, kv, backend=backend, launch=mine)
    return autodiff.run_backward(bw, values, dys, each, saved)


def _wrt(names: tuple[str, ...], tensors: Any, needs: Any) -> tuple[str, ...]:
    return tuple(n for n, t, need in zip(names, tensors, needs)
                 if need and t.dtype.is_floating_point)


class _KernelFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, how: How, graph: Graph, values: Mapping[str, Any],
                names: tuple[str, ...], *tensors: torch.Tensor) -> Any:
        vals = dict(values)
        vals.update(zip(names, tensors))
        bw = autodiff.backward_of(graph, _wrt(names, tensors, ctx.needs_input_grad[4:]))
        saved: tuple[torch.Tensor, ...] = ()
        if bw.forward:          # the forward that also writes what the backward reads
            saved = run(bw.kernels[0], vals, backend=how[0], launch=how[1])
            n = len(graph.outputs)
            out = saved[0] if n == 1 else saved[:n]
        else:
            out = run(graph, vals, backend=how[0], launch=how[1])
        outs = out if isinstance(out, tuple) else (out,)
        ctx.mark_non_differentiable(*[o for o in outs if not o.dtype.is_floating_point])
        ctx.save_for_backward(*tensors, *saved)
        ctx.meta = (how, graph, values, names)
        return out

    @staticmethod
    def backward(ctx: Any, *dys: Any) -> Any:
        how, graph, values, names = ctx.meta
        if torch.is_grad_enabled():         # create_graph=True: the result must be differentiable
            raise NotDifferentiable(f"{kernel_at(graph.name, graph.loc)}: double backward "
                                    "(create_graph=True) through a metalforge kernel is not "
                                    "supported; its backward kernels have no derivative")
        tensors, saved = ctx.saved_tensors[:len(names)], ctx.saved_tensors[len(names):]
        wrt = _wrt(names, tensors, ctx.needs_input_grad[4:])
        vals = dict(values)
        vals.update(zip(names, tensors))
        grads = run_backward(autodiff.backward_of(graph, wrt), vals, dys, how[0], how[1],
                             saved or None)
        return (None, None, None, None, *[grads.get(n) for n in names])


def call_differentiable(graph: Graph, values: Mapping[str, Any], backend: Optional[str],
                        launch: Optional[Mapping[str, Any]]) -> Any:
    """Run `graph` so that autograd can differentiate its outputs with respect to the input
    tensors that require grad (the backward kernels of `metalforge.autodiff`)."""
    names = tuple(t.name for t in graph.tensors)
    wrt = tuple(n for n in names if values[n].requires_grad)
    try:
        autodiff.backward_of(graph, wrt)            # no derivative: fail now, not at backward
    except NotDifferentiable as e:
        raise NotDifferentiable(f"{e} (argument(s) {', '.join(wrt)} require grad)") from None
    scalars = {k: v for k, v in values.items() if k not in names}
    return _KernelFunction.apply(  # type: ignore[no-untyped-call]
        (backend, launch), graph, scalars, names,
                                 *[values[n] for n in names])


def backward_source(graph: Graph, values: Optional[Mapping[str, Any]] = None, *,
                    sizes: Optional[Mapping[str, int]] = None,
                    launch: Optional[Mapping[str, Any]] = None) -> str:
    """The MSL of the backward kernels of `graph`, in launch order."""
    return autodiff.source(autodiff.backward_of(graph),
                           lambda k, kv: source(k, kv, sizes=sizes, launch=launch), values)
