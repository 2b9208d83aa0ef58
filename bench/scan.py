"""Scans along rows (and columns): ours vs torch eager and torch.compile, bytes moved, GB/s.

    python bench/scan.py                  # MPS on a Mac, CUDA on NVIDIA, else the simulator
    python bench/scan.py --device cuda --dtype f16 f32 --sizes 4096x4096 64x65536 16384x128
    python bench/scan.py --device cuda --ops cumsum --launch threads_per_group=256

Bytes are the schedule's own count (each input read once, each output written once), so GB/s
is comparable with the device's copy bandwidth: the copy columns time `copy_` moving the same
number of bytes (the ceiling), %copy is ours against it, vs eager / vs compile > 1 means ours is
faster than torch eager / torch.compile (compiled once per shape and dtype before timing;
skipped on the simulator and with --no-compile). On CUDA all are timed as GPU time of
CUDA-graph replays (see common.timeit). The variant column names the kernel a call launches
first: `row` (one threadgroup per row), `simd` (one simdgroup per short row), `totals` (few
long rows split into segments: a totals launch, then the row kernel; bytes count both),
`column` (`col_cumsum` scans the matrix along its first axis, one thread per column).
`rev_cumsum` / `rev_col_cumsum`: reverse scans (`reverse=True`, the backward of cumsum; the
row kernel with scalar accesses at mirrored positions) against torch's flip/cumsum/flip. On the
simulator the times are only a smoke test of the script.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import parse_launch, pick_device, print_table, table_parser  # noqa: E402
from cumsum import masked_running_mean  # noqa: E402

import metalforge as mf  # noqa: E402
from metalforge import runtime  # noqa: E402


@mf.kernel
def cumsum(x: "T[R, D]"):  # noqa: F821
    return mf.cumsum(x, "D")


@mf.kernel
def cummax(x: "T[R, D]"):  # noqa: F821
    return mf.cummax(x, "D")


@mf.kernel
def logcumsumexp(x: "T[R, D]"):  # noqa: F821
    return mf.logcumsumexp(x, "D")


@mf.kernel
def col_cumsum(x: "T[R, D]"):  # noqa: F821
    return mf.cumsum(x, "R")


@mf.kernel
def rev_cumsum(x: "T[R, D]"):  # noqa: F821
    return mf.cumsum(x, "D", reverse=True)


@mf.kernel
def rev_col_cumsum(x: "T[R, D]"):  # noqa: F821
    return mf.cumsum(x, "R", reverse=True)


def cases(rows: int, cols: int, dtype, device):
    def t(*shape):
        return torch.randn(*shape, dtype=dtype, device=device)
    x = t(rows, cols)
    m = (torch.rand(rows, cols, device=device) > 0.3).to(dtype)
    yield "cumsum", cumsum, (x,), lambda: torch.cumsum(x, dim=-1)
    yield "cummax", cummax, (x,), lambda: torch.cummax(x, dim=-1).values
    yield "logcumsumexp", logcumsumexp, (x,), lambda: torch.logcumsumexp(x, dim=-1)
    yield ("masked_mean", masked_running_mean, (x, m),
           lambda: torch.cumsum(x * m, -1) / torch.cumsum(m, -1).clamp(min=1.0))
    yield "col_cumsum", col_cumsum, (x,), lambda: torch.cumsum(x, dim=0)
    # reverse scans (cumsum's backward): ours at mirrored positions, torch through flips
    yield "rev_cumsum", rev_cumsum, (x,), lambda: x.flip(-1).cumsum(-1).flip(-1)
    yield "rev_col_cumsum", rev_col_cumsum, (x,), lambda: x.flip(0).cumsum(0).flip(0)


def main(argv=None) -> int:
    ap = table_parser(__doc__.split("\n")[0], "4096x4096 64x65536 16384x128 on a GPU; 16x1000 "
                                              "and 2x8192 on the simulator")
    a = ap.parse_args(argv)
    device = pick_device(a.device)
    sim = device == "cpu"
    sizes = a.sizes or (["16x1000", "2x8192"] if sim else
                        ["4096x4096", "64x65536", "16384x128"])
    dtypes = a.dtype if a.dtype != ["f16"] or a.sizes else ["f16", "f32"]
    repeat = a.repeat or (2 if sim else 50)
    launch = parse_launch(a.launch)
    backend = runtime.current_backend([torch.empty(0, device=device)])
    print(f"device {device}, backend {backend}, launch {launch or 'default'}, median of "
          f"{repeat}" + ("  (simulator: times are a smoke test only)" if sim else ""))
    print_table(cases, sizes, dtypes, a.ops, device, repeat, launch, with_variant=True,
                compile_=a.compile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
