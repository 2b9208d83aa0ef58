"""The wrapper around one graph specialisation: argument checks, output allocation, launch.

`Specialisation` is built once per (graph, launch overrides) and keeps everything a warm call
needs precomputed: the tensor/scalar parameters, the grid axes, and per (index width, backend)
a `Launcher` holding the compiled kernel object, its positional argument plan and `arg_casts`.
"""
from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

import torch

from .. import schedule as sched_mod
from ..graph import Graph
from ..shapes import ShapeBinding, bind_shapes, flat_shape, output_shape
from ..codegen import render_msl
from .backends import DEVICE_OF, current_backend, kernel_object
from ..schedule.policy import (MAX_THREADS_PER_GROUP, TUNABLE, LaunchError,
                               validate_for_kernel)
from ..tuning.cache import tuned_launch
from ..tuning.launch import merge

MAX_THREADS = 2 ** 32 - 1        # dispatchThreads takes a 32-bit thread count per axis

# Test seam (owned by metalforge.testing.faults, which sets it inside `planted(...)` blocks): a
# function rewriting the MSL text before it is compiled, to plant faults that `check` must
# catch. Unset (None) outside those blocks; while set, launchers are built fresh, not cached.
MSL_REWRITE: ContextVar[Optional[Callable[[str], str]]] = ContextVar("mf_msl_rewrite",
                                                                     default=None)


class DeviceError(ValueError):
    """Tensor arguments on a device metalforge cannot run on, or on different devices."""


def _where(graph: Graph) -> str:
    return f"kernel '{graph.name}'" + (f" ({graph.loc[0]}:{graph.loc[1]})" if graph.loc else "")


@dataclass
class Launcher:
    schedule: sched_mod.Schedule
    backend: str
    source: str
    kernel: Any
    binds: tuple                  # per positional argument: what to pass
    casts: Optional[dict]         # arg_casts for compile_shader (None when none needed)
    max_threads: int = MAX_THREADS_PER_GROUP   # the pipeline's max_threads_per_threadgroup
    variants: dict = field(default_factory=dict)  # host name → (kernel, max_threads): the
                                                  # schedule's other kernels (row lengths)

    def kernel_for(self, host: str) -> tuple[Any, int]:
        """The compiled kernel with this host name (the schedule's first kernel, or one of its
        variants from the same library) and its pipeline's max threads per group."""
        if host == self.schedule.kernel.host_name:
            return self.kernel, self.max_threads
        got = self.variants.get(host)
        if got is None:
            k = kernel_object(self.backend, self.source, host)
            mt = int(k.max_threads_per_threadgroup)
            validate_for_kernel(self.schedule.policy, host, mt,
                                int(getattr(k, "static_thread_group_memory_length", 0)))
            got = self.variants[host] = (k, mt)
        return got


@dataclass
class Specialisation:
    graph: Graph
    launch: Optional[Mapping[str, Any]]
    family: str
    tensors: tuple
    scalars: tuple
    grid: tuple[str, ...]
    where: str
    _schedules: dict = field(default_factory=dict)
    _launchers: dict = field(default_factory=dict)

    @classmethod
    def of(cls, graph: Graph, launch) -> "Specialisation":
        fam = sched_mod.family(graph)
        grid = max(graph.outputs, key=lambda o: len(o.axes)).axes
        return cls(graph, launch, fam, graph.tensors, graph.scalars, tuple(grid), _where(graph))

    # -- schedule and compiled kernel, cached ------------------------------------------
    def schedule(self, index64: bool) -> sched_mod.Schedule:
        s = self._schedules.get(index64)
        if s is None:
            try:
                s = sched_mod.plan(self.graph, self.launch, index64=index64)
            except LaunchError as e:
                raise LaunchError(f"{self.where}: {e} (launch options "
                                  f"{dict(self.launch or {})})") from None
            self._schedules[index64] = s
        return s

    def launcher(self, index64: bool, backend: str) -> Launcher:
        key = (index64, backend)
        rewrite = MSL_REWRITE.get()                      # test seam, see MSL_REWRITE
        ln = self._launchers.get(key) if rewrite is None else None
        if ln is None:
            s = self.schedule(index64)
            src = render_msl(s.kernels if len(s.kernels) > 1 else s.kernel)
            if rewrite is not None:
                src = rewrite(src)
            k = kernel_object(backend, src, s.kernel.host_name)
            max_threads = int(k.max_threads_per_threadgroup)
            validate_for_kernel(s.policy, s.kernel.host_name, max_threads,
                                int(getattr(k, "static_thread_group_memory_length", 0)))
            casts = {p.index: p.cast for p in s.kernel.params if p.cast}
            ln = Launcher(s, backend, src, k, tuple(p.binds for p in s.kernel.params),
                          casts or None, max_threads)
            if rewrite is None:
                self._launchers[key] = ln
        return ln

    # -- checks ------------------------------------------------------------------------
    def collect(self, values: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        tensors: dict[str, torch.Tensor] = {}
        for p in self.tensors:
            if p.name not in values:
                raise TypeError(f"{self.where}: missing tensor argument '{p.name}'")
            t = values[p.name]
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{self.where}: argument '{p.name}' (annotated "
                                f"\"{p.annotation}\") must be a torch.Tensor, got "
                                f"{type(t).__name__}")
            if t.dtype != p.dtype.torch:
                raise TypeError(f"{self.where}: argument '{p.name}' has dtype {t.dtype}, but "
                                f"this specialisation was built for {p.dtype.torch}")
            tensors[p.name] = t
        return tensors

    def device(self, tensors: Mapping[str, torch.Tensor]) -> torch.device:
        dev = None
        first = None
        for name, t in tensors.items():
            if t.device.type not in ("mps", "cpu", "cuda"):
                raise DeviceError(f"{self.where}: argument '{name}' is on device "
                                  f"'{t.device}'; metalforge runs on 'mps' tensors (Metal), "
                                  f"'cuda' tensors (NVIDIA GPUs) or 'cpu' tensors (the "
                                  f"simulator)")
            if dev is None:
                dev, first = t.device, name
            elif t.device != dev:
                raise DeviceError(f"{self.where}: all tensor arguments must be on one device: "
                                  f"'{first}' is on {dev} but '{name}' is on {t.device}")
        return dev if dev is not None else torch.device("cpu")


_specs: dict[tuple, Specialisation] = {}


def specialisation(graph: Graph, launch) -> Specialisation:
    lkey = None if not launch else tuple(sorted(launch.items()))
    key = (id(graph), lkey)
    s = _specs.get(key)
    if s is None or s.graph is not graph:
        s = _specs[key] = Specialisation.of(graph, launch)
    return s


def _setup(graph: Graph, values: Mapping[str, Any], backend: Optional[str],
           launch: Optional[Mapping[str, Any]]):
    """Everything a call needs before its launch, with every host-side check: the
    specialisation (autotuned launch merged under explicit options), backend, tensors, shapes,
    freshly allocated outputs and the output element count."""
    spec = specialisation(graph, launch)
    tensors = spec.collect(values)
    dev = spec.device(tensors)
    be = backend or current_backend(tensors.values())
    if DEVICE_OF[be] != dev.type:
        hint = {"mps": ".to('mps')", "cuda": ".cuda()"}.get(be, ".cpu()")
        other = {"mps": "mps", "cuda": "cuda"}.get(dev.type, "sim")
        raise DeviceError(f"{spec.where}: backend '{be}' runs on {DEVICE_OF[be]} tensors but the "
                          f"arguments are on {dev}; move them with {hint} or choose backend "
                          f"'{other}'")
    binding: ShapeBinding = bind_shapes(graph, tensors)
    tuned = tuned_launch(graph, be, binding.sizes, spec.family)  # autotune cache; explicit wins
    if tuned:
        spec = specialisation(graph, merge(tuned, launch))
    outs = [torch.empty(output_shape(binding, o), dtype=o.dtype.torch, device=dev)
            for o in graph.outputs]
    numel = 1
    for a in spec.grid:
        numel *= binding.sizes[a]
    return spec, be, tensors, binding, outs, numel


def run(graph: Graph, values: Mapping[str, Any], backend: Optional[str] = None,
        launch: Optional[Mapping[str, Any]] = None):
    spec, be, tensors, binding, outs, numel = _setup(graph, values, backend, launch)
    if numel:                                  # empty outputs: no launch
        kernel, args, kw = _prepare(spec, be, tensors, values, binding, outs, numel)
        kernel(*args, **kw)
    return outs[0] if len(outs) == 1 else tuple(outs)


def _prepare(spec: Specialisation, be: str, tensors, values, binding: ShapeBinding, outs,
             numel: int):
    """(kernel object, positional args, keyword args) of one launch, in compile_shader's call
    model: argument i binds buffer i; threads/group_size as dispatchThreads; arg_casts."""
    sizes = binding.sizes
    index64 = sched_mod.needs_index64(sizes, numel)
    host = spec.schedule(index64).host_name(sizes)      # may refuse these sizes, before compiling
    ln = spec.launcher(index64, be)
    s = ln.schedule
    vw = s.policy.vector_width
    args: list = []
    for b in ln.binds:
        kind = b[0]
        if kind == "input":
            p = spec.graph.param(b[1])
            t = tensors[b[1]].contiguous()
            if b[1] in s.vector_inputs and t.storage_offset() % vw:
                t = t.clone()                  # vector loads need an aligned start
            if p.dims and p.dims[0].batch:
                t = t.reshape(flat_shape(binding, p))
            args.append(t)
        elif kind == "output":
            args.append(outs[b[1]])
        elif kind == "scalar":
            p = spec.graph.param(b[1])
            v = values[b[1]]
            args.append(float(v) if p.dtype.is_float else int(v))
        elif kind == "numel":
            args.append(numel)
        else:                                  # ("size", axis)
            args.append(sizes[b[1]])
    kernel, max_threads = ln.kernel_for(host)
    threads, group = s.launch(sizes)
    if not 1 <= group <= max_threads:              # checked on every launch
        raise LaunchError(f"{spec.where}: a threadgroup of {group} threads, but this pipeline "
                          f"allows 1 to {max_threads} (launch policy {s.policy})")
    if threads > MAX_THREADS:
        raise ValueError(f"{spec.where}: {numel} output elements need {threads} threads, over "
                         f"the {MAX_THREADS} a dispatch can launch; raise "
                         f"launch={{'vectors_per_thread': ...}}")
    return kernel, args, dict(threads=threads, group_size=group, arg_casts=ln.casts)


def prepare(graph: Graph, values: Mapping[str, Any], backend: Optional[str] = None,
            launch: Optional[Mapping[str, Any]] = None):
    """What `run` would launch, without launching: (kernel, args, kwargs, outputs). For
    benchmarks (to time the bare kernel call against the wrapped one) and tuning."""
    spec, be, tensors, binding, outs, numel = _setup(graph, values, backend, launch)
    kernel, args, kw = _prepare(spec, be, tensors, values, binding, outs, numel)
    return kernel, args, kw, outs


def compiled(graph: Graph) -> list[dict]:
    """The libraries compiled for this graph so far, one per (backend, generated source): the
    host name of its kernel (and of every kernel in it: reductions hold one per row-length
    variant), backend, family, and the launch policies it has been built for (launch options
    that do not change the generated code, like threads per group, share one library)."""
    out: dict[tuple, dict] = {}
    for spec in list(_specs.values()):
        if spec.graph is not graph:
            continue
        for ln in spec._launchers.values():
            entry = out.setdefault((ln.backend, ln.source), {
                "host_name": ln.schedule.kernel.host_name,
                "host_names": tuple(k.host_name for k in ln.schedule.kernels),
                "backend": ln.backend, "family": ln.schedule.family, "launches": []})
            launch = {k: getattr(ln.schedule.policy, k)
                      for k in TUNABLE.get(ln.schedule.family, ())}
            if launch not in entry["launches"]:
                entry["launches"].append(launch)
    return list(out.values())
