"""Which launch-table values and codegen changes bring the row reductions to the bandwidth
limit on a CUDA GPU: every case of the issue's shapes under several launch overrides, and one
hand-edited codegen change, each as torch time / ours (> 1: ours faster).

    python bench/cuda_levers.py [--dtype f16 f32] [--sizes 16384x4096 ...] [--ops softmax ...]

Candidates (launch overrides are `kernel.with_launch(...)`, the keys of schedule/policy.py's
TUNABLE; "16B" is an experiment on the generated text, not something codegen emits):
  default    the current table
  r8 / r16   reads_per_thread=8 / 16 with looped_limit = 1024 * reads: rows up to 8192 / 16384
             held in registers and read once (no looped re-read)
  r16t512    reads_per_thread=16, threads_per_group=512, looped_limit=8192
  rpg4/16    rows_per_group=4 / 16 (short rows: rows per threadgroup, one simdgroup each)
  r8+16B     r8, and each thread's 8 contiguous f16 elements moved as ONE 16-byte access: the
             generated 2-chunk 8-byte vector loops rewritten to a 16-byte aligned struct access
             (valid MSL; needs rows that are a multiple of 8 elements, as all shapes here are)
  r16+16B    the same with reads_per_thread=16
"""
from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import DTYPES, timeit  # noqa: E402
from metalforge.runtime import launcher  # noqa: E402
from metalforge.schedule.policy import LaunchError  # noqa: E402
from reductions import cases  # noqa: E402

CANDIDATES = {
    "default": ({}, False),
    "r8": (dict(reads_per_thread=8, looped_limit=8192), False),
    "r16": (dict(reads_per_thread=16, looped_limit=16384), False),
    "r16t512": (dict(reads_per_thread=16, threads_per_group=512, looped_limit=8192), False),
    "rpg4": (dict(rows_per_group=4), False),
    "rpg16": (dict(rows_per_group=16), False),
    "r8+16B": (dict(reads_per_thread=8, looped_limit=8192), True),
    "r16+16B": (dict(reads_per_thread=16, looped_limit=16384), True),
}

_X8 = ("\n// bench experiment: 16 bytes per access (two 4-vectors, 16-byte aligned)\n"
       "template <typename T> struct alignas(16) mf_x8 { vec<T, 4> v[2]; };\n")
_LOAD = re.compile(r"for \(uint mf_c = 0u; mf_c < (\d+)u; \+\+mf_c\) \{\n(\s*)const vec<T, 4> "
                   r"(\w+) = \*reinterpret_cast<device const vec<T, 4>\*>\((.*?) \+ mf_c \* 4u\);")
_STORE = re.compile(r"for \(uint mf_c = 0u; mf_c < (\d+)u; \+\+mf_c\) \{\n(\s*)\*reinterpret_cast"
                    r"<device vec<T, 4>\*>\((.*?) \+ mf_c \* 4u\) = (vec<T, 4>\(.*?\));\n(\s*)\}")


def sixteen_bytes(src: str) -> str:
    """Each pair of adjacent 8-byte vector accesses of a thread → one 16-byte access."""
    def load(m):
        n, ind, name, ptr = m.group(1), m.group(2), m.group(3), m.group(4)
        return (f"for (uint mf_c = 0u; mf_c < {n}u; ++mf_c) {{\n{ind}const vec<T, 4> {name} = "
                f"(*reinterpret_cast<device const mf_x8<T>*>({ptr} + (mf_c / 2u) * 8u))"
                f".v[mf_c % 2u];")

    def store(m):
        n, ind, ptr, val, ind2 = m.groups()
        return (f"for (uint mf_c = 0u; mf_c < {n}u; mf_c += 2u) {{\n{ind}mf_x8<T> mf_s8;\n"
                f"{ind}mf_s8.v[0] = {val};\n"
                f"{ind}mf_s8.v[1] = {val.replace('mf_c * 4u', '(mf_c + 1u) * 4u')};\n"
                f"{ind}*reinterpret_cast<device mf_x8<T>*>({ptr} + mf_c * 4u) = mf_s8;\n{ind2}}}")
    out = _STORE.sub(store, _LOAD.sub(load, src))
    return out.replace("using namespace metal;\n", "using namespace metal;\n" + _X8, 1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtype", nargs="+", choices=DTYPES, default=["f16", "f32"])
    ap.add_argument("--sizes", nargs="*", default=["16384x4096", "65536x1024", "4096x8192",
                                                  "2048x16384", "8192x128"])
    ap.add_argument("--ops", nargs="*", default=["rms_norm", "layer_norm", "softmax",
                                                 "log_softmax", "add_rms_norm"])
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--candidates", nargs="*", default=list(CANDIDATES))
    a = ap.parse_args(argv)
    names = a.candidates
    print(f"torch/ours per launch candidate (device cuda, median of {a.repeat} graph replays)")
    print(f"{'op':<13} {'dtype':>5} {'shape':>11} " + " ".join(f"{n:>8}" for n in names) +
          f" {'best':>8}")
    ratios: dict[str, list] = {n: [] for n in names}
    best_ratios = []
    for spec in a.sizes:
        rows, cols = (int(v) for v in spec.lower().split("x"))
        for dname in a.dtype:
            for name, k, args, eager in cases(rows, cols, DTYPES[dname], "cuda"):
                if name not in a.ops:
                    continue
                theirs = timeit(eager, "cuda", a.repeat)
                got = {}
                for n in names:
                    launch, rewrite = CANDIDATES[n]
                    if rewrite and dname == "f32":
                        continue
                    kk = k.with_launch(**launch) if launch else k
                    tok = launcher.MSL_REWRITE.set(sixteen_bytes) if rewrite else None
                    try:
                        ours = timeit(lambda: kk(*args), "cuda", a.repeat)
                        got[n] = theirs / ours
                    except LaunchError:
                        pass
                    finally:
                        if tok is not None:
                            launcher.MSL_REWRITE.reset(tok)
                for n in names:
                    ratios[n].append(got.get(n, got["default"]))
                best = max(got, key=got.get)
                best_ratios.append(got[best])
                print(f"{name:<13} {dname:>5} {spec:>11} " +
                      " ".join(f"{got[n]:>8.2f}" if n in got else f"{'-':>8}" for n in names) +
                      f" {best:>8}", flush=True)
    geo = lambda v: math.exp(sum(math.log(x) for x in v) / len(v))  # noqa: E731
    print("\ngeomean torch/ours per candidate (a case it cannot run counts at default):")
    for n in names:
        print(f"  {n:<9} {geo(ratios[n]):.3f}  (min {min(ratios[n]):.2f}, "
              f"{sum(r < 1 for r in ratios[n])} cases < 1.0)")
    print(f"  best-of   {geo(best_ratios):.3f}  (min {min(best_ratios):.2f}, "
          f"{sum(r < 1 for r in best_ratios)} cases < 1.0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
