"""Dropout (mf.rand: Philox-4x32-10): ours vs torch eager and torch.compile, bytes moved, GB/s.

    python bench/dropout.py                  # MPS on a Mac, CUDA on NVIDIA, else the simulator
    python bench/dropout.py --device cuda --dtype f16 f32 --sizes 4096x4096 8192x8192

Rows: `dropout` (examples/dropout.py: x in, y out, the mask drawn from the seed) against
`F.dropout(x, p, training=True)` (eager writes y and a bool mask; torch.compile draws with its
own Philox and writes y); `dropout_bw`, the kernel metalforge's derived backward of dropout is
(dy in, dx out, the same mask drawn again from the seed: `dropout.backward_source` shows it),
against `aten.native_dropout_backward(dy, mask, scale)` (torch reads the stored mask). Bytes
are our schedule's own count (each input element read once, each output written once), so
%copy compares ours with `copy_` moving as many bytes; vs eager / vs compile > 1 means ours is
faster. On CUDA all are timed as GPU time of CUDA-graph replays (see common.timeit). On the
simulator the times are only a smoke test of the script.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import example, parse_launch, pick_device, print_table, table_parser  # noqa: E402

import metalforge as mf  # noqa: E402
from metalforge import runtime  # noqa: E402

P, SEED, STEP = 0.1, 1234, 7


dropout = example("dropout").dropout


@mf.kernel
def dropout_bw(dy: "T[*B, D]", seed: int, p: float = 0.5, offset: int = 0):  # noqa: F821
    """What the derived backward of examples/dropout.py computes: the mask drawn again."""
    keep = mf.rand(seed, like=dy, offset=offset) >= p
    return mf.where(keep, dy / (1 - p), 0.0)


def cases(rows: int, cols: int, dtype, device):
    x = torch.randn(rows, cols, dtype=dtype, device=device)
    dy = torch.randn(rows, cols, dtype=dtype, device=device)
    mask = torch.rand(rows, cols, device=device) >= P
    scale = 1.0 / (1.0 - P)
    yield ("dropout", dropout, (x, SEED, P, STEP),
           lambda: F.dropout(x, P, training=True))
    yield ("dropout_bw", dropout_bw, (dy, SEED, P, STEP),
           lambda: torch.ops.aten.native_dropout_backward(dy, mask, scale))


def main(argv=None) -> int:
    ap = table_parser(__doc__.split("\n")[0], "4096x4096 and 8192x8192 on a GPU; 64x1024 on "
                                              "the simulator")
    a = ap.parse_args(argv)
    device = pick_device(a.device)
    sim = device == "cpu"
    sizes = a.sizes or (["64x1024"] if sim else ["4096x4096", "8192x8192"])
    repeat = a.repeat or (3 if sim else 50)
    launch = parse_launch(a.launch)
    backend = runtime.current_backend([torch.empty(0, device=device)])
    print(f"device {device}, backend {backend}, launch {launch or 'default'}, p = {P}, median "
          f"of {repeat}" + ("  (simulator: times are a smoke test only)" if sim else ""))
    print_table(cases, sizes, a.dtype, a.ops, device, repeat, launch, with_variant=False,
                compile_=a.compile)
    # the derived backward is the kernel timed above: same mask, no mask in memory
    x = torch.randn(4, 33, device=device, requires_grad=True)
    y = dropout(x, SEED, P, STEP)
    y.backward(torch.ones_like(y))
    want = dropout_bw(torch.ones_like(y), SEED, P, STEP)
    same = bool(torch.equal(x.grad, want))
    print(f"\nderived backward == dropout_bw: {same}; backward source draws the mask: "
          f"{'mf_rand_bits(' in dropout.backward_source(x, SEED, P, STEP)}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
