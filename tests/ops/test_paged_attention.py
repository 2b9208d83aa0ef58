"""Paged attention: GQA decode reading K/V through a block table with `mf.take`, against SDPA on
each sequence's keys gathered by torch indexing."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import metalforge as mf
from metalforge.testing import check

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from paged_attention import CHECK, paged_attention, torch_paged_attention  # noqa: E402

TOL = {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.float16: dict(rtol=2e-3, atol=2e-3),
       torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


def _case(batch, g, r, e, blocks, per_seq, lengths, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, g * r, e, generator=gen).to(dtype)
    k_cache, v_cache = (torch.randn(blocks * 16, g, e, generator=gen).to(dtype)
                        for _ in range(2))
    table = torch.randperm(blocks, generator=gen)[:batch * per_seq]
    return q, k_cache, v_cache, table.reshape(batch, per_seq).to(torch.int32), \
        torch.tensor(lengths, dtype=torch.int32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("g,r,e,per_seq,lengths", [
    (2, 4, 64, 5, [70, 80, 1]),           # GQA, ragged sequences, one of a single key
    (1, 8, 128, 40, [640, 17]),           # MQA, long enough to split the keys into blocks
    (4, 1, 33, 3, [48, 20]),              # MHA, E not a multiple of the vector width
])
@pytest.mark.parametrize("launch", [{"stage_kv": False}, {"stage_kv": True},
                                    {"stage_kv": True, "key_splits": 3}])
def test_matches_sdpa_per_sequence(dtype, g, r, e, per_seq, lengths, launch):
    """Keys read by the lanes that score them, and stage_kv (each copy into the K/V tiles
    finds its key's row through the block table)."""
    args = _case(len(lengths), g, r, e, 100, per_seq, lengths, dtype)
    want = torch_paged_attention(*(a.double() if a.is_floating_point() else a for a in args),
                                 0.125).to(dtype)
    kernel = paged_attention.with_launch(**launch) if launch else paged_attention
    torch.testing.assert_close(kernel(*args, 0.125), want, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_many_query_heads_per_kv_head_run_the_matrix_kernel(dtype):
    """40 query heads on one kv head share their keys: the simdgroup_matrix prefill kernel
    (its K/V tiles filled through the block table), ragged sequences and E = 40."""
    args = _case(3, 1, 40, 40, 60, 6, [90, 33, 1], dtype)
    assert paged_attention.launches(*args, 0.125)[0][0].endswith("_prefill")
    want = torch_paged_attention(*(a.double() if a.is_floating_point() else a for a in args),
                                 0.125).to(dtype)
    torch.testing.assert_close(paged_attention(*args, 0.125), want, **TOL[dtype])


def test_block_outside_the_cache_is_a_clear_error():
    q, k_cache, v_cache, table, lengths = _case(2, 2, 2, 16, 10, 3, [40, 5], torch.float32)
    table[1, 2] = 10                                   # one past the last block
    with pytest.raises(mf.GatherIndexError,
                       match=r"'[kv]_cache' along 'N' \(size 160.*index 1[67]\d "):
        paged_attention(q, k_cache, v_cache, table, lengths, 0.125)
    with pytest.raises(mf.GatherIndexError):           # the reference raises the same class
        paged_attention.reference(q, k_cache, v_cache, table, lengths, 0.125)
    with pytest.raises(mf.GatherIndexError,          # staged: found while filling a tile
                       match=r"'[kv]_cache' along 'N' \(size 160.*index 1[67]\d "):
        paged_attention.with_launch(stage_kv=True)(q, k_cache, v_cache, table, lengths, 0.125)


def test_check_covers_paged_attention():
    # every dtype variant: this is also the example's generated test (tests/testing/
    # test_testing_gen.py runs it here, not there)
    report = check(paged_attention, **CHECK["paged_attention"])
    assert report.examples > 0
    assert {i.host_name for i in report.instantiations if i.launches} >= {
        "paged_attention_f16_BS_16_decode", "paged_attention_f16_BS_16_merge"}
