"""The mutation gate: `check` kills at least GATE of the single-site mutants of the example
kernels' generated MSL that are not argued equivalent.

GATE is 85%, not the 95% we aim for: what survives (measured 2026-11-24: 47 of 53 killed here,
64 of 70 in a 3-per-kernel sample) is mostly dropped barriers that guard a write-after-read
hazard (attention's row-by-row merge through threadgroup memory, the tiled quantized kernel's
step loop): running the threads in either order shows them only for some sizes and values. A
threadgroup-memory race detector in the simulator would catch them all.

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
PER_KERNEL = 2
SEED = 0
GATE = 0.85


def test_check_kills_the_examples_mutants():
    examples = example_kernels(ROOT / "examples")
    reports = list(gate_runs([examples[n] for n in sorted(examples)], PER_KERNEL, SEED))
    killed = sum(len(r.killed) for r in reports)
    counted = killed + sum(len(r.survived) for r in reports)
    text = "\n".join(r.describe() for r in reports)
    assert counted >= 50, text
    assert killed >= GATE * counted, f"check killed {killed} of {counted} mutants\n{text}"
