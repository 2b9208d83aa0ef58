"""`metalforge gen-tests`: generated pytest modules for the shipped examples, and that they pass."""
import ast
from pathlib import Path

import pytest

from metalforge.cli import main
from metalforge.testing.gen import GenError, generate, kernels_of, load_module

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    out = tmp_path_factory.mktemp("generated")
    assert main(["gen-tests", str(EXAMPLES), "-o", str(out)]) == 0
    return out


def test_one_module_per_example_file_one_test_per_kernel(generated):
    sources = sorted(p for p in EXAMPLES.glob("*.py") if kernels_of(load_module(p)))
    assert sources, "examples/ defines no kernels"
    written = sorted(generated.glob("test_*.py"))
    assert [p.name for p in written] == [f"test_{p.stem}.py" for p in sources]
    for src in sources:
        text = (generated / f"test_{src.stem}.py").read_text()
        tree = ast.parse(text)                                     # valid Python
        tests = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
        names = [name for name, _ in kernels_of(load_module(src))]
        assert tests == [f"test_{n}" for n in names]
        module = load_module(src)
        for name, k in kernels_of(module):
            opts = f', **kernels.CHECK["{name}"]' if name in getattr(module, "CHECK", {}) else ""
            assert f"    check(kernels.{name}{opts})\n" in text       # the module's options
            assert f"    # {k.name}(" in text                         # the signature, as a comment
        assert "dims={" in text and "max_examples=" in text            # editable hints


# generated tests not run here (CI time: 80 s of the suite, and 60 s more for the window and
# padding examples): llama_decode's, padded_attention's and sliding_window_softcap's attention
# kernels are the schedules of attention.py's and paged_attention.py's (whose generated tests
# run), with masks that tests/ops/test_attention.py checks against torch, and each example's
# own run (tests/runtime/test_examples.py) checks them against torch too
SKIPPED = {("llama_decode", "decode_attention"), ("llama_decode", "paged_decode_attention"),
           ("padded_attention", "padded_attention"),
           ("sliding_window_softcap", "window_softcap"),
           # 47 s: the multi-axis schedule's check, which tests/ops/test_multiaxis.py runs on
           # the same group norm (against F.group_norm)
           ("group_norm", "group_norm"),
           # 53 s and 30 s: tests/ops/test_attention.py (test_check_covers_attention) and
           # tests/ops/test_paged_attention.py (test_check_covers_paged_attention) run check on
           # these same kernel objects, every dtype variant, with the module's CHECK options
           # (attention: at the head sizes that pick each of its kernels)
           ("attention", "attention"), ("paged_attention", "paged_attention")}


def _generated_tests():
    """(example file stem, kernel name) of every test gen-tests writes for examples/: one
    pytest case each, so that they are timed (and spread over workers) one by one."""
    return [pytest.param(src.stem, name, id=f"{src.stem}.{name}")
            for src in sorted(EXAMPLES.glob("*.py"))
            for name, _ in kernels_of(load_module(src)) if (src.stem, name) not in SKIPPED]


@pytest.mark.parametrize("stem, name", _generated_tests())
def test_generated_tests_pass(generated, stem, name):
    module = load_module(generated / f"test_{stem}.py")
    getattr(module, f"test_{name}")()


def test_every_example_kernel_has_a_generated_test():
    assert len(_generated_tests()) >= 5


def test_existing_files_are_not_overwritten_without_force(tmp_path, capsys):
    target = EXAMPLES / "silu.py"
    generated = tmp_path
    edited = generated / "test_silu.py"
    edited.write_text("# my edits\n")
    with pytest.raises(GenError, match="would overwrite .*test_silu.py.*--force"):
        generate(target, generated)
    assert edited.read_text() == "# my edits\n"
    assert main(["gen-tests", str(target), "-o", str(generated)]) == 1
    assert "would overwrite" in capsys.readouterr().err
    assert generate(target, generated, force=True) == [edited]
    assert "check(kernels.silu)" in edited.read_text()


def test_files_without_kernels_and_imported_kernels(tmp_path):
    (tmp_path / "helpers.py").write_text("X = 1\n")
    (tmp_path / "mine.py").write_text(
        "import metalforge as mf\n"
        "from silu import silu          # imported: tested where it is defined\n\n"
        "@mf.kernel\n"
        "def twice(x: \"T[N]\"):\n"
        "    return x + x\n")
    (tmp_path / "silu.py").write_text((EXAMPLES / "silu.py").read_text())
    with pytest.raises(GenError, match="defines no @metalforge.kernel"):
        generate(tmp_path / "helpers.py", tmp_path / "out")
    written = generate(tmp_path, tmp_path / "out")
    assert sorted(p.name for p in written) == ["test_mine.py", "test_silu.py"]
    mine = (tmp_path / "out" / "test_mine.py").read_text()
    assert "def test_twice" in mine and "def test_silu" not in mine
    with pytest.raises(GenError, match="no such file"):
        generate(tmp_path / "nope.py", tmp_path / "out")
