"""Attention: ours (examples/attention.py) vs torch's scaled_dot_product_attention, same device.

    python bench/attention.py                       # MPS on a Mac, CUDA on NVIDIA, else the sim
    python bench/attention.py --device cuda --launch threads_per_group=512 key_splits=32
    python bench/attention.py --device cuda --launch stage_kv=0 --splits 0 32 64 128 --no-prefill
    python bench/attention.py --device cuda --no-prefill --variants '' 'key_splits=128' \
        'stage_kv=0 lane_scores=0'                   # decode launch options side by side

Decode: B=1, 32 query heads over 8 key/value heads (GQA), one query, E=128, L in {4096, 16384,
65536}, f16: the K/V bytes (read once) over the time, as GB/s and as a share of what `copy_`
achieves moving as many bytes; torch: SDPA with enable_gqa=True. Paged decode: the same
shape with K/V in a cache of 16-row blocks in random order read through a block table
(examples/paged_attention.py; no torch equivalent, so ours and copy only). Window decode:
32 heads, E=128, a causal sliding window of 4096 keys with a soft cap
(examples/sliding_window_softcap.py), its bytes the schedule's own count (`schedule.traffic`
with the window's value: the window's K/V, however long L is); ours and copy. Prefill: S = L in
{1024, 4096}, causal, E in {64, 128}, 32 heads (R = 1): TFLOP/s counts the 4·S·L·E
multiply-adds per head that a causal kernel needs half of (so both sides get the same
credit). On CUDA all times are GPU times of CUDA-graph replays (common.timeit); on the
simulator this is a smoke test only.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import DTYPES, copy_time, example, parse_launch, pick_device, plan, timeit  # noqa: E402

_ex, _pex, _wex = (example(n) for n in ("attention", "paged_attention",
                                          "sliding_window_softcap"))
attention, causal_mask = _ex.attention, _ex.causal_mask
paged_attention, torch_paged_attention = _pex.paged_attention, _pex.torch_paged_attention
window_softcap, torch_window_softcap = _wex.window_softcap, _wex.torch_window_softcap

DECODE = [4096, 16384, 65536]
PREFILL = [(1024, 64), (1024, 128), (4096, 64), (4096, 128)]


def decode(device: str, dtype, lengths, repeat: int, launch: dict) -> None:
    kernel = attention.with_launch(**launch) if launch else attention
    print(f"decode: B=1, 32 query heads / 8 kv heads, S=1, E=128, causal, {dtype}")
    print(f"{'L':>6} {'K/V bytes':>11} {'ours us':>8} {'sdpa us':>8} {'copy us':>8} "
          f"{'ours GB/s':>9} {'%copy':>6} {'sdpa/ours':>9}")
    for length in lengths:
        heads, kv, e = (32, 8, 128) if device != "cpu" else (4, 2, 64)
        if device == "cpu":
            length = min(length, 300)
        q = torch.randn(1, heads, 1, e, dtype=dtype, device=device)
        k = torch.randn(1, kv, length, e, dtype=dtype, device=device)
        v = torch.randn(1, kv, length, e, dtype=dtype, device=device)
        want = F.scaled_dot_product_attention(q, k, v, scale=e ** -0.5, enable_gqa=True)
        torch.testing.assert_close(kernel(q, k, v, e ** -0.5), want, rtol=2e-2, atol=2e-2)
        nbytes = 2 * k.numel() * k.element_size()
        ours = timeit(lambda: kernel(q, k, v, e ** -0.5), device, repeat)
        theirs = timeit(lambda: F.scaled_dot_product_attention(q, k, v, scale=e ** -0.5,
                                                               enable_gqa=True), device, repeat)
        copy = copy_time(nbytes, device, repeat)
        print(f"{length:>6} {nbytes:>11} {ours * 1e6:>8.1f} {theirs * 1e6:>8.1f} "
              f"{copy * 1e6:>8.1f} {nbytes / ours / 1e9:>9.0f} {100 * copy / ours:>5.0f}% "
              f"{theirs / ours:>8.2f}x")


def paged(device: str, dtype, lengths, repeat: int, launch: dict) -> None:
    """The decode shape again, K/V in a paged cache (blocks of 16 rows in random order)."""
    kernel = paged_attention.with_launch(**launch) if launch else paged_attention
    print(f"paged decode: B=1, 32 query heads / 8 kv heads, E=128, blocks of 16, {dtype}")
    print(f"{'L':>6} {'K/V bytes':>11} {'ours us':>8} {'copy us':>8} {'ours GB/s':>9} "
          f"{'%copy':>6}")
    for length in lengths:
        heads, kv, e = (32, 8, 128) if device != "cpu" else (4, 2, 64)
        if device == "cpu":
            length = min(length, 320)
        blocks = length // 16
        q = torch.randn(1, heads, e, dtype=dtype, device=device)
        k, v = (torch.randn(blocks * 16, kv, e, dtype=dtype, device=device) for _ in range(2))
        table = torch.randperm(blocks, device=device).to(torch.int32)[None]
        lens = torch.tensor([length], dtype=torch.int32, device=device)
        want = torch_paged_attention(q, k, v, table, lens, e ** -0.5)
        torch.testing.assert_close(kernel(q, k, v, table, lens, e ** -0.5), want,
                                   rtol=2e-2, atol=2e-2)
        nbytes = 2 * k.numel() * k.element_size()
        ours = timeit(lambda: kernel(q, k, v, table, lens, e ** -0.5), device, repeat)
        copy = copy_time(nbytes, device, repeat)
        print(f"{length:>6} {nbytes:>11} {ours * 1e6:>8.1f} {copy * 1e6:>8.1f} "
              f"{nbytes / ours / 1e9:>9.0f} {100 * copy / ours:>5.0f}%")


def window(device: str, dtype, lengths, repeat: int, launch: dict, width: int = 4096) -> None:
    """Decode under a causal sliding window: the bytes are what the schedule counts for the
    window (its K/V rows, q and the outputs), checked against torch on the window's keys."""
    kernel = window_softcap.with_launch(**launch) if launch else window_softcap
    print(f"window decode: B=1, 32 heads, S=1, E=128, window {width}, soft cap 30, {dtype}")
    print(f"{'L':>6} {'bytes':>11} {'ours us':>8} {'copy us':>8} {'ours GB/s':>9} {'%copy':>6}")
    for length in lengths:
        heads, e = (32, 128) if device != "cpu" else (2, 32)
        if device == "cpu":
            length, width = min(length, 300), 40
        q = torch.randn(1, heads, 1, e, dtype=dtype, device=device)
        k, v = (torch.randn(1, heads, length, e, dtype=dtype, device=device) for _ in range(2))
        args = (q, k, v, e ** -0.5, width, 30.0)
        want = torch_window_softcap(q.cpu(), k[:, :, -width:].cpu(), v[:, :, -width:].cpu(),
                                    e ** -0.5, width, 30.0)
        torch.testing.assert_close(kernel(*args).cpu(), want, rtol=2e-2, atol=2e-2)
        schedule, sizes = plan(kernel, args)
        nbytes = schedule.traffic(sizes, {"window": width}).total
        ours = timeit(lambda: kernel(*args), device, repeat)
        copy = copy_time(nbytes, device, repeat)
        print(f"{length:>6} {nbytes:>11} {ours * 1e6:>8.1f} {copy * 1e6:>8.1f} "
              f"{nbytes / ours / 1e9:>9.0f} {100 * copy / ours:>5.0f}%")


def prefill(device: str, dtype, cases, repeat: int, launch: dict) -> None:
    kernel = attention.with_launch(**launch) if launch else attention
    print(f"prefill: B=1, 32 heads, S = L, causal, {dtype}")
    print(f"{'S=L':>6} {'E':>4} {'ours us':>9} {'sdpa us':>9} {'ours TFLOP/s':>12} "
          f"{'sdpa TFLOP/s':>12} {'sdpa/ours':>9}")
    for length, e in cases:
        heads = 32 if device != "cpu" else 2
        if device == "cpu":
            length = min(length, 40)
        q, k, v = (torch.randn(1, heads, length, e, dtype=dtype, device=device)
                   for _ in range(3))
        want = F.scaled_dot_product_attention(q, k, v, scale=e ** -0.5, is_causal=True)
        torch.testing.assert_close(kernel(q, k, v, e ** -0.5), want, rtol=2e-2, atol=2e-2)
        flops = 4 * heads * length * length * e / 2             # causal: half the products
        ours = timeit(lambda: kernel(q, k, v, e ** -0.5), device, repeat)
        theirs = timeit(lambda: F.scaled_dot_product_attention(q, k, v, scale=e ** -0.5,
                                                               is_causal=True), device, repeat)
        print(f"{length:>6} {e:>4} {ours * 1e6:>9.1f} {theirs * 1e6:>9.1f} "
              f"{flops / ours / 1e12:>12.2f} {flops / theirs / 1e12:>12.2f} "
              f"{theirs / ours:>8.2f}x")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device")
    ap.add_argument("--dtype", default="f16", choices=list(DTYPES))
    ap.add_argument("--lengths", nargs="+", type=int, default=DECODE)
    ap.add_argument("--no-prefill", action="store_true")
    ap.add_argument("--no-decode", action="store_true")
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--launch", nargs="*", help="launch overrides, e.g. key_splits=16 or "
                    "stage_kv=0 (keys read by each simdgroup, not staged)")
    ap.add_argument("--splits", nargs="+", type=int,
                    help="decode and paged decode once per key_splits value (0: chosen per "
                         "call), on top of --launch")
    ap.add_argument("--variants", nargs="+", metavar="'K=V ...'",
                    help="decode rows once per variant, each a quoted list of launch options "
                         "on top of --launch ('' for none): side by side in one run, e.g. '' "
                         "'key_splits=128' 'stage_kv=0 lane_scores=0'")
    ap.add_argument("--no-window", action="store_true")
    args = ap.parse_args(argv)
    device = pick_device(args.device)
    repeat = args.repeat if device != "cpu" else 1
    launch = parse_launch(args.launch)
    print(f"device {device}" + (f", launch {launch}" if launch else ""))
    variants = [parse_launch(v.split()) for v in args.variants or [""]]
    for splits in [] if args.no_decode else args.splits or [None]:
        for variant in variants:
            each = {**launch, **variant}
            each = each if splits is None else {**each, "key_splits": splits}
            if splits is not None or len(variants) > 1:
                print(f"launch {each or '(defaults)'}"
                      + (" (key_splits chosen per call)" if splits == 0 else ""))
            decode(device, DTYPES[args.dtype], args.lengths, repeat, each)
            paged(device, DTYPES[args.dtype], args.lengths, repeat, each)
            if not args.no_window:
                window(device, DTYPES[args.dtype], args.lengths, repeat, each)
    if not args.no_prefill:
        prefill(device, DTYPES[args.dtype], PREFILL, repeat, launch)


if __name__ == "__main__":
    main()
