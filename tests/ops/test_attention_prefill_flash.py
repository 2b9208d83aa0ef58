"""Attention prefill in FlashAttention-2's structure (schedule/attention/flash.py,
launch={'prefill_rows': 64 or 128}): each simdgroup owns 16 query rows over whole K/V tiles
(its scores, online softmax and P x V), 64 or 128 rows a threadgroup. Simulator runs at
partial tiles (rows, keys and E not whole blocks, key tiles sized by E: 16 or 32 keys)
against torch's math attention in float64 computed here, on simdgroup_matrix (apple9; the
Metal 4 tensor-ops lowering at the default 64 rows: test_attention_prefill_mma.py, whose
compiles cost more); the 32-row kernel stays selectable.
The default (64 rows) is also what tests/ops/test_attention_prefill_mma.py and
tests/ops/test_attention.py's matrix-prefill tests run."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import metalforge as mf
from metalforge.errors import LaunchError
from metalforge.schedule.attention.flash_budget import FLASH_BYTES, keys_per_tile, layout_bytes

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from attention import attention  # noqa: E402


def _math_attention(q, k, v, scale):
    """Causal (bottom-right aligned) GQA attention in float64, NaN where a row sees no key."""
    heads, kv = q.shape[1], k.shape[1]
    kk, vv = (t.double().repeat_interleave(heads // kv, dim=1) for t in (k, v))
    sc = q.double() @ kk.transpose(-1, -2) * scale
    s, length = q.shape[2], k.shape[2]
    seen = torch.ones(s, length, dtype=torch.bool).tril(length - s)
    return sc.masked_fill(~seen, float("-inf")).softmax(-1) @ vv


def test_budget_fits_metal_threadgroup_memory():
    """Every E up to 128 gets a tile of 16 or 32 keys at 64 rows within 32 KB; 128 rows hold
    E up to 64 only."""
    for e in range(1, 129):
        kt = keys_per_tile(e, 64)
        assert kt in (16, 32) and layout_bytes(e, 64, kt) <= FLASH_BYTES, e
        assert bool(keys_per_tile(e, 128)) == (e <= 64), e
    assert keys_per_tile(128, 64) == 16 and keys_per_tile(64, 64) == 32


def test_flash_prefill_128_rows_matches_math_attention():
    """128 rows a threadgroup (8 simdgroups): GQA (2 query heads a kv head share keys: 280
    rows, tiles of 128, 128 and 24; S > L: each head's first 90 rows see no key, NaN), 50
    keys in tiles of 16 (3 whole, one of 2), E = 40 (two whole 16-blocks and half one); one
    key block and two merged. (64 rows, the default, at E = 128's tiles of 16 keys, bf16 and
    key splits: tests/ops/test_attention.py's test_matrix_prefill_matches_sdpa.)"""
    g = torch.Generator().manual_seed(11)
    q = torch.randn(1, 4, 140, 40, generator=g).half()
    k, v = (torch.randn(1, 2, 50, 40, generator=g).half() for _ in range(2))
    want = _math_attention(q, k, v, 0.3).half()
    with mf.target("apple9"):
        for splits in (1, 2):
            kernel = attention.with_launch(key_splits=splits, prefill_rows=128)
            hosts = [h for h, _, _ in kernel.launches(q, k, v, 0.3)]
            assert hosts[0].endswith("_prefill") and len(hosts) == splits, hosts
            torch.testing.assert_close(kernel(q, k, v, 0.3), want, rtol=2e-3, atol=2e-3,
                                       equal_nan=True)


def test_split_tile_kernel_stays_selectable():
    """prefill_rows=32 runs the split-tile kernel (schedule/attention/mma.py) as before: 40
    rows (a whole tile and a partial one), 70 keys, E = 24."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 2, 40, 24, generator=g).half()
    k, v = (torch.randn(1, 1, 70, 24, generator=g).half() for _ in range(2))
    kernel = attention.with_launch(prefill_rows=32)
    with mf.target("apple9"):
        assert kernel.launches(q, k, v, 0.3)[0][0].endswith("_prefill")
        torch.testing.assert_close(kernel(q, k, v, 0.3), _math_attention(q, k, v, 0.3).half(),
                                   rtol=2e-3, atol=2e-3)


def test_rows_option_selects_the_kernel():
    """prefill_rows=32 keeps the split-tile kernel; 64 and 128 build the FlashAttention-2
    one (a simdgroup per 16 rows); 128 rows at E > 64 run the decode kernels (the tile does
    not fit); other values are refused, naming the option. (apple9 f16 at 128 rows: the
    source the simulator test above compiled.)"""
    q = torch.randn(1, 2, 128, 96, dtype=torch.float16)
    k = torch.randn(1, 2, 128, 96, dtype=torch.float16)
    with mf.target("apple9"):
        old = attention.with_launch(prefill_rows=32).source(q, k, k, 0.1)
        wide = attention.with_launch(prefill_rows=128)
        new = wide.source(q, k, k, 0.1)
        assert "4 simdgroups of 16 rows;" in old and "FlashAttention-2" not in old
        assert "FlashAttention-2" in new and "max_total_threads_per_threadgroup(256)" in new
        hosts = [h for h, _, _ in wide.launches(q, k, k, 0.1)]
        assert not hosts[0].endswith("_prefill"), hosts
        with pytest.raises(LaunchError, match="prefill_rows must be 32"):
            attention.with_launch(prefill_rows=48)(q, k, k, 0.1)
