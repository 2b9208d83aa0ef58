"""What an operator's forward saves for its backward (`kernel.as_op`: `torch_ops.KernelOp`).

When an argument requires grad (and grad mode is on), the op's Python wrapper calls
``<name>_saving`` (the op's arguments and ``int[] wrt``, returning the op's outputs and
``Tensor[] saved``) instead of the op itself: it runs the forward the direct call path runs
(`runtime.autograd.forward_for_grad`) and hands its extra results to ``<name>_backward``, so that
the backward runs only the backward kernels. WHICH tensors are saved depends on the graph and
`wrt` alone (`saves`), never on sizes or values, so the schema and the fake implementation fix
them when torch.compile or torch.export trace the op:

- ``"forward"`` (attention): the rows' logsumexp (f32, one per query row) that the forward's
  kernel writes beside its output; autograd keeps the output itself. The backward starts at its
  delta kernel: the forward runs once.
- ``"choice"`` (a backward that can load row logsumexps: softmax, log_softmax,
  cross-entropy): one f32 buffer per row value (`saving.forward_saving`). WHETHER the forward
  writes them is `saving.choose`'s measure of the bytes both plans move at the call's sizes,
  backend and launch, made inside the op's implementation, where the sizes are concrete
  (`decide`: without the deterministic-algorithms flag, which may change between forward and
  backward); the backward makes the same choice from the same values. Where recomputing
  wins, the buffers are allocated unwritten and never read.
- ``"none"``: nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

import torch

from . import autodiff
from .graph import Graph
from .runtime import saving
from .runtime.autograd import How, forward_saved, resume, run_backward
from .runtime.backends import device_backend
from .runtime.gradwarm import memo


@dataclass(frozen=True)
class Saves:
    """What the forward saves for gradients with respect to `wrt`: `kind` ("forward",
    "choice", "none"); the saved tensors are the outputs of `graph` after the forward's own."""
    kind: str
    graph: Graph


def saves(graph: Graph, wrt: tuple[str, ...]) -> Saves:
    """What the operator's forward saves (raises NotDifferentiable, at the call, where there
    is no derivative)."""
    plain = autodiff.backward_of(graph, wrt)
    if plain.forward:
        return Saves("forward", plain.kernels[0])
    kept = autodiff.backward_of(graph, wrt, False, saved=True)
    if kept.saved:
        return Saves("choice", saving.forward_saving(graph, kept))
    return Saves("none", graph)


def decide(graph: Graph, wrt: tuple[str, ...], vals: Mapping[str, Any], how: How
           ) -> Optional[autodiff.Backward]:
    """`saving.choose` for a "choice" graph, from what the forward and the backward both see:
    the sizes, the kernel's backend (else the tensors' device's) and launch; kept per the
    call's warm key (`gradwarm.memo`: an eager step decides once)."""
    dev = next(vals[t.name] for t in graph.tensors).device.type
    backend = how[0] or device_backend(dev)
    return memo(graph, vals, how[0], how[1], ("decide", wrt), lambda: saving.choose(
        graph, wrt, vals, how[1], backend, deterministic=False))


def forward(graph: Graph, vals: Mapping[str, Any], how: How, wrt: tuple[str, ...]
            ) -> tuple[Saves, Any, Optional[tuple[torch.Tensor, ...]]]:
    """(what is saved, the forward's outputs, the saved tensors: None where a "choice"
    forward recomputes, whose buffers the caller allocates unwritten)."""
    s = saves(graph, wrt)
    bw = autodiff.backward_of(graph, wrt) if s.kind == "forward" else \
        decide(graph, wrt, vals, how) if s.kind == "choice" else None
    out, kept = forward_saved(graph, vals, how, bw)
    if s.kind == "forward":
        return s, out, kept[len(graph.outputs):]
    return s, out, (kept if bw is not None else None) if s.kind == "choice" else ()


def backward(graph: Graph, vals: dict[str, Any], how: How, wrt: tuple[str, ...],
             saved_for: tuple[str, ...], saved: tuple[torch.Tensor, ...], dys: Any
             ) -> dict[str, torch.Tensor]:
    """The gradients for `wrt` given what the forward saved for `saved_for` (`saved`: for
    attention, its outputs then the rows' logsumexp; for a "choice", the buffers; nothing where
    the plain op ran)."""
    bw: Optional[autodiff.Backward] = None
    kind = saves(graph, saved_for).kind if saved_for else "none"
    if kind == "forward":
        bw = autodiff.backward_of(graph, saved_for)
    elif kind == "choice" and decide(graph, saved_for, vals, how) is not None:
        now = autodiff.backward_of(graph, saved_for, saved=True)   # torch's flag as it is now
        fixed = autodiff.backward_of(graph, saved_for, False, saved=True)
        same = len(now.saved) == len(fixed.saved) and all(
            a[1] is b[1] for a, b in zip(now.saved, fixed.saved))
        bw = now if same else None
    bw_run, ran = resume(graph, wrt, bw, saved if bw is not None else (), vals)
    return run_backward(bw_run, vals, dys, how[0], how[1], saved=ran)
