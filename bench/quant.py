"""Quantized matvec (decode, M = 1): ours vs torch on the same device, bytes moved, GB/s.

    python bench/quant.py                   # MPS on a Mac, CUDA on NVIDIA, else the simulator
    python bench/quant.py --device cuda --dtype f16 bf16 --shapes 4096x4096 11008x4096
    python bench/quant.py --dequantize [--dtype f16 bf16] [--shapes ...]
    python bench/quant.py --sweep           # one row per launch setting (the qmv levers)
    python bench/quant.py --sweep --dtype f16 --rows 1 2 4 --splits 1 4 8 --threads 256 512
    python bench/quant.py --matmul --device cuda     # the tiled kernel (qmm), M = 64 .. 512
    python bench/quant.py --matmul --device cuda --tiles 64x32 64x64 --qmm-splits 1 2 4
    python bench/quant.py --matmul --device cuda --lowerings cuda --tiles default 64x32 128x128

For each weight shape N x K (4-bit, group size 64, MLX layout): our q4_matvec
(examples/q4_matvec.py); torch F.linear with the f16/bf16 weight (what the 4-bit weight
replaces); torch dequantize-then-matmul on the same packed weight (metalforge.quant.dequantize,
then F.linear). Bytes are the schedule's count: packed words + scales + biases + x + y. GB/s is
ours over those bytes; %copy against `copy_` moving as many bytes (the ceiling). On CUDA all
are GPU times of CUDA-graph replays (common.timeit). On the simulator the times are only a
smoke test of the script.

--sweep times our kernel under every combination of the qmv schedule's launch levers
(schedule/quant/): rows_per_group (--rows), k_splits (--splits; every call split that many
ways, split_grid 0), threads_per_group
(--threads) and vector_width (--vector-width); combinations the policy refuses (threads per
group not a multiple of 32 x k_splits) are listed as skipped. Each row: µs, GB/s, % of the copy_
ceiling and F.linear time / ours; F.linear and copy_ are timed once per shape. Every setting's
result is checked against F.linear on the dequantized weight first. The best setting of each
shape is printed last; --csv also writes the rows to a file.

--matmul times the tiled kernel (qmm: many rows of x, schedule/quant/blocked.py) at M = 64,
128, 256, 512 (--ms) on N x K = 4096x4096 and 14336x4096 (--shapes), f16 (--dtype), one row
per lowering: target `cuda` (Metal 4 tensor ops; the cuda backend runs them on tensor cores),
`apple9` (8x8 simdgroup_matrix products with half operands, which the cuda shim emulates) and
`fp32` (the fp32 kernel of schedule/quant/tiled.py, launch option qmm_fp32: the table's before
the matrix block; register tiles on the cuda backend), each tile of --tiles (rows of x x weight
rows: launch options qmm_tile_m, qmm_tile_n), step of --tile-k (qmm_tile_k) and teams of
--qmm-splits (qmm_splits: teams of 4 simdgroups in a threadgroup, each taking every T-th step
of K); --no-prefetch adds each without its loads a step ahead (qmm_prefetch off). A named tile
runs at every M (qmm_wide_rows=0); the tile `default` is the launch table's choice by M (the
cuda backend's: qmm's 64 x 32 tiles in 4 teams, qmm_wide's 128 x 128 from M = 128), and each
row prints the kernel it launched (qmm or qmm_wide). Against
F.linear on the f16 weight (what the 4-bit weight replaces) and torch.compile of it. TFLOP/s
counts 2 M N K. On the simulator (--device cpu) the shapes and M shrink and `cuda` runs as
apple10 (a smoke test of the script).

--cold calls each kernel (ours, F.linear, dequantize-then-matmul, copy_) on one of several
copies of its inputs in turn, together more than twice the GPU's last-level cache, so that no
call finds its weights in the cache: what decode sees, where each layer's weights are read once
per token. Without it every call reads the same weights, which stay in the H100's 50 MB L2
whenever they fit (all four default shapes).
"""
from __future__ import annotations

import argparse
import csv
import itertools
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))          # this checkout's metalforge, not another installed one

from common import (  # noqa: E402
    DTYPES,
    cold_copies,
    compile_time,
    copy_time,
    launched_variant,
    parse_launch,
    pick_device,
    plan,
    ratio,
    timeit,
    us,
)
from dequantize import dequantize  # noqa: E402
from q4_matvec import q4_matvec  # noqa: E402

from metalforge import quant  # noqa: E402
from metalforge.schedule.policy import LaunchError  # noqa: E402

SHAPES = ["4096x4096", "11008x4096", "4096x11008", "14336x4096"]


def _inputs(spec: str, m: int, dtype, device: str):
    n, k = (int(v) for v in spec.split("x"))
    if device == "cpu":
        n, k = min(n, 64), min(k, 1024)        # the simulator: a smoke test
    g = torch.Generator().manual_seed(n * 31 + k)
    w = torch.randn(n, k, generator=g).to(dtype).to(device)
    x = torch.randn(m, k, generator=g).to(dtype).to(device)
    wq, s, b = quant.quantize(w, group_size=64, bits=4)
    return n, k, w, x, (wq, s, b, x)


def _check(y, args, k: int, dtype) -> None:
    wq, s, b, x = args
    w_hat = quant.dequantize(wq, s, b, group_size=64, bits=4)
    ref = F.linear(x.float(), w_hat.float()).to(dtype)
    torch.testing.assert_close(y, ref, rtol=3e-2, atol=3e-2 * k ** 0.5)


def _turns(args, tensors: tuple, device: str) -> list[tuple]:
    """The copies of `tensors` that the timed calls take in turn: with --cold enough of them
    that no call finds its inputs in the cache (`cold_copies`), else just `tensors`."""
    n = cold_copies(sum(t.nbytes for t in tensors), device) if args.cold else 1
    return [tensors] + [tuple(t.clone() for t in tensors) for _ in range(n - 1)]


def dequantize_table(args, device: str, repeat: int) -> None:
    """examples/dequantize.py (an elementwise kernel unpacking words) against the same
    arithmetic in plain torch (metalforge.quant.dequantize)."""
    print("dequantize, 4-bit, group size 64 (bytes: words + scales + biases + output)")
    print(f"{'dtype':>5} {'N x K':>11} {'bytes':>10} {'ours us':>8} {'torch us':>9} "
          f"{'copy us':>8} {'ours GB/s':>9} {'%copy':>6} {'torch/ours':>10}")
    for dname in args.dtype:
        dtype = DTYPES[dname]
        for spec in args.shapes:
            n, k, w, _, (wq, s, b, _) = _inputs(spec, 1, dtype, device)
            torch.testing.assert_close(dequantize(wq, s, b), quant.dequantize(wq, s, b, 64, 4),
                                       rtol=2e-2, atol=2e-2)   # torch rounds twice
            sched, sizes = plan(dequantize, (wq, s, b))
            nbytes = sched.traffic(sizes).total
            ours = timeit(lambda: dequantize(wq, s, b), device, repeat)
            theirs = timeit(lambda: quant.dequantize(wq, s, b, 64, 4), device, repeat)
            copy = copy_time(nbytes, device, repeat)
            print(f"{dname:>5} {f'{n}x{k}':>11} {nbytes:>10} {ours * 1e6:>8.1f} "
                  f"{theirs * 1e6:>9.1f} {copy * 1e6:>8.1f} {nbytes / ours / 1e9:>9.0f} "
                  f"{100 * copy / ours:>5.0f}% {theirs / ours:>9.2f}x")


def sweep(args, device: str, repeat: int) -> None:
    """One row per launch setting and shape: the levers of the qmv schedule."""
    settings = [dict(rows_per_group=r, k_splits=s, split_grid=0, threads_per_group=t,
                     vector_width=v)
                for r, s, t, v in itertools.product(args.rows, args.splits, args.threads,
                                                    args.vector_width)]
    print(f"device {device}, M = {args.m}, 4-bit, group size 64; sweep of {len(settings)} "
          f"launch settings (rows_per_group x k_splits x threads_per_group x vector_width)"
          f"{'; cold (inputs not in the cache)' if args.cold else ''}")
    head = (f"{'dtype':>5} {'N x K':>11} {'rows':>4} {'split':>5} {'tpg':>4} {'vw':>2} "
            f"{'bytes':>10} {'ours us':>8} {'GB/s':>6} {'%copy':>6} {'linear/ours':>11}")
    print(head)
    table: list[dict] = []
    for dname in args.dtype:
        dtype = DTYPES[dname]
        for spec in args.shapes:
            n, k, w, x, kargs = _inputs(spec, args.m, dtype, device)
            ws = _turns(args, (w,), device)
            qs = _turns(args, kargs[:3], device)
            linear = timeit([lambda w=w: F.linear(x, *w) for w in ws], device, repeat)
            copy = None
            for st in settings:
                tag = (f"{dname:>5} {f'{n}x{k}':>11} {st['rows_per_group']:>4} "
                       f"{st['k_splits']:>5} {st['threads_per_group']:>4} "
                       f"{st['vector_width']:>2}")
                try:
                    kernel = q4_matvec.with_launch(**st)
                    _check(kernel(*kargs), kargs, k, dtype)
                except LaunchError as e:
                    why = str(e).split("policy: ")[-1].split(" (launch options")[0]
                    print(f"{tag} skipped: {why}", flush=True)
                    continue
                sched, sizes = plan(kernel, kargs)
                nbytes = sched.traffic(sizes).total
                if copy is None:
                    copy = copy_time(nbytes, device, repeat, cold=args.cold)
                ours = timeit([lambda q=q: kernel(*q, x) for q in qs], device, repeat)
                rec = dict(dtype=dname, n=n, k=k, **st, bytes=nbytes, ours_us=ours * 1e6,
                           gbs=nbytes / ours / 1e9, pct_copy=100 * copy / ours,
                           linear_over_ours=linear / ours, linear_us=linear * 1e6,
                           copy_us=copy * 1e6)
                table.append(rec)
                print(f"{tag} {nbytes:>10} {rec['ours_us']:>8.1f} {rec['gbs']:>6.0f} "
                      f"{rec['pct_copy']:>5.0f}% {rec['linear_over_ours']:>10.2f}x", flush=True)
    print("\nbest setting per shape (least time):")
    for key, group in itertools.groupby(table, key=lambda r: (r["dtype"], r["n"], r["k"])):
        best = min(group, key=lambda r: r["ours_us"])
        print(f"{key[0]:>5} {f'{key[1]}x{key[2]}':>11}: rows_per_group={best['rows_per_group']} "
              f"k_splits={best['k_splits']} threads_per_group={best['threads_per_group']} "
              f"vector_width={best['vector_width']}: {best['ours_us']:.1f} us, "
              f"{best['pct_copy']:.0f}% of copy, {best['linear_over_ours']:.2f}x F.linear")
    if args.csv and table:
        with open(args.csv, "w", newline="") as f:
            out = csv.DictWriter(f, fieldnames=list(table[0]))
            out.writeheader()
            out.writerows(table)
        print(f"wrote {len(table)} rows to {args.csv}")


MATMUL_SHAPES = ["4096x4096", "14336x4096"]
LOWERINGS = {"cuda": {"target": "cuda"}, "apple9": {"target": "apple9"},
             "fp32": {"qmm_fp32": True}}


def _matmul_kernels(args, device: str) -> list[tuple[str, str, object]]:
    """(lowering, tile, kernel) for each lowering of --lowerings, tile of --tiles and teams of
    --qmm-splits (the fp32 kernel has one tile: its own); settings the policy refuses (tiles
    and teams over the threadgroup memory) are listed as skipped."""
    out = []
    for name in args.lowerings:
        opts = dict(LOWERINGS[name])
        if device == "cpu" and opts.get("target") == "cuda":
            opts["target"] = "apple10"           # the simulator has no cuda target
        settings = [("32x32", {})] if name == "fp32" else [
            ("default", {}) if tile == "default" else
            (f"{tile}x{bk}/{t}", {"qmm_tile_m": int(tile.split("x")[0]),
                                  "qmm_tile_n": int(tile.split("x")[1]), "qmm_tile_k": bk,
                                  "qmm_splits": t, "qmm_wide_rows": 0})
            for tile in args.tiles
            for bk, t in ([(0, 0)] if tile == "default" else
                          itertools.product(args.tile_k, args.qmm_splits))]
        if name != "fp32" and args.no_prefetch:     # the old staging beside each setting
            settings += [(f"{tag}-np", {**opts, "qmm_prefetch": False})
                         for tag, opts in list(settings)]
        for tag, tiles in settings:
            launch = {**parse_launch(args.launch), **opts, **tiles}
            kernel = q4_matvec.with_launch(**launch)
            try:
                kernel.source(T="f16")
            except LaunchError as e:
                print(f"  {name} {tag} skipped: {str(e).split('policy: ')[-1][:100]}")
                continue
            out.append((name, tag, kernel))
    return out


def matmul_table(args, device: str, repeat: int) -> None:
    """The tiled kernel (qmm) per lowering, tile and teams against F.linear and
    torch.compile."""
    ms = [min(m, 70) for m in args.ms] if device == "cpu" else args.ms
    kernels = _matmul_kernels(args, device)
    print(f"device {device}, tiled kernel (qmm), 4-bit, group size 64, launch "
          f"{parse_launch(args.launch) or 'default'}; tile: rows of x x weight rows x K a step "
          f"/ teams")
    print(f"{'dtype':>5} {'N x K':>11} {'M':>4} {'lowering':>8} {'tile':>12} {'variant':>8} "
          f"{'ours us':>8} "
          f"{'linear us':>9} {'compile us':>10} {'TFLOP/s':>7} {'linear/ours':>11} "
          f"{'compile/ours':>12}")
    for dname in args.dtype:
        dtype = DTYPES[dname]
        for spec, m in itertools.product(args.shapes, ms):
            n, k, w, x, kargs = _inputs(spec, m, dtype, device)
            linear = timeit(lambda: F.linear(x, w), device, repeat)
            comp = compile_time(lambda: F.linear(x, w), device, repeat, not args.no_compile)
            for name, tile, kernel in kernels:
                _check(kernel(*kargs), kargs, k, dtype)
                variant = launched_variant(plan(kernel, kargs)[0], kernel, kargs)
                assert variant in ("qmm", "qmm_wide"), variant
                ours = timeit(lambda kernel=kernel: kernel(*kargs), device, repeat)
                print(f"{dname:>5} {f'{n}x{k}':>11} {m:>4} {name:>8} {tile:>12} {variant:>8} "
                      f"{ours * 1e6:>8.1f} {linear * 1e6:>9.1f} {us(comp, 10)} "
                      f"{2 * m * n * k / ours / 1e12:>7.1f} {ratio(linear, ours, 11)} "
                      f"{ratio(comp, ours, 12)}", flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device")
    ap.add_argument("--dtype", nargs="+", default=["f16", "bf16"], choices=list(DTYPES))
    ap.add_argument("--shapes", nargs="+", default=SHAPES)
    ap.add_argument("--m", type=int, default=1, help="rows of x (1: decode)")
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--launch", nargs="*", help="launch overrides, e.g. rows_per_group=8")
    ap.add_argument("--sweep", action="store_true",
                    help="time every combination of --rows, --splits, --threads, --vector-width")
    ap.add_argument("--rows", nargs="+", type=int, default=[1, 2, 4, 8],
                    help="--sweep: rows_per_group values")
    ap.add_argument("--splits", nargs="+", type=int, default=[1, 2, 4, 8],
                    help="--sweep: k_splits values")
    ap.add_argument("--threads", nargs="+", type=int, default=[256],
                    help="--sweep: threads_per_group values (multiples of 32 x k_splits)")
    ap.add_argument("--vector-width", nargs="+", type=int, default=[4],
                    help="--sweep: vector_width values (packed words per load, 1, 2 or 4)")
    ap.add_argument("--csv", help="--sweep: also write the rows to this CSV file")
    ap.add_argument("--cold", action="store_true",
                    help="each call on another copy of its inputs (none found in the cache)")
    ap.add_argument("--dequantize", action="store_true",
                    help="time examples/dequantize.py against torch instead")
    ap.add_argument("--matmul", action="store_true",
                    help="time the tiled kernel (qmm) at M = --ms, one row per lowering x tile")
    ap.add_argument("--ms", nargs="+", type=int, default=[64, 128, 256, 512],
                    help="--matmul: rows of x")
    ap.add_argument("--tiles", nargs="+", default=["default", "64x32", "64x64", "128x128"],
                    help="--matmul: tiles, rows of x x weight rows (each 32, 64 or 128; "
                         "'default': the launch table's qmm / qmm_wide by M)")
    ap.add_argument("--tile-k", nargs="+", type=int, default=[32],
                    help="--matmul: values of K a step (qmm_tile_k: 32, 64 or 128)")
    ap.add_argument("--qmm-splits", nargs="+", type=int, default=[1, 4],
                    help="--matmul: teams of 4 simdgroups splitting K (1, 2 or 4)")
    ap.add_argument("--lowerings", nargs="+", default=list(LOWERINGS), choices=list(LOWERINGS),
                    help="--matmul: cuda (tensor ops), apple9 (simdgroup_matrix), fp32 (the "
                         "fp32 kernel)")
    ap.add_argument("--no-prefetch", action="store_true",
                    help="--matmul: also each setting without loads a step ahead (qmm_prefetch "
                         "off: rows tagged -np)")
    ap.add_argument("--no-compile", action="store_true",
                    help="--matmul: skip the torch.compile column")
    args = ap.parse_args(argv)
    device = pick_device(args.device)
    repeat = args.repeat if device != "cpu" else 1
    if args.dequantize:
        dequantize_table(args, device, repeat)
        return
    if args.matmul:
        if args.shapes == SHAPES:
            args.shapes = MATMUL_SHAPES
        if args.dtype == ["f16", "bf16"]:
            args.dtype = ["f16"]
        matmul_table(args, device, repeat)
        return
    if args.sweep:
        if args.launch:
            ap.error("--sweep sets the launch options itself; leave out --launch")
        sweep(args, device, repeat)
        return
    launch = parse_launch(args.launch)
    kernel = q4_matvec.with_launch(**launch) if launch else q4_matvec
    print(f"device {device}, M = {args.m}, 4-bit, group size 64, launch {launch or 'default'}"
          f"{', cold (inputs not in the cache)' if args.cold else ''}")
    print(f"{'dtype':>5} {'N x K':>11} {'kernel':>9} {'bytes':>10} {'ours us':>8} "
          f"{'linear us':>9} {'deq+mm us':>9} {'copy us':>8} {'ours GB/s':>9} {'%copy':>6} "
          f"{'linear/ours':>11} {'deq+mm/ours':>11}")
    for dname in args.dtype:
        dtype = DTYPES[dname]
        for spec in args.shapes:
            n, k, w, x, (wq, s, b, _) = _inputs(spec, args.m, dtype, device)
            _check(kernel(wq, s, b, x), (wq, s, b, x), k, dtype)
            sched, sizes = plan(kernel, (wq, s, b, x))
            nbytes = sched.traffic(sizes).total
            ws = _turns(args, (w,), device)
            qs = _turns(args, (wq, s, b), device)
            ours = timeit([lambda q=q: kernel(*q, x) for q in qs], device, repeat)
            linear = timeit([lambda w=w: F.linear(x, *w) for w in ws], device, repeat)
            deq = timeit([lambda q=q: F.linear(x, quant.dequantize(*q, 64, 4)) for q in qs],
                         device, repeat)
            copy = copy_time(nbytes, device, repeat, cold=args.cold)
            variant = launched_variant(sched, kernel, (wq, s, b, x))
            print(f"{dname:>5} {f'{n}x{k}':>11} {variant:>9} {nbytes:>10} {ours * 1e6:>8.1f} "
                  f"{linear * 1e6:>9.1f} {deq * 1e6:>9.1f} {copy * 1e6:>8.1f} "
                  f"{nbytes / ours / 1e9:>9.0f} {100 * copy / ours:>5.0f}% "
                  f"{linear / ours:>10.2f}x {deq / ours:>10.2f}x")


if __name__ == "__main__":
    main()
