"""Elementwise kernels: ours vs torch eager and torch.compile, bytes moved, achieved GB/s.

    python bench/elementwise.py                 # MPS on a Mac, CUDA on NVIDIA, else the simulator
    python bench/elementwise.py --device cuda --dtype f16 f32 --sizes 16384x4096
    python bench/elementwise.py --dtype f32 --sizes 4096x4096

Bytes are the schedule's own count (each input element read once, each output written once).
torch.compile: the eager callable compiled once per shape and dtype (common.compile_time).
On the simulator the times are only a smoke test of the script: it runs Metal code on CPU fibers.
The last section measures the wrapper's warm-call overhead: a full `kernel(x)` call minus the bare
compiled-kernel call with the same arguments (which, on the simulator, is the simulator's own
launch time).
"""
from __future__ import annotations

import math
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bias_scale import bias_scale  # noqa: E402
from common import DTYPES, parse_launch, pick_device, print_table, sync, table_parser  # noqa: E402
from gelu import gelu  # noqa: E402
from silu import silu  # noqa: E402
from swiglu import swiglu  # noqa: E402

from metalforge import runtime  # noqa: E402
from metalforge.runtime.launcher import Compiled, check_call  # noqa: E402


def cases(rows: int, cols: int, dtype, device):
    def t(*shape):
        return torch.randn(*shape, dtype=dtype, device=device)
    x, x2, b = t(rows, cols), t(rows, cols), t(cols)
    yield "silu", silu, (x,), lambda: torch.nn.functional.silu(x)
    yield "gelu_tanh", gelu, (x,), lambda: torch.nn.functional.gelu(x, approximate="tanh")
    yield "swiglu", swiglu, (x, x2), lambda: torch.nn.functional.silu(x) * x2
    yield "bias_scale", bias_scale, (x, b, 0.5), lambda: (x + b) * 0.5


def main(argv=None) -> int:
    ap = table_parser(__doc__.split("\n")[0],
                      "1024x1024 to 8192x8192 on a GPU; 64x1024 on the simulator")
    a = ap.parse_args(argv)
    device = pick_device(a.device)
    sim = device == "cpu"
    sizes = a.sizes or (["64x1024"] if sim else ["1024x1024", "4096x4096", "8192x8192"])
    repeat = a.repeat or (3 if sim else 50)
    launch = parse_launch(a.launch)
    dtype = DTYPES[a.dtype[0]]
    backend = runtime.current_backend([torch.empty(0, device=device)])
    print(f"device {device}, backend {backend}, launch {launch or 'default'}, median of "
          f"{repeat}" + ("  (simulator: times are a smoke test only)" if sim else ""))
    print_table(cases, sizes, a.dtype, a.ops, device, repeat, launch, with_variant=False,
                compile_=a.compile)

    # warm-call overhead of the wrapper: each full call minus the time spent inside the
    # compiled-kernel call it makes (on the simulator: the simulator's own launch time)
    x = torch.randn(256, dtype=dtype, device=device)
    for _ in range(3):
        silu(x)
    call = check_call(silu.graph(x), {"x": x}, None, None)  # the library the call takes
    lib = call.spec.library(call.index64, call.backend)
    host = silu.launches(x)[0][0]                 # at 256 elements the small kernel, if any
    compiled = lib.kernel(host)
    real, inner = compiled.kernel, []

    def timed(*args, **kw):
        t0 = time.perf_counter()
        real(*args, **kw)
        sync(device)
        inner.append(time.perf_counter() - t0)

    lib.kernels[host] = Compiled(timed, compiled.max_threads)
    n = 300 if sim else 3000
    overheads, fulls = [], []
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            silu(x)
            sync(device)
            fulls.append(time.perf_counter() - t0)
            overheads.append(fulls[-1] - inner[-1])
    finally:
        lib.kernels[host] = compiled
    full = statistics.median(fulls)
    print(f"\nwarm call, silu on {x.numel()} elements: full call {full * 1e6:.1f} us (median of "
          f"{n}), of which inside the kernel call {statistics.median(inner) * 1e6:.1f} us -> "
          f"wrapper overhead {statistics.median(overheads) * 1e6:.1f} us per call")
    if not math.isfinite(full):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
