"""The mutation gate: `check` kills at least GATE of the single-site mutants of the example
kernels' generated MSL that are not argued equivalent.

GATE is 95%. Measured 2026-11-28 at two mutants a kernel: 53 of 53 killed (3 argued
equivalent); 68 of 72 in
`bench/mutation.py --per-kernel 3 --seed 1` (the four survivors change nothing a caller sees)
and 108 of 119 in `--per-kernel 6 --seed 2`. What makes mutants observable: the simulator's
threadgroup-memory checks (include/mf_sim/race.h, on by default: two threads touching one
element, one writing, with no barrier between them; a read of an element no thread of the group
wrote), its bounds checks on every private and threadgroup array and vector component, and
check's boundary sizes (each kernel's thresholds, the row kernels' lanes steps and one vector
past them). Equivalent mutants (an array declared one longer, the last whole vector taking the
element path, ...) are argued by the rules in `mutate.EQUIVALENT`; see bench/README.md for the
survivors of the larger samples.

Every kernel of examples/ (elementwise, row and column reductions, attention with its merge
kernel, the quantized matvec and tiled kernels, gathers) contributes PER_KERNEL mutants of its
f32 library, drawn deterministically and spread over the operators; each runs through `check`
with the example module's own options in a worker process (a mutant may never end). The
failure message is the whole report: every survivor, and every equivalent mutant with its
argument. `python bench/mutation.py` runs larger samples.
"""
from pathlib import Path

from metalforge.testing.mutate import example_kernels, gate_runs

ROOT = Path(__file__).resolve().parents[2]
PER_KERNEL = 1          # one a kernel (two took 100 s of CI's suite; 35 of 35 killed, 2026-11-29)
SEED = 0
GATE = 0.95


def test_check_kills_the_examples_mutants():
    examples = example_kernels(ROOT / "examples")
    reports = list(gate_runs([examples[n] for n in sorted(examples)], PER_KERNEL, SEED))
    killed = sum(len(r.killed) for r in reports)
    counted = killed + sum(len(r.survived) for r in reports)
    text = "\n".join(r.describe() for r in reports)
    assert counted >= 30, text
    assert killed >= GATE * counted, f"check killed {killed} of {counted} mutants\n{text}"
