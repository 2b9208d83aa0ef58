"""launch={'decode_direct': True}: the direct decode kernels (keys streamed from device memory
into each simdgroup's registers, no staging, one reduce-scatter butterfly per step), against
torch's scaled_dot_product_attention and torch implementations of the masks, on the simulator.

Few kernels (each distinct MSL compiles once; matrix_rows=0 leaves the prefill kernel out of
them): f16 covers the three direct kernels by E, GQA
ratios 1 / 4 / 8 and a partial tile, key blocks and partial last steps; f32 and bf16 other
keys_per_step (more and fewer partial dots than lanes); paged decode with a run-time pos;
the sliding window with a soft cap; tensor masks with NaN. (check() over the direct kernels
takes ~20 s of simulation: run by hand, see bench/README.md.)"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import metalforge as mf
from metalforge import runtime
from metalforge.cuda.translate import translate

from ..cuda_host import assert_host_syntax

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from attention import attention, causal_mask  # noqa: E402
from llama_decode import paged_decode_attention  # noqa: E402
from padded_attention import padded_attention  # noqa: E402
from sliding_window_softcap import torch_window_softcap, window_softcap  # noqa: E402

TOL = {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.float16: dict(rtol=2e-3, atol=2e-3),
       torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


def _sdpa(q, k, v, scale, s, length):
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), scale=scale,
                                          attn_mask=causal_mask(s, length, "cpu"),
                                          enable_gqa=True).to(q.dtype)


@pytest.mark.parametrize("dtype,kps,cases", [
    # (query heads, kv heads, S, L, E, key_splits): E = 64 / 128 / 200 run the 8- / 16- /
    # 32-lane kernels; R = 8 (two tiles), 4, 1, 3 (a partial tile); L = 1, L not a
    # multiple of a step, several key blocks. Partial dots a step (keys_per_step x 4 rows)
    # against lanes a key: 8 (as many, fewer); the window test below takes 16 (more, as
    # many), the masks' 4 (fewer); f32 runs there
    (torch.float16, 2, [(16, 2, 1, 77, 128, 0), (8, 2, 1, 300, 64, 3), (3, 3, 1, 1, 128, 0),
                        (6, 2, 2, 129, 200, 2), (4, 1, 1, 300, 128, 0)]),
    (torch.bfloat16, 1, [(8, 2, 1, 70, 128, 2), (4, 4, 1, 33, 48, 0)]),
])
def test_direct_matches_sdpa(dtype, kps, cases):
    for heads, kvh, s, length, e, splits in cases:
        g = torch.Generator().manual_seed(heads * length + e)
        q = torch.randn(1, heads, s, e, generator=g).to(dtype)
        k, v = (torch.randn(1, kvh, length, e, generator=g).to(dtype) for _ in range(2))
        launch = dict(decode_direct=True, keys_per_step=kps, matrix_rows=0,
                      **({"key_splits": splits} if splits else {}))
        kernel = attention.with_launch(**launch)
        name = kernel.launches(q, k, v, e ** -0.5)[0][0]
        lanes = 8 if e <= 64 else 16 if e <= 128 else 32
        assert name.endswith({8: "_direct_narrow", 16: "_direct", 32: "_direct_wide"}[lanes])
        torch.testing.assert_close(kernel(q, k, v, e ** -0.5), _sdpa(q, k, v, e ** -0.5, s,
                                                                       length), **TOL[dtype])


def test_paged_decode_with_runtime_pos():
    """The paged step (llama_decode): each key's cache row from the block table, keys past
    the run-time pos masked, 4 query heads a kv head, key blocks split and merged."""
    gen = torch.Generator().manual_seed(0)
    b, g, r, e, bs, per_seq = 2, 2, 4, 128, 16, 12
    q = torch.randn(b, g * r, e, generator=gen).half()
    k_cache, v_cache = (torch.randn(60 * bs, g, e, generator=gen).half() for _ in range(2))
    table = torch.randperm(60, generator=gen)[:b * per_seq].reshape(b, per_seq).int()
    kernel = paged_decode_attention.with_launch(decode_direct=True, key_splits=3,
                                                matrix_rows=0)
    for pos in (0, 100, per_seq * bs - 1):
        rows = (table.long()[:, :, None] * bs + torch.arange(bs)).reshape(b, -1)[:, :pos + 1]
        k, v = (c[rows].permute(0, 2, 1, 3) for c in (k_cache, v_cache))   # [B, G, L, E]
        want = F.scaled_dot_product_attention(q[:, :, None].double(), k.double(), v.double(),
                                              scale=0.1, enable_gqa=True)[:, :, 0].half()
        got = kernel(q, k_cache, v_cache, table, 0.1, pos)
        mf.check_deferred()
        torch.testing.assert_close(got, want, **TOL[torch.float16])


def test_window_softcap_and_masked_rows():
    """A causal sliding window and a soft cap (run-time scalars); tensor masks: all keys
    masked gives NaN (as softmax of all -inf), a NaN score a NaN row."""
    kernel = window_softcap.with_launch(decode_direct=True, key_splits=3, matrix_rows=0,
                                        keys_per_step=4)
    for e in (40, 100):                       # 16 partials a step over 8 lanes, over 16
        q, k, v = (torch.randn(2, 3, n, e) for n in (3, 75, 75))
        want = torch_window_softcap(q, k, v, e ** -0.5, 20, 15.0)
        torch.testing.assert_close(kernel(q, k, v, e ** -0.5, 20, 15.0), want,
                                   **TOL[torch.float32])
    padded = padded_attention.with_launch(decode_direct=True, key_splits=2, matrix_rows=0,
                                          keys_per_step=1)
    q, k, v = torch.randn(2, 1, 3, 8), torch.randn(2, 1, 5, 8), torch.randn(2, 1, 5, 8)
    valid = torch.ones(2, 5, dtype=torch.bool)
    valid[1] = False
    out = padded(q, k, v, valid)
    assert out[1].isnan().all() and not out[0].isnan().any()
    k[0, 0, 2, 0] = float("nan")
    out = padded(q, k, v, valid)
    assert out[0].isnan().all()


def test_direct_is_off_by_default_and_refuses_stage_kv():
    q = torch.randn(1, 8, 1, 64)
    kv = torch.randn(1, 2, 100, 64)
    graph = attention.graph(q, kv, kv, 0.1)
    assert not runtime.schedule_of(graph).policy.decode_direct
    policy = runtime.schedule_of(graph, launch={"decode_direct": True}).policy
    assert policy.stage_kv is False and policy.lane_scores is False
    with pytest.raises(mf.LaunchError, match="decode_direct.*stage_kv"):
        attention.with_launch(decode_direct=True, stage_kv=True)(q, kv, kv, 0.1)


def test_cuda_translation_passes_host_syntax_check(tmp_path):
    """The direct kernels (indexed and xor shuffles, 16-byte loads) translate and compile
    against the cuda shim."""
    with mf.target("cuda"):
        src = attention.with_launch(decode_direct=True, matrix_rows=0).source(T="f16")
    assert "_direct_narrow" in src and "_direct_wide" in src
    assert_host_syntax(translate(src).text, tmp_path)
