"""Reductions over several axes: group norm, instance norm and a full sum, ours vs torch eager
and torch.compile, bytes, % of copy_.

    python bench/group_norm.py --device cuda              # N=8, C=512, H=W=64, G=32; 64M sum
    python bench/group_norm.py --device cuda --dtype f32 --groups 32 8 1

Ours: the multiaxis schedule (schedule/multiaxis): group norm normalises x[N, G, C/G, H, W]
over ("C", "H", "W") per group with per-channel weight and bias (F.group_norm); instance norm
over ("H", "W") per channel (F.instance_norm, no affine); the full sum is `mf.sum(x,
axis=None)` of an 8192 x 8192 tensor (x.sum()). Rows (groups, channels) fewer than
fill_groups split into chunks merged in chunk order (part/merge/out launches: the `variant`
column names the first kernel a call launches). Torch: F.group_norm / F.instance_norm /
x.sum() eager, and torch.compile of the same function.

Bytes are our schedule's count (each input read once per pass it makes: group norm reads x
three times, the mean, the variance and the output; the output written once); GB/s over them,
%copy against `copy_` moving as many. On CUDA, times are GPU times of CUDA-graph replays
(common.timeit). On the simulator (--device cpu) a smoke test of the script at small sizes.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import metalforge as mf

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    DTYPES,
    add_compile_flag,
    compile_time,
    copy_time,
    launched_variant,
    pick_device,
    plan,
    ratio,
    timeit,
    us,
)


@mf.kernel
def group_norm(x: "T[N, G, C, H, W]", w: "T[G, C]", b: "T[G, C]",  # noqa: F821
               eps: float = 1e-5):
    mean = mf.mean(x, axis=("C", "H", "W"))
    d = x - mean
    var = mf.mean(d * d, axis=("C", "H", "W"))
    return d * mf.rsqrt(var + eps) * w + b


@mf.kernel
def instance_norm(x: "T[N, C, H, W]", eps: float = 1e-5):  # noqa: F821
    mean = mf.mean(x, axis=("H", "W"))
    d = x - mean
    return d * mf.rsqrt(mf.mean(d * d, axis=("H", "W")) + eps)


@mf.kernel
def full_sum(x: "T[R, D]"):  # noqa: F821
    return mf.sum(x, axis=None)


def cases(n, c, h, w, groups, numel, dtype, device):
    """(name, shape text, kernel, args, ours, torch eager, tolerance) of each op."""
    x = torch.randn(n, c, h, w, device=device).to(dtype)
    wt = torch.randn(c, device=device).to(dtype)
    bt = torch.randn(c, device=device).to(dtype)
    out = []
    for g in groups:
        args = (x.view(n, g, c // g, h, w), wt.view(g, c // g), bt.view(g, c // g))
        out.append((f"group_norm G={g}", f"{n}x{c}x{h}x{w}", group_norm, args,
                    lambda args=args: group_norm(*args).view(n, c, h, w),
                    lambda g=g: F.group_norm(x, g, wt, bt, eps=1e-5)))
    out.append(("instance_norm", f"{n}x{c}x{h}x{w}", instance_norm, (x,),
                lambda: instance_norm(x), lambda: F.instance_norm(x, eps=1e-5)))
    flat = torch.randn(numel // 8192 or 1, min(numel, 8192), device=device).to(dtype)
    out.append(("sum", "x".join(map(str, flat.shape)), full_sum, (flat,), lambda: full_sum(flat),
                lambda: flat.sum()))
    return out


def check(name, ours, theirs, dtype) -> None:
    """Ours against torch before timing."""
    tol = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 5e-2}[dtype]
    a, b = ours().float(), theirs().float()
    if name == "sum":                     # a sum of 64M terms: relative to its scale
        tol = tol * max(1.0, float(b.abs()))
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("mps", "cuda", "cpu"), default=None)
    ap.add_argument("--dtype", nargs="+", default=["f16", "f32"], choices=list(DTYPES))
    ap.add_argument("--shape", nargs=4, type=int, default=[8, 512, 64, 64],
                    metavar=("N", "C", "H", "W"))
    ap.add_argument("--groups", nargs="+", type=int, default=[32])
    ap.add_argument("--numel", type=int, default=64 << 20, help="elements of the full sum")
    ap.add_argument("--repeat", type=int, default=30)
    add_compile_flag(ap)
    args = ap.parse_args(argv)
    device = pick_device(args.device)
    repeat = args.repeat if device != "cpu" else 1
    n, c, h, w = args.shape if device != "cpu" else (2, 8, 6, 5)
    numel = args.numel if device != "cpu" else 40000
    groups = args.groups if device != "cpu" else [4]
    print(f"device {device}")
    print(f"{'op':<16} {'dtype':>5} {'shape':>14} {'variant':>8} {'bytes':>11} {'ours us':>9} "
          f"{'torch us':>9} {'compile us':>10} {'copy us':>8} {'ours GB/s':>9} {'%copy':>6} "
          f"{'vs eager':>9} {'vs compile':>10}")
    for dname in args.dtype:
        dtype = DTYPES[dname]
        for name, shape, k, kargs, ours_fn, torch_fn in cases(n, c, h, w, groups, numel, dtype,
                                                              device):
            label = f"{name:<16} {dname:>5} {shape:>14}"
            try:
                check(name, ours_fn, torch_fn, dtype)
                print(measure(label, k, kargs, ours_fn, torch_fn, device, repeat,
                              args.compile), flush=True)
            except Exception as e:  # noqa: BLE001 - one failed row, not the table
                print(f"{label}  failed: {type(e).__name__}: {str(e)[:160]}", flush=True)


def measure(label, k, kargs, ours_fn, torch_fn, device, repeat, compile_) -> str:
    """One row: ours, torch eager, torch.compile, copy_ of as many bytes."""
    sched, sizes = plan(k, kargs)
    nbytes = sched.traffic(sizes).total
    variant = launched_variant(sched, k, kargs)
    ours = timeit(ours_fn, device, repeat)
    theirs = timeit(torch_fn, device, repeat)
    comp = compile_time(torch_fn, device, repeat, compile_)
    copy = copy_time(nbytes, device, repeat)
    return (f"{label} {variant:>8} {nbytes:>11} {ours * 1e6:>9.1f} {theirs * 1e6:>9.1f} "
            f"{us(comp, 10)} {copy * 1e6:>8.1f} {nbytes / ours / 1e9:>9.0f} "
            f"{100 * copy / ours:>5.0f}% {ratio(theirs, ours, 9)} {ratio(comp, ours, 10)}")


if __name__ == "__main__":
    main()
