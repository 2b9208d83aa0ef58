"""cummax's and cummin's gradient (`adjoints.running_grad`: a segmented cumsum the other way,
`ScanOp.SEGSUM`), checked against torch's own cummax / cummin backward (torch.cummax's
indices, ties to the latest element, NaN taking the index): the simulator's kernels (the simd,
row and column scan kernels, both directions), the reference path bit for bit against torch
in float64 and under gradcheck, check(grad=True), the operator, the cuda translation."""
from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import metalforge as mf
from metalforge import autodiff
from metalforge.reference import evaluate
from metalforge.testing import check

from ..cuda_host import assert_host_syntax


@mf.kernel
def running_max(x: "T[B, L]"):
    return mf.cummax(x, "L") * 2.0


@mf.kernel
def running_min_back(x: "T[L, B]"):
    return mf.cummin(x, "L", reverse=True)


def _torch_grad(fn, x, dy):
    """torch.autograd's gradient of fn(x) for output gradient dy, in float64."""
    leaf = x.detach().double().requires_grad_()
    return torch.autograd.grad(fn(leaf), leaf, dy.double())[0]


def _tied(rows: int, n: int, seed: int) -> torch.Tensor:
    """Small integers (many ties, the index moving to the latest), NaNs in row 0 (each new
    NaN takes the index), a -inf and a +inf in row 1."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-4, 5, (rows, n), generator=g).float()
    if n > 12:
        x[0, 5] = x[0, 9] = float("nan")
        x[1, 2], x[1, 11] = float("-inf"), float("inf")
    return x


def _cummax2(a):
    return torch.cummax(a, 1).values * 2.0


def _cummin_back(a):                                  # along dim 0, from its end
    return torch.cummin(a.flip(0), 0).values.flip(0)


def test_kernels_match_torch_backward():
    """Rows of one simdgroup's chunk (1, 7: the simd kernel), long rows (5000: the row kernel,
    the rows split over 3 threadgroups each after a totals launch, the (flags, sum) pairs in
    scratch), a column axis (the column kernel; 5000: split too), both directions; f32 close
    to torch's float64 gradient (the kernels sum in fp32), f16 within its rounding."""
    for n in (1, 7, 5000):
        x, dy = _tied(2, n, n), torch.randn(2, n, generator=torch.Generator().manual_seed(n))
        xa = x.clone().requires_grad_()
        got = torch.autograd.grad(running_max(xa), xa, dy)[0]
        torch.testing.assert_close(got.double(), _torch_grad(_cummax2, x, dy),
                                   rtol=1e-5, atol=1e-5 * n ** 0.5)
        xt = x.T.contiguous().requires_grad_()
        got = torch.autograd.grad(running_min_back(xt), xt, dy.T)[0]
        torch.testing.assert_close(got.double(), _torch_grad(_cummin_back, x.T, dy.T),
                                   rtol=1e-5, atol=1e-5 * n ** 0.5)
    x, dy = _tied(2, 300, 7).half(), torch.randn(2, 300).half()
    xa = x.clone().requires_grad_()
    got = torch.autograd.grad(running_max(xa), xa, dy)[0]
    torch.testing.assert_close(got.double(), _torch_grad(_cummax2, x, dy), rtol=1e-2, atol=5e-2)


def _reference_grad(kernel, x: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """The derived backward graphs evaluated by the reference (no kernel)."""
    bw = autodiff.backward_of(kernel.graph(T="f32"))
    return autodiff.run_backward(bw, {"x": x}, (dy,), lambda k, v: evaluate(k, v))["x"]


def test_reference_path_is_torch_bit_for_bit():
    """The reference sums each segment in float64 in torch's order (scatter_add's, from the
    running index on): its gradient is torch's float64 one rounded to fp32, exactly."""
    for n in (1, 13, 90):
        x, dy = _tied(3, n, 100 + n), torch.randn(3, n)
        got = _reference_grad(running_max, x, dy)
        assert torch.equal(got, _torch_grad(_cummax2, x, dy).float())
        got = _reference_grad(running_min_back, x.T.contiguous(), dy.T.contiguous())
        assert torch.equal(got, _torch_grad(_cummin_back, x.T, dy.T).float())


VALUES = [0.0, -0.0, 1.0, -1.0, 2.5, float("nan"), float("inf"), float("-inf")]


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 300), st.lists(st.sampled_from(VALUES), min_size=1, max_size=300),
       st.integers(0, 2 ** 16))
def test_ties_nans_and_infinities_any_length(n, pool, seed):
    """Values from a few (ties everywhere, NaNs, infinities, signed zeros) at any length: the
    reference is torch bit for bit, the kernel (cummax, rows of any length) close to it."""
    x = torch.tensor([pool[i % len(pool)] for i in range(n)]).reshape(1, n)
    x = x[:, torch.randperm(n, generator=torch.Generator().manual_seed(seed))]
    dy = torch.randn(1, n, generator=torch.Generator().manual_seed(seed))
    want = _torch_grad(_cummax2, x, dy)
    assert torch.equal(_reference_grad(running_max, x, dy), want.float())
    xa = x.clone().requires_grad_()
    got = torch.autograd.grad(running_max(xa), xa, dy)[0]
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * n ** 0.5)


class _Reference(torch.autograd.Function):
    """running_max on the reference path: forward and derived backward graphs evaluated."""
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return evaluate(running_max.graph(T="f32"), {"x": x}).double()

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        return _reference_grad(running_max, x, dy).double()


def test_reference_path_gradcheck():
    """Finite differences in float64 of the forward agree with the backward graphs (distinct
    values a step apart: no tie moves within eps; the reference rounds to fp32)."""
    g = torch.Generator().manual_seed(4)
    x = (torch.randperm(24, generator=g).double() * 0.5).reshape(2, 12).requires_grad_()
    assert torch.autograd.gradcheck(_Reference.apply, (x,), eps=1e-3, atol=1e-3, rtol=1e-3)


def test_check_grad_operator_and_cuda_translation(tmp_path):
    from metalforge.cuda import translate
    assert check(running_max, dtypes={"T": ["f32"]}, max_examples=2, grad=True).examples >= 2
    op = running_max.as_op("mf_test::running_max")
    x, dy = _tied(2, 40, 9), torch.randn(2, 40)
    xa = x.clone().requires_grad_()
    got = torch.autograd.grad(op(xa), xa, dy)[0]
    torch.testing.assert_close(got.double(), _torch_grad(_cummax2, x, dy), rtol=1e-5, atol=1e-5)
    src = running_max.backward_source(x)
    assert "mf_segsum" in src
    assert_host_syntax(translate(src).text, tmp_path)
