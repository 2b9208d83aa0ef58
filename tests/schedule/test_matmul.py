"""The contraction family (schedule/matmul) on the matrix block (schedule/matrix), each
lowering run in the simulator against torch computed directly, and target selection
(metalforge/target.py).

The Metal 4 tensor-op lowering needs the simulator's MetalPerformancePrimitives headers (the
`mpp` branch); its tests skip where they are not there yet."""

import pytest
import torch
import torch.nn.functional as F

import metalforge as mf
from metalforge import schedule
from metalforge.target import (
    PROBE,
    compile_options,
    current_target,
    get_target,
    pick_mps,
    probe,
)
from metalforge.testing import check

from .matmul_kernels import linear_gelu, matmul, scaled

DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}
TOL = {"f16": 1e-2, "bf16": 4e-2, "f32": 1e-4}
SMALL = {"M": (1, 40), "N": (1, 40), "B": [(), (2,)]}


def _inputs(dt: str):
    """Partial tiles everywhere: M = 70 (64 + 6), N = 66, K = 72 (two whole steps, read as
    vectors where the operand is a tensor, and 8), 2 batches."""
    g = torch.Generator().manual_seed(0)
    t = DTYPES[dt]
    return (torch.randn(2, 70, 72, generator=g).to(t), torch.randn(66, 72, generator=g),
            torch.randn(66, generator=g).to(t))


def _run_linear_gelu(dt: str, target: str, marker: str):
    x, w, b = _inputs(dt)
    with mf.target(target):
        assert marker in linear_gelu.source(x, w, b)
        y = linear_gelu(x, w, b)
    want = F.gelu(F.linear(x.double(), w.to(x.dtype).double(), b.double()))
    torch.testing.assert_close(y.double(), want, rtol=TOL[dt], atol=TOL[dt])


@pytest.mark.parametrize("dt", ["f16", "bf16", "f32"])
def test_simdgroup_matrix_lowering_matches_torch(dt):
    _run_linear_gelu(dt, "apple9", f"simdgroup_matrix<{get_mat(dt)}, 8, 8>")


def get_mat(dt: str) -> str:
    return {"f16": "half", "bf16": "bfloat", "f32": "float"}[dt]


@pytest.mark.parametrize("dt,target", [("bf16", "apple10"), ("f16", "apple9-metal4")])
def test_tensor_ops_lowering_matches_torch(dt, target):
    """matmul2d over threadgroup tensors, read back through get_multidimensional_index: right
    on M5's cooperative layout (family 10) and on the ALU layout of family 9 alike."""
    _run_linear_gelu(dt, target, "matmul2d<mf_desc, execution_simdgroup>")


def test_f32_and_computed_operands_keep_the_fp32_path_at_a_tensor_op_target():
    with mf.target("apple10"):
        for src in (matmul.source(T="f32"), scaled.source(T="f16")):
            assert "simdgroup_matrix<float, 8, 8>" in src and "matmul2d" not in src


def test_check_covers_the_simdgroup_lowering():
    """Boundary sizes of K (1, 31..33, 63..65: partial and whole steps), partial tiles of M
    and N (the direct tests above cover several tiles: the simulator's time)."""
    with mf.target("apple9"):
        check(linear_gelu, dtypes={"T": ["f16"]}, max_examples=4, dims=SMALL)


def test_check_covers_the_tensor_op_lowering():
    with mf.target("apple10"):
        check(linear_gelu, dtypes={"T": ["bf16"]}, max_examples=4, dims=SMALL)


# --------------------------------------------------------------------------- recognition

@mf.kernel
def same_rows(a: "T[M, K]", b: "T[M, K]") -> "T[M]":
    return mf.sum(a * b, axis="K")


@mf.kernel
def not_a_product(a: "T[M, K]", b: "T[N, K]") -> "T[M, N]":
    return mf.sum(mf.exp(a * b), axis="K")


@mf.kernel
def gathered(a: "T[M, K]", b: "T[V, K]", ids: "i32[N]") -> "T[M, N]":
    return mf.sum(a * mf.take(b, "V", ids), axis="K")


@pytest.mark.parametrize("kernel,fam", [(matmul, "matmul"), (linear_gelu, "matmul"),
                                        (same_rows, "row"), (not_a_product, "row")])
def test_only_contractions_are_recognised(kernel, fam):
    assert schedule.family(kernel.graph(T="f32")) == fam


def test_an_operand_with_a_gather_keeps_its_family():
    assert schedule.family(gathered.graph(T="f32")) != "matmul"


# --------------------------------------------------------------------------- targets

def test_target_precedence(monkeypatch):
    monkeypatch.delenv("METALFORGE_TARGET", raising=False)
    assert current_target("sim").name == "apple9" and current_target("cuda").name == "cuda"
    monkeypatch.setenv("METALFORGE_TARGET", "apple10")
    assert current_target("sim").name == "apple10"
    assert "matmul2d" in matmul.source(T="f16")
    with mf.target("apple8"):
        assert current_target("sim").name == "apple8"
        assert "matmul2d" not in matmul.source(T="f16")
        # the launch option wins over both
        assert "matmul2d" in matmul.with_launch(target="apple10").source(T="f16")
    assert current_target("sim").name == "apple10"
    monkeypatch.setenv("METALFORGE_TARGET", "m5")
    with pytest.raises(mf.DeviceError, match="target in METALFORGE_TARGET 'm5'.*apple10"):
        current_target("sim")


def test_unknown_targets_are_refused():
    with pytest.raises(mf.DeviceError, match="unknown metalforge target 'apple11'"):
        mf.target("apple11")
    with pytest.raises(mf.LaunchError, match="target must be one of"):
        matmul.with_launch(target="m5").source(T="f16")


def test_compile_options_and_the_mps_default():
    assert compile_options(get_target("apple9"), "sim") == {}
    assert compile_options(get_target("apple10"), "sim") == {"metal_version": 400,
                                                             "gpu_family": 10}
    assert compile_options(get_target("cuda"), "cuda") == {"metal_version": 400}
    assert compile_options(get_target("apple10"), "mps") == {}
    assert compile_options(None, "sim") == {}
    assert [pick_mps(5, True), pick_mps(5, False), pick_mps(4, True), pick_mps(1, False),
            pick_mps(None, True)] == ["apple10", "apple9", "apple9", "apple7", "apple9"]
    assert "#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>" in PROBE


def test_the_mps_probe_follows_compile_shaders_call_model():
    """A compile error is compile_shader's SyntaxError, other failures its RuntimeError."""
    def fails(exc):
        def compile_shader(source):
            assert "matmul2d_descriptor" in source
            raise exc("Failed to create metal library")
        return compile_shader
    assert probe(lambda source: object(), 5) == "apple10"
    assert probe(fails(SyntaxError), 5) == probe(fails(RuntimeError), 6) == "apple9"
    assert probe(lambda source: object(), 2) == "apple8"
