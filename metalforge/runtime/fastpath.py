"""The warm-call fast path: a checked call, replayed.

A call's first pass through `launcher.check_call` and `launcher.bind` settles everything that
depends only on what the caller can vary — the tensors' dtypes, shapes, strides and device, the
runtime scalars' Python types, the Const values, the backend and the launch policy (overrides
and autotune entry) — and checks it. The caller (`Kernel.__call__`) turns exactly those into a
key; `record` turns the checked call into a `Warm` closure for that key: the kernel object,
where each kernel argument comes from, the dispatch size and the output shapes. A later call with
the same key passed the same checks, so it only runs the closure, which still does the work that
depends on the values themselves: fresh outputs, the scalars' conversion, and the copy that
gives a vector-loaded input an aligned start.

What is not in the key is checked on every call: `Warm.current` (the autotune cache the closure
was built under; the compiled kernel whose pipeline limits its group size was checked against)
and, by the caller, the `MSL_REWRITE` test seam (while set, every call takes the full path).

Closures are immutable and `WarmCache` only adds or drops whole entries under a lock, so
threads may call one kernel at once.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Hashable, Mapping, Optional, Sequence

import torch

from .. import runtime
from ..graph import Graph
from ..tuning.cache import default_cache
from . import backends, launcher
from .launcher import MSL_REWRITE, Call, Launch

# read on every call: the `with mf.backend(...)` override (part of every key) and the test seam
# that plants faults in the MSL (while set, every call takes the full path: fresh libraries)
BACKEND_OVERRIDE = backends._override
__all__ = ["BACKEND_OVERRIDE", "MSL_REWRITE", "Warm", "WarmCache", "record", "run"]


@dataclass(frozen=True)
class Warm:
    """One checked call's launch, as a function of the next call's argument values (given in
    the kernel's parameter order)."""
    kernel: Any                       # the backend's kernel object (compile_shader's model)
    threads: int
    group_size: int
    arg_casts: Optional[dict[int, str]]
    template: tuple                   # the kernel's arguments: sizes and numel, None elsewhere
    # filled in per call: (argument index, position, make contiguous, vector width or 0,
    # shape to view it as or None) / (argument index, output index, shape to view it as or
    # None) / (argument index, position, float or int)
    inputs: tuple[tuple[int, int, bool, int, Optional[tuple[int, ...]]], ...]
    outputs: tuple[tuple[int, int, Optional[tuple[int, ...]]], ...]
    scalars: tuple[tuple[int, int, type], ...]
    allocate: tuple[tuple[tuple[int, ...], torch.dtype, torch.device], ...]   # the outputs
    launches: bool                    # False for empty outputs
    tuning: tuple[Any, Any]           # (autotune cache, its entries) this was built under
    compiled: tuple[dict, str, Any]   # (the library's kernels, host name, the Compiled checked)
    errors: Optional[launcher.IndexErrors] = None   # gathers: a zeroed report buffer per call
    scratch: Optional[tuple[int, int]] = None   # (argument index, fp32 elements) per call
    then: tuple[tuple[Any, int, int], ...] = ()     # later launches (kernel, threads, group)

    def current(self) -> bool:
        """Still what the full path would do: the autotune cache is the same object holding
        the same entries (a write replaces them; another cache directory is another object),
        and the library still holds the compiled kernel whose limits the launch was checked
        against (else the full path checks the group size again)."""
        c = default_cache()
        kernels, host, checked = self.compiled
        return (c is self.tuning[0] and c.entries is self.tuning[1]
                and kernels.get(host) is checked)

    def __call__(self, values: Sequence[Any]):
        outs = [torch.empty(shape, dtype=dtype, device=device)
                for shape, dtype, device in self.allocate]
        if self.launches:
            args = list(self.template)
            for i, pos, contiguous, vector, flat in self.inputs:
                t = values[pos]
                if contiguous:
                    t = t.contiguous()
                elif vector and t.storage_offset() % vector:
                    t = t.clone()                   # vector loads need an aligned start
                args[i] = t if flat is None else t.view(flat)
            for i, o, view in self.outputs:
                args[i] = outs[o] if view is None else outs[o].view(view)
            for i, pos, convert in self.scalars:
                args[i] = convert(values[pos])
            if self.errors is not None:
                args[self.errors.arg] = torch.zeros(4, dtype=torch.int32, device=outs[0].device)
            if self.scratch is not None:
                i, n = self.scratch
                args[i] = torch.empty(n, dtype=torch.float32, device=outs[0].device)
            self.kernel(*args, threads=self.threads, group_size=self.group_size,
                        arg_casts=self.arg_casts)
            for kernel, threads, group in self.then:
                kernel(*args, threads=threads, group_size=group, arg_casts=self.arg_casts)
            if self.errors is not None:
                self.errors.check(args[self.errors.arg])
        return outs[0] if len(outs) == 1 else tuple(outs)


_NONE: tuple[dict, str, Any] = ({}, "", None)       # no launch, no kernel to check


def tuning_state() -> tuple[Any, Any]:
    """What `Warm.current` compares against; taken before the call is checked, so a cache
    written meanwhile makes the closure stale rather than wrong."""
    c = default_cache()
    return c, c.entries


def record(call: Call, launch: Optional[Launch], tuning: tuple[Any, Any]) -> Warm:
    """The closure replaying `call` (checked, with `launch` bound from it; None when its
    outputs are empty) for later calls with the same key."""
    graph = call.spec.graph
    position = {p.name: i for i, p in enumerate(graph.params)}
    allocate = tuple((tuple(o.shape), o.dtype, o.device) for o in call.outputs)
    if launch is None:
        return Warm(None, 0, 0, None, (), (), (), (), allocate, False, tuning, _NONE)
    s = call.spec.schedule(call.index64)
    kernels = call.spec.library(call.index64, call.backend).kernels
    host = launch.host_name
    template: list[Any] = []
    inputs, outputs, scalars = [], [], []
    scratch = None
    for i, (p, arg) in enumerate(zip(s.kernel.params, launch.args)):
        kind, name = p.binds[0], p.binds[1] if len(p.binds) > 1 else None
        template.append(None)
        if kind == "input":
            t = call.tensors[name]
            vector = s.policy.vector_width if name in s.vector_inputs else 0
            flat = tuple(arg.shape)
            inputs.append((i, position[name], not t.is_contiguous(), vector,
                           None if flat == tuple(t.shape) else flat))
        elif kind == "output":                      # a 0-dim output binds as 1 element
            view = tuple(arg.shape)
            outputs.append((i, name, None if view == tuple(call.outputs[name].shape) else view))
        elif kind == "scalar":
            scalars.append((i, position[name],
                            float if graph.param(name).dtype.is_float else int))
        elif kind == "scratch":                     # fresh per call, like the outputs
            scratch = (i, arg.numel())
        else:                                       # numel, sizes, launch values: fixed
            template[i] = arg
    return Warm(launch.kernel, launch.threads, launch.group_size, launch.arg_casts,
                tuple(template), tuple(inputs), tuple(outputs), tuple(scalars), allocate, True,
                tuning, (kernels, host, kernels[host]), launch.errors, scratch, launch.then)


class WarmCache:
    """Closures by key, at most `size` of them (the oldest goes first)."""

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._entries: dict[Hashable, Warm] = {}
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Optional[Warm]:
        return self._entries.get(key)

    def put(self, key: Hashable, warm: Warm) -> None:
        with self._lock:
            while len(self._entries) >= self.size:
                del self._entries[next(iter(self._entries))]
            self._entries[key] = warm

    def __len__(self) -> int:
        return len(self._entries)


def run(graph: Graph, values: Mapping[str, Any], backend: Optional[str],
        launch: Optional[Mapping[str, Any]]):
    """`runtime.run` for torch tensors, also returning the closure that replays this call:
    (result, Warm), or (result, None) for a call the fast path does not replay (the mlx
    backend, which `runtime.run` refuses torch tensors for)."""
    if backend is not None:
        backends.check_name(backend)
    if (backend or backends.current_backend()) == "mlx":
        return runtime.run(graph, values, backend=backend, launch=launch), None
    tuning = tuning_state()
    call = launcher.check_call(graph, values, backend, launch)
    bound = launcher.bind(call) if call.numel else None
    if bound is not None:
        launcher.dispatch(bound)
    result = call.outputs[0] if len(call.outputs) == 1 else tuple(call.outputs)
    return result, record(call, bound, tuning)
