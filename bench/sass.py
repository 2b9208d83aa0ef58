"""Where a kernel's instructions go, from Nsight Compute's SASS page: the opcode mix (share of
the executed warp instructions and of the stall samples) and the instructions a warp executes
per pass of each loop (the SASS lines that run equally often).

    ncu --clock-control none --profile-from-start off --set full -o prof \
        python3 bench/nsight.py prefill
    ncu --import prof.ncu-rep --page source --print-source sass --csv | gzip > prof.csv.gz
    python bench/sass.py prof.csv.gz [--kernel prefill] [--top 30] [--loops 4]

`python bench/sass.py --self-test` checks the parsing on a small made-up export (no GPU).
The tenth session's prefill work was read off these tables (bench/README.md).
"""
from __future__ import annotations

import argparse
import csv
import gzip
import io
from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Kernel:
    name: str
    executed: Counter = field(default_factory=Counter)     # opcode -> warp instructions
    stalls: Counter = field(default_factory=Counter)       # opcode -> stall samples
    by_count: Counter = field(default_factory=Counter)     # times a line ran -> SASS lines


def opcode(text: str) -> str:
    """The opcode of a SASS line without its predicate and modifiers ("@P0 LDS.128" -> LDS)."""
    words = text.split()
    if not words:
        return "?"
    word = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    return word.split(".")[0]


def read(lines) -> list[Kernel]:
    """The kernels of an `ncu --page source --print-source sass --csv` export."""
    kernels: list[Kernel] = []
    at = stall = None
    for row in csv.reader(lines):
        if row and row[0] == "Kernel Name":
            kernels.append(Kernel(row[1]))
        elif row and row[0] == "Address":
            at = row.index("Instructions Executed")
            stall = row.index("Warp Stall Sampling (All Samples)")
        elif kernels and at is not None and len(row) > max(at, stall):
            k, n, s = kernels[-1], int(row[at] or 0), int(row[stall] or 0)
            op = opcode(row[1])
            k.executed[op] += n
            k.stalls[op] += s
            k.by_count[n] += 1
    return kernels


def report(k: Kernel, top: int, loops: int) -> str:
    total, samples = sum(k.executed.values()), max(sum(k.stalls.values()), 1)
    out = [f"{k.name}: {total:,} warp instructions executed, {samples:,} stall samples",
           f"  {'opcode':<10} {'executed':>14} {'share':>6} {'stalls':>7}"]
    for op, n in k.executed.most_common(top):
        out.append(f"  {op:<10} {n:>14,} {100 * n / max(total, 1):5.1f}% "
                   f"{100 * k.stalls[op] / samples:6.1f}%")
    out.append(f"  {'runs':>12} {'lines':>6} {'share':>6}   (the lines run equally often: a "
               "loop body's instructions a pass)")
    for n, lines in sorted(k.by_count.items(), key=lambda c: -c[0] * c[1])[:loops]:
        out.append(f"  {n:>12,} {lines:>6} {100 * n * lines / max(total, 1):5.1f}%")
    return "\n".join(out)


SAMPLE = '''"Kernel Name","mf_entry_0_demo",
"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed"
"0x0","      S2R R0, SR_TID.X","1","4"
"0x10","      HMMA.16816.F32 R4, R8, R12, R4","5","64"
"0x20","  @P0 LDS.128 R8, [R2]","3","64"
"0x30","      FMUL R1, R1, R2","0","64"
'''


def self_test() -> None:
    (k,) = read(io.StringIO(SAMPLE))
    assert k.name == "mf_entry_0_demo"
    assert k.executed == Counter({"HMMA": 64, "LDS": 64, "FMUL": 64, "S2R": 4})
    assert k.stalls["HMMA"] == 5 and k.by_count == Counter({64: 3, 4: 1})
    assert "HMMA" in report(k, 5, 2)
    print("bench/sass.py: self-test passed")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv", nargs="?", help="ncu's SASS page as CSV (.gz or plain)")
    ap.add_argument("--kernel", default="", help="only kernels whose name contains this")
    ap.add_argument("--top", type=int, default=30, help="opcodes shown")
    ap.add_argument("--loops", type=int, default=4, help="execution counts shown")
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args(argv)
    if args.self_test or not args.csv:
        self_test()
        return
    opener = gzip.open if args.csv.endswith(".gz") else open
    with opener(args.csv, "rt") as f:
        for k in read(f):
            if args.kernel in k.name:
                print(report(k, args.top, args.loops))


if __name__ == "__main__":
    main()
