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
from typing import Any, Callable, Optional, Sequence

import torch

from ..bounded import Bounded
from ..tuning.cache import default_cache
from . import backends
from .binding import Binder
from .indexcheck import IndexErrors
from .launcher import MSL_REWRITE, CheckedCall, Launch

# read on every call: the `with mf.backend(...)` override (part of every key) and the test seam
# that plants faults in the MSL (while set, every call takes the full path: fresh libraries)
BACKEND_OVERRIDE = backends._override
__all__ = ["BACKEND_OVERRIDE", "MSL_REWRITE", "Warm", "WarmCache", "record"]


@dataclass(frozen=True)
class Warm:
    """One checked call's launch, as a function of the next call's argument values (given in
    the kernel's parameter order)."""
    kernel: Any                       # the backend's kernel object (compile_shader's model)
    threads: int
    group_size: int
    arg_casts: Optional[dict[int, str]]
    binder: Optional[Binder]          # the call's binding plan, resolved (None: no launch)
    allocate: tuple[tuple[tuple[int, ...], torch.dtype, torch.device], ...]   # the outputs
    tuning: tuple[Any, Any]           # (autotune cache, its entries) this was built under
    compiled: tuple[Any, str, Any]    # (the library's kernels, host name, the Compiled checked)
    errors: Optional[IndexErrors] = None   # unproven gathers: where they report (indexcheck)
    then: tuple[tuple[Any, int, int], ...] = ()     # later launches (kernel, threads, group)
    given: tuple[int, ...] = ()       # outputs the caller gives (`outputs`): replay(values, outs)
    # per launch (the first, then `then`'s), the backend's planned launch of this call where
    # it has one (`planned`: cuda), called with the arguments alone; None: the kernel's call
    runs: tuple[Optional[Callable[..., None]], ...] = ()
    # per output, (position of a tensor argument, same shape): allocated `torch.empty_like` of
    # it (the same shape, dtype, device and strides, the contiguous ones: the key holds them)
    # or its `new_empty` (the same dtype and device); None: `torch.empty` (which parses three
    # arguments where those parse one or two)
    like: tuple[Optional[tuple[int, bool]], ...] = ()
    # the call itself, compiled from the fields above (see `source`)
    replay: Callable[..., Any] = field(init=False, repr=False, compare=False)

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

    def __call__(self, values: Sequence[Any]) -> Any:
        return self.replay(values)

    @property
    def source(self) -> str:
        """The replay as Python: straight-line code for this closure's call."""
        return _replay_source(self)[0]


def _replay_source(w: Warm) -> tuple[str, dict[str, Any]]:
    """Python for `w`'s replay, and the names it reads: allocate the outputs, then, when the
    call launches, bind its arguments (the binder's own lines: `binding.Binder.code`), launch
    the kernel(s), check a gather's report."""
    env: dict[str, Any] = {"_empty": torch.empty, "_empty_like": torch.empty_like}
    lines = ["def replay(values, outs):" if w.given else "def replay(values):"]
    for o, (shape, dtype, device) in enumerate(w.allocate):
        if o in w.given:
            lines.append(f"    o{o} = outs[{o}]")
            continue
        like = w.like[o] if w.like else None
        env.update({f"_shape{o}": shape, f"_dtype{o}": dtype, f"_device{o}": device})
        if like is not None:
            lines.append(f"    o{o} = _empty_like(values[{like[0]}])" if like[1] else
                         f"    o{o} = values[{like[0]}].new_empty(_shape{o})")
            continue
        lines.append(f"    o{o} = _empty(_shape{o}, dtype=_dtype{o}, device=_device{o})")
    outs = ", ".join(f"o{o}" for o in range(len(w.allocate)))
    result = "o0" if len(w.allocate) == 1 else f"({outs},)"
    if w.binder is not None:
        bind, args = w.binder.code(env, "o0.device" if w.allocate else "None")
        lines += bind
        env.update(_kernel=w.kernel, _casts=w.arg_casts)
        call = ", ".join(args)
        if w.then:
            lines.append(f"    args = ({call},)")
            call = "*args"
        runs = w.runs or (None,) * (1 + len(w.then))
        launches = [("_kernel", w.kernel, w.threads, w.group_size)] + [
            (f"_then{k}", kernel, threads, group)
            for k, (kernel, threads, group) in enumerate(w.then)]
        for k, ((name, kernel, threads, group), run) in enumerate(zip(launches, runs)):
            env[name] = kernel
            if run is not None:                 # the backend's plan of this launch
                env[f"_run{k}"] = run
                lines.append(f"    _run{k}({call})")
            else:
                lines.append(f"    {name}({call}, threads={threads}, group_size={group}, "
                             f"arg_casts=_casts)")
            call = "*args"
        if w.errors is not None and not w.errors.deferred:     # deferred: nothing read
            env["_check"] = w.errors.check
            lines.append("    _check(err)")
    lines.append(f"    return {result}")
    return "\n".join(lines) + "\n", env


def _compile(w: Warm) -> Callable[..., Any]:
    text, env = _replay_source(w)
    exec(compile(text, "<metalforge warm call>", "exec"), env)     # noqa: S102
    fn: Callable[..., Any] = env["replay"]
    return fn


_NONE: tuple[Any, str, Any] = ({}, "", None)       # no launch, no kernel to check


def tuning_state() -> tuple[Any, Any]:
    """What `Warm.current` compares against; taken before the call is checked, so a cache
    written meanwhile makes the closure stale rather than wrong."""
    c = default_cache()
    return c, c.entries


def record(call: CheckedCall, launch: Optional[Launch], tuning: tuple[Any, Any],
           given: tuple[int, ...] = ()) -> Warm:
    """The closure replaying `call` (checked, with `launch` bound from it; None when its
    outputs are empty) for later calls with the same key; the outputs numbered in `given` are
    the caller's (`replay(values, outs)`), the others allocated."""
    allocate = tuple((tuple(o.shape), o.dtype, o.device) for o in call.outputs)
    like = allocated_like(call)
    if launch is None:
        return Warm(None, 0, 0, None, None, allocate, tuning, _NONE, given=given, like=like)
    kernels = call.spec.library(call.index64, call.backend).kernels
    host = launch.host_name
    runs = tuple(planned(kernel, launch.args, threads, group, launch.arg_casts)
                 for kernel, threads, group in
                 [(launch.kernel, launch.threads, launch.group_size), *launch.then])
    return Warm(launch.kernel, launch.threads, launch.group_size, launch.arg_casts,
                launch.binder, allocate, tuning, (kernels, host, kernels[host]), launch.errors,
                launch.then, given, runs, like)


def allocated_like(call: CheckedCall) -> tuple[Optional[tuple[int, bool]], ...]:
    """Per output of `call`: (position, True) of a tensor argument (a torch.Tensor itself) with
    its shape, dtype, device and strides (its fresh, contiguous ones), else (position, False)
    of one with its dtype and device, else None. A later call with the same warm key has that
    argument alike, so `empty_like` / `new_empty` of it makes the same output."""
    tensors = [(i, call.values.get(p.name)) for i, p in enumerate(call.spec.graph.params)]
    inputs = [(i, t) for i, t in tensors if type(t) is torch.Tensor]

    def like(o: torch.Tensor) -> Optional[tuple[int, bool]]:
        alike = [(i, t) for i, t in inputs if t.dtype == o.dtype and t.device == o.device]
        same = [i for i, t in alike if t.shape == o.shape and t.stride() == o.stride()]
        return (same[0], True) if same else (alike[0][0], False) if alike else None
    return tuple(like(o) for o in call.outputs)


def planned(kernel: Any, args: tuple[Any, ...], threads: int, group: int,
            casts: Optional[dict[int, str]]) -> Optional[Callable[..., None]]:
    """The backend's launch of a kernel call with these arguments, as a function of the next
    call's arguments alone (`CudaFunction.planned`: the checks and plan lookup its own call
    makes, done once), or None where the backend has none. A replay passes the same kinds of
    arguments as `args` (tensors of the dtypes and devices the warm key holds, outputs made
    alike, scalars of the key's types), so the plan made for `args` is the one each call's
    own lookup would find."""
    plan = getattr(kernel, "planned", None)
    return None if plan is None else plan(*args, threads=threads, group_size=group,
                                          arg_casts=casts)


def key_function(kinds: Sequence[str]) -> Callable[[Sequence[Any], Any], Optional[tuple[Any, ...]]]:
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
    key: Callable[[Sequence[Any], Any], Optional[tuple[Any, ...]]] = env["key"]
    return key


class WarmCache(Bounded[Warm]):
    """A kernel's closures by warm key, at most `size` of them (the oldest goes first)."""

    def __init__(self, size: int = 256) -> None:
        super().__init__(size)
