"""Derived backward kernels of gathers (a scatter-add into the table: embeddings, an in-row
permutation), of mf.scatter_add (a gather of the output gradient) and of scans (a scan the
other way: reverse cumsum, torch's stable logcumsumexp formula), run through the simulator and
checked against torch.autograd on torch's own functions (not metalforge's reference); the
reverse scans themselves; check(grad=True). (No float64 gradcheck: the reference rounds every
value to fp32, as the kernels do, so finite differences in float64 do not apply to it.)"""
from __future__ import annotations

import pytest
import torch

import metalforge as mf
from metalforge import autodiff, schedule
from metalforge.autodiff import NotDifferentiable
from metalforge.testing import check

TOL = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.float16: dict(rtol=1e-2, atol=1e-2),
       torch.bfloat16: dict(rtol=5e-2, atol=5e-2)}


@mf.kernel
def embed(table: "T[V, D]", ids: "i32[N]") -> "T[N, D]":
    return mf.take(table, "V", ids)


@mf.kernel
def embed_scale(table: "T[V, D]", ids: "i32[N]", s: "T[D]") -> "T[N, D]":
    return mf.take(table, "V", ids) * s


@mf.kernel
def permute_row(x: "T[N, D]", perm: "i32[E]") -> "T[N, E]":
    return mf.take(x, "D", perm) * 2.0


@mf.kernel
def weighted_cumsum(x: "T[B, L]", w: "T[L]"):
    return mf.cumsum(x * w, "L")


@mf.kernel
def running_lse(x: "T[B, L]"):
    return mf.logcumsumexp(x, "L")


@mf.kernel
def column_cumsum(x: "T[L, B]"):
    return mf.cumsum(x, "L", reverse=True) * 0.5


@mf.kernel
def running_product(x: "T[B, L]"):
    return mf.cumprod(x, "L", reverse=True)


@mf.kernel
def histogram_grad(v: "T[N, D]", ids: "i32[N]", table: "T[V, D]") -> "T[V, D]":
    return mf.scatter_add(v * 3.0, "V", ids)


def _ids(n: int, v: int, seed: int) -> torch.Tensor:
    """n ids in [0, v), every one repeated (duplicates sum their gradients)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, max(1, v // 2), (n,), generator=g, dtype=torch.int32)


def _grads(fn, inputs, dy):
    """torch.autograd's gradients of fn(*inputs) for output gradient dy, in f64."""
    leaves = [t.detach().double().requires_grad_() for t in inputs]
    out = fn(*leaves)
    return torch.autograd.grad(out, leaves, dy.double())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_embedding_backward_is_a_scatter_add(dtype):
    g = torch.Generator().manual_seed(0)
    for v, d, n in ((7, 33, 50), (64, 4, 1)):
        table = torch.randn(v, d, generator=g).to(dtype).requires_grad_()
        s = torch.randn(d, generator=g).to(dtype).requires_grad_()
        ids = _ids(n, v, n)
        y = embed_scale(table, ids, s)
        dy = torch.randn(n, d, generator=g).to(dtype)
        got = torch.autograd.grad(y, (table, s), dy)
        want = _grads(lambda t, w: torch.nn.functional.embedding(ids.long(), t) * w,
                      (table, s), dy)
        for a, b in zip(got, want):
            assert a.dtype == dtype
            torch.testing.assert_close(a.double(), b, **TOL[dtype])


def test_embedding_backward_kernel_and_deterministic_mode():
    bw = autodiff.derive(embed_scale.graph(T="f16"))
    fams = [schedule.family(k) for k in bw.kernels]
    assert "scatter" in fams, fams
    scat = bw.kernels[fams.index("scatter")]
    assert len(scat.outputs) == 1 and scat.outputs[0].dtype.name == "f16"
    det = autodiff.derive(embed.graph(T="f32"), deterministic=True)
    (node,) = [n for n in det.kernels[0].nodes() if n.op.name == "SCATTER"]
    assert node.attr == ("V", True)
    table = torch.randn(5, 8, requires_grad=True)
    ids = torch.tensor([4, 0, 4, 4, 1, 0], dtype=torch.int32)
    dy = torch.randn(6, 8)
    prev = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        runs = [torch.autograd.grad(embed(table, ids), table, dy)[0] for _ in range(2)]
    finally:
        torch.use_deterministic_algorithms(prev)
    assert torch.equal(runs[0], runs[1])
    want = torch.zeros(5, 8).index_add_(0, ids.long(), dy)
    torch.testing.assert_close(runs[0], want)
    op = embed.as_op("mf_test::embed_grad")              # as an operator, and under compile
    torch.testing.assert_close(torch.autograd.grad(op(table, ids), table, dy)[0], want)
    twice = torch.compile(lambda t, i: op(t, i) * 2.0, backend="aot_eager")
    torch.testing.assert_close(torch.autograd.grad(twice(table, ids), table, dy)[0], 2 * want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_in_row_permutation_backward(dtype):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 16, generator=g).to(dtype).requires_grad_()
    half = torch.arange(8)
    perm = torch.cat([half + 8, half, half[:3]]).to(torch.int32)     # not one-hot: 19 reads
    dy = torch.randn(5, 19, generator=g).to(dtype)
    got = torch.autograd.grad(permute_row(x, perm), x, dy)[0]
    want = _grads(lambda t: t[:, perm.long()] * 2.0, (x,), dy)[0]
    torch.testing.assert_close(got.double(), want, **TOL[dtype])


def test_scatter_add_backward_is_a_gather():
    g = torch.Generator().manual_seed(4)
    v = torch.randn(9, 5, generator=g, requires_grad=True)
    ids = _ids(9, 6, 1)
    table = torch.zeros(6, 5)
    dy = torch.randn(6, 5, generator=g)
    got = torch.autograd.grad(histogram_grad(v, ids, table), v, dy)[0]
    want = _grads(lambda t: torch.zeros(6, 5, dtype=t.dtype).index_add(0, ids.long(), t * 3.0),
                  (v,), dy)[0]
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_reverse_scans_match_flipped_torch():
    for n in (1, 31, 33, 700):
        x = torch.randn(3, n)
        got = column_cumsum(x.T.contiguous())
        torch.testing.assert_close(got, x.T.flip(0).cumsum(0).flip(0) * 0.5, rtol=1e-4,
                                   atol=1e-4)


def test_scan_backward_matches_torch(dtype=torch.float32):
    g = torch.Generator().manual_seed(5)
    for n in (1, 33, 700):
        x = (torch.randn(3, n, generator=g) * 3).to(dtype).requires_grad_()
        w = torch.randn(n, generator=g).to(dtype).requires_grad_()
        dy = torch.randn(3, n, generator=g).to(dtype)
        k = weighted_cumsum
        got = torch.autograd.grad(k(x, w), (x, w), dy)
        want = _grads(lambda a, b: torch.cumsum(a * b, 1), (x, w), dy)
        for a, b in zip(got, want):
            torch.testing.assert_close(a.double(), b, **_scaled(dtype, n))
        got = torch.autograd.grad(running_lse.with_launch({"threads_per_group": 32})(x), x, dy)
        want = _grads(lambda a: torch.logcumsumexp(a, 1), (x,), dy)
        torch.testing.assert_close(got[0].double(), want[0], **_scaled(dtype, n))
    x = torch.randn(40, 3, requires_grad=True)
    dy = torch.randn(40, 3)
    got = torch.autograd.grad(column_cumsum(x), x, dy)[0]
    torch.testing.assert_close(got, 0.5 * dy.cumsum(0), rtol=1e-4, atol=1e-4)


def test_cumprod_backward_handles_zeros_as_torch():
    g = torch.Generator().manual_seed(6)
    for n in (1, 6, 300):
        x = 1 + 0.1 * torch.randn(4, n, generator=g)
        if n > 3:              # one zero, two zeros, a zero at either end (reverse: the end first)
            x[0, 2] = 0
            x[1, 1] = x[1, n - 2] = 0
            x[2, 0] = x[3, n - 1] = 0
        dy = torch.randn(4, n, generator=g)
        xa = x.clone().requires_grad_()
        got = torch.autograd.grad(running_product(xa), xa, dy)[0]
        want = _grads(lambda a: torch.cumprod(a.flip(1), 1).flip(1), (x,), dy)[0]
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


def _scaled(dtype, n):
    t = TOL[dtype]
    return dict(rtol=t["rtol"], atol=t["atol"] * max(1.0, n ** 0.5))


def test_check_grad_on_a_gather_and_a_scan():
    assert check(embed_scale, dtypes={"T": ["f32"]}, max_examples=2, grad=True).examples >= 2
    assert check(running_lse, dtypes={"T": ["f32"]}, max_examples=2, grad=True).examples >= 2
    # a reverse scan's kernels at their boundary lengths (check adds them to the drawn ones)
    assert check(column_cumsum, dtypes={"T": ["f32"]}, max_examples=2).examples >= 2


def test_refusals_name_the_batched_gather():
    @mf.kernel
    def batched(x: "T[B, V]", i: "i32[B, N]") -> "T[B, N]":
        return mf.take(x, "V", i)
    with pytest.raises(NotDifferentiable, match="batched gather"):
        autodiff.derive(batched.graph(T="f32"))

    @mf.kernel
    def shifted(table: "T[V, D]", ids: "i32[N]") -> "T[N, D]":
        return mf.take(table, "V", ids + 1)
    autodiff.derive(shifted.graph(T="f32"))                        # atomic: any index
    with pytest.raises(NotDifferentiable, match="deterministic.*tensor argument"):
        autodiff.derive(shifted.graph(T="f32"), deterministic=True)
