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

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

import torch

from .. import runtime
from ..bounded import Bounded
from ..dtypes import check_float, check_int64
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
    # the call itself, compiled from the fields above (see `source`)
    replay: Callable[[Sequence[Any]], Any] = field(init=False, repr=False, compare=False)

    def current(self) -> bool:
        """Still what the full path would do: the autotune cache is the same object holding
        the same entries (a write replaces them; another cache directory is another object),
        and the library still holds the compiled kernel whose limits the launch was checked
        against (else the full path checks the group size again)."""
        c = default_cache()
        kernels, host, checked = self.compiled
        return (c is self.tuning[0] and c.entries is self.tuning[1]
                and kernels.get(host) is checked)

    def __post_init__(self) -> None:
        object.__setattr__(self, "replay", _compile(self))

    def __call__(self, values: Sequence[Any]):
        return self.replay(values)

    @property
    def source(self) -> str:
        """The replay as Python: straight-line code for this closure's call."""
        return _replay_source(self)[0]


def _replay_source(w: Warm) -> tuple[str, dict[str, Any]]:
    """Python for `w`'s replay, and the names it reads: allocate the outputs, then, when the
    call launches, take each input (made contiguous, or copied to an aligned start, as the
    checked call needed), convert the scalars, launch the kernel(s), check a gather's report."""
    env: dict[str, Any] = {"_empty": torch.empty, "_float32": torch.float32}
    lines = ["def replay(values):"]
    for o, (shape, dtype, device) in enumerate(w.allocate):
        env.update({f"_shape{o}": shape, f"_dtype{o}": dtype, f"_device{o}": device})
        lines.append(f"    o{o} = _empty(_shape{o}, dtype=_dtype{o}, device=_device{o})")
    outs = ", ".join(f"o{o}" for o in range(len(w.allocate)))
    result = "o0" if len(w.allocate) == 1 else f"({outs},)"
    if w.launches:
        args = [f"_c{i}" for i in range(len(w.template))]
        for i, v in enumerate(w.template):
            env[f"_c{i}"] = v
        for i, pos, contiguous, vector, flat in w.inputs:
            lines.append(f"    a{i} = values[{pos}]")
            if contiguous:
                lines.append(f"    a{i} = a{i}.contiguous()")
            elif vector:                       # vector loads need an aligned start
                lines.append(f"    if a{i}.storage_offset() % {vector}:")
                lines.append(f"        a{i} = a{i}.clone()")
            if flat is not None:
                env[f"_flat{i}"] = flat
                lines.append(f"    a{i} = a{i}.view(_flat{i})")
            args[i] = f"a{i}"
        for i, o, view in w.outputs:
            args[i] = f"o{o}"
            if view is not None:
                env[f"_view{i}"] = view
                args[i] = f"o{o}.view(_view{i})"
        for i, pos, convert in w.scalars:
            env[f"_conv{i}"] = convert
            args[i] = f"_conv{i}(values[{pos}])"
        device = "o0.device" if w.allocate else "None"
        if w.errors is not None:
            env["_report"] = launcher.report_buffer
            lines.append(f"    err = _report({device})")
            args[w.errors.arg] = "err"
        if w.scratch is not None:
            i, n = w.scratch
            lines.append(f"    scratch = _empty({n}, dtype=_float32, device={device})")
            args[i] = "scratch"
        env.update(_kernel=w.kernel, _casts=w.arg_casts)
        call = ", ".join(args)
        if w.then:
            lines.append(f"    args = ({call},)")
            call = "*args"
        lines.append(f"    _kernel({call}, threads={w.threads}, group_size={w.group_size}, "
                     f"arg_casts=_casts)")
        for k, (kernel, threads, group) in enumerate(w.then):
            env[f"_then{k}"] = kernel
            lines.append(f"    _then{k}(*args, threads={threads}, group_size={group}, "
                         f"arg_casts=_casts)")
        if w.errors is not None:
            env["_check"] = w.errors.check
            lines.append("    _check(err)")
    lines.append(f"    return {result}")
    return "\n".join(lines) + "\n", env


def _compile(w: Warm) -> Callable[[Sequence[Any]], Any]:
    text, env = _replay_source(w)
    exec(compile(text, "<metalforge warm call>", "exec"), env)     # noqa: S102
    return env["replay"]


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
            scalars.append((i, position[name], _converter(graph, name)))
        elif kind == "scratch":                     # fresh per call, like the outputs
            scratch = (i, arg.numel())
        else:                                       # numel, sizes, launch values: fixed
            template[i] = arg
    return Warm(launch.kernel, launch.threads, launch.group_size, launch.arg_casts,
                tuple(template), tuple(inputs), tuple(outputs), tuple(scalars), allocate, True,
                tuning, (kernels, host, kernels[host]), launch.errors, scratch, launch.then)


def _converter(graph: Graph, name: str) -> Callable[[Any], Any]:
    """What a replay passes for runtime scalar `name`: a float, or an int checked to fit the
    kernel's 64-bit integer (the full path's check, repeated because values are not in keys)."""
    where = f"{launcher.kernel_at(graph.name, graph.loc)}, argument '{name}'"
    return (lambda v: check_float(v, where)) if graph.param(name).dtype.is_float else \
        (lambda v: check_int64(v, where))


def key_function(kinds: Sequence[str]) -> Callable[[Sequence[Any], Any], Optional[tuple]]:
    """The warm-call key of a kernel whose parameters are of these kinds ("tensor", "scalar",
    "const"), as straight-line Python: key(values in parameter order, backend) is None when
    the call must take the full path (a non-Tensor or Tensor subclass where a tensor goes, a
    Const that is not an int or bool, a tensor that requires grad while grad mode is on, a
    tensor without strides), else a flat tuple of everything a checked call's launch depends
    on: the backend and the `with mf.backend(...)` override, each tensor's dtype, shape,
    strides and device, each runtime scalar's Python type, each Const's type and value."""
    names = [f"a{i}" for i in range(len(kinds))]
    tensors = [n for n, k in zip(names, kinds) if k == "tensor"]
    consts = [n for n, k in zip(names, kinds) if k == "const"]
    lines = ["def key(values, backend):"]
    if names:
        lines.append(f"    {', '.join(names)}, = values")
    tests = [f"type({n}) is not _Tensor" for n in tensors] + [
        f"(type({n}) is not int and type({n}) is not bool)" for n in consts]
    if tests:
        lines += [f"    if {' or '.join(tests)}:", "        return None"]
    if tensors:
        grad = " or ".join(f"{n}.requires_grad" for n in tensors)
        lines += [f"    if ({grad}) and _grad_enabled():", "        return None"]
    parts = ["backend", "_override()"]
    for n, k in zip(names, kinds):
        parts += ([f"{n}.dtype", f"{n}.shape", f"{n}.stride()", f"{n}.device"] if k == "tensor"
                  else [f"type({n})"] if k == "scalar" else [f"type({n})", n])
    lines += ["    try:", f"        return ({', '.join(parts)},)",
              "    except RuntimeError:             # a tensor without strides (sparse, ...)",
              "        return None"]
    env: dict[str, Any] = {"_Tensor": torch.Tensor, "_grad_enabled": torch.is_grad_enabled,
                           "_override": BACKEND_OVERRIDE.get}
    exec(compile("\n".join(lines) + "\n", "<metalforge warm key>", "exec"), env)  # noqa: S102
    return env["key"]


class WarmCache(Bounded[Warm]):
    """A kernel's closures by warm key, at most `size` of them (the oldest goes first)."""

    def __init__(self, size: int = 256) -> None:
        super().__init__(size)


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
    result = call.outputs[0] if len(call.outputs) == 1 else tuple(call.outputs)
    if bound is not None:
        launcher.dispatch(bound)
    elif launcher.outputs_beside_an_empty_grid(call):
        return result, None                     # not replayed: no kernel computed them
    return result, record(call, bound, tuning)
