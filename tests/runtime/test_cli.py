"""`metalforge show FILE.py::NAME`: prints the kernel's MSL or IR; clear errors otherwise."""
import subprocess
import sys
from pathlib import Path

from metalforge.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_show_prints_msl(capsys):
    assert main(["show", f"{EXAMPLES / 'silu.py'}::silu"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("#include <metal_stdlib>")
    assert 'template [[host_name("silu_f32")]] kernel void mf_silu<float, uint>(' in out


def test_show_dtype_and_ir(capsys):
    target = f"{EXAMPLES / 'swiglu.py'}::swiglu"
    assert main(["show", target, "--dtype", "f16", "--emit", "ir"]) == 0
    out = capsys.readouterr().out
    assert "instance swiglu_f16: T=half, mf_index_t=uint" in out
    assert "store mf_out[mf_start : +8] = mf_pack8_of(mf_out_v[0], mf_out_v[1]," in out


def test_show_a_kernel_kept_as_an_operator(capsys):
    """examples/train_block.py keeps its kernels as operators (`kernel.as_op`): show takes
    the operator's kernel."""
    assert main(["show", f"{EXAMPLES / 'train_block.py'}::swiglu", "--backward"]) == 0
    out = capsys.readouterr().out
    assert "// backward kernel 1 of 1 of 'swiglu': writes dgate, dup" in out


def test_show_errors(capsys):
    assert main(["show", f"{EXAMPLES / 'silu.py'}::nope"]) == 2
    err = capsys.readouterr().err
    assert "defines no 'nope'" in err and "silu" in err
    assert main(["show", f"{EXAMPLES / 'silu.py'}"]) == 2
    assert "expected FILE.py::NAME" in capsys.readouterr().err
    assert main(["show", "missing.py::k"]) == 2
    assert "no such file" in capsys.readouterr().err


def test_console_entry_point_runs_as_module():
    r = subprocess.run([sys.executable, "-m", "metalforge.cli", "show",
                        f"{EXAMPLES / 'bias_scale.py'}::bias_scale", "--dtype", "bf16"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "constant float& scale [[buffer(3)]]" in r.stdout
    assert "mf_bias_scale<bfloat, uint>" in r.stdout
