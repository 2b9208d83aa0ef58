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
  fm         an accuracy experiment, not a proposal as is: precise::exp/log → fast:: and
             division by a row's sum → multiplication by its reciprocal, to see how much of
             the gap is arithmetic rather than memory
  r8+16B+fm, r16+16B+fm   the combinations
  nocmp      compensated sums (looped rows, online softmax) without their error term: what the
             compensation costs
"""
from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import DTYPES, timeit  # noqa: E402
from reductions import cases  # noqa: E402

from metalforge.runtime import launcher  # noqa: E402
from metalforge.schedule.policy import LaunchError  # noqa: E402

R8 = dict(reads_per_thread=8, looped_limit=8192)
R16 = dict(reads_per_thread=16, looped_limit=16384)
CANDIDATES = {                       # name: (launch overrides, text rewrites of the MSL)
    "default": ({}, ()),
    "r8": (R8, ()),
    "r16": (R16, ()),
    "r16t512": (dict(reads_per_thread=16, threads_per_group=512, looped_limit=8192), ()),
    "rpg4": (dict(rows_per_group=4), ()),
    "rpg16": (dict(rows_per_group=16), ()),
    "r8+16B": (R8, ("16B",)),
    "r16+16B": (R16, ("16B",)),
    "fm": ({}, ("fm",)),
    "r8+16B+fm": (R8, ("16B", "fm")),
    "r16+16B+fm": (R16, ("16B", "fm")),
    "nocmp": ({}, ("nocmp",)),
    "nocmp+fm": ({}, ("nocmp", "fm")),
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


_DIV = re.compile(r"= (\w+) / (mf_acc\d+);")


def fast_math(src: str) -> str:
    src = src.replace("precise::exp(", "fast::exp(").replace("precise::log(", "fast::log(")
    return _DIV.sub(r"= \1 * (1.0f / \2);", src)


def no_compensation(src: str) -> str:
    """Compensated sums without their error term (plain fp32 running sums)."""
    for term in ("x", "mf_e"):
        src = src.replace(f"    if (isfinite(mf_t)) {{\n        c += abs(s) >= abs({term}) ? "
                          f"(s - mf_t) + {term} : ({term} - mf_t) + s;\n    }}\n", "")
    return src


REWRITES = {"16B": sixteen_bytes, "fm": fast_math, "nocmp": no_compensation}


def rewriter(names):
    def apply(src: str) -> str:
        for n in names:
            src = REWRITES[n](src)
        return src
    return apply


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtype", nargs="+", choices=DTYPES, default=["f16", "f32"])
    ap.add_argument("--sizes", nargs="*", default=["16384x4096", "65536x1024", "4096x8192",
                                                  "2048x16384", "8192x128"])
    ap.add_argument("--ops", nargs="*", default=["rms_norm", "layer_norm", "softmax",
                                                 "log_softmax", "add_rms_norm"])
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--candidates", nargs="*", default=[n for n in CANDIDATES
                                                        if "fm" not in n])
    a = ap.parse_args(argv)
    names = a.candidates
    print(f"torch/ours per launch candidate (device cuda, median of {a.repeat} graph replays)")
    w = {n: max(8, len(n)) for n in names}
    print(f"{'op':<13} {'dtype':>5} {'shape':>11} " + " ".join(f"{n:>{w[n]}}" for n in names) +
          f" {'best':>10}")
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
                    launch, rewrites = CANDIDATES[n]
                    if "16B" in rewrites and dname == "f32":
                        continue
                    kk = k.with_launch(**launch) if launch else k
                    tok = launcher.MSL_REWRITE.set(rewriter(rewrites)) if rewrites else None
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
                      " ".join(f"{got[n]:>{w[n]}.2f}" if n in got else f"{'-':>{w[n]}}"
                               for n in names) +
                      f" {best:>10}", flush=True)
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
