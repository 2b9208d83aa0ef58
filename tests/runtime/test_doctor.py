"""`metalforge doctor` end to end on the simulator: the machine facts, a suite kernel checked,
a user file's kernels added, the JSON and Markdown reports (no personal paths), and the exit
status and report of a compile failure and of a wrong answer."""
import json
from pathlib import Path

import pytest

from metalforge import cli
from metalforge.doctor import machine, report, run
from metalforge.doctor.suite import SUITE, by_name

USER_FILE = '''
import metalforge as mf

@mf.kernel
def double(x: "T[N]"):
    return x * 2

CHECK = {"double": {"dims": {"N": [1, 33]}}}
'''


def test_doctor_checks_a_suite_kernel_and_a_user_file(tmp_path, capsys):
    user = tmp_path / "mine.py"
    user.write_text(USER_FILE)
    out = tmp_path / "report.json"
    code = cli.main(["doctor", str(user), "--kernels", "silu", "--dtype", "f16",
                     "--examples", "3", "--out", str(out)])
    assert code == 0
    doc = json.loads(out.read_text())
    assert doc["schema"] == report.SCHEMA
    assert doc["machine"]["backend"] == "sim" and doc["machine"]["metal_version"] == "3.2"
    assert [(r["kernel"], r["dtype"], r["status"]) for r in doc["results"]] == [
        ("silu", "f16", "ok"), ("mine.double", "f16", "ok")]
    assert all(r["examples"] > 0 and r["instantiations"] for r in doc["results"])
    md = out.with_suffix(".md").read_text()
    assert "| silu | elementwise | f16 | ok |" in md and "mine.double" in md
    printed = capsys.readouterr().out
    assert "backend sim (Metal 3.2)" in printed and "2/2 passed" in printed


def test_compile_failure_is_reported_with_its_source_line(monkeypatch):
    def refuse(backend, source):
        e = SyntaxError("program_source:3:5: error: use of undeclared identifier 'oops'")
        raise e
    monkeypatch.setattr(run.backends, "library", refuse)
    r = run.check_one(by_name(["silu"])[0], "f32", "sim", 2)
    assert r.status == "compile" and r.failed
    assert r.source_line.startswith("3: ")
    assert "undeclared identifier" in r.message


def test_wrong_answer_fails_the_run(tmp_path, monkeypatch, capsys):
    def wrong(*a, **k):
        raise AssertionError("metalforge check: kernel 'silu': output 0 differs")
    monkeypatch.setattr(run, "check", wrong)
    out = tmp_path / "r.json"
    code = cli.main(["doctor", "--kernels", "silu", "--dtype", "f32", "--out", str(out)])
    assert code == 1
    doc = json.loads(out.read_text())
    assert doc["summary"] == {"checked": 1, "failed": 1, "by_status": {"mismatch": 1}}
    assert "## Failures" in out.with_suffix(".md").read_text()
    assert "send both files" in capsys.readouterr().out


def test_reports_hold_no_personal_paths(monkeypatch):
    home = str(Path.home())
    r = run.Result("k", "user", "f32", "error", message=f"in {home}/secret/x.py line 3")
    doc = report.document({"backend": "sim"}, {}, [r])
    text = json.dumps(doc) + report.markdown(doc)
    assert home not in text and "~/secret/x.py" in text


def test_bench_is_refused_on_the_simulator(capsys):
    assert cli.main(["doctor", "--bench", "--device", "sim", "--kernels", "silu"]) == 1
    assert "--device mps or cuda" in capsys.readouterr().err


def test_the_suite_covers_every_family_and_names_are_checked():
    assert {e.family for e in SUITE} >= {"elementwise", "row", "column", "gather", "attention",
                                         "quant"}
    with pytest.raises(ValueError, match="no kernel 'nope'.*rms_norm"):
        by_name(["nope"])
    assert "Metal" in machine.describe(machine.facts("sim", "cpu"))
