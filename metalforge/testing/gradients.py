"""The gradient part of `check`: a differentiable kernel's gradients (its derived backward
kernels, `metalforge.autodiff`) against torch.autograd through `kernel.reference` (float64 math).

Run at the sizes, integer/bool inputs and scalars of a drawn example, with float inputs and
output gradients from the "normal" family (gradients of inf/NaN/huge inputs say more about the
reference's own rounding than about the kernel); tolerance as for outputs
(`metalforge.testing.tolerance`), with the reduction lengths of the forward and backward kernels
and the magnitude of the inputs and of the expected gradients as scale.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

import torch

from .. import autodiff
from ..dtypes import from_torch
from ..graph import Graph, TensorParam
from ..shapes import bind_shapes
from .tensors import make_values
from .tolerance import compare, lowest_precision, magnitude, reduction_length, tolerance


def differentiable_inputs(graph: Graph) -> tuple[str, ...]:
    """The float tensor inputs whose gradients metalforge derives, each on its own (x of a
    quantized matvec, not its scales)."""
    out = []
    for t in graph.tensors:
        try:
            if t.dtype.is_float:
                autodiff.backward_of(graph, (t.name,))
                out.append(t.name)
        except autodiff.NotDifferentiable:
            pass
    return tuple(out)


def differentiable(graph: Graph) -> bool:
    """Whether some float input has a derived gradient and all of them together do."""
    wrt = differentiable_inputs(graph)
    try:
        autodiff.backward_of(graph, wrt)
    except autodiff.NotDifferentiable:
        return False
    return bool(wrt)


def gradient_problem(kernel, graph: Graph, args: Mapping[str, Any], seed: int,
                     backend_ctx) -> Optional[str]:
    """None when the kernel's gradients match the reference's at these sizes, else why not."""
    if not differentiable(graph):
        return None
    gen = torch.Generator().manual_seed(seed)
    inputs: dict[str, Any] = {}
    wrt: list[str] = []
    derived = differentiable_inputs(graph)     # not a quantized weight's scales
    for p in graph.params:
        v = args[p.name]
        if isinstance(p, TensorParam) and p.name in derived:
            inputs[p.name] = make_values(p.dtype, tuple(v.shape), "normal",
                                           int(torch.randint(0, 2 ** 16, (1,), generator=gen)))
            inputs[p.name] = inputs[p.name].to(v.device).requires_grad_()
            wrt.append(p.name)
        else:
            inputs[p.name] = v
    try:
        with backend_ctx():
            got_out = _tuple(kernel(**inputs))
        dys = [make_values(from_torch(o.dtype), tuple(o.shape), "normal",
                             int(torch.randint(0, 2 ** 16, (1,), generator=gen))).to(o.device)
               if o.dtype.is_floating_point else None for o in got_out]
        got = _grads(got_out, dys, [inputs[n] for n in wrt])
    except Exception as e:                                       # noqa: BLE001 - reported
        return f"the gradient computation raised {type(e).__name__}: {e}"
    leaves = {n: (v.detach().clone().requires_grad_() if n in wrt else v)
              for n, v in inputs.items()}
    expected = _grads(_tuple(kernel.reference(**leaves)), dys, [leaves[n] for n in wrt])
    graphs = [graph, *autodiff.backward_of(graph, tuple(wrt)).kernels]
    lengths = bind_shapes(graph, {t.name: inputs[t.name] for t in graph.tensors}).sizes
    tol = tolerance(lowest_precision([t.dtype for t in graph.tensors] +
                                     [o.dtype for o in graph.outputs]),
                    reduction_length=sum(reduction_length(g, lengths) for g in graphs),
                    scale=max(magnitude([*inputs.values(), *[d for d in dys if d is not None]]),
                              magnitude(expected)))
    for name, g, e in zip(wrt, got, expected):
        breach = compare(g.detach(), e.detach(), tol)
        if breach is not None:
            return (f"the gradient with respect to '{name}' (backward kernels "
                    f"{', '.join(k.name for k in graphs[1:])}) does not match torch.autograd "
                    f"on the reference: {breach} ({tol.describe()})")
    return None


def _tuple(r) -> tuple:
    return tuple(r) if isinstance(r, (tuple, list)) else (r,)


def _grads(outs, dys, wrt) -> list[torch.Tensor]:
    pairs = [(o, d) for o, d in zip(outs, dys) if d is not None]
    got = torch.autograd.grad([o for o, _ in pairs], wrt, [d for _, d in pairs],
                              allow_unused=True)
    return [torch.zeros_like(w) if g is None else g for g, w in zip(got, wrt)]
