"""RoPE: ours vs torch eager and torch.compile on the same device, bytes moved, achieved GB/s.

    python bench/rope.py                    # MPS on a Mac, CUDA on NVIDIA, else the simulator
    python bench/rope.py --device cuda --dtype f16 bf16

Shapes [B, H, S, E] of q in prefill and decode. Ours: examples/rope.py's `rope` (angles from the
position tensor, computed in the kernel) and `rope_cached` (cos/sin tables [S, E/2]) against the
usual eager rotate-half with precomputed cos/sin of shape [S, E] (x * cos + cat(-x2, x1) * sin:
four kernels); `rope_interleaved` (pairs 2j, 2j + 1: the partner is lane k ^ 1 of the vector
the kernel loaded) against eager interleaved RoPE on [S, E/2] tables; `qk_norm_rope` (RMSNorm
and RoPE in one row kernel: for E <= 128 the partner comes from simd shuffles) against
F.rms_norm then the eager rotate-half. Bytes are our schedule's count (x read once more for a
partner element that is loaded, from cache: `rope`, `rope_cached`, and `qk_norm_rope` over
E > 128); GB/s over them, %copy against `copy_` moving as many. On CUDA all are GPU times of
CUDA-graph replays (common.timeit); torch.compile of each eager function (compiled once per
shape and dtype) beside eager. On the simulator only a smoke test of the script.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    DTYPES,
    add_compile_flag,
    compile_time,
    copy_time,
    pick_device,
    plan,
    ratio,
    timeit,
    us,
)

_spec = importlib.util.spec_from_file_location(      # examples/rope.py (this file is rope.py)
    "mf_example_rope", Path(__file__).resolve().parent.parent / "examples" / "rope.py")
_ex = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_ex)
angles, rope, rope_cached = _ex.angles, _ex.rope, _ex.rope_cached
rope_interleaved, qk_norm_rope = _ex.rope_interleaved, _ex.qk_norm_rope
KERNELS = ["rope", "rope_cached", "rope_interleaved", "qk_norm_rope"]

SHAPES = ["1x32x4096x128", "8x32x1024x128", "32x32x1x128", "1x8x8192x64"]


def torch_rope(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def torch_rope_interleaved(x, cos, sin):          # cos, sin: [S, E/2]
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1).flatten(-2)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device")
    ap.add_argument("--dtype", nargs="+", default=["f16", "bf16", "f32"], choices=list(DTYPES))
    ap.add_argument("--shapes", nargs="+", default=SHAPES)
    ap.add_argument("--kernels", nargs="+", default=KERNELS, choices=KERNELS)
    ap.add_argument("--repeat", type=int, default=50)
    add_compile_flag(ap)
    args = ap.parse_args(argv)
    device = pick_device(args.device)
    repeat = args.repeat if device != "cpu" else 1
    print(f"device {device}")
    print(f"{'dtype':>5} {'B x H x S x E':>15} {'kernel':>16} {'bytes':>10} {'ours us':>8} "
          f"{'torch us':>8} {'compile us':>10} {'copy us':>8} {'ours GB/s':>9} {'%copy':>6} "
          f"{'vs eager':>9} {'vs compile':>10}")
    for dname in args.dtype:
        dtype = DTYPES[dname]
        for spec in args.shapes:
            b, h, s, e = (int(v) for v in spec.split("x"))
            if device == "cpu":
                b, h, s = 1, 2, min(s, 16)
            x = torch.randn(b, h, s, e, dtype=dtype, device=device)
            pos = torch.arange(s, dtype=torch.int32, device=device).expand(b, s).contiguous()
            th = angles(torch.arange(s, device=device), e)
            cos_t, sin_t = th.cos().to(dtype), th.sin().to(dtype)          # [S, E/2]
            cos_f, sin_f = cos_t.repeat(1, 2), sin_t.repeat(1, 2)          # torch's [S, E]
            w = torch.randn(e, dtype=dtype, device=device)
            eager = {"rope": lambda: torch_rope(x, cos_f, sin_f),
                     "rope_interleaved": lambda: torch_rope_interleaved(x, cos_t, sin_t),
                     "qk_norm_rope": lambda: torch_rope(
                         torch.nn.functional.rms_norm(x, (e,), w, eps=1e-6), cos_f, sin_f)}
            eager["rope_cached"] = eager["rope"]
            ours_args = {"rope": (rope, (x, pos)), "rope_cached": (rope_cached, (x, cos_t, sin_t)),
                         "rope_interleaved": (rope_interleaved, (x, pos)),
                         "qk_norm_rope": (qk_norm_rope, (x, w, pos))}
            for name in args.kernels:
                k, kargs = ours_args[name]
                want = eager[name]()
                y = k(*kargs)
                # eager rounds every step to the dtype (x * cos, the norm): bf16's 8 bits
                # leave a few ulps of |x| ~ 4 between it and our fp32 math
                tol = 6e-2 if dtype == torch.bfloat16 else 2e-2
                torch.testing.assert_close(y, want, rtol=tol, atol=tol)
                theirs = timeit(eager[name], device, repeat)
                comp = compile_time(eager[name], device, repeat, args.compile)
                sched, sizes = plan(k, kargs)
                nbytes = sched.traffic(sizes).total
                ours = timeit(lambda: k(*kargs), device, repeat)
                copy = copy_time(nbytes, device, repeat)
                print(f"{dname:>5} {f'{b}x{h}x{s}x{e}':>15} {name:>16} {nbytes:>10} "
                      f"{ours * 1e6:>8.1f} {theirs * 1e6:>8.1f} {us(comp, 10)} "
                      f"{copy * 1e6:>8.1f} {nbytes / ours / 1e9:>9.0f} {100 * copy / ours:>5.0f}% "
                      f"{ratio(theirs, ours, 9)} {ratio(comp, ours, 10)}")


if __name__ == "__main__":
    main()
