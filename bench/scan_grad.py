"""Scans' forward + backward (cummax / cummin: the segmented cumsum; cumsum for scale): ours
vs torch eager and torch.compile, bytes moved, GB/s.

    python bench/scan_grad.py --device cuda --dtype f16 f32 --sizes 4096x4096 64x65536 16384x128
    python bench/scan_grad.py --device cuda --ops cummax --launch fill_groups=0   # no splits

Each call is ``torch.autograd.grad(f(x), x, dy)``: ours runs the forward kernel, then the
derived backward kernels (for cummax: the running maximum again, then one reverse segmented
cumsum kernel that also writes dx; `adjoints.running_grad`); torch's the same on
torch.cummax(...).values (its backward a scatter_add at the saved indices); torch.compile
compiles the forward (AOTAutograd its backward). Bytes: our kernels' own count, forward and
backward (each input read once, each output written once, a split's second read counted); the
copy column times `copy_` moving as many bytes. `--launch fill_groups=0` keeps each row in one
threadgroup (no totals launch) to time the split against it. On the simulator the times are
only a smoke test of the script.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    DTYPES,
    HEADER,
    copy_time,
    parse_launch,
    pick_device,
    plan,
    row,
    table_parser,
    timeit,
)

import metalforge as mf  # noqa: E402
from metalforge import autodiff  # noqa: E402
from metalforge.schedule import plan as plan_graph  # noqa: E402
from metalforge.shapes import bind_shapes  # noqa: E402


@mf.kernel
def cummax(x: "T[R, D]"):  # noqa: F821
    return mf.cummax(x, "D")


@mf.kernel
def rev_cummin(x: "T[R, D]"):  # noqa: F821
    return mf.cummin(x, "D", reverse=True)


@mf.kernel
def cumsum(x: "T[R, D]"):  # noqa: F821
    return mf.cumsum(x, "D")


TORCH = {"cummax": lambda a: torch.cummax(a, -1).values,
         "rev_cummin": lambda a: torch.cummin(a.flip(-1), -1).values.flip(-1),
         "cumsum": lambda a: torch.cumsum(a, -1)}
KERNELS = {"cummax": cummax, "rev_cummin": rev_cummin, "cumsum": cumsum}


def moved(kernel, x: torch.Tensor, launch: dict) -> int:
    """Bytes of the forward and the derived backward kernels, as our schedules count them."""
    sched, sizes = plan(kernel, (x,))
    total = sched.traffic(sizes).total
    g = kernel.graph(x)
    for bk in autodiff.backward_of(g, ("x",)).kernels:
        s = plan_graph(bk, launch or None)
        total += s.traffic(bind_shapes(bk, {t.name: x for t in bk.tensors}).sizes).total
    return total


def grad_call(fn, xr, dy):
    return lambda: torch.autograd.grad(fn(xr), xr, dy)


def compiled_call(fn, xr, dy, device: str, repeat: int, enabled: bool):
    if not enabled or device == "cpu":
        return None
    try:
        torch._dynamo.reset()
        return timeit(grad_call(torch.compile(fn, dynamic=False), xr, dy), device, repeat)
    except Exception as e:  # noqa: BLE001 - a failed compile is a '-' in the table
        print(f"  (torch.compile failed: {type(e).__name__}: {str(e)[:120]})", flush=True)
        return None


def main(argv=None) -> int:
    ap = table_parser(__doc__.split("\n")[0], "4096x4096 64x65536 16384x128 on a GPU; 4x1000 "
                                              "on the simulator")
    a = ap.parse_args(argv)
    device = pick_device(a.device)
    sim = device == "cpu"
    sizes = a.sizes or (["4x1000"] if sim else ["4096x4096", "64x65536", "16384x128"])
    repeat = a.repeat or (2 if sim else 50)
    launch = parse_launch(a.launch)
    print(f"device {device}, launch {launch or 'default'}, median of {repeat}, forward + "
          f"backward" + ("  (simulator: times are a smoke test only)" if sim else ""))
    print(HEADER)
    for spec in sizes:
        rows, cols = (int(v) for v in spec.lower().split("x"))
        for dname in a.dtype:
            x = torch.randn(rows, cols, dtype=DTYPES[dname], device=device)
            dy = torch.randn_like(x)
            xr = x.requires_grad_()
            for name, k in KERNELS.items():
                if a.ops and name not in a.ops:
                    continue
                k = k.with_launch(**launch) if launch else k
                nbytes = moved(k, x, launch)
                ours = timeit(grad_call(k, xr, dy), device, repeat)
                theirs = timeit(grad_call(TORCH[name], xr, dy), device, repeat)
                comp = compiled_call(TORCH[name], xr, dy, device, repeat, a.compile)
                copy = copy_time(nbytes, device, repeat)
                print(row(name, dname, spec, "-", nbytes, ours, theirs, comp, copy), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
