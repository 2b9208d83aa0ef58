"""The export's size rule: the launcher's code traced with symbolic sizes (export/symbolic.py,
export/rule.py) gives formulas that, evaluated at any sizes and pipeline limits, launch and bind
what the code does there; code with no such form is said so, never a wrong formula; and the
MLX loader makes the `mx.fast.metal_kernel` call the mlx backend makes for the traced kernel."""
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import metalforge as mf
from metalforge import schedule as sched_mod
from metalforge.export import export
from metalforge.export import rule as rule_mod
from metalforge.export import symbolic as sym
from metalforge.runtime import launcher
from metalforge.runtime.binding import BindingPlan

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _kernel(module, name):
    spec = importlib.util.spec_from_file_location(f"mf_rule_{module}", EXAMPLES / f"{module}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return getattr(mod, name)


def _context(kernel, bindings, groups=()):
    graph = kernel.graph(**bindings)
    s = sched_mod.plan(graph, kernel.launch, index64=False)
    grid = max(graph.outputs, key=lambda o: len(o.axes)).axes
    return rule_mod.Context(graph, s, BindingPlan.of(graph, s), False, tuple(grid), groups,
                            "kernel")


CASES = {   # a row reduction (a pipeline limit switches kernels), a column reduction (chunks
            # merged by later launches), attention (key blocks, a merge launch, scratch)
    "rms_norm": (("rms_norm", "rms_norm"), {"T": "f16"}, ()),
    "column_sum": (("column_sum", "column_sum"), {"T": "f32"}, ()),
    "attention": (("attention", "attention"), {"T": "f32"}, (("G", "R"),)),
}
_built = {}


def _rule(case):
    if case not in _built:
        where, bindings, groups = CASES[case]
        ctx = _context(_kernel(*where), bindings, groups)
        hosts = [i.host_name for k in ctx.schedule.kernels for i in k.instances]
        exported = {a: 4 for a in rule_mod.base_axes(ctx.graph)}
        got = rule_mod.rule(ctx, exported, {h: 1024 for h in hosts})
        assert "checks" in got, got
        _built[case] = ctx, hosts, got
    return _built[case]


SIZE = st.one_of(st.integers(0, 70), st.integers(0, 20000),
                 st.sampled_from([128, 256, 257, 4096, 8192, 8193, 16384, 16385]))


@pytest.mark.parametrize("case", sorted(CASES))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_the_formulas_launch_what_the_code_launches(case, data):
    ctx, hosts, got = _rule(case)
    base = {a: data.draw(SIZE, label=a) for a in rule_mod.base_axes(ctx.graph)}
    limits = {h: data.draw(st.sampled_from([32, 64, 256, 512, 1024]), label=h) for h in hosts}
    if "max_threads" in got:            # traced with every pipeline taking 1024 threads
        limits = dict.fromkeys(hosts, 1024)
    assert rule_mod.at(got, base, limits) == rule_mod.concrete(ctx, base, limits)


def test_a_pipeline_limit_is_a_symbol_of_the_rule():
    ctx, hosts, got = _rule("rms_norm")
    base = {"B": 3, "D": 4000}                      # the group kernel, 256 threads a row
    group = next(h for h in hosts if h.endswith("_group"))
    low = {h: 1024 for h in hosts} | {group: 128}
    assert [h for h, _, _ in rule_mod.at(got, base, {h: 1024 for h in hosts})["launches"]] \
        == [group]
    assert rule_mod.at(got, base, low)["launches"] == [(group[:-len("group")] + "looped",
                                                       3 * 1024, 1024)]
    assert any(f"max_threads({group})" in line for line in got["text"])


def test_symbolic_values_branch_and_refuse_what_has_no_formula():
    def rule():
        d = sizes["D"]
        lanes = max(1, -(-d // 8))
        band = 1 if d * 4 <= d + 300 else 2 if d <= 120 else 3 if 4096 < d * 2 else 4
        return [1 << (lanes - 1).bit_length(), d % 3 + (d >> 2), sym.maximum(1, d - 5), band]
    sizes = {"D": sym.SymInt("D")}
    tree = sym.trace(rule, (ValueError,), {"D": (0, 2 ** 64)})
    node = sym.project(tree, lambda v: [sym.to_json(sym.value(x)) for x in v])
    for d in list(range(0, 300)) + [4095, 4096, 4097]:
        sizes = {"D": d}
        want = rule()
        leaf = rule_mod.pick(node, {"D": d})["value"]
        assert [sym.evaluate(e, {"D": d}) for e in leaf] == want
    assert str(-(-sym.SymInt("D") // 4)) == "ceil(D / 4)"
    with pytest.raises(sym.NotSymbolic, match="used as a Python int"):
        range(sym.SymInt("D"))
    with pytest.raises(sym.NotSymbolic):
        sym.SymInt("D") / 2


def test_a_rule_the_code_cannot_trace_is_unavailable(monkeypatch):
    ctx, hosts, _ = _rule("rms_norm")
    monkeypatch.setattr(type(ctx.schedule), "steps",
                        lambda self, sizes: tuple(launcher.Step("k", n, 1)
                                                  for n in range(sizes["D"])))
    got = rule_mod.rule(ctx, {"B": 4, "D": 8}, {h: 1024 for h in hosts})
    assert "checks" not in got and "not a formula of the sizes" in got["unavailable"]


def test_sizes_are_read_off_plain_grouped_and_derived_dims():
    from metalforge.export.loader import ExportedKernel
    k = ExportedKernel({"where": "kernel 'k'"}, Path("."))
    sources = {"K": ["w", 1, [], [1, 8, 0]], "R": ["q", 1, ["G"]], "G": ["k", 0, []]}
    assert k._sizes(sources, {"w": (5, 64), "q": (2, 12), "k": (3, 7)}) == \
        {"K": 512, "G": 3, "R": 4}
    with pytest.raises(mf.BindingError, match="cannot read size 'R' off argument 'q'"):
        k._sizes(sources, {"w": (5, 64), "q": (2, 12), "k": (0, 7)})


def test_messages_in_the_rule_name_no_directories():
    got = rule_mod._no_paths({"refuse": "mf.argmax at /home/me/k.py:3 over an empty axis",
                              "x": ["dim 'K/8'", "(C:\\u\\k.py:1)"]})
    assert got == {"refuse": "mf.argmax at k.py:3 over an empty axis",
                   "x": ["dim 'K/8'", "(k.py:1)"]}


mx = pytest.importorskip("mlx.core")


def test_mlx_loader_makes_the_mlx_backends_call(tmp_path):
    from metalforge.export.mlx import launch
    from metalforge.runtime import mlx as mfx
    rms = _kernel("rms_norm", "rms_norm")
    export(rms, {"T": "f16"}, {"B": 4, "D": 100}, tmp_path)
    assert json.loads((tmp_path / "manifest.json").read_text())["specialisations"][0]["mlx"] \
        == {"source": "rms_norm-0.mlx.json"}
    x, w = mfx.to_mlx(torch.randn(3, 300).half()), mfx.to_mlx(torch.randn(300).half())
    entry = mf.load_exported(tmp_path, backend="sim")["rms_norm"][0]
    values = entry.values((x, w), {})
    ours = launch(entry, values, entry.layout(values, "sim"))
    theirs, _ = mfx.prepare(rms.graph(T="f16"), {"x": x, "w": w, "eps": 1e-6})
    assert ours.kernel == theirs.kernel and ours.kwargs == theirs.kwargs
    assert [(a.shape, a.dtype, a.tolist() if a.ndim == 0 else None) for a in ours.inputs] == \
        [(a.shape, a.dtype, a.tolist() if a.ndim == 0 else None) for a in theirs.inputs]
    got = mf.load_exported(tmp_path, backend="sim").rms_norm(x, w)     # MLX's source, simulated
    assert torch.equal(mfx.to_torch(got), rms(mfx.to_torch(x), mfx.to_torch(w)))
    if not mx.metal.is_available():
        with pytest.raises(mf.BackendUnavailable, match="backend='sim'"):
            mf.load_exported(tmp_path, backend="mlx").rms_norm(x, w)
