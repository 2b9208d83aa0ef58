"""Autograd beside the call path: a call on tensors that require grad runs its forward inside a
`torch.autograd.Function` whose backward runs the kernels `metalforge.autodiff` derives, each
through `gradwarm.run_warm` (`runs.run` on a key's first call, its replay after: a warm step
re-plans nothing); `backward_source` shows them."""
from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

import torch

from .. import autodiff
from ..autodiff import NotDifferentiable
from ..errors import kernel_at
from ..graph import Graph, ScalarParam, TensorParam
from . import saving
from .grad_launch import options_for
from .gradrun import backward_run
from .gradwarm import FORWARD, memo, run_warm
from .show import source

# how a differentiable call runs its kernels: (backend, launch overrides)
How = tuple[Optional[str], Optional[Mapping[str, Any]]]


def run_backward(bw: autodiff.Backward, values: Mapping[str, Any], dys: Any,
                 backend: Optional[str], launch: Optional[Mapping[str, Any]],
                 saved: Optional[tuple[torch.Tensor, ...]] = None) -> dict[str, torch.Tensor]:
    """`autodiff.run_backward` through the runtime, on `backend` under `launch` (the forward's:
    the user tuned the forward): `gradrun.BackwardRun`, each kernel replaying its warm closure.
    Each kernel takes the options of `launch` its family takes (`options_for`); where the
    backward's first kernel is the forward's own (`bw.forward`), that one takes the forward's
    options (`forward_options`)."""
    return backward_run(bw, backend, launch)(values, dys, saved)


class _KernelFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, how: How, graph: Graph, values: Mapping[str, Any],
                names: tuple[str, ...], op: Optional[str], *tensors: torch.Tensor) -> Any:
        vals = dict(values)
        vals.update(zip(names, tensors))
        wrt = _wrt(names, tensors, ctx.needs_input_grad)
        out, kept, bw = forward_for_grad(graph, vals, how, wrt)
        outs = out if isinstance(out, tuple) else (out,)
        ctx.mark_non_differentiable(*[o for o in outs if not o.dtype.is_floating_point])
        ctx.save_for_backward(*tensors, *kept)
        ctx.meta = (how, graph, values, names, bw, op)
        return out

    @staticmethod
    def backward(ctx: Any, *dys: Any) -> Any:
        how, graph, values, names, bw, op = ctx.meta
        double = torch.is_grad_enabled()    # create_graph=True
        if double and op is None:           # a direct call: the result must be differentiable
            raise NotDifferentiable(f"{kernel_at(graph.name, graph.loc)}: double backward "
                                    "(create_graph=True) through a metalforge kernel is not "
                                    "supported; its backward kernels have no derivative")
        tensors, kept = ctx.saved_tensors[:len(names)], ctx.saved_tensors[len(names):]
        wrt = _wrt(names, tensors, ctx.needs_input_grad)
        vals = dict(values)
        vals.update(zip(names, tensors))
        bw, ran = resume(graph, wrt, bw, tuple(kept), vals)
        with torch.no_grad():
            grads = run_backward(bw, vals, dys, how[0], how[1], saved=ran)
        got = [grads.get(n) for n in names]
        anchor = [t for t in tensors if t.requires_grad][:1]
        if double and op is not None and anchor:
            got = _NoDerivative.mark(op, anchor, got)
        return (None, None, None, None, None, *got)


class _NoDerivative(torch.autograd.Function):
    """The gradients an operator's eager call returns under create_graph=True, as its backward
    op returns them: first-order gradients that raise where they are differentiated (the
    backward kernels have no derivative), never a silent zero."""
    @staticmethod
    def forward(ctx: Any, op: str, *tensors: torch.Tensor) -> Any:
        ctx.op = op                         # tensors: the anchor, then the gradients
        return tuple(g.view_as(g) for g in tensors[1:])

    @staticmethod
    def backward(ctx: Any, *_: Any) -> Any:
        raise NotDifferentiable(f"{ctx.op}: double backward (differentiating gradients taken "
                                "with create_graph=True) through a metalforge operator is not "
                                "supported; its backward kernels have no derivative")

    @staticmethod
    def mark(op: str, anchor: list[torch.Tensor], grads: list[Optional[torch.Tensor]]
             ) -> list[Optional[torch.Tensor]]:
        """`grads` with each tensor passed through this Function, recorded on the graph of
        `anchor` (an input that requires grad: the kernels' results do not)."""
        present = [g for g in grads if g is not None]
        out = iter(_NoDerivative.apply(op, *anchor, *present))  # type: ignore[no-untyped-call]
        return [None if g is None else next(out) for g in grads]


def _wrt(names: tuple[str, ...], tensors: tuple[torch.Tensor, ...],
         needs: tuple[bool, ...]) -> tuple[str, ...]:
    """The float inputs whose gradients autograd asks for (`needs`: the Function's
    needs_input_grad, after its 5 non-tensor arguments)."""
    return tuple(n for n, t, need in zip(names, tensors, needs[5:])
                 if need and t.dtype.is_floating_point)


def forward_for_grad(graph: Graph, vals: Mapping[str, Any], how: How, wrt: tuple[str, ...]
                     ) -> tuple[Any, tuple[torch.Tensor, ...], Optional[autodiff.Backward]]:
    """(the forward's outputs, what it saves, the backward that reads it) of a call whose
    gradients with respect to `wrt` will be asked for: the forward that also writes its rows'
    logsumexps where `saving.choose` finds that moves fewer bytes; where the backward's first
    kernel is the forward's own (attention with its rows' logsumexp), that kernel; else the
    forward alone, nothing saved (backward None)."""
    deterministic = torch.are_deterministic_algorithms_enabled()
    bw = memo(graph, vals, how[0], how[1], (wrt, deterministic),
              lambda: _plan(graph, wrt, vals, how, deterministic))
    out, kept = forward_saved(graph, vals, how, bw)
    return out, kept, bw


def _plan(graph: Graph, wrt: tuple[str, ...], vals: Mapping[str, Any], how: How,
          deterministic: bool) -> Optional[autodiff.Backward]:
    """`forward_for_grad`'s backward: the saving one `saving.choose` picks, else the forward's
    own kernel's where it is the backward's first (attention), else None."""
    bw = saving.choose(graph, wrt, vals, how[1], how[0], deterministic)
    if bw is None and wrt:
        plain = autodiff.backward_of(graph, wrt, deterministic)
        bw = plain if plain.forward else None
    return bw


def resume(graph: Graph, wrt: tuple[str, ...], bw: Optional[autodiff.Backward],
           kept: tuple[torch.Tensor, ...], vals: dict[str, Any]
           ) -> tuple[autodiff.Backward, Optional[tuple[torch.Tensor, ...]]]:
    """(the backward for `wrt`, the results of its first kernel the forward ran: `run_backward`'s
    saved) given what the forward saved (`kept`) for backward `bw` (`forward_for_grad`); the
    saved row buffers join `vals`. Attention's forward results serve any `wrt`; buffers saved
    for other gradients than those asked are not used (recomputed)."""
    if bw is not None and bw.forward and kept:
        return (bw if bw.wrt == wrt else autodiff.backward_of(graph, wrt)), kept
    if bw is None or bw.wrt != wrt or len(kept) != len(bw.saved):
        return autodiff.backward_of(graph, wrt), None
    vals.update((name, t) for (name, _), t in zip(bw.saved, kept))
    return bw, None


def forward_saved(graph: Graph, vals: Mapping[str, Any], how: How,
             bw: Optional[autodiff.Backward]) -> tuple[Any, tuple[torch.Tensor, ...]]:
    """(the forward's outputs, what it saves for backward `bw`): with `bw` None
    (`saving.choose`: recomputing moves fewer bytes), the forward alone and nothing saved;
    where the backward's first kernel is the forward's own (`bw.forward`: attention with its
    rows' logsumexp), all that kernel's results."""
    k = len(graph.outputs)
    g = graph if bw is None else bw.kernels[0] if bw.forward else \
        saving.forward_saving(graph, bw)
    full = run_warm(g, vals, how[0], how[1], FORWARD)
    if bw is None:
        return full, ()
    if bw.forward:
        return (full[0] if k == 1 else tuple(full[:k])), tuple(full)
    return (full[0] if k == 1 else tuple(full[:k])), tuple(full[k:])


def call_differentiable(graph: Graph, values: Mapping[str, Any], backend: Optional[str],
                        launch: Optional[Mapping[str, Any]], op: Optional[str] = None) -> Any:
    """Run `graph` so that autograd can differentiate its outputs with respect to the input
    tensors that require grad (the backward kernels of `metalforge.autodiff`). op: the name of
    the backward operator of an `as_op` operator whose eager call this is
    (`torch_ops.plain_eager`): under create_graph=True its backward returns first-order
    gradients, as that operator does, which refuse to be differentiated; None (a direct call):
    create_graph=True is refused at the backward."""
    names = tuple(t.name for t in graph.tensors)
    wrt = tuple(n for n in names if values[n].requires_grad)
    try:
        autodiff.backward_of(graph, wrt)            # no derivative: fail now, not at backward
    except NotDifferentiable as e:
        raise NotDifferentiable(f"{e} (argument(s) {', '.join(wrt)} require grad)") from None
    scalars = {k: v for k, v in values.items() if k not in names}
    return _KernelFunction.apply(  # type: ignore[no-untyped-call]
        (backend, launch), graph, scalars, names, op,
                                 *[values[n] for n in names])


def backward_source(graph: Graph, values: Optional[Mapping[str, Any]] = None, *,
                    sizes: Optional[Mapping[str, int]] = None,
                    launch: Optional[Mapping[str, Any]] = None) -> str:
    """The MSL of the backward kernels of `graph`, in launch order."""
    return _sources(autodiff.backward_of(graph),
                    lambda k, kv: source(k, kv, sizes=sizes,
                                         launch=options_for(k, launch)), values)


def _sources(bw: autodiff.Backward, show: Callable[[Graph, Optional[Mapping[str, Any]]], str],
           values: Optional[Mapping[str, Any]] = None) -> str:
    """The MSL of every backward kernel (`show(graph, values or None)`), in launch order, each
    under a header comment."""
    parts = []
    for i, k in enumerate(bw.kernels):
        mine = sorted((v[1], n) for n, v in {**bw.grads, **bw.buffers}.items() if v[0] == i)
        outs = ", ".join(f"d{n}" if n in bw.grads else n for _, n in mine)
        head = (f"// backward kernel {i + 1} of {len(bw.kernels)} of '{bw.graph.name}': "
                f"writes {outs}; reads {', '.join(autodiff.loaded(k))}")
        kv = None
        if values is not None:
            kv = {p.name: values[p.name] for p in k.params if p.name in values}
            if len(kv) != len([p for p in k.params if isinstance(p, (TensorParam,
                                                                    ScalarParam))]):
                kv = None
        parts.append(head + "\n" + show(k, kv))
    return "\n\n".join(parts)
