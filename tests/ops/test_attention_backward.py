"""The attention backward (FlashAttention-2 style: `metalforge.adjoints_attention`, the
`attention_grad` family): dq, dk, dv through the simulator against torch's own backward
(scaled_dot_product_attention's, or torch's math in float64 for the soft cap), with GQA,
causal / sliding-window / padding masks and a soft cap, at E and row counts that leave partial
simdgroups and groups; the backward graphs on the reference path against finite differences
(gradcheck in float64); check(grad=True); the variants it refuses."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import metalforge as mf
from examples.attention import attention, causal_mask
from examples.padded_attention import padded_attention
from examples.sliding_window_softcap import window_softcap
from metalforge import autodiff, schedule
from metalforge.autodiff import NotDifferentiable
from metalforge.reference import evaluate
from metalforge.runtime.runs import run
from metalforge.testing import check

TOL = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.float16: dict(rtol=2e-2, atol=2e-2)}


def _leaves(*xs):
    return [x.detach().double().requires_grad_() for x in xs]


def _ours(kernel, inputs, extra, dy):
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    out = kernel(*leaves, *extra)
    return torch.autograd.grad(out, leaves, dy)


def _close(got, want, dtype):
    for name, a, b in zip("qkv", got, want):
        assert a.dtype == dtype, name
        torch.testing.assert_close(a.double(), b, **TOL[dtype], msg=lambda m: f"d{name}: {m}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_causal_gqa_matches_sdpa_backward(dtype):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 6, 5, 40, generator=g).to(dtype)    # 3 kv heads x 2 query heads
    k, v = (torch.randn(2, 3, 7, 40, generator=g).to(dtype) for _ in range(2))
    dy = torch.randn(2, 6, 5, 40, generator=g).to(dtype)
    got = _ours(attention, (q, k, v), (0.2,), dy)
    lq, lk, lv = _leaves(q, k, v)
    ref = F.scaled_dot_product_attention(lq, lk, lv, scale=0.2, enable_gqa=True,
                                         attn_mask=causal_mask(5, 7, "cpu"))
    _close(got, torch.autograd.grad(ref, (lq, lk, lv), dy.double()), dtype)


def test_padding_mask_matches_sdpa_backward():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(3, 2, 4, 16, generator=g).half()
    k, v = (torch.randn(3, 2, 9, 16, generator=g).half() for _ in range(2))
    valid = torch.arange(9)[None, :] < torch.tensor([9, 3, 6])[:, None]
    dy = torch.randn(3, 2, 4, 16, generator=g).half()
    got = _ours(padded_attention, (q, k, v), (valid,), dy)
    lq, lk, lv = _leaves(q, k, v)
    ref = F.scaled_dot_product_attention(lq, lk, lv, attn_mask=valid[:, None, None, :])
    _close(got, torch.autograd.grad(ref, (lq, lk, lv), dy.double()), torch.float16)


def _window_softcap(q, k, v, scale, window, cap):
    s = (q @ k.transpose(-1, -2)) * scale
    s = cap * torch.tanh(s / cap)
    n, length = q.shape[-2], k.shape[-2]
    pos = torch.arange(n)[:, None] + length - n
    key = torch.arange(length)[None, :]
    s = s.masked_fill(~((key <= pos) & (key > pos - window)), float("-inf"))
    return torch.softmax(s, -1) @ v


def test_window_and_soft_cap_backward():
    """Masked scores get no gradient; the cap's derivative is 1 - tanh^2 (a small cap makes
    it matter); 37 keys: a partial last group of the dk/dv kernel."""
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 2, 6, 33, generator=g)
    k, v = (torch.randn(1, 2, 37, 33, generator=g) for _ in range(2))
    dy = torch.randn(1, 2, 6, 33, generator=g)
    extra = (0.5, 9, 2.0)
    got = _ours(window_softcap, (q, k, v), extra, dy)
    leaves = _leaves(q, k, v)
    want = torch.autograd.grad(_window_softcap(*leaves, *extra), leaves, dy.double())
    _close(got, want, torch.float32)


class _Reference(torch.autograd.Function):
    """The forward graph and the derived backward graphs, both on the reference path."""
    @staticmethod
    def forward(ctx, graph, scale, q, k, v):
        ctx.save_for_backward(q, k, v)
        ctx.meta = graph, scale
        return evaluate(graph, {"q": q, "k": k, "v": v, "scale": scale})

    @staticmethod
    def backward(ctx, dy):
        graph, scale = ctx.meta
        q, k, v = ctx.saved_tensors
        bw = autodiff.backward_of(graph)
        grads = autodiff.run_backward(bw, {"q": q, "k": k, "v": v, "scale": scale}, (dy,),
                                      evaluate)
        return None, None, grads["q"].double(), grads["k"].double(), grads["v"].double()


def test_backward_graphs_gradcheck_on_the_reference_path():
    """The backward graphs are the math (the reference evaluates them); finite differences
    in float64 of the forward agree with them (the reference rounds each value to fp32, so
    the steps and tolerances are those fp32 allows)."""
    graph = attention.graph(T="f32", causal=True)
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 2, 3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(1, 1, 4, 4, generator=g, dtype=torch.float64, requires_grad=True)
            for _ in range(2))
    assert torch.autograd.gradcheck(lambda *x: _Reference.apply(graph, 0.7, *x), (q, k, v),
                                    eps=1e-3, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("launch", [{"stage_kv": False, "key_splits": 1},
                                    {"stage_kv": True, "key_splits": 3},
                                    {"matrix_rows": 8, "key_splits": 1}])
def test_forward_kernels_write_the_rows_logsumexp(launch):
    """The forward with the rows' logsumexp beside its output (the backward's first kernel):
    the decode kernel, the staged one with key blocks merged (merge kernel), the
    simdgroup_matrix prefill kernel; the output itself as without it."""
    fwd = autodiff.derive(attention.graph(T="f16", causal=True)).kernels[0]
    g = torch.Generator().manual_seed(4)
    q = torch.randn(1, 4, 9, 24, generator=g).half()
    k, v = (torch.randn(1, 2, 70, 24, generator=g).half() for _ in range(2))
    out, lse = run(fwd, {"q": q, "k": k, "v": v, "scale": 0.3}, launch=launch)
    s = (q.double().view(1, 2, 2, 9, 24) @ k.double()[:, :, None].transpose(-1, -2)) * 0.3
    s = s.masked_fill(~causal_mask(9, 70, "cpu"), float("-inf"))
    torch.testing.assert_close(lse.double(), torch.logsumexp(s, -1).view(1, 4, 9),
                               rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(out, attention(q, k, v, 0.3), rtol=2e-3, atol=2e-3)


def test_kernels_and_check_grad():
    bw = autodiff.derive(attention.graph(T="f16", causal=True))
    assert [schedule.family(k) for k in bw.kernels] == ["attention", "row", "attention_grad",
                                                        "attention_grad"]
    assert set(bw.buffers) == {"out", "lse", "delta"} and bw.reads == ("q", "k", "v")
    src = attention.backward_source(torch.zeros(1, 2, 3, 8).half(),
                                    torch.zeros(1, 1, 4, 8).half(),
                                    torch.zeros(1, 1, 4, 8).half(), 0.5)
    assert "simd_sum" in src and "lse" in src
    report = check(attention, dims={"B": 1, "G": 1, "R": 2, "S": (1, 3), "L": (3, 9),
                                    "E": (1, 40)}, dtypes={"T": "f32"}, values={"causal": False},
                   max_examples=2, max_variants=1, layouts=False, grad=True)
    assert report.examples >= 1           # a mismatch raises


@mf.kernel
def biased(q: "T[B, H, S, E]", k: "T[B, H, L, E]", v: "T[B, H, L, E]", bias: "T[S, L]"):
    s = mf.sum(q * k, axis="E") + bias
    return mf.sum(mf.softmax(s, axis="L") * v, axis="L")


@mf.kernel
def rescaled(q: "T[B, H, S, E]", k: "T[B, H, L, E]", v: "T[B, H, L, E]"):
    s = mf.sum(q * k, axis="E")
    return mf.sum(mf.softmax(s, axis="L") * v, axis="L") * 2.0


def test_refusals_name_what_is_missing():
    from examples.paged_attention import paged_attention
    with pytest.raises(NotDifferentiable, match="paged K/V reads"):
        autodiff.derive(paged_attention.graph(T="f16", BS=16))
    with pytest.raises(NotDifferentiable, match="'bias'.*detach"):
        autodiff.derive(biased.graph(T="f32"))
    bw = autodiff.derive(biased.graph(T="f32"), ("q", "k", "v"))     # the bias detached
    assert set(bw.grads) == {"q", "k", "v"}
    with pytest.raises(NotDifferentiable, match="work after the sum"):
        autodiff.derive(rescaled.graph(T="f32"))


def test_as_op_and_under_compile():
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 2, 3, 8, generator=g, requires_grad=True)
    k, v = (torch.randn(1, 1, 5, 8, generator=g, requires_grad=True) for _ in range(2))
    want = torch.autograd.grad(attention(q, k, v, 0.3).sum(), (q, k, v))
    op = attention.as_op("mf_test::attention_backward")
    twice = torch.compile(lambda a, b, c: op(a, b, c, 0.3) * 2.0, backend="aot_eager")
    for got, w in zip(torch.autograd.grad(twice(q, k, v).sum(), (q, k, v)), want):
        torch.testing.assert_close(got, 2 * w)
