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

A call by position takes all of it in two generated functions (`fast_function`, kept as
`CallPath.fast`: the seam, the key, the lookup; then the closure's `hit`: `current`'s checks
inline and the replay). Where the backend's launch is a plan that gives its code (cuda:
`Plan.lines`), the replay holds that code itself, its arguments bound by data pointer.

Closures are immutable and `WarmCache` only adds or drops whole entries under a lock, so
threads may call one kernel at once.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

import torch

from ..bounded import Bounded
from ..tuning.cache import _CACHE_DIR, _CACHES, default_cache, env_lookup
from . import backends
from .binding import Binder
from .indexcheck import IndexErrors
from .launcher import MSL_REWRITE, CheckedCall, Launch

# read on every call: the `with mf.backend(...)` override (part of every key) and the test seam
# that plants faults in the MSL (while set, every call takes the full path: fresh libraries)
BACKEND_OVERRIDE = backends._override
__all__ = ["BACKEND_OVERRIDE", "MISS", "MSL_REWRITE", "Warm", "WarmCache", "record"]


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
    # bytes per element of each argument (parameter order; 0: not a tensor), where the
    # replay checks an input's alignment on its data pointer (`Binder.pointer_code`)
    itemsize: tuple[int, ...] = ()
    # the call itself, compiled from the fields above (see `source`)
    replay: Callable[..., Any] = field(init=False, repr=False, compare=False)
    # `current()` and the replay in one function (`hit(values)`: MISS when not current), for
    # the warm path of calls by position (`fast_function`); None when outputs are given
    hit: Optional[Callable[..., Any]] = field(init=False, repr=False, compare=False)

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
        object.__setattr__(self, "replay", _compile(self, "replay"))
        object.__setattr__(self, "hit", None if self.given else _compile(self, "hit"))

    def __call__(self, values: Sequence[Any]) -> Any:
        return self.replay(values)

    @property
    def source(self) -> str:
        """The replay as Python: straight-line code for this closure's call."""
        return _replay_source(self)[0]

    @property
    def hit_source(self) -> str:
        """`hit` as Python: `current()`'s checks inline, then the replay's lines."""
        return _replay_source(self, "hit")[0]


MISS = object()         # what `hit` and a fast path return for a call they do not serve


def _cache_dir_read() -> tuple[str, dict[str, Any]]:
    """An expression reading $METALFORGE_CACHE_DIR as `tuning.cache._CACHE_DIR()` does (the
    key of its caches), and the names it reads: `env_lookup`'s lookup inline where there is
    one, else a call of `_CACHE_DIR`."""
    found = env_lookup("METALFORGE_CACHE_DIR")
    if found is not None:
        return "_env_get(_env_key)", {"_env_get": found[0], "_env_key": found[1]}
    return "_cache_dir()", {"_cache_dir": _CACHE_DIR}


_CACHE_DIR_READ = _cache_dir_read()


def _current_lines(w: Warm, env: dict[str, Any]) -> list[str]:
    """`Warm.current` inline: the autotune cache of the cache directory now (`default_cache`'s
    lookup; none yet: not the one recorded) is the recorded object holding the recorded
    entries (`_entries`: loaded once `entries` was read, as `tuning_state` did, and only
    replaced after), and the library still holds the kernel checked."""
    kernels, host, checked = w.compiled
    env.update(_caches_get=_CACHES.get, _MISS=MISS, _t0=w.tuning[0], _t1=w.tuning[1],
               _kernels_get=kernels.get, _host=host, _checked=checked, **_CACHE_DIR_READ[1])
    return [f"    c = _caches_get({_CACHE_DIR_READ[0]})",
            "    if c is not _t0 or c._entries is not _t1 or _kernels_get(_host) is not _checked:",
            "        return _MISS"]


def _replay_source(w: Warm, name: str = "replay") -> tuple[str, dict[str, Any]]:
    """Python for `w`'s replay (or, `name` "hit", `current()` then the replay), and the names
    it reads: allocate the outputs, then, when the call launches, bind its arguments (the
    binder's own lines: `binding.Binder.code`), launch the kernel(s) (a backend plan's
    launch inline where it gives its lines: `Plan.lines`), check a gather's report."""
    env: dict[str, Any] = {"_empty": torch.empty, "_empty_like": torch.empty_like}
    lines = [f"def {name}(values, outs):" if w.given else f"def {name}(values):"]
    if name == "hit":
        lines += _current_lines(w, env)
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
        lines += _launch_lines(w, w.binder, env)
    lines.append(f"    return {result}")
    return "\n".join(lines) + "\n", env


def _launch_lines(w: Warm, binder: Binder, env: dict[str, Any]) -> list[str]:
    """The replay's lines from binding the arguments to launching the kernel(s) and checking
    a gather's report. Where every launch is a backend plan that gives its lines
    (`Plan.inlined`: cuda), they are inlined, with the arguments bound by data pointer
    (`Binder.pointer_code`); else each plan's `run`, or the kernel's call, is called."""
    runs = w.runs or (None,) * (1 + len(w.then))
    inline = all(getattr(r, "inlined", False) for r in runs)
    device = "o0.device" if w.allocate else "None"
    if inline:
        lines, args, ptrs = binder.pointer_code(env, device, w.itemsize)
    else:
        (lines, args), ptrs = binder.code(env, device), {}
    env.update(_kernel=w.kernel, _casts=w.arg_casts)
    call = ", ".join(args)
    if w.then and not inline:
        lines.append(f"    args = ({call},)")
        call = "*args"
    launches = [("_kernel", w.kernel, w.threads, w.group_size)] + [
        (f"_then{k}", kernel, threads, group) for k, (kernel, threads, group) in enumerate(w.then)]
    floats = frozenset(a.index for a in binder.scalars if a.is_float)
    for k, ((kname, kernel, threads, group), run) in enumerate(zip(launches, runs)):
        env[kname] = kernel
        if inline:                          # the backend's plan of this launch, inline
            lines += getattr(run, "lines")(args, env, str(k), dict(binder.fixed), ptrs, floats)
        elif run is not None:               # the backend's plan of this launch
            env[f"_run{k}"] = getattr(run, "run", run)
            lines.append(f"    _run{k}({call})")
        else:
            casts = ", arg_casts=_casts" if w.arg_casts is not None else ""   # default None
            lines.append(f"    {kname}({call}, threads={threads}, group_size={group}{casts})")
        call = "*args"
    if w.errors is not None and not w.errors.deferred:     # deferred: nothing read
        env["_check"] = w.errors.check
        lines.append("    _check(err)")
    return lines


def _compile(w: Warm, name: str) -> Callable[..., Any]:
    text, env = _replay_source(w, name)
    exec(compile(text, "<metalforge warm call>", "exec"), env)     # noqa: S102
    fn: Callable[..., Any] = env[name]
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
    itemsize = tuple(v.element_size() if isinstance(v, torch.Tensor) else 0
                     for v in (call.values.get(p.name) for p in call.spec.graph.params))
    return Warm(launch.kernel, launch.threads, launch.group_size, launch.arg_casts,
                launch.binder, allocate, tuning, (kernels, host, kernels[host]), launch.errors,
                launch.then, given, runs, like, itemsize)


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
    makes, done once) or as the plan itself where the backend gives one whose launch the
    replay can inline (`CudaFunction.launch_plan`: a `Plan` with `lines` and `run`), or None
    where the backend has neither. A replay passes the same kinds of arguments as `args`
    (tensors of the dtypes and devices the warm key holds, outputs made alike, scalars of the
    key's types), so the plan made for `args` is the one each call's own lookup would find."""
    plan = getattr(kernel, "launch_plan", None) or getattr(kernel, "planned", None)
    return None if plan is None else plan(*args, threads=threads, group_size=group,
                                          arg_casts=casts)


def _key_lines(kinds: Sequence[str], miss: str, values: str = "values",
               grad: bool = False) -> list[str]:
    """The lines computing a call's warm key `key` from `values` (the name of the arguments
    in parameter order), returning `miss` where the call must take the full path
    (`key_function`; `grad`: a tensor that requires grad does not)."""
    names = [f"a{i}" for i in range(len(kinds))]
    tensors = [n for n, k in zip(names, kinds) if k == "tensor"]
    consts = [n for n, k in zip(names, kinds) if k == "const"]
    lines = []
    if names:
        lines.append(f"    {', '.join(names)}, = {values}")
    tests = [f"type({n}) is not _Tensor" for n in tensors] + [
        f"(type({n}) is not int and type({n}) is not bool)" for n in consts]
    if tests:
        lines += [f"    if {' or '.join(tests)}:", f"        return {miss}"]
    if tensors and not grad:
        needs = " or ".join(f"{n}.requires_grad" for n in tensors)
        lines += [f"    if ({needs}) and _grad_enabled():", f"        return {miss}"]
    parts = ["backend", "_override()"]
    for n, k in zip(names, kinds):
        parts += ([f"{n}.dtype", f"{n}.shape", f"{n}.stride()", f"{n}.device"] if k == "tensor"
                  else [f"type({n})"] if k == "scalar" else [f"type({n})", n])
    return lines + ["    try:", f"        key = ({', '.join(parts)},)",
                    "    except RuntimeError:             # a tensor without strides (sparse, ...)",
                    f"        return {miss}"]


def _key_env() -> dict[str, Any]:
    return {"_Tensor": torch.Tensor, "_grad_enabled": torch.is_grad_enabled,
            "_override": BACKEND_OVERRIDE.get, "_MISS": MISS, "_rewrite": MSL_REWRITE.get}


def key_function(kinds: Sequence[str], grad: bool = False
                 ) -> Callable[[Sequence[Any], Any], Optional[tuple[Any, ...]]]:
    """The warm-call key of a kernel whose parameters are of these kinds ("tensor", "scalar",
    "const"), as straight-line Python: key(values in parameter order, backend) is None when
    the call must take the full path (a non-Tensor or Tensor subclass where a tensor goes, a
    Const that is not an int or bool, a tensor that requires grad while grad mode is on, a
    tensor without strides), else a flat tuple of everything a checked call's launch depends
    on: the backend and the `with mf.backend(...)` override, each tensor's dtype, shape,
    strides and device, each runtime scalar's Python type, each Const's type and value.
    grad: the same key for a call whose tensors require grad (`CallPath`'s differentiable
    calls, which key their traced graph by it)."""
    lines = ["def key(values, backend):", *_key_lines(kinds, "None", grad=grad),
             "    return key"]
    env = _key_env()
    exec(compile("\n".join(lines) + "\n", "<metalforge warm key>", "exec"), env)  # noqa: S102
    key: Callable[[Sequence[Any], Any], Optional[tuple[Any, ...]]] = env["key"]
    return key


def fast_function(kinds: Sequence[str], backend: Any, find: Callable[[Any], Any],
                  tails: Mapping[int, tuple[Any, ...]]) -> Callable[[tuple[Any, ...]], Any]:
    """The warm path of a call giving its parameters by position, as one straight-line
    function: fast(args) is the call's result, or MISS for a call it does not serve (another
    number of arguments, the `MSL_REWRITE` seam set, a key `key_function` refuses, no
    closure for the key, a closure that is not current). A call of n < len(kinds) arguments
    is completed with `tails[n]` (the defaults of the parameters after them; none: MISS);
    then its key as `key_function` makes it (the same tuple), looked up with `find` (key →
    the closure's `hit`), then that `hit`."""
    lines = ["def fast(args):", "    if _rewrite() is not None:", "        return _MISS"]
    env = {**_key_env(), "backend": backend, "_find": find}
    if tails:
        lines += ["    n = len(args)", f"    if n == {len(kinds)}:", "        pass"]
        for n, tail in sorted(tails.items(), reverse=True):
            env[f"_tail{n}"] = tail
            lines += [f"    elif n == {n}:", f"        args = args + _tail{n}"]
        lines += ["    else:", "        return _MISS"]
    else:
        lines += [f"    if len(args) != {len(kinds)}:", "        return _MISS"]
    lines += _key_lines(kinds, "_MISS", "args")
    lines += ["    hit = _find(key)", "    if hit is None:", "        return _MISS",
              "    return hit(args)"]
    exec(compile("\n".join(lines) + "\n", "<metalforge warm path>", "exec"), env)  # noqa: S102
    fast: Callable[[tuple[Any, ...]], Any] = env["fast"]
    return fast


class WarmCache(Bounded[Warm]):
    """A kernel's closures by warm key, at most `size` of them (the oldest goes first), and
    their `hit` functions by the same keys (`hits`, read by `fast_function`)."""

    def __init__(self, size: int = 256) -> None:
        super().__init__(size)
        self.hits: dict[Any, Callable[..., Any]] = {}

    def put(self, key: Optional[Any], value: Warm) -> None:
        if key is None:
            return
        with self._lock:
            while len(self._entries) >= self.size:
                old = next(iter(self._entries))
                del self._entries[old]
                self.hits.pop(old, None)
            self._entries[key] = value
            if value.hit is not None:
                self.hits[key] = value.hit
            else:
                self.hits.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.hits.clear()
