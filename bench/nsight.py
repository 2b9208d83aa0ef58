"""One warm call of a case and of torch's counterpart, between cudaProfilerStart and Stop, for
Nsight Compute (`ncu --profile-from-start off`): each kernel of the call is profiled once,
after the warm-up calls that compile and cache it. CUDA only.

    ncu --clock-control none --profile-from-start off --set full -o prof \\
        python3 bench/nsight.py prefill [--length 4096] [--e 128]
    ncu --clock-control none --profile-from-start off --set full -o prof \\
        python3 bench/nsight.py backward [--length 4096] [--e 128]
    ncu --clock-control none --profile-from-start off --set full -o prof \\
        python3 bench/nsight.py matmul [--size 4096]

Cases: `prefill` (examples/attention.py at the cuda target, f16, causal, B = 1, 32 heads,
S = L; SDPA beside it), `backward` (its backward, 16 heads; SDPA's beside it) and `matmul`
(bench/matmul.py's `mf.sum(a * b, axis="K")`, f16; torch.matmul beside it). bench/sass.py
reads the SASS page of the report.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import example  # noqa: E402


def prefill(args) -> tuple:
    attention = example("attention").attention.with_launch(target="cuda")
    q, k, v = (torch.randn(1, 32, args.length, args.e, dtype=torch.float16, device="cuda")
               for _ in range(3))
    scale = args.e ** -0.5
    return (lambda: attention(q, k, v, scale),
            lambda: F.scaled_dot_product_attention(q, k, v, scale=scale, is_causal=True))


def backward(args) -> tuple:
    """The backward of examples/attention.py (causal, f16, 16 heads as
    bench/attention_backward.py) and of SDPA: torch.autograd.grad of an output computed once."""
    from attention_backward import _backward
    attention = example("attention").attention.with_launch(target="cuda")
    q, k, v, dy = (torch.randn(1, 16, args.length, args.e, dtype=torch.float16, device="cuda")
                   for _ in range(4))
    scale = args.e ** -0.5
    return (_backward(lambda a, b, c: attention(a, b, c, scale), (q, k, v), dy),
            _backward(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, scale=scale,
                                                                     is_causal=True),
                      (q, k, v), dy))


def matmul(args) -> tuple:
    from matmul import matmul as mm
    a, b = (torch.randn(args.size, args.size, dtype=torch.float16, device="cuda")
            for _ in range(2))
    ours = mm.with_launch(target="cuda")
    return lambda: ours(a, b), lambda: a @ b.T


CASES = {"prefill": prefill, "backward": backward, "matmul": matmul}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("case", choices=CASES)
    ap.add_argument("--length", type=int, default=4096, help="prefill, backward: S = L")
    ap.add_argument("--e", type=int, default=128, help="prefill, backward: E")
    ap.add_argument("--size", type=int, default=4096, help="matmul: M = N = K")
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench/nsight.py: CUDA only (Nsight Compute profiles the cuda backend)")
    torch.manual_seed(0)
    calls = CASES[args.case](args)
    for _ in range(args.warmup):
        for call in calls:
            call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for call in calls:
        call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
