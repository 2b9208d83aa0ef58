"""Attention backward: ours (the kernels metalforge derives for examples/attention.py:
`metalforge.adjoints_attention`) vs the backward of torch's scaled_dot_product_attention, and of
torch's math attention (eager and under torch.compile), same device.

    python bench/attention_backward.py --device cuda
    python bench/attention_backward.py --device cuda --lengths 1024 --heads 32 --no-causal
    python bench/attention_backward.py --device cuda --lowerings tensor fp32
    python bench/attention_backward.py --device cuda --lowerings tensor wide

A row per lowering of our backward (`--lowerings`, default all): "tensor" (the device's own
target: on cuda the 16x16 blocks on tensor ops with f16 operands, 2 simdgroups a threadgroup),
"wide" (launch option grad_simdgroups=4: 4 simdgroups a threadgroup, each simdgroup's own 16
keys or query rows in registers; tensor-op targets, else as "tensor"), "apple9" (the same blocks on
simdgroup_matrix products, half operands), "fp32" (launch option grad_fp32: the fp32 8x8
simdgroup_matrix kernels); SDPA, eager and torch.compile timed once per length.

f16, B = 1, 16 heads (R = 1), E = 128, S = L in {1024, 4096}, causal unless --no-causal. The
time is that of torch.autograd.grad(out, (q, k, v), dy) on an output computed once with
requires_grad (the backward alone: for ours its four kernels: the forward again with the
rows' logsumexp, delta = rowsum(dO * O), dq, dk/dv). TFLOP/s counts the backward's 5
products of S x L x E multiply-adds per head (10 S L E flops), half of them under a causal
mask (both sides get the same credit); "ours/sdpa" is SDPA's time over ours (1.0: as fast);
"rel err": the largest difference of our dq, dk, dv from SDPA's over its largest value.
Peak memory: what the backward allocates beyond the inputs (CUDA only). On CUDA the times are
CUDA-event times of `--repeat` calls after warm-up (autograd's host work included); on the
simulator (--device cpu) this is a smoke test at small sizes.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch._functorch.config
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import DTYPES, attention_parser, example, pick_device, sync, timeit  # noqa: E402

_ex = example("attention")
attention, causal_mask = _ex.attention, _ex.causal_mask


def _math(q, k, v, scale, mask):
    s = (q @ k.transpose(-1, -2)).float() * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return (torch.softmax(s, -1).to(q.dtype)) @ v


def _time(fn, device: str, repeat: int) -> float:
    """Seconds per call: CUDA events around `repeat` calls (CUDA: a backward is not captured
    in a CUDA graph here), else common.timeit's median of synchronised calls."""
    if device != "cuda":
        return timeit(fn, device, repeat, warmup=2)
    for _ in range(2):
        fn()
    sync(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeat):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / repeat


def _peak(fn, device: str) -> int:
    """Bytes the call allocates at its peak beyond what was allocated before (CUDA), else 0."""
    if device != "cuda":
        return 0
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def _backward(forward, inputs, dy):
    """A closure timing the backward of forward(*inputs) alone (the graph kept)."""
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    out = forward(*leaves)
    return lambda: torch.autograd.grad(out, leaves, dy, retain_graph=True)


# the backward's lowerings (a row each): launch options of the call
LOWERINGS = {
    "tensor": {},                                   # the device's target: tensor ops on cuda
    "wide": {"grad_simdgroups": 4},                 # the same, 4 simdgroups a threadgroup with
                                                    # their own rows in registers (tensor ops)
    "wide32": {"grad_simdgroups": 4, "grad_step_blocks": 2},   # the same, 32 rows / keys a step
    "apple9": {"target": "apple9"},                 # 16x16 blocks on simdgroup_matrix (half)
    "fp32": {"grad_fp32": True},                    # the old fp32 8x8 simdgroup_matrix kernels
}


def case(device: str, dtype, length: int, heads: int, e: int, causal: bool, repeat: int,
         compiled: bool, lowerings: list[str]) -> None:
    q, k, v, dy = (torch.randn(1, heads, length, e, dtype=dtype, device=device)
                   for _ in range(4))
    scale = e ** -0.5
    mask = causal_mask(length, length, device) if causal else None
    sides = {
        "sdpa": lambda a, b, c: F.scaled_dot_product_attention(a, b, c, scale=scale,
                                                               is_causal=causal),
        "eager": lambda a, b, c: _math(a, b, c, scale, mask)}
    if compiled:
        # the timing loop runs one compiled backward many times (retain_graph=True), which
        # AOTAutograd's donated buffers forbid
        torch._functorch.config.donated_buffer = False
        sides["compile"] = torch.compile(lambda a, b, c: _math(a, b, c, scale, mask))
    runs = {n: _backward(f, (q, k, v), dy) for n, f in sides.items()}
    want = runs["sdpa"]()
    times = {n: _time(r, device, repeat) for n, r in runs.items()}
    peaks = {n: _peak(r, device) for n, r in runs.items()}
    flops = 10 * heads * length * length * e * (0.5 if causal else 1.0)
    for low in lowerings:
        kernel = attention.with_launch(**LOWERINGS[low]) if LOWERINGS[low] else attention
        ours = _backward(lambda a, b, c: kernel(a, b, c, scale, causal=causal), (q, k, v), dy)
        got = ours()
        err = max(float((a.float() - b.float()).abs().max()
                        / b.float().abs().max().clamp_min(1e-6))
                  for a, b in zip(got, want))      # the largest error against SDPA's, relative
        if not err < 5e-2:
            print(f"  WARNING: ours ({low}) differs from SDPA's backward by {err:.3g}")
        t = {"ours": _time(ours, device, repeat), **times}
        p = {"ours": _peak(ours, device), **peaks}
        cols = " ".join(f"{t[n] * 1e3:>9.2f}" for n in t)
        tf = " ".join(f"{flops / t[n] / 1e12:>7.2f}" for n in t)
        mem = " ".join(f"{p[n] / 2 ** 20:>7.0f}" for n in t)
        print(f"{length:>6} {e:>4} {str(causal):>6} {low:>7} {cols} {tf} {mem} "
              f"{t['sdpa'] / t['ours']:>9.3f}x {err:>8.1e}")


def main(argv=None) -> None:
    ap = attention_parser(__doc__.split("\n")[0])
    ap.add_argument("--no-causal", dest="causal", action="store_false")
    ap.add_argument("--lowerings", nargs="+", default=list(LOWERINGS), choices=list(LOWERINGS),
                    help="our backward's lowerings, a row each (default: all)")
    args = ap.parse_args(argv)
    device = pick_device(args.device)
    heads, e, lengths, repeat = args.heads, args.e, args.lengths, args.repeat
    if device == "cpu":                         # the simulator: a smoke test
        heads, e, lengths, repeat = 2, 32, [min(n, 48) for n in lengths[:1]], 1
    names = ["ours", "sdpa", "eager"] + (["compile"] if args.compile and device != "cpu"
                                         else [])
    print(f"attention backward on {device}: B=1, {heads} heads, E={e}, {args.dtype}; "
          "ms, TFLOP/s, peak MiB per side")
    print(f"{'S=L':>6} {'E':>4} {'causal':>6} {'ours':>7} "
          + " ".join(f"{n + ' ms':>9}" for n in names)
          + " " + " ".join(f"{n[:7]:>7}" for n in names) + " "
          + " ".join(f"{n[:5] + ' MiB':>7}" for n in names) + f" {'ours/sdpa':>9} "
          f"{'rel err':>8}")
    for length in lengths:
        case(device, DTYPES[args.dtype], length, heads, e, args.causal, repeat,
             args.compile and device != "cpu", args.lowerings)


if __name__ == "__main__":
    main()
