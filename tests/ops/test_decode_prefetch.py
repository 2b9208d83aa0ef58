"""launch={'kv_prefetch': True}: the decode kernels with their K/V loads a tile (stage_kv:
`pipelined`) or a step (key streams: `decode._prefetched_scan`) ahead of the arithmetic,
against torch computed directly: GQA ratios 1 / 4 / 8, E = 40 / 64 / 128, partial tiles and
key blocks, a paged cache with a run-time position, a sliding window with a soft cap."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import metalforge as mf
from metalforge import runtime

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from attention import attention  # noqa: E402
from llama_decode import paged_decode_attention  # noqa: E402
from sliding_window_softcap import torch_window_softcap, window_softcap  # noqa: E402

TILES = {"kv_prefetch": True}                                       # stage_kv (the default)
STREAMS = {"kv_prefetch": True, "stage_kv": False, "lane_scores": False}
F16 = dict(rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("g,r,e,pos", [(2, 8, 128, (0, 17, 159)), (1, 4, 40, (70,))])
def test_prefetched_paged_decode_sees_keys_up_to_pos(g, r, e, pos):
    """stage_kv, a tile ahead: the decode step's paged attention (examples/llama_decode.py),
    blocks of 16 cache rows in random order through the block table, keys 0..pos only (a
    run-time scalar: one kernel for every pos), two key blocks (a partial tile in each).
    GQA 8 at E = 128; GQA 4 at E = 40 (not whole 16-byte vectors: copied element by element,
    not prefetched)."""
    gen = torch.Generator().manual_seed(1)
    blocks = 12
    q = torch.randn(1, g * r, e, generator=gen).half()
    k_cache, v_cache = (torch.randn(blocks * 16, g, e, generator=gen).half() for _ in range(2))
    table = torch.randperm(blocks, generator=gen)[:10].to(torch.int32)[None]
    kernel = paged_decode_attention.with_launch(**TILES, key_splits=2)
    rows = (table[0, :, None] * 16 + torch.arange(16)).reshape(-1)      # key l's cache row
    for p in pos:
        k, v = (c[rows[:p + 1]].double().permute(1, 0, 2) for c in (k_cache, v_cache))
        want = F.scaled_dot_product_attention(q.double().reshape(g, r, 1, e), k[:, None],
                                              v[:, None], scale=e ** -0.5)
        got = kernel(q, k_cache, v_cache, table, e ** -0.5, p)
        torch.testing.assert_close(got, want.reshape(1, g * r, e).half(), **F16)


def test_prefetched_window_with_soft_cap():
    """A causal sliding window (its bounds: the keys a block reads) and a soft cap on the
    scores, both run-time scalars, through the key streams a step ahead (GQA 1, E = 64), keys
    in 3 blocks."""
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(1, 2, 1, 64, generator=gen).half()
    k, v = (torch.randn(1, 2, 150, 64, generator=gen).half() for _ in range(2))
    kernel = window_softcap.with_launch(**STREAMS, key_splits=3)
    want = torch_window_softcap(q.double(), k[:, :, -50:].double(), v[:, :, -50:].double(),
                                0.125, 50, 15.0)
    torch.testing.assert_close(kernel(q, k, v, 0.125, 50, 15.0), want.half(), **F16)


def test_kv_prefetch_picks_its_kernels_and_refuses_lane_scores():
    q, kv = torch.zeros(1, 8, 1, 64), torch.zeros(1, 2, 500, 64)
    tiles = runtime.schedule_of(attention.graph(q, kv, kv, 0.1), launch=TILES)
    assert "kv_prefetch" in tiles.kernel.summary and tiles.policy.stage_kv is True
    streams = runtime.schedule_of(attention.graph(q, kv, kv, 0.1), launch=STREAMS)
    assert "loaded while the step before it computes" in streams.kernel.summary
    with pytest.raises(mf.LaunchError, match="kv_prefetch.*not to lane scores"):
        attention.with_launch(kv_prefetch=True, stage_kv=False)(q, kv, kv, 0.1)


def test_prefetched_kernels_translate_for_cuda(tmp_path):
    """The cuda backend's translation of both prefetching kernels (the paged decode step's
    attention, f16) passes the shim's host syntax check."""
    from metalforge.cuda.translate import translate

    from ..cuda_host import assert_host_syntax
    q, cache = torch.zeros(1, 8, 128).half(), torch.zeros(64, 2, 128).half()
    table = torch.zeros(1, 4, dtype=torch.int32)
    for i, launch in enumerate((TILES, STREAMS)):
        src = paged_decode_attention.with_launch(**launch).source(q, cache, cache, table, 0.1, 5)
        (tmp_path / str(i)).mkdir()
        assert_host_syntax(translate(src).text, tmp_path / str(i))
