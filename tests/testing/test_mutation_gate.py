"""The mutation gate: `check` kills at least GATE of the single-site mutants of the example
kernels' generated MSL that are not argued equivalent.

GATE is 95%. Measured 2026-11-25 with the simulator's threadgroup-memory race detector
(include/mf_sim/race.h, on by default): 53 of 53 killed here (100%; 51 of 53 before it), 65 of
70 in `bench/mutation.py --per-kernel 3 --seed 1` and every one of the 33 dropped-barrier
mutants of the examples (`--operators drop_barrier --per-kernel 0`; 28 of 33 before). The
detector fails a launch where two threads touch one threadgroup element, one writing, with no
barrier between them, whatever the thread order and the values, so a dropped barrier that
guards a write-after-read hazard (attention's row-by-row merge through threadgroup memory, the
tiled quantized kernel's step loop) shows at any size where two threads share an element.
None survives in this sample. In the larger samples the survivors are not barriers: guards of
the last row or column flipped from `>=` to `>` (they only matter to a thread past the last
row or column, which no example launched there: it would have written out of bounds), index
arithmetic in the split-merge kernels of
attention/window_softcap/paged_attention that only shows with several rows and splits at once,
and private or threadgroup arrays made one element larger (equivalent, not yet argued by a
rule); see bench/README.md.

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
GATE = 0.95


def test_check_kills_the_examples_mutants():
    examples = example_kernels(ROOT / "examples")
    reports = list(gate_runs([examples[n] for n in sorted(examples)], PER_KERNEL, SEED))
    killed = sum(len(r.killed) for r in reports)
    counted = killed + sum(len(r.survived) for r in reports)
    text = "\n".join(r.describe() for r in reports)
    assert counted >= 50, text
    assert killed >= GATE * counted, f"check killed {killed} of {counted} mutants\n{text}"
