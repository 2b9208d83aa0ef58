"""Scans (mf.cumsum, cumprod, cummax, cummin, logcumsumexp) against torch's own functions:
the row kernel (scan axis innermost: serial scan, simdgroup prefix, threadgroup carry over
chunks) and the column kernel (scan axis outer), f32/f16/bf16, boundary lengths, NaN in the
running max/min, fused elementwise work before and after, what a scan kernel refuses."""
from __future__ import annotations

import shutil
import subprocess

import pytest
import torch

import metalforge as mf
from metalforge.cuda import translate
from metalforge.cuda.library import INCLUDE_DIR
from metalforge.schedule import family
from metalforge.testing import check

TOL = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.float16: dict(rtol=2e-3, atol=2e-3),
       torch.bfloat16: dict(rtol=1.6e-2, atol=1.6e-2)}
# 32 threads a row: chunks of 256 elements, so 700 runs three chunks with a carry between
ONE_SIMDGROUP = {"threads_per_group": 32}


@mf.kernel
def scans_row(x: "T[B, L]"):
    return (mf.cumsum(x, "L"), mf.cumprod(x, "L"), mf.cummax(x, "L"), mf.cummin(x, "L"),
            mf.logcumsumexp(x, "L"))


@mf.kernel
def scans_col(x: "T[L, B]"):
    return (mf.cumsum(x, "L"), mf.cumprod(x, "L"), mf.cummax(x, "L"), mf.cummin(x, "L"),
            mf.logcumsumexp(x, "L"))


@mf.kernel
def masked_cumsum(x: "T[B, L]", m: "T[B, L]", n: "T[B]"):
    return mf.cumsum(x * m, "L") / n


@mf.kernel
def softmax_so_far(x: "T[B, L]", y: "T[B, L]"):
    return mf.exp(mf.logcumsumexp(x, "L") - y)


@mf.kernel
def int_extremes(x: "i32[B, L]"):
    return mf.cummax(x, "L"), mf.cummin(x, "L")


def torch_scans(x: torch.Tensor, dim: int) -> list[torch.Tensor]:
    """The five scans of x along dim, in f64 (torch's own functions), rounded to x's dtype."""
    d = x.double()
    out = [torch.cumsum(d, dim), torch.cumprod(d, dim), torch.cummax(d, dim).values,
           torch.cummin(d, dim).values, torch.logcumsumexp(d, dim)]
    return [o.to(x.dtype) for o in out]


def values(b: int, n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Values near 1 (cumprod stays finite), a NaN in row 0 and -inf in row 1 where they fit."""
    g = torch.Generator().manual_seed(seed)
    x = (1.0 + 0.05 * torch.randn(b, n, generator=g, dtype=torch.float64)).to(dtype)
    if n > 2:
        x[0, n // 2] = float("nan")
        x[1, n // 3] = float("-inf")
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_row_scans_match_torch(dtype):
    k = scans_row.with_launch(ONE_SIMDGROUP)
    for n in (1, 31, 32, 33, 700):
        x = values(3, n, dtype, n)
        for got, want in zip(k(x), torch_scans(x, 1)):
            torch.testing.assert_close(got, want, equal_nan=True, **TOL[dtype])
    assert [t.shape for t in scans_row(torch.empty(2, 0, dtype=dtype))] == [(2, 0)] * 5


@pytest.mark.parametrize("dtype", [torch.float32])
def test_column_scans_match_torch(dtype):
    """One thread per column; 1100 positions of 3 columns split into 4 segments (a totals
    launch first: the columns alone are too few threads)."""
    for n, launches in ((1, 1), (33, 1), (300, 1), (1100, 2)):
        x = values(3, n, dtype, n).t().contiguous()      # [L, B]: the scan axis outer
        assert len(scans_col.launches(x)) == launches
        for got, want in zip(scans_col(x), torch_scans(x, 0)):
            torch.testing.assert_close(got, want, equal_nan=True, **TOL[dtype])


def test_long_rows_carry_across_chunks_and_segments():
    """Rows of several 256-element chunks (32 threads a group): 3 rows split into segments
    of a chunk each, a totals launch first (fewer rows than fill_groups); 256 rows one
    threadgroup each, the carry running across the chunks; one group holding a whole row."""
    k = scans_row.with_launch(ONE_SIMDGROUP)
    for x, kern, segs in ((values(3, 1000, torch.float32, 7), k, 4),
                          (values(256, 600, torch.float32, 8), k, 1),
                          (values(2, 4095, torch.float32, 9), scans_row, 1)):
        steps = kern.launches(x)
        assert len(steps) == (2 if segs > 1 else 1)
        assert steps[-1][1] == x.shape[0] * segs * steps[-1][2]
        for got, w in zip(kern(x), torch_scans(x, 1)):
            torch.testing.assert_close(got, w, equal_nan=True, rtol=1e-4, atol=1e-3)


def test_fused_prologue_and_epilogue():
    g = torch.Generator().manual_seed(0)
    x, m = torch.randn(4, 300, generator=g), (torch.rand(4, 300, generator=g) > 0.5).float()
    n = torch.rand(4, generator=g) + 0.5
    want = torch.cumsum(x * m, 1) / n[:, None]
    torch.testing.assert_close(masked_cumsum(x, m, n), want, rtol=1e-5, atol=1e-5)
    y = torch.randn(4, 300, generator=g)
    torch.testing.assert_close(softmax_so_far(x, y), torch.exp(torch.logcumsumexp(x, 1) - y),
                               rtol=1e-5, atol=1e-5)


def test_integer_running_extremes_are_exact():
    """Short rows (8 a group of the simd kernel, the last group partial) and rows of three
    chunks (integer scans never split: their totals would pass through fp32 scratch)."""
    for shape, k in (((20, 77), int_extremes), ((2, 600), int_extremes.with_launch(ONE_SIMDGROUP))):
        x = torch.randint(-2 ** 31, 2 ** 31 - 1, shape, dtype=torch.int32)
        assert len(k.launches(x)) == 1
        hi, lo = k(x)
        assert torch.equal(hi, torch.cummax(x, 1).values)
        assert torch.equal(lo, torch.cummin(x, 1).values)


def test_check_masked_cumsum():
    check(masked_cumsum.with_launch(ONE_SIMDGROUP), dtypes={"T": "f32"}, dims={"L": (1, 700)},
          max_examples=6)


def test_as_op_runs_the_kernel():
    op = masked_cumsum.as_op("mf_test::masked_cumsum")
    x, m, n = torch.randn(2, 40), torch.ones(2, 40), torch.full((2,), 2.0)
    torch.testing.assert_close(op(x, m, n), torch.cumsum(x, 1) / 2, rtol=1e-5, atol=1e-5)


def test_backward_is_the_reverse_scan():
    x = torch.randn(2, 8, requires_grad=True)
    m, n = torch.ones(2, 8), torch.ones(2)
    masked_cumsum.as_op("mf_test::masked_cumsum_grad")(x, m, n).sum().backward()
    torch.testing.assert_close(x.grad, torch.arange(8, 0, -1.0).expand(2, 8))
    # every scan differentiable, in one backward: cummax's and cummin's gradients (segmented
    # cumsums) beside the reverse cumsums, one kernel
    x = (1 + 0.05 * torch.randn(2, 300)).requires_grad_()       # cumprod stays finite
    dys = [torch.randn(2, 300) for _ in range(5)]
    got = torch.autograd.grad(scans_row(x), x, dys)[0]
    xd = x.detach().double().requires_grad_()
    want = torch.autograd.grad((xd.cumsum(1), xd.cumprod(1), xd.cummax(1).values,
                                xd.cummin(1).values, xd.logcumsumexp(1)), xd,
                               [d.double() for d in dys])[0]
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-3)


# -- what a scan kernel refuses ------------------------------------------------------------

@mf.kernel
def int_cumsum(x: "i32[B, L]"):
    return mf.cumsum(x, "L")


@mf.kernel
def scan_and_sum(x: "f32[B, L]"):
    return mf.cumsum(x, "L") / mf.sum(x, "L")


@mf.kernel
def scan_of_scan(x: "f32[B, L]"):
    return mf.cumsum(mf.cummax(x, "L"), "L")


@mf.kernel
def two_axes(x: "f32[B, L]"):
    return mf.cumsum(x, "L") + mf.cumsum(x, "B")


@pytest.mark.parametrize("kernel,message", [
    (int_cumsum, r"mf.cumsum at .*test_scan.py:\d+: an integer or bool value gives i64.*"
                 r"mf.cumsum\(x.to\(mf.f32\)"),
    (scan_and_sum, r"a scan \(mf.cumsum.*\) and a reduction \(mf.sum.*split it"),
    (scan_of_scan, r"mf.cumsum at .* scans the result of mf.cummax.*two kernels"),
    (two_axes, r"scans along several axes \('L', 'B'\).*one kernel per axis"),
])
def test_refused_with_what_to_write(kernel, message):
    x = torch.zeros(2, 3, dtype=kernel.params[0].dtype.torch)
    with pytest.raises(mf.UnsupportedConstruct, match=message):
        family(kernel.graph(x))


def test_logcumsumexp_of_integers_is_refused_at_the_call():
    @mf.kernel
    def k(x: "i32[L]"):
        return mf.logcumsumexp(x, "L")
    with pytest.raises(mf.TraceError, match=r"mf.logcumsumexp needs a floating-point value"):
        k.graph(torch.zeros(3, dtype=torch.int32))


def test_cuda_translation_compiles_against_the_shim(tmp_path):
    """The row kernel's simd prefix, shuffle ladder and threadgroup carry, and the column
    kernel, through the cuda backend's translation and shim (a host syntax check)."""
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no host C++ compiler for the syntax check")
    x = torch.zeros(2, 3)
    for k in (scans_row, scans_col):
        f = tmp_path / f"{k.name}.cu"
        f.write_text(translate(k.source(x)).text)
        r = subprocess.run([cxx, "-std=c++17", "-fsyntax-only", "-DMF_CUDA_HOST_CHECK",
                            f"-I{INCLUDE_DIR}", "-x", "c++", str(f)], capture_output=True,
                           text=True)
        assert r.returncode == 0, r.stderr[:4000]


def test_mlx_runs_the_same_source():
    """The source the MLX backend builds (mx.fast.metal_kernel's body), run by the simulator
    on MLX arrays as tests/runtime/test_mlx.py does: long rows over several chunks, and the
    column kernel."""
    mx = pytest.importorskip("mlx.core")
    import numpy as np

    from metalforge.runtime import mlx as mfx
    mx.random.seed(0)
    for k, x in ((scans_row.with_launch(ONE_SIMDGROUP), mx.random.normal((3, 700)) + 4.0),
                 (scans_col, mx.random.normal((70, 3)) + 4.0)):
        with mf.backend("sim"):
            got = k(x)
        want = torch_scans(torch.from_numpy(np.array(x)), 0 if k is scans_col else 1)
        for g, w in zip(got, want):
            assert mfx.is_array(g)
            torch.testing.assert_close(torch.from_numpy(np.array(g)), w, rtol=1e-4, atol=1e-4)
