"""Every example runs as a script: prints its MSL, runs on the default backend, checks itself."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


def test_examples_found():
    names = {p.stem for p in EXAMPLES}
    assert {"silu", "gelu", "swiglu", "bias_scale", "causal_mask", "two_outputs"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_runs(path):
    # the checkout under test's metalforge (not an installed one from another checkout)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    r = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300,
                       env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert "#include <metal_stdlib>" in r.stdout
    assert "kernel void mf_" in r.stdout
    assert "match" in r.stdout.splitlines()[-1]
