"""What the bench scripts share: dtype names, device sync and the median timer."""
from __future__ import annotations

import statistics
import time

import torch

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
