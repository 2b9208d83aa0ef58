"""Attention prefill on matrix hardware with the tensors' own half / bfloat values as operands
and fp32 accumulation, by target: on Metal 4 tensor ops whose layout the target knows (apple10,
cuda) with the scores in registers (schedule/attention/flash.py); on tensor ops of no known
layout (apple9-metal4) and on simdgroup_matrix (apple9) as 16 x 16 blocks through threadgroup
memory (schedule/attention/mma.py); f32 keeps the fp32 simdgroup_matrix kernel. Simulator
runs at partial tiles (rows, keys and E not whole blocks) against torch's math attention in
float64, the cuda target's translation through the shim's host syntax check (goldens per
target: tests/schedule/test_golden.py). `check` covers the kernel at the simulator's default
target in tests/ops/test_attention.py; at apple10 it takes over a minute on the CI box: not
here."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import metalforge as mf
from metalforge.cuda.translate import translate

from ..cuda_host import assert_host_syntax

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from attention import attention, causal_mask  # noqa: E402
from sliding_window_softcap import torch_window_softcap, window_softcap  # noqa: E402

TOL = {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.float16: dict(rtol=2e-3, atol=2e-3),
       torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}
SHORT = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32"}


def _prefill_source(kernel, target: str, **bindings) -> str:
    with mf.target(target):
        src = kernel.source(**bindings)
    return src[src.index("(prefill)"):]


def _math_attention(q, k, v, scale, causal):
    """torch's math attention in float64 (softmax's NaN where every key is masked)."""
    heads, kv = q.shape[1], k.shape[1]
    kk, vv = (t.double().repeat_interleave(heads // kv, dim=1) for t in (k, v))
    sc = q.double() @ kk.transpose(-1, -2) * scale
    if causal:
        sc = sc.masked_fill(~causal_mask(q.shape[2], k.shape[2], "cpu"), float("-inf"))
    return sc.softmax(-1) @ vv


@pytest.mark.parametrize("dtype,target,lowered", [
    (torch.float16, "apple9", "mf_mma16<half, true>"),
    (torch.float16, "apple9-metal4", "mf_sacc_op.run(tensor<threadgroup half"),
    (torch.bfloat16, "apple9", "mf_mma16<bfloat, true>"),
    (torch.float16, "apple10", "tensor<threadgroup half, dextents<int32_t, 2>, tensor_inline>"),
    (torch.bfloat16, "apple10", "tensor<threadgroup bfloat, dextents<int32_t, 2>, "
                                "tensor_inline>"),
    (torch.float16, "cuda", "tensor<threadgroup half, dextents<int32_t, 2>, tensor_inline>"),
    (torch.float32, "apple10", "mf_mma(")])
def test_prefill_lowering_by_target(dtype, target, lowered):
    """The prefill kernel's products on the target's matrix hardware with the tensors' own
    operand type: simdgroup_matrix (apple9: mf_mma16, K^T loaded transposed, V not), Metal 4
    tensor ops (apple10, cuda: q, the scores and the weights in registers, the scores one
    product over all of E up to 128, the values one over a tile's 32 keys and all of E;
    apple9-metal4, whose layout is not known: 16 x 16 blocks over
    threadgroup tensors, V k-outer); f32 keeps the fp32 simdgroup_matrix products everywhere
    (no TF32)."""
    src = _prefill_source(attention, target, T=SHORT[dtype])
    assert lowered in src
    if target in ("apple10", "cuda") and dtype != torch.float32:
        assert "matmul2d_descriptor(16, 32, 128, false, true" in src       # Q·K^T
        assert "matmul2d_descriptor(16, 128, 32, false, false" in src      # P·V
        assert "mf_p_tile[mf_c] = " in src and "mf_st[" not in src       # P in registers
    elif "tensor" in lowered:
        assert "matmul2d_descriptor(16, 16, 16, false, true" in src        # Q·K^T
        assert "matmul2d_descriptor(16, 16, 16, false, false" in src       # P·V
    else:
        assert "matmul2d" not in src


@pytest.mark.parametrize("target,e,kernel_name", [("apple10", 33, "_prefill_narrow"),
                                                  ("cuda", 80, "_prefill")])
def test_tensor_ops_prefill_matches_math_attention(target, e, kernel_name):
    """Metal 4 tensor ops in the simulator, each target's layout (apple10: M5's; cuda: the
    shim's mma.sync fragments, family 0), each kernel at one of them (E = 33: the narrow
    kernel, tiles of 64 keys, two whole 16-blocks of E and one of a single element; E = 80:
    the kernel of E up to 128, tiles of 32 keys, E's last 16-block whole and the next ones
    skipped): GQA, 66 query positions (a whole tile of 64 rows and a partial one per head
    pair), 70 keys; causal with S < L (bottom-right), one key block and two merged.
    (simdgroup_matrix, apple9: tests/ops/test_attention.py's test_matrix_prefill_matches_sdpa,
    the simulator's default target.)"""
    dtype = torch.float16
    g = torch.Generator().manual_seed(7)
    q = torch.randn(1, 4, 66, e, generator=g).to(dtype)
    k, v = (torch.randn(1, 2, 70, e, generator=g).to(dtype) for _ in range(2))
    want = _math_attention(q, k, v, 0.3, True).to(dtype)
    with mf.target(target):
        for splits in (1, 2):
            kernel = attention.with_launch(key_splits=splits)
            hosts = [h for h, _, _ in kernel.launches(q, k, v, 0.3)]
            assert hosts[0].endswith(kernel_name) and len(hosts) == splits, hosts
            torch.testing.assert_close(kernel(q, k, v, 0.3), want, **TOL[dtype])


@pytest.mark.parametrize("target,e", [("apple10", 64), ("cuda", 128), ("apple9", 64)])
def test_prefill_inner_tiles_lazy_max_and_nan(target, e):
    """Tiles of keys inside every row's causal bound take the score without its mask (S = L
    = 150: rows 64..149 have whole tiles of keys below the diagonal), the rows' maxes move
    lazily (keys that grow along L: a later tile's scores exceed the row's max by far more
    than the threshold, and by less), and a NaN key makes the rows that see it NaN though
    the maxes skip NaN (NaN weights), on both kernels (E = 64: narrow, 64-key tiles; E = 128:
    32-key tiles; the full tiles' batched copies, the last tile partial); apple9: the block
    kernel's scores through threadgroup memory, whose inner tiles go without the mask too
    (its maxes are eager and NaN-propagating)."""
    dtype = torch.float16
    g = torch.Generator().manual_seed(11)
    q = torch.randn(1, 2, 150, e, generator=g).to(dtype)
    grow = torch.linspace(0.2, 60.0 / e ** 0.5, 150).view(1, 1, 150, 1)
    k = (torch.randn(1, 1, 150, e, generator=g) * grow).to(dtype)
    v = torch.randn(1, 1, 150, e, generator=g).to(dtype)
    k[0, 0, 140, 3] = float("nan")
    want = _math_attention(q, k, v, 0.4, True).to(dtype)
    with mf.target(target):
        got = attention.with_launch(key_splits=1)(q, k, v, 0.4)     # a pass over every tile
    assert got[0, :, 140:].isnan().all() and not got[0, :, :140].isnan().any()
    torch.testing.assert_close(got, want, equal_nan=True, **TOL[dtype])


def test_prefill_inner_tiles_of_a_sliding_window():
    """A sliding window bounds a row's keys from both sides: tiles inside every row's window
    (S = L = 200, a window of 100: rows 128..191 all see keys 92..128) take the soft-capped
    score without the mask, the others keep it (cuda, E = 80: 32-key tiles)."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 200, 80, generator=g).half() for _ in range(3))
    args = (q, k, v, 80 ** -0.5, 100, 5.0)
    with mf.target("cuda"):
        kernel = window_softcap.with_launch(key_splits=1)
        assert "mf_kilo" in kernel.source(*args)
        got = kernel(*args)
    torch.testing.assert_close(got, torch_window_softcap(*args), **TOL[torch.float16])


def test_tensor_ops_prefill_window_softcap_and_rows_without_keys():
    """bf16 operands on Metal 4 tensor ops with the score's elementwise work on the block's
    elements (a sliding window with a soft cap; 40 rows, 90 keys, E = 40: partial blocks
    everywhere), and rows that see no key (S > L: NaN, as softmax; f16)."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 2, 40, 40, generator=g).bfloat16()
    k, v = (torch.randn(1, 2, 90, 40, generator=g).bfloat16() for _ in range(2))
    with mf.target("apple10"):
        args = (q, k, v, 40 ** -0.5, 20, 15.0)
        assert window_softcap.launches(*args)[0][0].endswith("_prefill_narrow")
        torch.testing.assert_close(window_softcap(*args), torch_window_softcap(*args),
                                   **TOL[torch.bfloat16])
        q2 = torch.randn(1, 1, 50, 16, generator=g).half()
        k2, v2 = (torch.randn(1, 1, 20, 16, generator=g).half() for _ in range(2))
        got = attention(q2, k2, v2, 0.25)
    torch.testing.assert_close(got, _math_attention(q2, k2, v2, 0.25, True).half(),
                               equal_nan=True, **TOL[torch.float16])
    assert got[0, 0, :30].isnan().all() and not got[0, 0, 30:].isnan().any()


def test_cuda_target_translation_passes_host_syntax_check(tmp_path):
    """The cuda target's prefill (Metal 4 tensor ops, the shim's mma.sync) translates and
    compiles against the cuda shim (C++20, Metal 4.0)."""
    with mf.target("cuda"):
        src = attention.source(T="f16")
    assert "mf_s_op.run(" in src and "mf_p_op.run(" in src
    assert_host_syntax(translate(src).text, tmp_path, metal_version=400)


@pytest.mark.parametrize("target,family", [("apple10", 9), ("cuda", 10)])
def test_the_layout_it_assumes_is_the_targets(monkeypatch, target, family):
    """The register-resident prefill assumes its target's cooperative-tensor layout (a row's
    lanes, P laid out as S): compiled for another family's layout in the simulator it gives
    wrong values (finite or not), so a kernel that assumed the wrong layout fails visibly; at
    its own it matches (test_tensor_ops_prefill_matches_math_attention)."""
    from metalforge.runtime import launcher
    monkeypatch.setattr(launcher, "compile_options",
                        lambda t, backend: {"metal_version": 400, "gpu_family": family})
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 40, 32, generator=g).half() for _ in range(3))
    # a launch of its own (matrix_rows=33: still the prefill for 40 rows), so that no call plan
    # another test made at the target's own layout serves it
    kernel = attention.with_launch(target=target, matrix_rows=33)
    assert kernel.launches(q, k, v, 0.2)[0][0].endswith("_prefill_narrow")
    got = kernel(q, k, v, 0.2)
    want = _math_attention(q, k, v, 0.2, True).half()
    assert not torch.allclose(got, want, **TOL[torch.float16])
