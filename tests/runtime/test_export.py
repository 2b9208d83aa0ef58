"""`metalforge export` and `mf.load_exported`: the exported source and manifest, loaded into the
simulator with no tracing, compute exactly what the traced kernel computes (the same Metal, the
same launches), for one launch, several (attention's split keys and merge, with a scratch
buffer), packed words, an index report and a device sort; wrong shapes and schemas are refused."""
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

import metalforge as mf
from metalforge import cli, quant
from metalforge.export import export

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _example(name):
    spec = importlib.util.spec_from_file_location(f"mf_export_{name}", EXAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_export_cli_and_load_run_as_the_traced_kernel(tmp_path, capsys):
    rms = EXAMPLES / "rms_norm.py"
    for shape in (["B=4", "D=100"], ["B=2", "D=4096"]):
        assert cli.main(["export", f"{rms}::rms_norm", "--dtype", "f16", "--shape", *shape,
                         "-o", str(tmp_path)]) == 0
    assert "runs at any sizes its rule admits" in capsys.readouterr().out
    doc = json.loads((tmp_path / "manifest.json").read_text())
    assert doc["schema"] == mf.export.SCHEMA and len(doc["specialisations"]) == 2
    assert "/" not in doc["specialisations"][0]["where"]          # no paths of the machine
    assert str(EXAMPLES) not in (tmp_path / "manifest.json").read_text()
    assert "xcrun -sdk macosx metallib" in (tmp_path / "build_rms_norm-0.sh").read_text()
    lib = mf.load_exported(tmp_path)
    k = _example("rms_norm").rms_norm
    for shape in ((4, 100), (2, 4096)):
        x, w = torch.randn(shape).half(), torch.randn(shape[1]).half()
        assert torch.equal(lib.rms_norm(x, w), k(x, w))
        assert torch.equal(lib.rms_norm(x, w, eps=0.1), k(x, w, eps=0.1))
    x, w = torch.randn(5, 300).half(), torch.randn(300).half()   # other sizes: the rule
    assert torch.equal(lib.rms_norm(x, w), k(x, w))
    with pytest.raises(mf.BindingError, match=r"'w'.*must have shape \(300,\).*got \(301,\)"):
        lib.rms_norm(x, torch.randn(301).half())
    doc["specialisations"][0]["rule"] = {"unavailable": "no formula"}     # a per-shape entry
    (tmp_path / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(mf.BindingError, match=r"\(4, 100\).*no formula.*export these sizes"):
        mf.load_exported(tmp_path)["rms_norm"][0](x, w)


def test_split_keys_packed_words_reports_and_sorts(tmp_path):
    att = _example("attention").attention
    sizes = {"B": 1, "G": 2, "R": 4, "S": 1, "L": 300, "E": 64}
    export(att, {"T": "f32"}, sizes, tmp_path)
    q, k, v = torch.randn(1, 8, 1, 64), torch.randn(1, 2, 300, 64), torch.randn(1, 2, 300, 64)
    entry = mf.load_exported(tmp_path)["attention"][0]
    assert len(entry.entry["launches"]) == 2 and any(a["kind"] == "scratch"
                                                     for a in entry.entry["arguments"])
    assert torch.equal(entry(q, k, v, 0.125), att(q, k, v, 0.125))
    for e, length in ((64, 40), (64, 1000)):     # one launch, more key blocks: by the rule
        q, k, v = (torch.randn(1, 8, 1, e), torch.randn(1, 2, length, e),
                   torch.randn(1, 2, length, e))
        assert torch.equal(entry(q, k, v, 0.125), att(q, k, v, 0.125))
    assert [len(entry.layout({"q": q, "k": k[:, :, :n], "v": v[:, :, :n]}, "sim").launches)
            for n in (40, 1000)] == [1, 2]

    qm = _example("q4_matvec").q4_matvec
    export(qm, {"T": "f16", "GS": 64}, {"N": 96, "K": 512, "M": 1}, tmp_path)
    wq, s, b = quant.quantize(torch.randn(96, 512).half(), group_size=64, bits=4)
    x = torch.randn(1, 512).half()
    assert torch.equal(mf.load_exported(tmp_path).q4_matvec(wq, s, b, x), qm(wq, s, b, x))
    wq, s, b = quant.quantize(torch.randn(40, 1024).half(), group_size=64, bits=4)
    x = torch.randn(3, 1024).half()                     # other sizes: by the rule
    assert torch.equal(mf.load_exported(tmp_path).q4_matvec(wq, s, b, x), qm(wq, s, b, x))

    emb = _example("embedding").embed
    export(emb, {"T": "f32"}, {"V": 10, "D": 8, "N": 5}, tmp_path)
    table, ids = torch.randn(10, 8), torch.tensor([1, 9, 0, 3, 3], dtype=torch.int32)
    lib = mf.load_exported(tmp_path)
    assert torch.equal(lib.embed(table, ids), emb(table, ids))
    with pytest.raises(mf.GatherIndexError, match="index 10 is out of range"):
        lib.embed(table, torch.tensor([1, 10, 0, 3, 3], dtype=torch.int32))

    @mf.kernel
    def grads(g: "T[N, E]", ids: "i32[N]", table: "T[V, E]") -> "T[V, E]":
        return mf.scatter_add(g, "V", ids, deterministic=True)
    export(grads, {"T": "f32"}, {"N": 40, "E": 4, "V": 7}, tmp_path)
    g, ids = torch.randn(40, 4), torch.randint(0, 7, (40,), dtype=torch.int32)
    got = mf.load_exported(tmp_path).grads(g, ids, torch.empty(7, 4))
    assert torch.equal(got, grads(g, ids, torch.empty(7, 4)))


def test_export_needs_every_size_and_a_known_schema(tmp_path):
    rms = _example("rms_norm").rms_norm
    with pytest.raises(mf.BindingError, match="--shape D="):
        export(rms, {"T": "f32"}, {"B": 2}, tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"schema": 99, "specialisations": []}))
    with pytest.raises(ValueError, match="schema 99"):
        mf.load_exported(tmp_path)
