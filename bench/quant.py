"""Quantized matvec (decode, M = 1): ours vs torch on the same device, bytes moved, GB/s.

    python bench/quant.py                   # MPS on a Mac, CUDA on NVIDIA, else the simulator
    python bench/quant.py --device cuda --dtype f16 bf16 --shapes 4096x4096 11008x4096

For each weight shape N x K (4-bit, group size 64, MLX layout): our q4_matvec
(examples/q4_matvec.py); torch F.linear with the f16/bf16 weight (what the 4-bit weight
replaces); torch dequantize-then-matmul on the same packed weight (metalforge.quant.dequantize,
then F.linear). Bytes are the schedule's count: packed words + scales + biases + x + y. GB/s is
ours over those bytes; %copy against `copy_` moving as many bytes (the ceiling). On CUDA all
are GPU times of CUDA-graph replays (common.timeit). On the simulator the times are only a
smoke test of the script.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import DTYPES, copy_time, parse_launch, pick_device, plan, timeit  # noqa: E402
from metalforge import quant  # noqa: E402
from q4_matvec import q4_matvec  # noqa: E402

SHAPES = ["4096x4096", "11008x4096", "4096x11008", "14336x4096"]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device")
    ap.add_argument("--dtype", nargs="+", default=["f16", "bf16"], choices=list(DTYPES))
    ap.add_argument("--shapes", nargs="+", default=SHAPES)
    ap.add_argument("--m", type=int, default=1, help="rows of x (1: decode)")
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--launch", nargs="*", help="launch overrides, e.g. rows_per_group=8")
    args = ap.parse_args(argv)
    device = pick_device(args.device)
    launch = parse_launch(args.launch)
    kernel = q4_matvec.with_launch(**launch) if launch else q4_matvec
    repeat = args.repeat if device != "cpu" else 1
    print(f"device {device}, M = {args.m}, 4-bit, group size 64, launch {launch or 'default'}")
    print(f"{'dtype':>5} {'N x K':>11} {'bytes':>10} {'ours us':>8} {'linear us':>9} "
          f"{'deq+mm us':>9} {'copy us':>8} {'ours GB/s':>9} {'%copy':>6} {'linear/ours':>11} "
          f"{'deq+mm/ours':>11}")
    for dname in args.dtype:
        dtype = DTYPES[dname]
        for spec in args.shapes:
            n, k = (int(v) for v in spec.split("x"))
            if device == "cpu":
                n, k = min(n, 64), min(k, 1024)        # the simulator: a smoke test
            w = torch.randn(n, k, dtype=dtype, device=device)
            x = torch.randn(args.m, k, dtype=dtype, device=device)
            wq, s, b = quant.quantize(w, group_size=64, bits=4)
            y = kernel(wq, s, b, x)
            w_hat = quant.dequantize(wq, s, b, group_size=64, bits=4)
            ref = F.linear(x.float(), w_hat.float()).to(dtype)
            torch.testing.assert_close(y, ref, rtol=3e-2, atol=3e-2 * k ** 0.5)
            sched, sizes = plan(kernel, (wq, s, b, x))
            nbytes = sched.traffic(sizes).total
            ours = timeit(lambda: kernel(wq, s, b, x), device, repeat)
            linear = timeit(lambda: F.linear(x, w), device, repeat)
            deq = timeit(lambda: F.linear(x, quant.dequantize(wq, s, b, 64, 4)), device, repeat)
            copy = copy_time(nbytes, device, repeat)
            print(f"{dname:>5} {f'{n}x{k}':>11} {nbytes:>10} {ours * 1e6:>8.1f} "
                  f"{linear * 1e6:>9.1f} {deq * 1e6:>9.1f} {copy * 1e6:>8.1f} "
                  f"{nbytes / ours / 1e9:>9.0f} {100 * copy / ours:>5.0f}% "
                  f"{linear / ours:>10.2f}x {deq / ours:>10.2f}x")


if __name__ == "__main__":
    main()
