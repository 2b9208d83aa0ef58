"""The pipeline's stages, called one by one (plan → render → compile → bind → dispatch), agree
with a plain kernel call; METALFORGE_DUMP writes each stage's artefact."""
from types import SimpleNamespace

import torch

import metalforge as mf
from metalforge.runtime import launcher


@mf.kernel
def rms(x: "T[R, D]", w: "T[D]", eps: float = 1e-6):
    return x * mf.rsqrt(mf.mean(x * x, axis="D") + eps) * w


def _torch_rms(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def test_stages_one_by_one_match_a_call():
    x, w = torch.randn(3, 200), torch.randn(200)
    g = rms.graph(x, w)
    s = launcher.plan(g, None, False)
    assert s.family == "row" and not s.index64
    src = launcher.render(s)
    assert src == rms.source(x, w)
    host = s.host_name({"R": 3, "D": 200})
    compiled = launcher.compile(s, src, "sim", host)
    assert compiled.max_threads >= s.policy.threads_per_group

    call = launcher.check_call(g, {"x": x, "w": w, "eps": 1e-6}, "sim", None)
    assert call.numel == 600 and call.outputs[0].shape == (3, 200)
    bound = launcher.bind(call)
    assert bound.args[0] is x and bound.args[2] is call.outputs[0]
    launcher.dispatch(bound)
    torch.testing.assert_close(call.outputs[0], _torch_rms(x, w))
    torch.testing.assert_close(rms(x, w), _torch_rms(x, w))


def test_specialisation_caches_plan_and_library():
    x, w = torch.randn(2, 64), torch.randn(64)
    rms(x, w)
    spec = launcher.specialisation(rms.graph(x, w), None)
    assert spec.schedule(False) is spec.schedule(False)
    assert spec.library(False, "sim") is spec.library(False, "sim")
    assert spec.library(False, "sim").source == launcher.render(spec.schedule(False))


def test_dump_writes_graph_ir_and_msl(tmp_path, monkeypatch):
    monkeypatch.setenv("METALFORGE_DUMP", str(tmp_path))

    @mf.kernel
    def double(x: "T[N]"):
        return x * 2

    src = double.source(T="f16")
    (metal,) = tmp_path.glob("*.metal")
    assert metal.read_text() == src
    assert "kernel double" in metal.with_suffix(".graph").read_text()
    assert metal.with_suffix(".ir").read_text() == double.ir(T="f16")


def test_a_large_input_selects_64_bit_indexing_however_small_the_output():
    """Attention's K/V or a gather's table can pass 2^31 elements while the output is small:
    the call indexes with 64 bits by itself (an expanded tensor: no memory behind it)."""
    big = torch.zeros(1).expand(2 ** 16, 2 ** 15)
    call = launcher.CheckedCall(spec=None, backend="sim", values={}, tensors={"k": big},
                binding=SimpleNamespace(sizes={"A": 2 ** 16, "B": 2 ** 15}), outputs=[],
                numel=1)
    assert call.index64
    small = launcher.CheckedCall(spec=None, backend="sim", values={}, tensors={"k": big[:2]},
                 binding=SimpleNamespace(sizes={"A": 2, "B": 2 ** 15}), outputs=[], numel=1)
    assert not small.index64
