"""Scatter outputs (mf.scatter_add) on the simulator against torch computed directly: embedding
gradients (rows added at ids, duplicates included), histograms and MoE counts in integers, f32
and f16 outputs, an empty source, deterministic mode (bit-identical runs, within tolerance of a
float64 sum), indices out of range, the errors at the user's line, the cuda shim's atomics."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import metalforge as mf
from metalforge.cuda import translate
from metalforge.cuda.library import INCLUDE_DIR
from metalforge.testing import check


@mf.kernel
def embedding_grad(grad: "T[N, E]", ids: "i32[N]", table: "T[V, E]") -> "T[V, E]":
    return mf.scatter_add(grad, "V", ids)


@mf.kernel
def embedding_grad_det(grad: "T[N, E]", ids: "i32[N]", table: "T[V, E]",
                       scale: float = 1.0) -> "T[V, E]":
    return mf.scatter_add(grad * scale, "V", ids, deterministic=True)


@mf.kernel
def histogram(x: "i32[N]", edges: "f32[B]"):
    return mf.scatter_add(1, "B", x)


@mf.kernel
def expert_counts(topk: "i32[T, K]", router: "f32[T, X]"):
    return mf.scatter_add(1, "X", topk)


def _ids(n: int, v: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, v, (n,), generator=g, dtype=torch.int32)


def _want(grad: torch.Tensor, ids: torch.Tensor, v: int) -> torch.Tensor:
    """torch's index_add_ in float64 (the exact sum, rounded once by the comparison)."""
    return torch.zeros(v, grad.shape[1], dtype=torch.float64).index_add_(0, ids.long(),
                                                                         grad.double())


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 2e-3),
                                       (torch.bfloat16, 1e-2)])
def test_embedding_grad_rows_match_index_add(dtype, tol):
    n, e, v = 300, 33, 7                     # 300 rows onto 7: every row many times
    g = torch.Generator().manual_seed(1)
    grad = torch.randn(n, e, generator=g).to(dtype)
    ids = _ids(n, v, 2)
    got = embedding_grad(grad, ids, torch.empty(v, e, dtype=dtype))
    assert got.dtype == dtype and got.shape == (v, e)
    torch.testing.assert_close(got.double(), _want(grad, ids, v), rtol=tol, atol=tol * 10)
    # torch's own (f16 in f32 accumulation, rounded once): within an f16 rounding
    ref = torch.zeros(v, e, dtype=torch.float32).index_add_(0, ids.long(), grad.float())
    torch.testing.assert_close(got.float(), ref.to(dtype).float(), rtol=tol, atol=tol * 10)


@settings(max_examples=8, deadline=None)
@given(n=st.integers(0, 70), e=st.integers(1, 9), v=st.integers(1, 12), seed=st.integers(0, 99))
def test_embedding_grad_any_shape(n, e, v, seed):
    g = torch.Generator().manual_seed(seed)
    grad = torch.randn(n, e, generator=g)
    ids = _ids(n, v, seed)
    got = embedding_grad(grad, ids, torch.empty(v, e))
    torch.testing.assert_close(got.double(), _want(grad, ids, v), rtol=1e-5, atol=1e-4)


def test_histogram_and_moe_counts_are_exact_integers():
    x = _ids(5000, 13, 3)                    # every bin hit by hundreds of concurrent atomics
    got = histogram(x, torch.zeros(13))
    assert got.dtype == torch.int32
    assert torch.equal(got, torch.bincount(x.long(), minlength=13).to(torch.int32))
    topk = _ids(2 * 64, 8, 4).view(64, 2)    # top-2 experts of 64 tokens: index over [T, K]
    counts = expert_counts(topk, torch.zeros(64, 8))
    want = torch.zeros(8, dtype=torch.int64).scatter_add_(0, topk.reshape(-1).long(),
                                                          torch.ones(128, dtype=torch.int64))
    assert torch.equal(counts, want.to(torch.int32))


def test_empty_source_gives_zeros():
    for k in (embedding_grad, embedding_grad_det):
        got = k(torch.empty(0, 5), torch.empty(0, dtype=torch.int32), torch.full((4, 5), 7.0))
        assert torch.equal(got, torch.zeros(4, 5))


def test_deterministic_mode_is_bit_identical_and_close_to_float64():
    n, e, v = 2000, 5, 3                     # long runs of equal ids: order matters in fp32
    g = torch.Generator().manual_seed(5)
    grad = torch.randn(n, e, generator=g) * torch.logspace(-3, 3, n).unsqueeze(1)
    ids = _ids(n, v, 6)
    table = torch.empty(v, e)
    first = embedding_grad_det(grad, ids, table, scale=0.5)
    again = embedding_grad_det(grad, ids, table, scale=0.5)
    assert torch.equal(first.view(torch.int32), again.view(torch.int32))
    want = _want(grad * 0.5, ids, v)
    torch.testing.assert_close(first.double(), want, rtol=1e-5, atol=1e-3)
    other = ids.flip(0).contiguous()         # a warm call sorts its own index
    torch.testing.assert_close(embedding_grad_det(grad, other, table, scale=0.5).double(),
                               _want(grad * 0.5, other, v), rtol=1e-5, atol=1e-3)
    # the same sum as adding each run in index order in fp32, bit for bit
    for j in range(v):
        acc = torch.zeros(e)
        for row in (grad[ids == j] * 0.5):
            acc = acc + row
        assert torch.equal(first[j], acc)


def test_deterministic_f16_sums_in_f32_and_rounds_once():
    grad, ids = torch.randn(200, 6).half(), _ids(200, 4, 9)
    got = embedding_grad_det(grad, ids, torch.empty(4, 6, dtype=torch.float16))
    want = torch.zeros(4, 6)
    for row, j in zip(grad.float(), ids.tolist()):      # f32 adds in index order
        want[j] = want[j] + row
    assert got.dtype == torch.float16 and torch.equal(got, want.half())


@pytest.mark.parametrize("kernel", [embedding_grad, embedding_grad_det])
@pytest.mark.parametrize("bad", [-1, 4])
def test_index_out_of_range_raises(kernel, bad):
    ids = torch.tensor([0, 3, bad, 1], dtype=torch.int32)
    with pytest.raises(mf.GatherIndexError, match=rf"scatter_add along 'V' \(size 4.*index {bad} "):
        kernel(torch.ones(4, 2), ids, torch.empty(4, 2))
    with pytest.raises(mf.GatherIndexError, match=rf"index {bad} "):
        kernel.reference(torch.ones(4, 2), ids, torch.empty(4, 2))


def test_check_covers_boundary_sizes_and_bad_indices():
    report = check(embedding_grad_det, dtypes={"T": "f32"}, max_examples=4, layouts=False)
    assert report.examples > 0


def _trace_error(fn, *args) -> str:
    with pytest.raises(mf.MetalforgeError) as e:
        fn(*args)
    return str(e.value)


def test_errors_name_the_line_and_what_would_be_right():
    @mf.kernel
    def float_index(x: "f32[N]", at: "f32[N]", t: "f32[V]"):
        return mf.scatter_add(x, "V", at)

    @mf.kernel
    def computed_sorted(x: "f32[N]", ids: "i32[N]", t: "f32[V]"):
        return mf.scatter_add(x, "V", ids + 1, deterministic=True)

    @mf.kernel
    def wide_counts(ids: "i32[N]", t: "f32[V]"):
        return mf.scatter_add(1, "V", ids, dtype=mf.i64)

    @mf.kernel
    def not_alone(x: "f32[N]", ids: "i32[N]", t: "f32[V]"):
        return mf.scatter_add(x, "V", ids), x * 2

    @mf.kernel
    def own_axis(x: "f32[V]", ids: "i32[V]"):
        return mf.scatter_add(x, "V", ids)

    x, ids, t = torch.ones(3), torch.zeros(3, dtype=torch.int32), torch.empty(4)
    msg = _trace_error(float_index, x, x, t)
    assert "integer value" in msg and "test_scatter.py" in msg
    assert "tensor argument of the kernel itself" in _trace_error(computed_sorted, x, ids, t)
    assert "dtype=mf.i32" in _trace_error(wide_counts, ids, t)
    assert "only output" in _trace_error(not_alone, x, ids, t)
    assert "must not have it" in _trace_error(own_axis, x, ids)


def test_generated_msl_uses_relaxed_atomics_and_the_cuda_shim_takes_it(tmp_path):
    sources = [embedding_grad.source(T="f16"), histogram.source(),
               embedding_grad_det.source(T="bf16")]
    assert "mf_atomic_add(mf_scratch + " in sources[0] and "finish" in sources[0]
    assert "memory_order_relaxed" in sources[1] and "atomic_int" in sources[1]
    assert "atomic" not in sources[2].split("kernel void")[1]     # segmented: no atomics
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no host C++ compiler for the syntax check")
    for k, src in enumerate(sources):
        f = tmp_path / f"tu{k}.cu"
        f.write_text(translate(src).text)
        r = subprocess.run([cxx, "-std=c++17", "-fsyntax-only", "-DMF_CUDA_HOST_CHECK",
                            f"-I{INCLUDE_DIR}", "-x", "c++", str(f)], capture_output=True,
                           text=True)
        assert r.returncode == 0, r.stderr[:4000]
    assert re.search(r"atomicAdd", (INCLUDE_DIR / "metal_stdlib").read_text())


@mf.kernel
def expert_counts_det(topk: "i32[T, K]", router: "f32[T, X]"):
    return mf.scatter_add(1, "X", topk, deterministic=True)


def test_deterministic_counts_over_a_two_axis_index():
    topk = _ids(3 * 40, 6, 7).view(40, 3)
    counts = expert_counts_det(topk, torch.zeros(40, 6))
    assert torch.equal(counts, torch.bincount(topk.reshape(-1).long(), minlength=6).int())


def test_as_op_and_gradient_is_a_gather():
    op = embedding_grad.as_op("mftest::scatter_embedding_grad")
    grad, ids = torch.randn(20, 4), _ids(20, 5, 8)
    torch.testing.assert_close(op(grad, ids, torch.empty(5, 4)).double(), _want(grad, ids, 5),
                               rtol=1e-5, atol=1e-5)       # fp32 adds, in the atomics' order
    # its gradient is the gather of the output gradient (autodiff, #53): dy[ids]
    g = grad.clone().requires_grad_()
    dy = torch.randn(5, 4)
    got = torch.autograd.grad(embedding_grad(g, ids, torch.empty(5, 4)), g, dy)[0]
    torch.testing.assert_close(got, dy[ids.long()])


def test_mlx_backend_refuses_scatter_kernels():
    from metalforge.runtime import mlx
    with pytest.raises(mf.UnsupportedOnBackend, match="scatter_add.*torch tensors"):
        mlx._one_launch(embedding_grad.graph(T="f32"), None, "kernel 'embedding_grad'")


def test_checks_slack_covers_the_reordered_sums():
    from metalforge.testing.slack import reduction_slack
    grad, ids, table = torch.randn(50, 3), torch.zeros(50, dtype=torch.int32), torch.empty(2, 3)
    values = {"grad": grad, "ids": ids, "table": table}
    s = reduction_slack(embedding_grad.graph(grad, ids, table), values,
                        (embedding_grad.reference(grad, ids, table),))
    assert (s[0][0] > 0).all() and (s[0][1] == 0).all()       # 50 terms in row 0, none in 1
    assert reduction_slack(histogram.graph(ids, torch.zeros(2)),
                           {"x": ids, "edges": torch.zeros(2)}, ()) is None    # exact integers
