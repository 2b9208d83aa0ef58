"""`mf.autotune`: try launch configurations of one kernel on example arguments, check each
against the reference, time them where timings mean something, and remember the fastest.

    result = mf.autotune(rms_norm, x, w)      # candidates: a small grid (tuning.sweep.SWEEP)
    print(result)                                  # every candidate, its time, the winner
    rms_norm(x, w)                                 # later calls use the winner automatically

On MPS and CUDA each candidate is warmed up, then timed as the median of repeated samples,
each sample a batch of launches between two `torch.mps.synchronize()` (`torch.cuda.
synchronize()`) calls; the winner is stored in the autotune cache (see
`metalforge.tuning.cache`), keyed by the GPU's name. On the simulator every candidate is run and
checked, but nothing is timed or stored: CPU timings of a simulated GPU say nothing about the
GPU, so the result is the default configuration.

A candidate whose output differs from the reference is a metalforge bug: autotune checks them
all, then raises `CandidateMismatch` naming each failing configuration.
"""
from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence, TextIO

import torch

from ._version import __version__
from .errors import BindingError, CandidateMismatch
from .frontend.kernel import Kernel
from .runtime import run
from .runtime.backends import current_backend
from .runtime.launcher import dispatch, prepare
from .schedule import family as family_of
from .schedule.policy import TUNABLE, LaunchError, backend_launch, resolve
from .shapes import bind_shapes
from .testing.slack import Allowance, allowance
from .tolerance import Tolerance, compare, lowest_precision, magnitude, reduction_length, tolerance
from .tuning.cache import TuneKey, default_cache, device_name, key_for
from .tuning.launch import NOT_TUNED, check_options, merge
from .tuning.sweep import grid

# the backends that run on a GPU, and how to wait for it
SYNC: dict[str, Callable[[], Any]] = {"mps": lambda: torch.mps.synchronize(),
                                     "cuda": lambda: torch.cuda.synchronize()}
TIMED_BACKENDS = tuple(SYNC)


@dataclass
class Trial:
    launch: dict[str, Any]
    status: str                          # "ok" | "wrong" | "skipped"
    seconds: Optional[float] = None      # median time per launch (timed backends only)
    detail: str = ""                     # why it was skipped, or what was wrong

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.launch.items()) or "(table defaults)"


@dataclass
class TuneResult:
    kernel: str
    backend: str
    device: str
    key: TuneKey
    default: dict[str, Any]              # the configuration used without tuning
    best: dict[str, Any]                 # the winner (the default where nothing was timed)
    timed: bool
    trials: list[Trial] = field(default_factory=list)
    saved_to: Optional[Path] = None
    note: str = ""

    def trial(self, launch: Mapping[str, Any]) -> Trial:
        for t in self.trials:
            if t.launch == dict(launch):
                return t
        raise KeyError(dict(launch))

    @property
    def speedup(self) -> Optional[float]:
        """Default time / best time (timed backends only)."""
        if not self.timed:
            return None
        d, b = self.trial(self.default).seconds, self.trial(self.best).seconds
        return d / b if d and b else None

    def __str__(self) -> str:
        lines = [f"autotune {self.kernel} on {self.device} ({self.backend}), {self.key.dtypes}, "
                 f"shape bucket {self.key.shape}: {len(self.trials)} candidates"]
        if self.note:
            lines.append(self.note)
        trials = sorted(self.trials, key=lambda t: (t.seconds is None, t.seconds or 0.0))
        for t in trials:
            mark = "*" if t.launch == self.best else " "
            tm = f"{t.seconds * 1e3:9.4f} ms" if t.seconds is not None else " " * 12
            extra = f"  {t.status}: {t.detail}" if t.status != "ok" else ""
            lines.append(f" {mark} {tm}  {t.describe()}{extra}")
        if self.saved_to is not None:
            lines.append(f"winner saved to {self.saved_to}")
        return "\n".join(lines)


# --------------------------------------------------------------------------- timing

def median_time(call: Callable[[], Any], sync: Callable[[], Any], *, warmup: int = 3,
                repeats: int = 15, clock: Callable[[], float] = time.perf_counter,
                min_sample: float = 2e-4) -> float:
    """Seconds per call: the median over `repeats` samples, each a batch of calls between two
    syncs, sized from a first timed call so a sample lasts about `min_sample` seconds (short
    kernels are not drowned by the cost of synchronising)."""
    for _ in range(warmup):
        call()
    sync()
    t0 = clock()
    call()
    sync()
    once = max(clock() - t0, 1e-9)
    number = max(1, min(1000, int(min_sample / once)))
    samples = []
    for _ in range(repeats):
        sync()
        t0 = clock()
        for _ in range(number):
            call()
        sync()
        samples.append((clock() - t0) / number)
    return statistics.median(samples)


def _timer(backend: str, warmup: int, repeats: int) -> Optional[Callable[[Callable], float]]:
    """How to time one candidate's bare launch on this backend; None where timings are not
    meaningful (the simulator)."""
    sync = SYNC.get(backend)
    if sync is None:
        return None
    return lambda call: median_time(call, sync, warmup=warmup, repeats=repeats)


class _Progress:
    """One status line on stderr, redrawn in place on a terminal; elsewhere only the summary."""

    def __init__(self, label: str, total: int, enabled: bool, stream: Optional[TextIO] = None,
                 tty: Optional[bool] = None):
        self.label, self.total, self.enabled = label, total, enabled
        self.stream = stream if stream is not None else sys.stderr
        self.tty = tty if tty is not None else bool(getattr(self.stream, "isatty", lambda: False)())
        self.width = 0

    def step(self, done: int, text: str) -> None:
        if not (self.enabled and self.tty):
            return
        n = 20 * done // max(self.total, 1)
        line = f"\r{self.label} [{'#' * n}{'.' * (20 - n)}] {done}/{self.total} {text}"
        self.width = max(self.width, len(line))
        self.stream.write(line.ljust(self.width))
        self.stream.flush()

    def close(self, summary: str) -> None:
        if not self.enabled:
            return
        self.stream.write(("\r" + summary.ljust(self.width) if self.tty else summary) + "\n")
        self.stream.flush()


# --------------------------------------------------------------------------- autotune

def autotune(kernel, *args, candidates: Optional[Sequence[Mapping[str, Any]]] = None,
             repeats: int = 15, warmup: int = 3, progress: bool = True, save: bool = True,
             **kwargs) -> TuneResult:
    """Sweep launch configurations of `kernel` on these example arguments (given as for a call;
    a kernel parameter named like one of autotune's options must be passed positionally).

    candidates: launch-option dicts to try; default: `sweep.grid` over the kernel family's
    tunable options not pinned by the kernel's own `launch=` (pinned options apply to every
    candidate: explicit overrides win). The default configuration is always tried too.
    Raises LaunchError for a candidate that cannot apply (before anything runs) and
    CandidateMismatch if any candidate disagrees with the reference.

    Example::

        r = mf.autotune(rms_norm, x, w)     # r.best, r.trials, r.speedup; print(r)
    """
    if not isinstance(kernel, Kernel):
        raise BindingError(f"mf.autotune tunes an @mf.kernel, got {kernel!r}")
    tn = _setup(kernel, args, kwargs, candidates, warmup, repeats)
    bar = _Progress(f"autotune {kernel.name}", len(tn.trials), progress)
    for i, t in enumerate(tn.trials):
        bar.step(i, t.describe())
        _try(t, tn, tn.timer, tn.timed)
    bar.step(len(tn.trials), "done")
    ok = _runnable(kernel, tn.trials, tn.key, tn.sizes, tn.tol, bar)
    result = _result(tn, ok, save)
    bar.close(_summary(kernel.name, result, len(ok)))
    return result


@dataclass
class _Tuning:
    """What one `autotune` call works from: the call's graph and values, the reference result,
    the candidates (as trials, the default first), the cache key, tolerance and timer."""
    kernel: Kernel
    graph: Any
    values: dict[str, Any]
    backend: str
    expected: tuple
    pinned: dict[str, Any]
    trials: list[Trial]
    sizes: dict[str, int]
    key: TuneKey
    tol: Tolerance
    timer: Optional[Callable[[Callable], float]]
    allowed: Allowance                        # the slack of sums the schedules reorder
    timed: dict[tuple, float] = field(default_factory=dict)   # per (kernel, threads, group)


def _setup(kernel: Kernel, args: tuple, kwargs: dict, candidates, warmup: int,
           repeats: int) -> _Tuning:
    """Bind the example arguments (binding errors surface here, from the reference), check
    every candidate, and fix the key, tolerance and timer of the sweep."""
    expected = kernel.reference(*args, **kwargs)
    expected = expected if isinstance(expected, tuple) else (expected,)
    graph = kernel.graph(*args, **kwargs)
    values = _values(kernel, graph, args, kwargs)
    tensors = {t.name: values[t.name] for t in graph.tensors}
    backend = kernel.backend or current_backend(tensors.values())
    pinned = dict(kernel.launch or {})
    family = family_of(graph)
    trials = [Trial(c, "ok") for c in _candidates(family, pinned, candidates,
                                                  f"mf.autotune({kernel.name})",
                                                  backend_launch(backend, family))]
    sizes = bind_shapes(graph, tensors).sizes
    return _Tuning(kernel, graph, values, backend, expected, pinned, trials, sizes,
                   key_for(graph, backend, sizes), _tolerance(graph, sizes, values),
                   _timer(backend, warmup, repeats), allowance(graph, values, expected))


def _result(tn: _Tuning, ok: list[Trial], save: bool) -> TuneResult:
    """The result: the fastest correct candidate (saved to the autotune cache unless
    save=False), or the default where timings mean nothing."""
    default = tn.trials[0].launch
    result = TuneResult(tn.kernel.name, tn.backend, device_name(tn.backend), tn.key, default,
                        default, tn.timer is not None, tn.trials)
    if tn.timer is None:
        result.note = (f"all {len(ok)} runnable candidates match the reference; timings on the "
                       f"'{tn.backend}' backend are not meaningful (it runs the GPU kernel on "
                       "the CPU), so the default launch policy is kept and nothing is cached")
        return result
    best = min(ok, key=lambda t: t.seconds)
    result.best = best.launch
    if save:
        cache = default_cache()
        cache.put(tn.key, _entry(best, result, tn.pinned))
        result.saved_to = cache.path
    return result


def _try(t: Trial, tn: _Tuning, timer: Optional[Callable[[Callable], float]],
         timed: dict[tuple, float]) -> None:
    """Run one candidate, compare it with the reference (with the slack its reordered sums
    allow, as `check` does) and, where timings mean something, time its bare launch; the
    outcome goes into `t`."""
    graph, values, backend = tn.graph, tn.values, tn.backend
    try:
        got = run(graph, values, backend, t.launch)
    except LaunchError as e:        # this pipeline cannot take it (e.g. its thread limit)
        t.status, t.detail = "skipped", str(e)
        return
    except Exception as e:          # noqa: BLE001 - a candidate that fails is reported
        t.status, t.detail = "wrong", f"raised {type(e).__name__}: {e}"
        return
    t.detail = _mismatch(got, tn.expected, tn.tol, tn.allowed)
    if t.detail:
        t.status = "wrong"
        return
    if timer is not None:
        ready, _ = prepare(graph, values, backend, t.launch)
        # candidates that end up as the same kernel and dispatch are timed once
        effect = (id(ready.kernel), ready.threads, ready.group_size)
        if effect not in timed:
            timed[effect] = timer(lambda: dispatch(ready))
        t.seconds = timed[effect]


def _runnable(kernel, trials: list[Trial], key: TuneKey, sizes, tol: Tolerance,
              bar: _Progress) -> list[Trial]:
    """The candidates that ran and matched; raises if any was wrong or none could run."""
    wrong = [t for t in trials if t.status == "wrong"]
    if wrong:
        bar.close(f"autotune {kernel.name}: {len(wrong)} of {len(trials)} candidates are wrong")
        raise CandidateMismatch(
            f"{kernel.where}: {len(wrong)} launch configuration(s) give a result different from "
            f"the reference on {key.dtypes}, sizes {dict(sizes)} ({tol.describe()}). This is a "
            "metalforge bug; please report it with this message:\n" +
            "\n".join(f"  {t.describe()}: {t.detail}" for t in wrong))
    ok = [t for t in trials if t.status == "ok"]
    if not ok:
        bar.close(f"autotune {kernel.name}: no candidate can run")
        raise LaunchError(f"{kernel.where}: no launch configuration can run here:\n" +
                          "\n".join(f"  {t.describe()}: {t.detail}" for t in trials))
    return ok


def _summary(name: str, result: TuneResult, n_ok: int) -> str:
    head = f"autotune {name}: {n_ok}/{len(result.trials)} candidates correct; "
    if not result.timed:
        return head + f"timings on '{result.backend}' are not meaningful; keeping the default"
    best = result.trial(result.best)
    return (head + f"best {best.describe()} {best.seconds * 1e3:.4f} ms" +
            (f" ({result.speedup:.2f}x the default)" if result.speedup else ""))


def _values(kernel, graph, args, kwargs) -> dict[str, Any]:
    """Every tensor and runtime scalar by name, defaults filled (what runtime.run takes)."""
    ba = kernel.signature.bind(*args, **kwargs)
    ba.apply_defaults()
    return {p.name: ba.arguments[p.name] for p in (*graph.tensors, *graph.scalars)}


def _candidates(fam: str, pinned: dict, candidates, where: str,
                base: Optional[Mapping[str, Any]] = None) -> list[dict[str, Any]]:
    """Full configurations (every tunable option spelled out), the default first, no repeats;
    options a candidate leaves out come from the table with the backend's changes (`base`)
    under the kernel's pinned ones, as for a call. Every one is checked against the family's
    policy before anything runs."""
    keys = [k for k in TUNABLE[fam] if k not in NOT_TUNED]

    def full(cand: Mapping[str, Any], label: str) -> dict[str, Any]:
        try:
            p = resolve(fam, merge(base, cand, pinned))
        except LaunchError as e:
            raise LaunchError(f"{where}: {label} {dict(cand)}: {e}") from None
        return {**{k: getattr(p, k) for k in keys}, **pinned}

    if candidates is None:
        given = grid(fam, pinned)
    else:
        if isinstance(candidates, Mapping) or not all(isinstance(c, Mapping)
                                                      for c in candidates):
            raise LaunchError(f"{where}: candidates must be a list of launch-option dicts, "
                              f"e.g. [{{'threads_per_group': 128}}, "
                              f"{{'threads_per_group': 512}}]")
        given = []
        for i, c in enumerate(candidates):
            c = check_options(c, f"{where} candidate {i}")
            nt = [k for k in c if k in NOT_TUNED]
            if nt:
                raise LaunchError(f"{where} candidate {i}: {', '.join(nt)} is chosen from the "
                                  "sizes for correctness and is not tuned; leave it out")
            given.append(c)
    out = [full({}, "the default")]
    for i, c in enumerate(given):
        f = full(c, f"candidate {i}")
        if f not in out:
            out.append(f)
    return out


def _tolerance(graph, sizes, values) -> Tolerance:
    floats = [n.dtype for n in graph.nodes()] + [o.dtype for o in graph.outputs] + \
        [t.dtype for t in graph.tensors]
    return tolerance(lowest_precision(floats), reduction_length=reduction_length(graph, sizes),
                     scale=magnitude(values.values()))


def _mismatch(got, expected: tuple, tol, allowed: Allowance) -> str:
    got = got if isinstance(got, tuple) else (got,)
    if len(got) != len(expected):
        return f"returned {len(got)} outputs, the reference {len(expected)}"
    for i, (g, e) in enumerate(zip(got, expected)):
        breach = compare(g.cpu(), e.cpu(), tol, output=i,
                         slack=allowed.slack[i].cpu() if allowed.slack else None,
                         alternatives=[m[i].cpu() for m in allowed.alternatives] or None)
        if breach is not None:
            return str(breach)
    return ""


def _entry(best: Trial, result: TuneResult, pinned: Mapping[str, Any]) -> dict[str, Any]:
    default_s = result.trial(result.default).seconds
    return {"launch": {k: v for k, v in best.launch.items() if k not in pinned},
            "kernel": result.kernel, "time_ms": best.seconds * 1e3,
            "default_ms": default_s * 1e3 if default_s else None,
            "candidates": len(result.trials), "metalforge": __version__,
            "when": time.strftime("%Y-%m-%dT%H:%M:%S")}

