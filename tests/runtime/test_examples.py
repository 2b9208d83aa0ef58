"""Every example runs as a script: prints its MSL, runs on the default backend, checks itself."""
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.py"))


def test_examples_found():
    names = {p.stem for p in EXAMPLES}
    assert {"silu", "gelu", "swiglu", "bias_scale", "causal_mask", "two_outputs"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_runs(path):
    r = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert "#include <metal_stdlib>" in r.stdout
    assert "kernel void mf_" in r.stdout
    assert "match" in r.stdout.splitlines()[-1]
