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
from examples.attention import attention
from metalforge import autodiff, schedule
from metalforge.autodiff import NotDifferentiable
from metalforge.reference import evaluate
from metalforge.runtime.runs import run
from metalforge.testing import check

from ..cuda_host import assert_host_syntax

TOL = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.float16: dict(rtol=2e-2, atol=2e-2),
       torch.bfloat16: dict(rtol=5e-2, atol=5e-2)}
SHORT = {torch.float16: "f16", torch.bfloat16: "bf16"}


@mf.kernel
def masked(q: "T[B, (G R), S, E]", k: "T[B, G, L, E]", v: "T[B, G, L, E]", valid: "bool[B, L]",
           scale: float, window: int, cap: float):
    """GQA with a soft cap, a causal sliding window and a key-padding mask: every score term
    the backward differentiates, in one kernel (one compile per dtype)."""
    s = mf.sum(q * k, axis="E") * scale
    s = cap * mf.tanh(s / cap)
    pos = mf.index("S") + mf.size("L") - mf.size("S")
    key = mf.index("L")
    s = mf.where((key <= pos) & (key > pos - window) & valid, s, -mf.inf)
    return mf.sum(mf.softmax(s, axis="L") * v, axis="L")


def _mask(valid, n, length, window):
    pos = torch.arange(n)[:, None] + length - n
    key = torch.arange(length)[None, :]
    return ((key <= pos) & (key > pos - window))[None, None] & valid[:, None, None, :]


def _torch_masked(q, k, v, valid, scale, window, cap):
    """torch's math in float64 (GQA: each kv head repeated for its R query heads)."""
    r = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(r, 1), v.repeat_interleave(r, 1)
    s = cap * torch.tanh((q @ k.transpose(-1, -2)) * scale / cap)
    s = s.masked_fill(~_mask(valid, q.shape[2], k.shape[2], window), float("-inf"))
    return torch.softmax(s, -1) @ v


def _inputs(dtype, seed, b=2, g=2, r=2, n=5, length=37, e=40):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, g * r, n, e, generator=gen).to(dtype)
    k, v = (torch.randn(b, g, length, e, generator=gen).to(dtype) for _ in range(2))
    dy = torch.randn(b, g * r, n, e, generator=gen).to(dtype)
    valid = torch.arange(length)[None, :] < torch.tensor([length, length - 3])[:b, None]
    return q, k, v, valid, dy


def _leaves(*xs):
    return [x.detach().double().requires_grad_() for x in xs]


def _ours(inputs, extra, dy):
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    out = masked(*leaves, *extra)
    return torch.autograd.grad(out, leaves, dy)


def _close(got, want, dtype):
    for name, a, b in zip("qkv", got, want):
        assert a.dtype == dtype, name
        torch.testing.assert_close(a.double(), b, **TOL[dtype], msg=lambda m: f"d{name}: {m}")


def test_f16_gqa_window_padding_match_sdpa_backward():
    """f16 against SDPA's backward (a cap of 1e4 leaves the scores as they are): GQA (dk, dv
    summed over each kv head's 2 query heads), a window of 30 of 37 keys and 3 padded keys,
    E = 40 (a partial last lane slot), 37 keys (a partial threadgroup of the dk/dv kernel)."""
    q, k, v, valid, dy = _inputs(torch.float16, 0)
    got = _ours((q, k, v), (valid, 0.15, 30, 1e4), dy)
    lq, lk, lv = _leaves(q, k, v)
    ref = F.scaled_dot_product_attention(lq, lk, lv, scale=0.15, enable_gqa=True,
                                         attn_mask=_mask(valid, 5, 37, 30))
    _close(got, torch.autograd.grad(ref, (lq, lk, lv), dy.double()), torch.float16)


# (apple10, bf16) left out for CI time: its kernels are (apple10, f16)'s with bfloat types
@pytest.mark.parametrize("target,dtype,e", [("apple9", torch.float16, 40),
                                            ("apple9", torch.bfloat16, 40),
                                            ("apple10", torch.float16, 36)])
def test_block_kernels_by_target_match_torch(target, dtype, e):
    """The 16x16 block kernels (half / bfloat operands, P and dS cast to them; simdgroup_matrix
    at apple9, tensor ops at apple10) at partial tiles: 2 x 19 query rows a kv head (GQA),
    37 keys, E = 40 or 36 (none whole 16- or 32-blocks; rows staged in 16-byte chunks, or
    element by element where E is not a multiple of 8), soft cap, window and padding, against
    torch's autograd of its math in float64."""
    q, k, v, valid, dy = _inputs(dtype, 2, n=19, e=e)
    extra = (valid, 0.15, 30, 5.0)
    with mf.target(target):
        got = _ours((q, k, v), extra, dy)
    src = _dq_source(dtype, target)
    assert "dq_block" in src and ("_op.run(" in src) == (target == "apple10")
    leaves = _leaves(q, k, v)
    want = torch.autograd.grad(_torch_masked(*leaves, *extra), leaves, dy.double())
    _close(got, want, dtype)


@pytest.mark.parametrize("target,blocks", [("apple10", 1), ("cuda", 1), ("cuda", 2),
                                           ("apple10", 2)])
def test_wide_kernels_match_torch(target, blocks):
    """grad_simdgroups=4 (tensor ops; apple10: M5's layout, cuda: the shim's, in the
    simulator): 4 simdgroups a threadgroup, each with its own 16 keys (dk/dv) or query rows
    (dq) in registers and its P^T / dS^T set in left operands element by element, a step
    staging `blocks` blocks of 16 rows or keys (grad_step_blocks), at partial tiles: 2 x 37
    query rows a kv head (GQA), 80 keys (a partial second group of 64), E = 40 (rows zeroed
    past E up to the products' 128), soft cap, window and padding, against torch's autograd
    in float64; the MSL accounts for its threadgroup memory."""
    q, k, v, valid, dy = _inputs(torch.float16, 3, n=37, length=80, e=40)
    extra = (valid, 0.15, 30, 5.0)
    with mf.target(target):
        leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
        out = masked.with_launch(grad_simdgroups=4, grad_step_blocks=blocks)(*leaves, *extra)
        got = torch.autograd.grad(out, leaves, dy)
    from metalforge.msl.parse import parse
    for simdgroups, variant in ((4, "_wide"), (2, "_block")):   # the comment's accounting
        if target != "apple10":
            break
        src = _dq_source(torch.float16, "apple10", grad_simdgroups=simdgroups,
                         grad_step_blocks=blocks)
        assert (variant == "_wide") == ("get_left_input_cooperative_tensor" in src)
        (tg,) = [k.threadgroup_bytes for k in parse(src).kernels if k.host_name.endswith(variant)]
        assert f"threadgroup memory {tg} bytes of 32768" in src
    leaves = _leaves(q, k, v)
    want = torch.autograd.grad(_torch_masked(*leaves, *extra), leaves, dy.double())
    _close(got, want, torch.float16)


def _dq_source(dtype, target: str, **launch) -> str:
    from metalforge.runtime.show import source
    dq = autodiff.derive(masked.graph(T=SHORT[dtype])).kernels[2]
    return source(dq, None, launch={"target": target, **launch})


def test_f32_soft_cap_and_masks_match_torch():
    """f32 with a small cap (its derivative 1 - tanh^2 matters) and a window of 9 keys:
    masked scores get no gradient; against torch's own autograd of its math in float64."""
    extra = (0.5, 9, 2.0)
    # E = 40: the simdgroup_matrix kernels; E = 136 (over their 128): the simd kernels
    for e, length in ((40, 37), (136, 11)):
        q, k, v, valid, dy = _inputs(torch.float32, 1, length=length, e=e)
        got = _ours((q, k, v), (valid, *extra), dy)
        leaves = _leaves(q, k, v)
        want = torch.autograd.grad(_torch_masked(*leaves, valid, *extra), leaves,
                                   dy.double())
        _close(got, want, torch.float32)


class _Reference(torch.autograd.Function):
    """The derived graphs on the reference path, as the runtime runs them: the forward with
    the rows' logsumexp (`Backward.forward`), saved; then the backward's other kernels."""
    @staticmethod
    def forward(ctx, graph, scale, q, k, v):
        values = {"q": q, "k": k, "v": v, "scale": scale}
        ctx.saved = evaluate(autodiff.backward_of(graph).kernels[0], values)
        ctx.save_for_backward(q, k, v)
        ctx.meta = graph, scale
        return ctx.saved[0]

    @staticmethod
    def backward(ctx, dy):
        graph, scale = ctx.meta
        q, k, v = ctx.saved_tensors
        bw = autodiff.backward_of(graph)
        ran = []

        def run(kernel, values):
            ran.append(kernel.name)
            return evaluate(kernel, values)
        grads = autodiff.run_backward(bw, {"q": q, "k": k, "v": v, "scale": scale}, (dy,),
                                      run, ctx.saved)
        assert ran == [kernel.name for kernel in bw.kernels[1:]]       # the forward saved
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
    fwd = autodiff.derive(masked.graph(T="f16")).kernels[0]
    q, k, v, valid, _ = _inputs(torch.float16, 4, n=9, length=70, e=24)
    extra = {"scale": 0.3, "window": 50, "cap": 1e4}
    out, lse = run(fwd, {"q": q, "k": k, "v": v, "valid": valid, **extra}, launch=launch)
    kk = k.double().repeat_interleave(2, 1)
    s = (q.double() @ kk.transpose(-1, -2)) * 0.3
    s = s.masked_fill(~_mask(valid, 9, 70, 50), float("-inf"))
    torch.testing.assert_close(lse.double(), torch.logsumexp(s, -1), rtol=1e-3, atol=1e-3)
    want = torch.softmax(s, -1) @ v.double().repeat_interleave(2, 1)
    torch.testing.assert_close(out.double(), want, rtol=2e-3, atol=2e-3)


def test_kernels_and_check_grad():
    bw = autodiff.derive(masked.graph(T="f32"))
    assert [schedule.family(k) for k in bw.kernels] == ["attention", "row", "attention_grad",
                                                        "attention_grad"]
    assert set(bw.buffers) == {"out", "lse", "delta"} and bw.reads == ("q", "k", "v", "valid")
    src = attention.backward_source(torch.zeros(1, 2, 3, 8).half(),
                                    torch.zeros(1, 1, 4, 8).half(),
                                    torch.zeros(1, 1, 4, 8).half(), 0.5)
    assert "simd_sum" in src and "mf_lse" in src
    # a forward's launch options reach each backward kernel that takes them (the delta pass, a
    # row kernel, takes neither), as when the backward runs
    tuned = attention.with_launch(target="cuda", grad_simdgroups=4)
    src = tuned.backward_source(torch.zeros(1, 2, 40, 64).half(), torch.zeros(1, 2, 40, 64).half(),
                                torch.zeros(1, 2, 40, 64).half(), 0.5)
    assert "dq_wide" in src and "matmul2d" in src
    report = check(masked, dims={"B": 1, "G": 1, "R": 2, "S": (1, 3), "L": (3, 9),
                                 "E": (1, 40)}, dtypes={"T": "f32"},
                   values={"window": (1, 9), "cap": (5.0, 30.0), "scale": (0.1, 0.5),
                           "valid": ["true"]},
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


def test_launch_options_of_the_forward():
    """Options for the forward's kernels (a split of the keys: the merge kernel) apply to
    the forward with the rows' logsumexp; the other backward kernels take none of them."""
    q, k, v, valid, dy = _inputs(torch.float16, 0)
    extra = (valid, 0.15, 30, 1e4)
    want = _ours((q, k, v), extra, dy)
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    out = masked.with_launch(key_splits=2)(*leaves, *extra)
    for a, b in zip(torch.autograd.grad(out, leaves, dy), want):
        torch.testing.assert_close(a, b, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("target,version", [("apple9", 0), ("cuda", 400)])
def test_backward_kernels_translate_to_cuda(tmp_path, target, version):
    """The dq and dk/dv kernels' MSL (the simd, the fp32 matrix and the 16x16 block kernel:
    simdgroup_matrix at apple9, tensor ops at the cuda target) through the CUDA backend's
    translation and its syntax check against the CUDA shim (with a host C++ compiler)."""
    from metalforge.cuda import translate
    from metalforge.runtime.show import source
    for k in autodiff.derive(masked.graph(T="f16")).kernels[2:]:
        src = source(k, None, launch={"target": target})
        assert ("_op.run(" in src) == (target == "cuda") and "_block" in src
        tr = translate(src)
        assert len(tr.entries) == 3
        (tmp_path / k.name).mkdir()
        assert_host_syntax(tr.text, tmp_path / k.name, metal_version=version)
        # grad_simdgroups=4: the wide kernels at cuda, the 2-simdgroup ones at apple9 (the
        # host syntax check of one of them: they share their constructs)
        src = source(k, None, launch={"target": target, "grad_simdgroups": 4})
        assert ("_wide" in src) == (target == "cuda") and ("_block" in src) != ("_wide" in src)
        if target == "cuda" and "dkdv_wide" in src:
            wide = translate(src)
            (tmp_path / f"{k.name}_wide").mkdir()
            assert_host_syntax(wide.text, tmp_path / f"{k.name}_wide", metal_version=version)
