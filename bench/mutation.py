"""How well `check` guards the example kernels: mutation scores of their generated MSL.

    python bench/mutation.py                          # 6 mutants of each example kernel
    python bench/mutation.py --per-kernel 0           # every mutable site (slow: hours)
    python bench/mutation.py --kernels rms_norm rope --per-kernel 20 --seed 3
    python bench/mutation.py --operators drop_barrier --per-kernel 0   # every dropped barrier

For each kernel of examples/*.py: its f32 library at 32-bit indexing (every variant kernel of a
reduction, the matvec and tiled kernels of a quantized one), a deterministic sample of
single-site mutants spread over the operators (`metalforge.testing.mutate`), and `check` run
against each (the example module's `CHECK` options, f32, the CI profile). Prints one row per
kernel (sites, killed, survived, argued equivalent, stillborn, score), then every survivor and
every equivalent mutant with the rule that argues it (`metalforge.testing.mutate.EQUIVALENT`).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))          # this checkout's metalforge, not another installed one

from metalforge.testing.mutate import example_kernels, gate_runs  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kernels", nargs="*", help="only these example kernels")
    ap.add_argument("--per-kernel", type=int, default=6, help="mutants per kernel (0: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--operators", nargs="*", help="only mutants of these operators "
                    "(drop_barrier, relational, arithmetic, ...)")
    a = ap.parse_args(argv)
    kernels = example_kernels(ROOT / "examples")
    names = a.kernels or sorted(kernels)
    print(f"{'kernel':<24} {'sites':>6} {'killed':>7} {'survived':>9} {'equivalent':>11} "
          f"{'stillborn':>10} {'score':>6} {'s':>6}")
    survivors, equivalent, killed, total = [], [], 0, 0
    t0 = time.perf_counter()
    for name, rep in zip(names, gate_runs([kernels[n] for n in names], a.per_kernel or None,
                                          a.seed, operators=a.operators)):
        n = len(rep.killed) + len(rep.survived)
        killed, total = killed + len(rep.killed), total + n
        survivors += [f"{name}: {m.describe()}" for m in rep.survived]
        equivalent += [f"{name} ({r.name}): {m.describe()}" for m, r in rep.equivalent]
        print(f"{name:<24} {rep.total_sites:>6} {len(rep.killed):>7} {len(rep.survived):>9} "
              f"{len(rep.equivalent):>11} {len(rep.stillborn):>10} {rep.score:>6.0%} "
              f"{time.perf_counter() - t0:>6.0f}", flush=True)
        t0 = time.perf_counter()
    print(f"\nall: {killed} of {total} non-equivalent mutants killed "
          f"({killed / max(total, 1):.1%}); {len(equivalent)} argued equivalent")
    for line in survivors:
        print("  survivor:", line)
    for line in equivalent:
        print("  equivalent:", line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
