"""What the bench scripts share: dtype names, device sync, the median timer and each call's
schedule (for its byte count)."""
from __future__ import annotations

import statistics
import time

import torch

from metalforge import runtime
from metalforge.shapes import bind_shapes

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def sync(device: str) -> None:
    if device == "mps":
        torch.mps.synchronize()


def timeit(fn, device: str, repeat: int, warmup: int = 3) -> float:
    """Median seconds per call (synchronised after the warm-up and after each call)."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def plan(kernel, args):
    """(schedule, axis sizes) of the call `kernel(*args)` makes: `schedule.traffic(sizes)` is
    its global-memory byte count."""
    g = kernel.graph(*args)
    values = {p.name: a for p, a in zip(g.params, args)}
    sizes = bind_shapes(g, {p.name: values[p.name] for p in g.tensors}).sizes
    return runtime.schedule_of(g, values, launch=kernel.launch), sizes
