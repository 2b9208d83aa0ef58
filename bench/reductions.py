"""Row and column reductions: ours vs torch eager and torch.compile, bytes moved, GB/s.

    python bench/reductions.py              # MPS on a Mac, CUDA on NVIDIA, else the simulator
    python bench/reductions.py --device cuda --dtype f16 f32 --sizes 16384x4096 2048x16384
    python bench/reductions.py --device cuda --ops softmax --launch reads_per_thread=8
    python bench/reductions.py --device cuda --ops column_sum --column-merge both
    python bench/reductions.py --device cuda --ops softmax_t --launch keep_narrow=1   # as before
    python bench/reductions.py --device cuda --sizes 64x65536 --launch fill_groups=0  # unsplit

--column-merge says how a column reduction whose reduced axis is split into chunks merges
them: `combine` (default: a second launch), `one` (launch={"one_launch": True}: the last
threadgroup of each column block merges them in the same launch; rows named NAME/1L) or
`both` (each column op twice, side by side).

Row ops: rms_norm, layer_norm, softmax, softmax_t (a temperature: softmax(x / t)),
softmax_scale (softmax(x * s)), log_softmax, logsumexp, add_rms_norm (two outputs),
row_argmax; column ops: column_sum, column_mean, column_max, column_min, column_argmax.

Bytes are the schedule's own count for the variant each size launches (register variants read
each input once; the looped variant once per pass; each output is written once), so GB/s is
comparable with the device's copy bandwidth: the copy columns time `copy_` moving the same number
of bytes (the ceiling), %copy is ours against it, vs eager / vs compile > 1 means ours is faster
than torch eager / torch.compile (compiled once per shape and dtype before timing; skipped on the
simulator and with --no-compile). On CUDA all are timed as GPU time of CUDA-graph replays (see
common.timeit). The variant column says which kernel ran. On the simulator the times are only a
smoke test of the script (Metal code on CPU fibers).
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from add_rms_norm import add_rms_norm  # noqa: E402
from column_sum import column_sum  # noqa: E402
from common import parse_launch, pick_device, print_table, table_parser  # noqa: E402
from layer_norm import layer_norm  # noqa: E402
from log_softmax import log_softmax  # noqa: E402
from logsumexp import logsumexp  # noqa: E402
from rms_norm import rms_norm  # noqa: E402
from row_argmax import row_argmax  # noqa: E402
from softmax import softmax  # noqa: E402

import metalforge as mf  # noqa: E402
from metalforge import runtime  # noqa: E402


@mf.kernel
def softmax_t(x: "T[R, D]", t: float = 1.0):  # noqa: F821
    return mf.softmax(x / t, axis="D")


@mf.kernel
def softmax_scale(x: "T[R, D]", s: float = 1.0):  # noqa: F821
    return mf.softmax(x * s, axis="D")


@mf.kernel
def column_max(x: "T[R, D]"):  # noqa: F821
    return mf.max(x, axis="R")


@mf.kernel
def column_mean(x: "T[R, D]"):  # noqa: F821
    return mf.mean(x, axis="R")


@mf.kernel
def column_min(x: "T[R, D]"):  # noqa: F821
    return mf.min(x, axis="R")


@mf.kernel
def column_argmax(x: "T[R, D]"):  # noqa: F821
    return mf.argmax(x, axis="R")


def cases(rows: int, cols: int, dtype, device):
    def t(*shape):
        return torch.randn(*shape, dtype=dtype, device=device)
    x, r, w, b = t(rows, cols), t(rows, cols), t(cols), t(cols)
    yield "rms_norm", rms_norm, (x, w), lambda: F.rms_norm(x, (cols,), w, eps=1e-6)
    yield "layer_norm", layer_norm, (x, w, b), lambda: F.layer_norm(x, (cols,), w, b)
    yield "softmax", softmax, (x,), lambda: torch.softmax(x, dim=-1)
    yield "softmax_t", softmax_t, (x, 0.7), lambda: torch.softmax(x / 0.7, dim=-1)
    yield "softmax_scale", softmax_scale, (x, 0.125), lambda: torch.softmax(x * 0.125, dim=-1)
    yield "log_softmax", log_softmax, (x,), lambda: torch.log_softmax(x, dim=-1)
    yield "logsumexp", logsumexp, (x,), lambda: torch.logsumexp(x, dim=-1)

    def add_norm():
        h = x + r
        return h, F.rms_norm(h, (cols,), w, eps=1e-6)
    yield "add_rms_norm", add_rms_norm, (x, r, w), add_norm
    yield "row_argmax", row_argmax, (x,), lambda: torch.argmax(x, dim=-1)
    yield "column_sum", column_sum, (x,), lambda: x.sum(dim=0)
    yield "column_mean", column_mean, (x,), lambda: x.mean(dim=0)
    yield "column_max", column_max, (x,), lambda: x.amax(dim=0)
    yield "column_min", column_min, (x,), lambda: x.amin(dim=0)
    yield "column_argmax", column_argmax, (x,), lambda: torch.argmax(x, dim=0)


def merged(cases, merge: str, ops):
    """`cases` with each column op as `merge` asks (combine, one or both: see the module
    doc), only `ops` (by the op's name, a /1L row with its op)."""
    def each(rows, cols, dtype, device):
        for name, k, args, eager in cases(rows, cols, dtype, device):
            if ops and name not in ops:
                continue
            column = name.startswith("column_")
            if not column or merge in ("combine", "both"):
                yield name, k, args, eager
            if column and merge in ("one", "both"):
                yield f"{name}/1L", k.with_launch(one_launch=True), args, eager
    return each


def main(argv=None) -> int:
    ap = table_parser(__doc__.split("\n")[0],
                      "several on a GPU; 16x1000 and 2x8192 on the simulator")
    ap.add_argument("--column-merge", choices=("combine", "one", "both"), default="combine",
                    help="column reductions' chunks merged by a second launch, in one "
                         "launch, or both side by side")
    a = ap.parse_args(argv)
    device = pick_device(a.device)
    sim = device == "cpu"
    sizes = a.sizes or (["16x1000", "2x8192"] if sim else
                        ["4096x128", "4096x1024", "4096x4096", "1024x16384", "64x65536",
                          "2048x16384"])
    repeat = a.repeat or (2 if sim else 50)
    launch = parse_launch(a.launch)
    backend = runtime.current_backend([torch.empty(0, device=device)])
    print(f"device {device}, backend {backend}, launch {launch or 'default'}, median of "
          f"{repeat}" + ("  (simulator: times are a smoke test only)" if sim else ""))
    print_table(merged(cases, a.column_merge, a.ops), sizes, a.dtype, None, device, repeat,
                launch, with_variant=True, compile_=a.compile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
