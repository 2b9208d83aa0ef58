"""Running a backward's kernels on the runtime, step after step (#53).

`autodiff.run_backward` runs the kernels of a `Backward` through any `run(graph, values)` (the
runtime, the torch reference); on every call it finds again what depends on the backward alone:
each output gradient's name and dtype, the '*B' batch parameters, each kernel's arguments and
the buffers it writes, where each gradient comes from. `BackwardRun` is that, found once per
(backward, backend, the call's launch options), with each kernel's `gradwarm.GraphPath` (its
warm closures): calling it does what `autodiff.run_backward` does with `gradwarm.run_warm` as
`run`, and where an output gradient is None (zeros of the output's shape) it is that call.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

import torch

from .. import autodiff
from ..once import OnceMap
from .gradwarm import BACKWARD, FORWARD, GraphPath, graph_path, launch_key

Step = tuple[GraphPath, tuple[str, ...], tuple[tuple[str, int], ...]]


@dataclass(frozen=True)
class BackwardRun:
    """`bw`'s kernels as the runtime runs them on `backend` under the call's `given` options.

    dys: (forward output, its gradient's parameter, its dtype); batched: (parameter, its dims)
    of every kernel's '*B' tensors, in `autodiff.run_backward`'s order; steps: per kernel, its
    path (`FORWARD` for kernels[0] where `bw.forward`, else `BACKWARD`), its parameters' names
    and the buffers (name, output index) it writes; grads: per input of `bw.wrt`, its (kernel,
    output) or None (no path to an output: zeros)."""
    bw: autodiff.Backward
    given: Optional[Mapping[str, Any]]
    dys: tuple[tuple[int, str, torch.dtype], ...]
    batched: tuple[tuple[str, int], ...]
    steps: tuple[Step, ...]
    grads: tuple[tuple[str, Optional[tuple[int, int]]], ...]

    @classmethod
    def of(cls, bw: autodiff.Backward, backend: Optional[str],
           given: Optional[Mapping[str, Any]]) -> "BackwardRun":
        dys = tuple((i, name, o.dtype.torch) for i, (name, o) in
                    enumerate(zip(bw.dy, bw.graph.outputs)) if name is not None)
        batched = tuple((p.name, len(p.dims)) for k in bw.kernels for p in k.tensors
                        if p.dims and p.dims[0].batch)
        steps = tuple(
            (graph_path(k, backend, given, FORWARD if bw.forward and i == 0 else BACKWARD),
             tuple(p.name for p in k.params),
             tuple((n, oi) for n, (ki, oi) in bw.buffers.items() if ki == i))
            for i, k in enumerate(bw.kernels))
        return cls(bw, given, dys, batched, steps,
                   tuple((n, bw.grads.get(n)) for n in bw.wrt))

    def __call__(self, values: Mapping[str, Any], dys: Any,
                 saved: Optional[tuple[torch.Tensor, ...]] = None) -> dict[str, torch.Tensor]:
        """`autodiff.run_backward(bw, values, dys, run, saved)` with each kernel's path."""
        if any(i < len(dys) and dys[i] is None for i, _, _ in self.dys):
            return autodiff.run_backward(self.bw, values, dys, self._run, saved)
        env: dict[str, Any] = dict(values)
        for i, name, dtype in self.dys:
            if i < len(dys):
                env[name] = dys[i].to(dtype).contiguous()
        for name, dims in self.batched:      # never 0-dim row buffers (autodiff.run_backward)
            v = env.get(name)
            if isinstance(v, torch.Tensor) and v.dim() == dims - 1:
                env[name] = v.unsqueeze(0)
        results: list[tuple[Any, ...]] = []
        for i, (path, names, buffers) in enumerate(self.steps):
            if i == 0 and saved is not None and self.bw.forward:     # the forward call's
                r: Any = tuple(saved)
            else:
                r = path.run({n: env[n] for n in names if n in env})
            r = r if isinstance(r, tuple) else (r,)
            results.append(r)
            for name, oi in buffers:
                env[name] = r[oi]
        return {name: torch.zeros_like(values[name]) if at is None else
                _shaped(results[at[0]][at[1]], values[name].shape) for name, at in self.grads}

    def _run(self, k: Any, values: Mapping[str, Any]) -> Any:
        """`autodiff.run_backward`'s run: kernel `k` through its path."""
        return next(p for p, _, _ in self.steps if p.graph is k).run(values)


def _shaped(t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """`t.reshape(shape)`; `t` itself where it has that shape (a gradient the kernel wrote
    fresh: no view to make)."""
    return t if t.shape == shape else t.reshape(shape)


_runs: OnceMap[tuple[int, Optional[str], Any], BackwardRun] = OnceMap()


def backward_run(bw: autodiff.Backward, backend: Optional[str],
                 launch: Optional[Mapping[str, Any]]) -> BackwardRun:
    """The `BackwardRun` of `bw` on `backend` under the call's `launch` options, made once."""
    return _runs.get_or_build((id(bw), backend, launch_key(launch)),
                              lambda: BackwardRun.of(bw, backend, launch), lambda r: r.bw is bw)
