"""What the bench scripts share: dtype names, device choice and sync, the timers, the copy_
ceiling and each call's schedule (for its byte count)."""
from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import fields

import torch

from metalforge import runtime
from metalforge.schedule.policy import LaunchPolicy
from metalforge.shapes import bind_shapes

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def pick_device(name: str | None) -> str:
    """--device: "mps", "cuda" or "cpu" (the simulator); default: the GPU there is, else cpu."""
    if name:
        return name
    if torch.backends.mps.is_available():
        return "mps"
    return "cuda" if torch.cuda.is_available() else "cpu"


def table_parser(description: str, sizes_help: str) -> argparse.ArgumentParser:
    """The arguments of the per-op tables (bench/elementwise.py, bench/reductions.py)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--device", choices=("mps", "cuda", "cpu"), default=None)
    ap.add_argument("--dtype", nargs="+", choices=DTYPES, default=["f16"])
    ap.add_argument("--sizes", nargs="*", default=None, help=f"ROWSxCOLS (default: {sizes_help})")
    ap.add_argument("--repeat", type=int, default=None)
    ap.add_argument("--ops", nargs="*", default=None, help="only these ops")
    ap.add_argument("--launch", nargs="*", default=None, help="launch overrides, key=value")
    add_compile_flag(ap)
    return ap


def attention_parser(description: str) -> argparse.ArgumentParser:
    """The arguments of the attention training benches (bench/attention_backward.py,
    bench/op_training.py): B = 1, `--heads` heads of `--e` values, S = L in `--lengths`."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--device", choices=("mps", "cuda", "cpu"), default=None)
    ap.add_argument("--dtype", default="f16", choices=list(DTYPES))
    ap.add_argument("--lengths", nargs="+", type=int, default=[1024, 4096])
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--e", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=10)
    add_compile_flag(ap)
    return ap


def add_compile_flag(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--no-compile", dest="compile", action="store_false",
                    help="skip the torch.compile column (skipped anyway on the simulator)")


def example(name: str):
    """examples/<name>.py as a module (imported once, registered in sys.modules: its
    dataclasses look their module up; its script part does not run)."""
    from pathlib import Path

    from metalforge.testing import load_module
    return load_module(Path(__file__).resolve().parent.parent / "examples" / f"{name}.py")


def sync(device: str) -> None:
    if device == "mps":
        torch.mps.synchronize()
    elif device == "cuda":
        torch.cuda.synchronize()


def timeit(fn, device: str, repeat: int, warmup: int = 3) -> float:
    """Seconds per call. `fn` is one callable or a list of them called in turn (the same call
    on different copies of its inputs: see `cold_copies`). On CUDA: GPU time from CUDA events
    around replays of a CUDA graph of at least 10 calls (no host launch overhead in it, for ours
    and torch alike; median over `repeat` replays). Elsewhere: the median wall time of single
    synchronised calls."""
    fns = list(fn) if isinstance(fn, (list, tuple)) else [fn]
    for _ in range(warmup):
        for f in fns:
            f()
    sync(device)
    if device == "cuda":
        return _cuda_graph_time(fns, repeat)
    times = []
    for i in range(repeat * len(fns)):
        t0 = time.perf_counter()
        fns[i % len(fns)]()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _cuda_graph_time(fns, repeat: int, inner: int = 10) -> float:
    rounds = -(-inner // len(fns))
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns:
            f()                                # allocations of the side stream, before capture
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        for _ in range(rounds):
            for f in fns:
                f()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3 / (rounds * len(fns)))
    return statistics.median(times)


def compile_time(fn, device: str, repeat: int, enabled: bool = True) -> float | None:
    """Seconds per call of `torch.compile(fn, dynamic=False)`, compiled for this call's shapes
    and dtype (dynamo's caches reset first: each row's closure is its own graph), warmed up,
    then timed as `timeit` times eager. None where skipped (`enabled` false, the simulator)
    or where compiling fails."""
    if not enabled or device == "cpu":
        return None
    torch._dynamo.reset()
    compiled = torch.compile(fn, dynamic=False)
    try:
        for _ in range(3):
            compiled()
        return timeit(compiled, device, repeat)
    except Exception as e:  # noqa: BLE001 - a failed compile is a '-' in the table, not a stop
        print(f"  (torch.compile failed: {type(e).__name__}: {str(e)[:120]})", flush=True)
        return None


def us(t: float | None, width: int) -> str:
    """A time in microseconds, or '-' where there is none."""
    return f"{t * 1e6:>{width}.1f}" if t is not None else f"{'-':>{width}}"


def ratio(theirs: float | None, ours: float, width: int) -> str:
    """theirs / ours as 'N.NNx' (> 1: ours is faster), or '-'."""
    return f"{theirs / ours:>{width - 1}.2f}x" if theirs is not None else f"{'-':>{width}}"


def cold_copies(nbytes: int, device: str) -> int:
    """How many copies of a call's `nbytes` of inputs, called in turn, keep each call from
    finding its inputs in the GPU's last-level cache: together at least twice its size (CUDA:
    the device's L2; elsewhere 128 MB, above the system-level cache of Apple's largest chips),
    at most 64."""
    cache = (torch.cuda.get_device_properties(0).L2_cache_size if device == "cuda"
             else 128 << 20)
    return min(64, max(2, -(-2 * cache // max(1, nbytes)) + 1))


def copy_time(nbytes: int, device: str, repeat: int, cold: bool = False) -> float:
    """Seconds for `copy_` to move `nbytes` (read nbytes/2, write nbytes/2, as float32): the
    ceiling a kernel moving that many bytes can approach. cold: each call on another pair of
    buffers (`cold_copies`), so that none starts in the cache."""
    half = max(1, nbytes // 8)
    pairs = [(torch.empty(half, dtype=torch.float32, device=device),
              torch.empty(half, dtype=torch.float32, device=device))
             for _ in range(cold_copies(nbytes, device) if cold else 1)]
    return timeit([lambda s=s, d=d: d.copy_(s) for s, d in pairs], device, repeat)


def plan(kernel, args):
    """(schedule, axis sizes) of the call `kernel(*args)` makes: `schedule.traffic(sizes)` is
    its global-memory byte count."""
    g = kernel.graph(*args)
    values = {p.name: a for p, a in zip(g.params, args)}
    sizes = bind_shapes(g, {p.name: values[p.name] for p in g.tensors}).sizes
    return runtime.schedule_of(g, values, launch=kernel.launch), sizes


def launched_variant(schedule, kernel, args) -> str:
    """The variant the call `kernel(*args)` launches (of a schedule with `variants`: a row
    reduction's, where the group kernel's pipeline may not take the threads the row needs; the
    quantized matvec's)."""
    host = kernel.launches(*args)[0][0]
    return next(v for v, k in schedule.variants.items() if k.host_name == host)


def parse_launch(items) -> dict:
    """--launch key=value ... → launch overrides (ints; True / False, or 1 / 0, for switches
    such as stage_kv)."""
    switches = {f.name for f in fields(LaunchPolicy) if "bool" in str(f.type)}
    out: dict = {}
    for it in items or ():
        k, _, v = it.partition("=")
        if v in ("True", "False"):
            out[k] = v == "True"
        else:
            out[k] = bool(int(v)) if k in switches else int(v)
    return out


HEADER = (f"{'op':<13} {'dtype':>5} {'shape':>11} {'variant':>8} {'bytes':>11} {'ours us':>9} "
          f"{'torch us':>9} {'compile us':>10} {'copy us':>8} {'ours GB/s':>9} {'copy GB/s':>9} "
          f"{'%copy':>6} {'vs eager':>9} {'vs compile':>10}")


def row(name, dtype, spec, variant, nbytes, ours, theirs, comp, copy) -> str:
    gbs = lambda s: nbytes / s / 1e9  # noqa: E731
    return (f"{name:<13} {dtype:>5} {spec:>11} {variant:>8} {nbytes:>11} {ours * 1e6:>9.1f} "
            f"{theirs * 1e6:>9.1f} {us(comp, 10)} {copy * 1e6:>8.1f} {gbs(ours):>9.0f} "
            f"{gbs(copy):>9.0f} {100 * copy / ours:>5.0f}% {ratio(theirs, ours, 9)} "
            f"{ratio(comp, ours, 10)}")


def print_table(cases, sizes, dtypes, ops, device: str, repeat: int, launch: dict,
                with_variant: bool, compile_: bool = True) -> None:
    """One row per (size "ROWSxCOLS", dtype name, op) of `cases(rows, cols, dtype, device)`
    (each case: name, kernel, args, torch eager callable; only `ops` when given): ours, torch,
    torch.compile of the same callable (`compile_time`; '-' where skipped), the copy_ ceiling,
    GB/s from the schedule's byte count; with_variant names the row-length variant the host
    picks."""
    print(HEADER)
    for spec in sizes:
        rows, cols = (int(v) for v in spec.lower().split("x"))
        for dname in dtypes:
            for name, k, kargs, eager in cases(rows, cols, DTYPES[dname], device):
                if ops and name not in ops:
                    continue
                if launch:
                    k = k.with_launch(**launch)
                s, sz = plan(k, kargs)
                variant = launched_variant(s, k, kargs) if with_variant else "-"
                traffic = s.traffic(sz, variant) if with_variant else s.traffic(sz)
                ours = timeit(lambda: k(*kargs), device, repeat)
                theirs = timeit(eager, device, repeat)
                comp = compile_time(eager, device, repeat, compile_)
                copy = copy_time(traffic.total, device, repeat)
                print(row(name, dname, spec, variant, traffic.total, ours, theirs, comp, copy),
                      flush=True)
