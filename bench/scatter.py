"""Scatter-add (embedding gradient): ours, atomic and deterministic, vs torch index_add_ eager
and torch.compile on the same device, bytes moved, % of copy_.

    python bench/scatter.py                      # MPS on a Mac, CUDA on NVIDIA, else the simulator
    python bench/scatter.py --device cuda --dtype f32 f16 bf16

The gradient of an embedding table [V, E] from rows grad [N, E] at ids [N]:
`mf.scatter_add(grad, "V", ids)` (zero the output, then relaxed atomic adds, f16/bf16 through an
f32 accumulator) and `deterministic=True` (the ids sorted on the device, each output element
summing its run in order) against `torch.zeros(V, E).index_add_(0, ids, grad)` (eager; and
torch.compile of it, which on CUDA also zeroes and adds atomically). Default shape: N = 32K
rows of E = 4096 into V = 32K (ids uniform: few repeats, as a token batch over a vocabulary).
Bytes are the schedule's count (the zeroing pass's and the accumulator's writes included; the
sort's keys and order for the deterministic mode); %copy is copy_ moving as many bytes. On
CUDA the times are GPU times of CUDA-graph replays (common.timeit); on the simulator only a
smoke test of the script at small sizes.
"""
# ruff: noqa: F821  (the kernels' annotation strings name dims and dtypes, not Python names)
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

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

import metalforge as mf  # noqa: E402

SHAPES = ["32768x4096x32768", "8192x4096x32768", "32768x1024x131072"]


@mf.kernel
def embedding_grad(grad: "T[N, E]", ids: "i32[N]", table: "T[V, E]") -> "T[V, E]":
    return mf.scatter_add(grad, "V", ids)


@mf.kernel
def embedding_grad_det(grad: "T[N, E]", ids: "i32[N]", table: "T[V, E]") -> "T[V, E]":
    return mf.scatter_add(grad, "V", ids, deterministic=True)


KERNELS = {"atomic": embedding_grad, "deterministic": embedding_grad_det}


def torch_grad(grad: torch.Tensor, ids: torch.Tensor, v: int) -> torch.Tensor:
    return torch.zeros(v, grad.shape[1], dtype=grad.dtype,
                       device=grad.device).index_add_(0, ids, grad)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("mps", "cuda", "cpu"), default=None)
    ap.add_argument("--dtype", nargs="+", default=["f32"], choices=list(DTYPES))
    ap.add_argument("--shapes", nargs="+", default=SHAPES, help="NxExV")
    ap.add_argument("--modes", nargs="+", default=list(KERNELS), choices=list(KERNELS))
    ap.add_argument("--repeat", type=int, default=20)
    add_compile_flag(ap)
    args = ap.parse_args(argv)
    device = pick_device(args.device)
    repeat = args.repeat if device != "cpu" else 1
    print(f"device {device}")
    print(f"{'dtype':>5} {'N x E x V':>18} {'mode':>13} {'bytes':>11} {'ours us':>9} "
          f"{'torch us':>9} {'compile us':>10} {'copy us':>8} {'%copy':>6} {'vs eager':>9} "
          f"{'vs compile':>10}")
    for dname in args.dtype:
        dtype = DTYPES[dname]
        for spec in args.shapes:
            n, e, v = (int(s) for s in spec.split("x"))
            if device == "cpu":
                n, e, v = 64, 32, 48
            g = torch.Generator(device=device).manual_seed(0)
            grad = torch.randn(n, e, dtype=dtype, device=device, generator=g)
            ids = torch.randint(0, v, (n,), dtype=torch.int32, device=device, generator=g)
            ids64 = ids.long()
            table = torch.empty(v, e, dtype=dtype, device=device)
            want = torch_grad(grad.float(), ids64, v)

            def eager():
                return torch_grad(grad, ids64, v)

            theirs = timeit(eager, device, repeat)
            comp = compile_time(eager, device, repeat, args.compile)
            for mode in args.modes:
                k = KERNELS[mode]
                kargs = (grad, ids, table)
                got = k(*kargs)
                tol = 2e-2 if dtype == torch.bfloat16 else 2e-3 if dtype == torch.float16 else 1e-4
                torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol)
                sched, sizes = plan(k, kargs)
                nbytes = sched.traffic(sizes).total
                ours = timeit(lambda k=k: k(*kargs), device, repeat)
                copy = copy_time(nbytes, device, repeat)
                print(f"{dname:>5} {f'{n}x{e}x{v}':>18} {mode:>13} {nbytes:>11} "
                      f"{ours * 1e6:>9.1f} {theirs * 1e6:>9.1f} {us(comp, 10)} "
                      f"{copy * 1e6:>8.1f} {100 * copy / ours:>5.0f}% "
                      f"{ratio(theirs, ours, 9)} {ratio(comp, ours, 10)}", flush=True)


if __name__ == "__main__":
    main()
