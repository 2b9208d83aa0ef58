"""DSL matmul and a fused linear + bias + GELU: ours (both matrix lowerings) vs torch eager and
torch.compile on the same device, TFLOP/s.

    python bench/matmul.py --device cuda                  # f16 4096^3, the H200 run
    python bench/matmul.py --device cuda --dtype f16 bf16 --sizes 4096x4096x4096 512x4096x4096
    python bench/matmul.py --device cuda --tile 128       # 128 x 128 tiles (launch option)
    python bench/matmul.py --device cuda --configs \
        "old:tile=64,stage_pad=0,prefetch=0,tile_groups=0" "new:" "w8:tile_simdgroups=8"
                                                          # launch options side by side
    python bench/matmul.py --device cuda --dtype f32 --configs "fp32:" "tf32:tf32=1"
                                                          # f32 exact vs TF32 (tensor ops)
    python bench/matmul.py --device cpu                   # the simulator: a smoke test

Ops, each at M x N x K:
- matmul:      c = mf.sum(a * b, axis="K"), a [M, K], b [N, K]   vs  torch.matmul(a, b.T)
- linear_gelu: y = gelu(mf.sum(x * w, axis="K") + bias)          vs  F.gelu(F.linear(x, w, bias))
               (exact erf GELU; one kernel: the bias and GELU are its epilogue)

Each of our rows runs one --configs entry ("name:option=value,..." launch options over the
backend's table; default: "old", the 64 x 64 unpadded kernel, and "new", the table: on cuda
128 x 128 tiles; schedule/policy.py). Our kernels run under each target given by --targets (the
launch option `target`, metalforge/target.py): by default the backend's own (cuda: "cuda",
Metal 4 tensor ops that the cuda shim runs on tensor cores with mma.sync; mps: what the Mac
has) and "apple9" (8x8 simdgroup_matrix products, the M1-M4 lowering), side by side. Every
result is checked against torch first. TFLOP/s = 2 M N K / time. On CUDA all times are GPU
times of CUDA-graph replays (common.timeit); on the simulator they only show the script runs.
"""

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))          # this checkout's metalforge, not another installed one

from common import DTYPES, add_compile_flag, compile_time, pick_device, ratio, timeit, us  # noqa: E402

import metalforge as mf  # noqa: E402
from metalforge.runtime import current_backend  # noqa: E402
from metalforge.target import current_target  # noqa: E402


@mf.kernel
def matmul(a: "T[M, K]", b: "T[N, K]") -> "T[M, N]":  # noqa: F821
    return mf.sum(a * b, axis="K")


@mf.kernel
def linear_gelu(x: "T[M, K]", w: "T[N, K]", bias: "T[N]") -> "T[M, N]":  # noqa: F821
    h = mf.sum(x * w, axis="K") + bias
    return 0.5 * h * (1 + mf.erf(h * 0.7071067811865476))


def cases(m: int, n: int, k: int, dtype: torch.dtype, device: str):
    """(name, our kernel, its args, torch's callable) of each op."""
    g = torch.Generator(device="cpu").manual_seed(0)
    a = (torch.randn(m, k, generator=g) / k ** 0.25).to(dtype).to(device)
    b = (torch.randn(n, k, generator=g) / k ** 0.25).to(dtype).to(device)
    bias = torch.randn(n, generator=g).to(dtype).to(device)
    return [("matmul", matmul, (a, b), lambda: torch.matmul(a, b.T)),
            ("linear_gelu", linear_gelu, (a, b, bias), lambda: F.gelu(F.linear(a, b, bias)))]


OLD = "old:tile=64,stage_pad=0,prefetch=0,tile_groups=0"
TABLE = "the table"


def parse_config(spec: str) -> tuple[str, dict]:
    """"name:opt=v,opt=v" -> (name, launch options); values int, or bool for prefetch and
    tf32."""
    name, _, rest = spec.partition(":")
    opts: dict = {}
    for item in filter(None, rest.split(",")):
        key, _, v = item.partition("=")
        opts[key] = bool(int(v)) if key in ("prefetch", "tf32") else int(v)
    return name or "-", opts


HEADER = (f"{'op':<12} {'dtype':>5} {'MxNxK':>15} {'target':>8} {'config':>6} {'ours us':>9} "
          f"{'TFLOP/s':>8} "
          f"{'torch us':>9} {'TFLOP/s':>8} {'compile us':>10} {'TFLOP/s':>8} {'vs eager':>9} "
          f"{'vs compile':>10}")


def tflops(flop: int, t: float | None, width: int) -> str:
    return f"{flop / t / 1e12:>{width}.1f}" if t else f"{'-':>{width}}"


def run(args) -> None:
    device = pick_device(args.device)
    repeat = args.repeat or (20 if device != "cpu" else 1)
    sizes = args.sizes or (["4096x4096x4096"] if device != "cpu" else ["96x80x72"])
    backend = current_backend([torch.empty(0, device=device)])
    targets = args.targets or list(dict.fromkeys([current_target(backend).name, "apple9"]))
    tile = {"tile": args.tile} if args.tile else {}
    configs = [parse_config(c) for c in (args.configs or [OLD, "new:"])]
    print(f"device {device} (backend {backend}); targets {', '.join(targets)}; tiles of "
          f"{args.tile or 'the launch table'}; configs "
          f"{'; '.join(f'{n}: {o or TABLE}' for n, o in configs)}; {repeat} timed calls")
    print(HEADER)
    for spec in sizes:
        m, n, k = (int(v) for v in spec.split("x"))
        flop = 2 * m * n * k
        for dname in args.dtype:
            for name, kernel, kargs, theirs in cases(m, n, k, DTYPES[dname], device):
                want = theirs()
                t_torch = timeit(theirs, device, repeat)
                t_comp = compile_time(theirs, device, repeat, args.compile)
                for target, (cname, opts) in ((t, c) for t in targets for c in configs):
                    ours = kernel.with_launch(target=target, **{**opts, **tile})
                    got = ours(*kargs)
                    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
                    t = timeit(lambda: ours(*kargs), device, repeat)
                    print(f"{name:<12} {dname:>5} {spec:>15} {target:>8} {cname:>6} {us(t, 9)} "
                          f"{tflops(flop, t, 8)} {us(t_torch, 9)} {tflops(flop, t_torch, 8)} "
                          f"{us(t_comp, 10)} {tflops(flop, t_comp, 8)} "
                          f"{ratio(t_torch, t, 9)} {ratio(t_comp, t, 10)}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("mps", "cuda", "cpu"), default=None)
    ap.add_argument("--dtype", nargs="+", choices=("f16", "bf16", "f32"), default=["f16"])
    ap.add_argument("--sizes", nargs="*", default=None, help="MxNxK (default: 4096x4096x4096)")
    ap.add_argument("--targets", nargs="*", default=None,
                    help="metalforge targets (default: the backend's own, and apple9)")
    ap.add_argument("--tile", type=int, choices=(32, 64, 128), default=None,
                    help="outputs a side of a threadgroup's tile (launch option tile)")
    ap.add_argument("--configs", nargs="*", default=None,
                    help='launch options side by side, "name:opt=v,opt=v" each (default: '
                         f'"{OLD}" and "new:", the backend\'s table)')
    ap.add_argument("--repeat", type=int, default=None)
    add_compile_flag(ap)
    run(ap.parse_args())


if __name__ == "__main__":
    main()
