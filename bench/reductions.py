"""Reductions: ours vs torch eager on the same device, bytes moved, achieved GB/s.

    python bench/reductions.py                    # MPS tensors on a Mac, else the simulator
    python bench/reductions.py --dtype f32 --sizes 4096x4096 64x65536

Bytes are the schedule's own count for the variant each size launches (register variants read
each input once; the looped variant once per pass; each output is written once), so GB/s is
comparable with the device's copy bandwidth. The variant column says which kernel ran. On the
simulator the times are only a smoke test of the script (Metal code on CPU fibers).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import DTYPES, plan, timeit  # noqa: E402
from metalforge import runtime  # noqa: E402
from add_rms_norm import add_rms_norm  # noqa: E402
from column_sum import column_sum  # noqa: E402
from layer_norm import layer_norm  # noqa: E402
from log_softmax import log_softmax  # noqa: E402
from logsumexp import logsumexp  # noqa: E402
from rms_norm import rms_norm  # noqa: E402
from row_argmax import row_argmax  # noqa: E402
from softmax import softmax  # noqa: E402

def cases(rows: int, cols: int, dtype, device):
    def t(*shape):
        return torch.randn(*shape, dtype=dtype, device=device)
    x, r, w, b = t(rows, cols), t(rows, cols), t(cols), t(cols)
    yield "rms_norm", rms_norm, (x, w), lambda: F.rms_norm(x, (cols,), w, eps=1e-6)
    yield "layer_norm", layer_norm, (x, w, b), lambda: F.layer_norm(x, (cols,), w, b)
    yield "softmax", softmax, (x,), lambda: torch.softmax(x, dim=-1)
    yield "log_softmax", log_softmax, (x,), lambda: torch.log_softmax(x, dim=-1)
    yield "logsumexp", logsumexp, (x,), lambda: torch.logsumexp(x, dim=-1)

    def add_norm():
        h = x + r
        return h, F.rms_norm(h, (cols,), w, eps=1e-6)
    yield "add_rms_norm", add_rms_norm, (x, r, w), add_norm
    yield "row_argmax", row_argmax, (x,), lambda: torch.argmax(x, dim=-1)
    yield "column_sum", column_sum, (x,), lambda: x.sum(dim=0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtype", choices=DTYPES, default="f16")
    ap.add_argument("--sizes", nargs="*", default=None,
                    help="ROWSxCOLS (default: several on MPS; 16x1000 and 2x8192 on the simulator)")
    ap.add_argument("--repeat", type=int, default=None)
    ap.add_argument("--ops", nargs="*", default=None, help="only these ops")
    a = ap.parse_args(argv)
    device = "mps" if torch.backends.mps.is_available() else "cpu"
    sim = device == "cpu"
    sizes = a.sizes or (["16x1000", "2x8192"] if sim else
                        ["4096x128", "4096x1024", "4096x4096", "1024x16384", "64x65536"])
    repeat = a.repeat or (2 if sim else 50)
    dtype = DTYPES[a.dtype]
    backend = runtime.current_backend([torch.empty(0, device=device)])
    print(f"device {device}, backend {backend}, dtype {a.dtype}, median of {repeat}" +
          ("  (simulator: times are a smoke test only)" if sim else ""))
    print(f"{'op':<13} {'shape':>11} {'variant':>8} {'bytes':>11} {'ours us':>10} "
          f"{'torch us':>10} {'ours GB/s':>10} {'torch GB/s':>10}")
    for spec in sizes:
        rows, cols = (int(v) for v in spec.lower().split("x"))
        for name, k, args, eager in cases(rows, cols, dtype, device):
            if a.ops and name not in a.ops:
                continue
            s, sz = plan(k, args)
            var, traffic = s.variant(sz), s.traffic(sz)
            ours = timeit(lambda: k(*args), device, repeat)
            theirs = timeit(eager, device, repeat)
            # torch moves at least the same bytes: report both against our count
            gbs = lambda s: traffic.total / s / 1e9  # noqa: E731
            print(f"{name:<13} {spec:>11} {var:>8} {traffic.total:>11} {ours * 1e6:>10.1f} "
                  f"{theirs * 1e6:>10.1f} {gbs(ours):>10.2f} {gbs(theirs):>10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
