"""The pipeline: how a traced graph becomes a kernel launch, one stage per function.

    Graph ──plan──▶ Schedule ──render──▶ MSL ──compile──▶ Compiled ──bind──▶ Launch ──dispatch──▶
         (schedule/)          (codegen/)      (backends)              (this call's
                                                                       arguments)

    plan(graph, launch, index64)          the family's schedule and lowered IR, under the launch
                                          overrides
    render(schedule)                      the Metal source of every kernel of the schedule
    compile(schedule, source, backend, host)   the kernel object, checked against its pipeline
    bind(call)                            positional arguments and dispatch size of one call
    dispatch(launch)                      run it

`runs.run` strings them together for one call after `check_call` (argument checks, shapes, the
autotuned launch, freshly allocated outputs). `Specialisation` only caches: per (graph, launch
overrides) the schedule of each index width and, per (index width, backend), the `KernelSet`
holding the rendered source and its compiled kernels. `METALFORGE_DUMP=dir` writes each
freshly planned schedule's graph, IR and MSL there.
"""
from __future__ import annotations

import os
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import torch

from .. import ir as ir_mod
from .. import schedule as sched_mod
from ..codegen import render_library, render_msl
from ..errors import BindingError, DeviceError, LaunchError, kernel_at
from ..graph import Graph
from ..once import OnceMap
from ..reference import evaluate
from ..schedule.base import Step
from ..schedule.policy import TUNABLE, backend_launch, validate_for_kernel
from ..shapes import ShapeBinding, bind_shapes, numel, output_shape
from ..target import compile_options, current_target, get_target
from ..tuning.cache import graph_text, tuned_launch
from ..tuning.launch import merge
from . import outputs
from .backends import DEVICE_OF, current_backend, device_backend, kernel_object
from .binding import Binder, BindingPlan, bound
from .indexcheck import IndexErrors
from .layout import check_dense

MAX_THREADS = 2 ** 32 - 1        # dispatchThreads takes a 32-bit thread count per axis

# Test seam (owned by metalforge.testing.faults, which sets it inside `planted(...)` blocks): a
# function rewriting the MSL text before it is compiled, to plant faults that `check` must
# catch. Unset (None) outside those blocks; while set, libraries are built fresh, not cached.
MSL_REWRITE: ContextVar[Optional[Callable[[str], str]]] = ContextVar("mf_msl_rewrite",
                                                                     default=None)


# --------------------------------------------------------------------------- the stages

def plan(graph: Graph, launch: Optional[Mapping[str, Any]], index64: bool) -> sched_mod.Schedule:
    """Stage 1: the schedule (family, launch policy, lowered IR kernels)."""
    try:
        s = sched_mod.plan(graph, launch, index64=index64)
    except LaunchError as e:
        raise LaunchError(f"{kernel_at(graph.name, graph.loc)}: {e} (launch options "
                          f"{dict(launch or {})})") from None
    _dump(s)
    return s


def render(schedule: sched_mod.Schedule) -> str:
    """Stage 2: the Metal source of every kernel of the schedule, as one library."""
    if len(schedule.kernels) > 1:
        return render_library(schedule.kernels)
    return render_msl(schedule.kernel)


@dataclass(frozen=True)
class Compiled:
    kernel: Any                   # the backend's kernel object (compile_shader's call model)
    max_threads: int              # its pipeline's max_threads_per_threadgroup


def compile(schedule: sched_mod.Schedule, source: str, backend: str,
            host_name: str) -> Compiled:
    """Stage 3: the kernel `host_name` of `source` on `backend` (libraries are cached by the
    backend), refused if its pipeline cannot take the schedule's launch policy."""
    k = kernel_object(backend, source, host_name, target_options(schedule, backend))
    max_threads = int(k.max_threads_per_threadgroup)
    validate_for_kernel(replace(schedule.policy,
                                threads_per_group=schedule.max_group_size(host_name)),
                        host_name, max_threads,
                        int(getattr(k, "static_thread_group_memory_length", 0)))
    return Compiled(k, max_threads)


def target_options(schedule: sched_mod.Schedule, backend: str) -> tuple[tuple[str, int], ...]:
    """The compile keywords of the target a schedule's code was generated for (its policy's
    `target`; none where the family reads no target)."""
    name = schedule.policy.target
    chosen = get_target(name) if name else None
    return tuple(sorted(compile_options(chosen, backend).items()))


def target_launch(backend: str, family: str) -> Optional[dict[str, Any]]:
    """The target layer of a family that reads one (TUNABLE lists "target"): the current target
    on `backend` (`metalforge.target.current`); None for the others."""
    if "target" not in TUNABLE.get(family, ()):
        return None
    return {"target": current_target(backend).name}


@dataclass
class KernelSet:
    """One schedule rendered and compiled for one backend: its kernels, compiled on first use
    (a reduction's library holds one kernel per row-length variant), once each."""
    schedule: sched_mod.Schedule
    backend: str
    source: str
    kernels: OnceMap[str, Compiled] = field(default_factory=OnceMap)   # host name → compiled

    def kernel(self, host_name: str) -> Compiled:
        return self.kernels.get_or_build(
            host_name, lambda: compile(self.schedule, self.source, self.backend, host_name))


@dataclass
class CheckedCall:
    """One call, checked: everything `bind` needs besides the compiled kernel."""
    spec: "Specialisation"
    backend: str
    values: Mapping[str, Any]              # every tensor and runtime scalar by name
    tensors: dict[str, torch.Tensor]
    binding: ShapeBinding
    outputs: list[torch.Tensor]
    numel: int                             # output elements the grid covers

    @property
    def index64(self) -> bool:
        """64-bit indexing when the grid or any tensor argument (attention's K/V, a gather's
        table) has 2^31 elements or more."""
        largest = max([self.numel] + [t.numel() for t in self.tensors.values()])
        return sched_mod.needs_index64(self.binding.sizes, largest)


@dataclass(frozen=True)
class Launch:
    """A bound launch in compile_shader's call model: argument i binds buffer i; threads and
    group_size as dispatchThreads; arg_casts."""
    kernel: Any
    args: tuple[Any, ...]
    threads: int
    group_size: int
    arg_casts: Optional[dict[int, str]]
    errors: Optional["IndexErrors"] = None     # kernels with gathers: where they report
    then: tuple[tuple[Any, int, int], ...] = ()   # later launches (kernel, threads, group)
    host_name: str = ""                         # the first launch's kernel
    plan: tuple[tuple[str, int, int], ...] = ()   # every launch: (host name, threads, group)
    binder: Optional[Binder] = None               # how `args` were bound (fastpath replays it)


def _groups_per_core(c: Compiled, group: int) -> int:
    """Threadgroups of `group` threads the backend says can share one core (cuda: from the
    compiled kernel's registers and threadgroup memory); 0 where it cannot say."""
    f = getattr(c.kernel, "groups_per_core", None)
    return int(f(group)) if f is not None else 0


def _resident_gain(alt: Step, step: Step) -> float:
    """How many times the threads resident on a core an alternative must keep to replace
    `step`: another kernel (the staged row kernel) twice as many (H100, 2026-11-27, f16
    layer_norm 2048x16384 one group of 1024 a core -> two, 74.3 -> 52.1 us; add_rms_norm
    4096x8192 two groups of 512 -> three, 97.9 -> 103.4 us); the same kernel in smaller
    groups half again as many (H200, 2026-11-29, f32 layer_norm's looped kernel one group of
    1024 -> three of 512, 124.0 -> 94.2 us; rms_norm's, two of 1024 or four of 512, runs
    75.8 / 94.1: bench/README.md)."""
    return 1.5 if alt.host_name == step.host_name else 2.0


def bind(call: CheckedCall) -> Launch:
    """Stage 4: this call's positional arguments (in the kernel's parameter order, by the
    specialisation's binding plan) and its dispatch (every launch of the call: most schedules
    make one), with the launch-time checks."""
    spec, sizes = call.spec, call.binding.sizes
    s = spec.schedule(call.index64)
    steps = s.steps(sizes)                      # may refuse these sizes, before compiling
    lib = spec.library(call.index64, call.backend)
    plan = spec.binding(call.index64)
    values = [call.values.get(p.name) for p in spec.graph.params]
    binder = plan.binder(s, values, call.binding, spec.graph, call.numel)
    args = bound(binder, len(call.outputs))(values, *call.outputs)
    launches = [_launch(call, s, lib, step) for step in steps]
    (kernel, threads, group, host), *then = launches
    return Launch(kernel, args, threads, group, plan.arg_casts,
                  binder.errors,
                  tuple(t[:3] for t in then), host, tuple((h, n, g) for _, n, g, h in launches),
                  binder)


def _launch(call: CheckedCall, s: sched_mod.Schedule, lib: KernelSet,
            step: Step) -> tuple[Any, int, int, str]:
    """One launch of a call: (kernel object, threads, group, host name), the kernel the
    pipeline allows (another where its limit is lower, an alternative where more of its
    threads share a core: `_resident_gain`), checked."""
    sizes = call.binding.sizes
    step = fit(s, step, sizes, lambda host: lib.kernel(host).max_threads)
    compiled = lib.kernel(step.host_name)
    for alt in s.alternatives(step, sizes):     # where more threads share a core
        other = lib.kernel(alt.host_name)
        now = _groups_per_core(compiled, step.group) * step.group
        if alt.group <= other.max_threads and now and \
                _groups_per_core(other, alt.group) * alt.group >= _resident_gain(alt, step) * now:
            step, compiled = alt, other
    check_step(call.spec.where, step, compiled.max_threads, call.numel, s.policy)
    return compiled.kernel, step.threads, step.group, step.host_name


def fit(s: sched_mod.Schedule, step: Step, sizes: Mapping[str, Any],
        max_threads: Callable[[str], Any]) -> Step:
    """The launch to make for `step` on pipelines allowing `max_threads(host name)` threads
    a group: `step`, or the schedule's other kernel where its group is over that limit (a
    register-bound pipeline). Pure, so that an export can trace it with symbolic sizes."""
    if step.group > max_threads(step.host_name):
        return s.within(step, sizes, max_threads(step.host_name))
    return step


def check_step(where: str, step: Step, max_threads: int, count: int, policy: Any) -> None:
    """The checks of every launch: a group the pipeline allows, a grid dispatchThreads takes
    (`count`: the output elements, and `policy`, for the messages)."""
    if not 1 <= step.group <= max_threads:
        raise LaunchError(f"{where}: a threadgroup of {step.group} threads, but this "
                          f"pipeline allows 1 to {max_threads} (launch policy "
                          f"{policy})")
    if step.threads > MAX_THREADS:
        raise LaunchError(f"{where}: {count} output elements need {step.threads} "
                          f"threads, over the {MAX_THREADS} a dispatch can launch; raise "
                          f"launch={{'vectors_per_thread': ...}}")


def dispatch(launch: Launch) -> None:
    """Stage 5: run the bound launch."""
    launch.kernel(*launch.args, threads=launch.threads, group_size=launch.group_size,
                  arg_casts=launch.arg_casts)
    for kernel, threads, group in launch.then:
        kernel(*launch.args, threads=threads, group_size=group, arg_casts=launch.arg_casts)
    if launch.errors is not None:
        launch.errors.check(launch.args[launch.errors.arg])


# --------------------------------------------------------------------------- a call

def outputs_beside_an_empty_grid(call: CheckedCall) -> bool:
    """Fill the outputs of a call whose grid is empty but whose other outputs are not (`x * w,
    w * 2` with no rows of x: no thread runs, yet the second output has D elements; a sum over
    an empty axis beside the softmax over it), from `eager_outputs`. Whether it filled any."""
    filled = [i for i, out in enumerate(call.outputs) if out.numel()]
    for i, value in zip(filled, eager_outputs(call.spec.graph, call.values, filled)):
        call.outputs[i].copy_(value)
    return bool(filled)


def eager_outputs(graph: Graph, values: Mapping[str, Any],
                  which: list[int]) -> list[torch.Tensor]:
    """Outputs `which` of `graph` (indices), computed eagerly: the torch reference of those
    outputs alone, so one that needs a max over an empty axis raises and the others do not."""
    if not which:
        return []
    got = evaluate(replace(graph, outputs=tuple(graph.outputs[i] for i in which)), values)
    return list(got) if isinstance(got, tuple) else [got]


def prepare(graph: Graph, values: Mapping[str, Any], backend: Optional[str] = None,
            launch: Optional[Mapping[str, Any]] = None) -> tuple[Launch, list[torch.Tensor]]:
    """What `run` would dispatch, without dispatching: (launch, outputs). For benchmarks (to
    time the bare kernel call against the wrapped one) and tuning."""
    call = check_call(graph, values, backend, launch)
    return bind(call), call.outputs


def check_call(graph: Graph, values: Mapping[str, Any], backend: Optional[str],
               launch: Optional[Mapping[str, Any]],
               given: Optional[outputs.Outs] = None) -> CheckedCall:
    """Every host-side check of a call, then its specialisation (the backend's changes to the
    table and the autotuned launch merged under explicit overrides), shapes and freshly
    allocated outputs (or the caller's, `given`: `outputs`)."""
    spec = specialisation(graph, launch)
    tensors = check_tensors(spec, values)
    dev = common_device(spec.where, tensors)
    be = backend or current_backend(tensors.values())
    if DEVICE_OF[be] != dev.type:
        hint = {"mps": ".to('mps')", "cuda": ".cuda()"}.get(be, ".cpu()")
        other = device_backend(dev.type)
        raise DeviceError(f"{spec.where}: backend '{be}' runs on {DEVICE_OF[be]} tensors but the "
                          f"arguments are on {dev}; move them with {hint} or choose backend "
                          f"'{other}'")
    binding, count = shaped(spec, tensors)
    spec = layered(graph, be, launch, binding.sizes)
    if given is not None:
        outs = outputs.place(spec.where, graph, given, [output_shape(binding, o)
                                                         for o in graph.outputs], dev)
        call = CheckedCall(spec, be, values, tensors, binding, outs, count)
        outputs.check_given(spec.where, graph, spec.family, given, tensors,
                            spec.schedule(call.index64) if count else None)
        return call
    outs = [torch.empty(output_shape(binding, o), dtype=o.dtype.torch, device=dev)
            for o in graph.outputs]
    return CheckedCall(spec, be, values, tensors, binding, outs, count)


def shaped(spec: Specialisation, tensors: Mapping[str, Any]) -> tuple[ShapeBinding, int]:
    """The shape checks of a call (torch tensors or MLX arrays: only `.shape` is read): its
    axis sizes, and the number of output elements the grid covers."""
    binding = bind_shapes(spec.graph, tensors)
    return binding, numel(spec.grid, binding.sizes)


def check_tensors(spec: "Specialisation", values: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The tensor arguments by name, each present, a tensor, and of the traced dtype."""
    tensors: dict[str, torch.Tensor] = {}
    for p in spec.graph.tensors:
        if p.name not in values:
            raise BindingError(f"{spec.where}: missing tensor argument '{p.name}'")
        t = values[p.name]
        if not isinstance(t, torch.Tensor):
            raise BindingError(f"{spec.where}: argument '{p.name}' (annotated \"{p.annotation}\") "
                               f"must be a torch.Tensor, got {type(t).__name__}")
        check_dense(f"{spec.where}, argument '{p.name}'", p.name, t)
        if t.dtype != p.dtype.torch:
            raise BindingError(f"{spec.where}: argument '{p.name}' has dtype {t.dtype}, but this "
                               f"specialisation was built for {p.dtype.torch}")
        tensors[p.name] = t
    return tensors


def common_device(where: str, tensors: Mapping[str, torch.Tensor]) -> torch.device:
    """The one device every tensor argument is on (cpu when there are none)."""
    dev, first = None, None
    for name, t in tensors.items():
        if t.device.type not in ("mps", "cpu", "cuda"):
            raise DeviceError(f"{where}: argument '{name}' is on device '{t.device}'; "
                              f"metalforge runs on 'mps' tensors (Metal), 'cuda' tensors "
                              f"(NVIDIA GPUs) or 'cpu' tensors (the simulator)")
        if dev is None:
            dev, first = t.device, name
        elif t.device != dev:
            raise DeviceError(f"{where}: all tensor arguments must be on one device: "
                              f"'{first}' is on {dev} but '{name}' is on {t.device}")
    return dev if dev is not None else torch.device("cpu")


# --------------------------------------------------------------------------- caching

@dataclass
class Specialisation:
    """The cache of one (graph, launch overrides): a schedule per index width and a compiled
    `KernelSet` per (index width, backend), each made once (threads asking meanwhile wait)."""
    graph: Graph
    launch: Optional[Mapping[str, Any]]
    family: str
    grid: tuple[str, ...]                 # the output axes the threads cover
    where: str
    _schedules: OnceMap[bool, sched_mod.Schedule] = field(default_factory=OnceMap)
    _libraries: OnceMap[tuple[bool, str], KernelSet] = field(default_factory=OnceMap)
    _plans: OnceMap[bool, BindingPlan] = field(default_factory=OnceMap)

    @classmethod
    def of(cls, graph: Graph, launch: Optional[Mapping[str, Any]]) -> "Specialisation":
        grid = max(graph.outputs, key=lambda o: len(o.axes)).axes
        return cls(graph, launch, sched_mod.family(graph), tuple(grid),
                   kernel_at(graph.name, graph.loc))

    def schedule(self, index64: bool) -> sched_mod.Schedule:
        return self._schedules.get_or_build(index64,
                                            lambda: plan(self.graph, self.launch, index64))

    def binding(self, index64: bool) -> BindingPlan:
        """Where each argument of this index width's kernels comes from (built once)."""
        return self._plans.get_or_build(
            index64, lambda: BindingPlan.of(self.graph, self.schedule(index64)))

    def library(self, index64: bool, backend: str) -> KernelSet:
        rewrite = MSL_REWRITE.get()                      # test seam, see MSL_REWRITE
        if rewrite is not None:
            s = self.schedule(index64)
            return KernelSet(s, backend, rewrite(render(s)))
        return self._libraries.get_or_build((index64, backend),
                                            lambda: self._library(index64, backend))

    def _library(self, index64: bool, backend: str) -> KernelSet:
        s = self.schedule(index64)
        return KernelSet(s, backend, render(s))


_specs: OnceMap[tuple[int, Optional[tuple[tuple[str, Any], ...]]], Specialisation] = \
    OnceMap()


def specialisation(graph: Graph, launch: Optional[Mapping[str, Any]]) -> Specialisation:
    key = (id(graph), None if not launch else tuple(sorted(launch.items())))
    return _specs.get_or_build(key, lambda: Specialisation.of(graph, launch),
                               lambda s: s.graph is graph)


def layered(graph: Graph, backend: str, launch: Optional[Mapping[str, Any]],
            sizes: Optional[Mapping[str, int]] = None) -> Specialisation:
    """The specialisation a call on `backend` runs: the family's launch table, what the backend
    changes in it (BACKEND_POLICIES), the autotune cache's options for these sizes (when
    given), then the explicit options, later layers winning key by key."""
    spec = specialisation(graph, launch)
    tuned = tuned_launch(graph, backend, sizes, spec.family, launch) if sizes is not None \
        else None
    under = merge(merge(backend_launch(backend, spec.family), target_launch(backend, spec.family)),
                  tuned)
    return specialisation(graph, merge(under, launch)) if under else spec


def compiled(graph: Graph) -> list[dict[str, Any]]:
    """The libraries compiled for this graph so far, one per (backend, generated source): the
    host name of its kernel (and of every kernel in it: reductions hold one per row-length
    variant), backend, family, and the launch policies it has been built for (launch options
    that do not change the generated code, like threads per group, share one library)."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for spec in list(_specs.values()):
        if spec.graph is not graph:
            continue
        for lib in list(spec._libraries.values()):     # other threads may add meanwhile
            if not lib.kernels:
                continue
            s = lib.schedule
            entry = out.setdefault((lib.backend, lib.source), {
                "host_name": s.kernel.host_name,
                "host_names": tuple(k.host_name for k in s.kernels),
                "backend": lib.backend, "family": s.family, "launches": []})
            launch = {k: getattr(s.policy, k) for k in TUNABLE.get(s.family, ())}
            if launch not in entry["launches"]:
                entry["launches"].append(launch)
    return list(out.values())


# --------------------------------------------------------------------------- METALFORGE_DUMP

def _dump(s: sched_mod.Schedule) -> None:
    """With METALFORGE_DUMP=dir: write the schedule's graph, IR and MSL to
    dir/<host name>.{graph,ir,metal}."""
    root = os.environ.get("METALFORGE_DUMP")
    if not root:
        return
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    stem = path / s.kernel.host_name
    stem.with_suffix(".graph").write_text(graph_text(s.graph) + "\n")
    stem.with_suffix(".ir").write_text("\n".join(ir_mod.dump(k) for k in s.kernels))
    stem.with_suffix(".metal").write_text(render(s))
