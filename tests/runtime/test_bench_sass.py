"""bench/sass.py reads Nsight Compute's SASS page (CSV): the opcode of each line, the opcode mix
and the loop bodies by execution count, on a made-up export (no GPU)."""
import io
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import sass  # noqa: E402


def test_opcodes_drop_predicates_and_modifiers():
    assert sass.opcode("  @!P0 LDSM.16.M88.4 R8, [R2]") == "LDSM"
    assert sass.opcode("HMMA.16816.F32 R4, R8, R12, R4") == "HMMA"
    assert sass.opcode("   ") == "?"


def test_the_report_counts_a_loop_body_per_pass():
    (k,) = sass.read(io.StringIO(sass.SAMPLE))
    assert sum(k.executed.values()) == 3 * 64 + 4
    text = sass.report(k, top=2, loops=1)
    assert "HMMA" in text and "64" in text and "3" in text.splitlines()[-1]


def test_no_bench_script_shadows_the_standard_library():
    # tests put bench/ first on sys.path (this file, test_floors_edits.py): a script named like
    # a standard module (bench/profile.py was) replaces it in every later import of the
    # worker, and torch.compile's `import cProfile` failed
    scripts = {p.stem for p in (Path(__file__).resolve().parents[2] / "bench").glob("*.py")}
    assert "sass" in scripts and not scripts & set(sys.stdlib_module_names)
