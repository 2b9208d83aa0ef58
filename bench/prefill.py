"""Attention prefill per lowering: ours (examples/attention.py) at each target vs torch's
scaled_dot_product_attention and torch.compile of it, same device.

    python bench/prefill.py --device cuda
    python bench/prefill.py --device cuda --targets cuda apple9 decode --cases 4096:128
    python bench/prefill.py --device cpu            # the simulator: a smoke test, tiny sizes

B = 1, 32 heads (R = 1), S = L, causal, f16 by default; S = L in {1024, 4096}, E in {64, 128}.
One row per lowering of our prefill kernel (schedule/attention/mma.py), chosen by target:
`cuda` (Metal 4 tensor ops: the cuda shim's matmul2d on tensor cores, mma.sync m16n8k16 with
f16 operands and fp32 accumulation), `apple9` (the same kernel on 8x8 simdgroup_matrix
products with half operands, which the cuda shim emulates with shuffles; what an M1-M4 runs),
`apple10` (tensor ops as an M5 runs them: on cuda the same code as `cuda`), and `decode`
(matrix_rows=0: the stage_kv decode kernels, no matrix products: the cuda default before
tensor ops). TFLOP/s counts the 4·S·L·E multiply-adds per head that a causal kernel needs half
of (both sides get the same credit). On CUDA all times are GPU times of CUDA-graph replays
(common.timeit); torch.compile's column compiles SDPA for the call's shapes.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    DTYPES,
    compile_time,
    example,
    parse_launch,
    pick_device,
    ratio,
    timeit,
    us,
)

attention = example("attention").attention
CASES = [(1024, 64), (1024, 128), (4096, 64), (4096, 128)]
TARGETS = ["cuda", "apple9", "decode"]
LOWERING = {"cuda": "tensor ops", "apple10": "tensor ops", "apple9": "simdgroup",
            "decode": "no matrix"}


def kernel_for(target: str, launch: dict):
    """Our attention at a target (its launch option), or the decode kernels (`decode`)."""
    if target == "decode":
        return attention.with_launch(**{**launch, "matrix_rows": 0})
    return attention.with_launch(**{**launch, "target": target})


def case(device: str, dtype, length: int, e: int, targets, repeat: int, launch: dict,
         compiled: bool) -> None:
    heads = 32 if device != "cpu" else 2
    if device == "cpu":
        length = min(length, 40)
    q, k, v = (torch.randn(1, heads, length, e, dtype=dtype, device=device) for _ in range(3))
    scale = e ** -0.5

    def sdpa():
        return F.scaled_dot_product_attention(q, k, v, scale=scale, is_causal=True)
    want = sdpa()
    flops = 4 * heads * length * length * e / 2             # causal: half the products
    theirs = timeit(sdpa, device, repeat)
    comp = compile_time(sdpa, device, repeat, compiled)
    for target in targets:
        kernel = kernel_for(target, launch)
        host = kernel.launches(q, k, v, scale)[0][0].rsplit("_", 1)[-1]
        torch.testing.assert_close(kernel(q, k, v, scale), want, rtol=2e-2, atol=2e-2)
        ours = timeit(lambda: kernel(q, k, v, scale), device, repeat)
        tf = lambda t: f"{flops / t / 1e12:>8.1f}" if t else f"{'-':>8}"  # noqa: E731
        print(f"{length:>5} {e:>4} {target:>8} {LOWERING[target]:>11} {host:>8} "
              f"{ours * 1e6:>9.1f} {theirs * 1e6:>9.1f} {us(comp, 10)} {tf(ours)} {tf(theirs)} "
              f"{tf(comp)} {theirs / ours:>8.3f}x {ratio(comp, ours, 10)}", flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device")
    ap.add_argument("--dtype", default="f16", choices=list(DTYPES))
    ap.add_argument("--targets", nargs="+", default=TARGETS, choices=list(LOWERING))
    ap.add_argument("--cases", nargs="+", help="S:E pairs (S = L), e.g. 1024:128")
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--launch", nargs="*", help="launch overrides, e.g. key_splits=2")
    args = ap.parse_args(argv)
    device = pick_device(args.device)
    repeat = args.repeat if device != "cpu" else 1
    launch = parse_launch(args.launch)
    cases = [tuple(map(int, c.split(":"))) for c in args.cases] if args.cases else CASES
    targets = args.targets
    if device == "cpu":             # the simulator (the cuda target in its layout, family 0)
        cases = cases[:1]
    print(f"device {device}, prefill B=1, 32 heads, S = L, causal, {args.dtype}"
          + (f", launch {launch}" if launch else ""))
    print(f"{'S=L':>5} {'E':>4} {'target':>8} {'lowering':>11} {'kernel':>8} {'ours us':>9} "
          f"{'sdpa us':>9} {'compile us':>10} {'ours TF':>8} {'sdpa TF':>8} {'comp TF':>8} "
          f"{'vs sdpa':>9} {'vs compile':>10}")
    for length, e in cases:
        case(device, DTYPES[args.dtype], length, e, targets, repeat, launch,
             not args.no_compile)


if __name__ == "__main__":
    main()
