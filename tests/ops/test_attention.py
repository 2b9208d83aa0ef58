"""The attention family: online-softmax attention written in the DSL, one pass over the keys,
against torch's scaled_dot_product_attention and the graph's reference."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import metalforge as mf
from metalforge import runtime
from metalforge.testing import check

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from attention import attention, causal_mask  # noqa: E402
from padded_attention import padded_attention  # noqa: E402
from sliding_window_softcap import torch_window_softcap, window_softcap  # noqa: E402

TOL = {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.float16: dict(rtol=2e-3, atol=2e-3),
       torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


@pytest.mark.parametrize("dtype,stage_kv", [(torch.float32, None), (torch.float16, None),
                                            (torch.bfloat16, None), (torch.float16, False),
                                            (torch.float32, False)])
@pytest.mark.parametrize("s,length,e", [(1, 1, 8), (1, 31, 64), (1, 33, 128), (5, 100, 256),
                                        (7, 7, 16), (3, 4097, 32)])
def test_matches_sdpa(dtype, stage_kv, s, length, e):
    """The schedule's own choice (K/V tiles staged) and the keys read by the lanes that score
    them (stage_kv=False)."""
    g = torch.Generator().manual_seed(s * length + e)
    q, k, v = (torch.randn(1, 2, n, e, generator=g).to(dtype) for n in (s, length, length))
    kernel = attention if stage_kv is None else attention.with_launch(stage_kv=stage_kv)
    policy = runtime.schedule_of(kernel.graph(q, k, v, 0.1), launch=kernel.launch).policy
    assert policy.stage_kv is (stage_kv is None)
    for causal in (True, False):
        mask = causal_mask(s, length, "cpu") if causal else None
        want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=e ** -0.5,
                                              attn_mask=mask).to(dtype)
        torch.testing.assert_close(kernel(q, k, v, e ** -0.5, causal=causal), want,
                                   **TOL[dtype])


@mf.kernel
def attention_divided(q: "T[B, H, S, E]", k: "T[B, H, L, E]", v: "T[B, H, L, E]", scale: float):
    s = mf.sum(q * k, axis="E") * scale
    e = mf.exp(s - mf.max(s, axis="L"))
    return mf.sum(e / mf.sum(e, axis="L") * v, axis="L")


@mf.kernel
def attention_reciprocal(q: "T[B, H, S, E]", k: "T[B, H, L, E]", v: "T[B, H, L, E]",
                         scale: float):
    s = mf.sum(q * k, axis="E") * scale
    e = mf.exp(s - mf.max(s, axis="L"))
    return mf.sum(v * (e * (1.0 / mf.sum(e, axis="L"))), axis="L")


@pytest.mark.parametrize("kernel", [attention_divided, attention_reciprocal])
def test_softmax_spelled_out_is_attention(kernel):
    """exp(s - max) divided by its sum, or times the sum's reciprocal, in either order: the
    attention schedule, as for mf.softmax."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, n, 32, generator=g) for n in (3, 70, 70))
    assert runtime.schedule_of(kernel.graph(q, k, v, 0.2), {}).family == "attention"
    want = F.scaled_dot_product_attention(q, k, v, scale=0.2)
    torch.testing.assert_close(kernel(q, k, v, 0.2), want, **TOL[torch.float32])


@pytest.mark.parametrize("lane_scores", [True, False, None])     # None: K/V staged (default)
@pytest.mark.parametrize("heads,kv_heads", [(8, 2), (4, 1), (3, 3)])     # GQA, MQA, MHA
@pytest.mark.parametrize("s,length,splits", [(1, 700, 0), (1, 129, 3), (2, 50, 50), (3, 40, 1),
                                             (1, 1500, 37)])
def test_grouped_query_heads_match_sdpa(heads, kv_heads, s, length, splits, lane_scores):
    """q's heads "(G R)": each of the G key/value heads serves R query heads; the keys of a
    query row split into `splits` blocks (0: chosen per call) merged by a second kernel (37:
    more blocks than a simdgroup has lanes, and not a multiple of its streams); scores by a
    lane per key or by lanes over E, or from K/V tiles staged in threadgroup memory."""
    g = torch.Generator().manual_seed(heads * length + s)
    q = torch.randn(2, heads, s, 64, generator=g)
    k, v = (torch.randn(2, kv_heads, length, 64, generator=g) for _ in range(2))
    launch = {} if lane_scores is None else dict(stage_kv=False, lane_scores=lane_scores)
    launch.update({"key_splits": splits} if splits else {})
    kernel = attention.with_launch(**launch)
    want = F.scaled_dot_product_attention(q, k, v, scale=0.125, enable_gqa=True,
                                          attn_mask=causal_mask(s, length, "cpu"))
    for _ in range(2):                                          # cold, then the warm path
        torch.testing.assert_close(kernel(q, k, v, 0.125), want, **TOL[torch.float32])


def test_key_blocks_per_call():
    """A few tiles of query rows split their keys (a second launch merges the blocks); many
    tiles, or few keys, launch the one kernel. Unstaged (stage_kv: test_stage_kv_launch),
    the R = 4 query heads of a kv head make one
    tile of rows_per_group = 4 (a threadgroup of 128 threads per tile and key block): 8 tiles,
    512 / 8 = 64 blocks, merged by threadgroups of 8 simdgroups, 2 per query row (each
    reads 8 lanes' elements of E of every block: 64 of its 128)."""
    q, kv = torch.randn(1, 32, 1, 128), torch.randn(1, 8, 65536, 128)
    s = runtime.schedule_of(attention.graph(q, kv, kv, 0.1), launch={"stage_kv": False})
    sizes = dict(B=1, G=8, R=4, S=1, L=65536, E=128)
    steps = s.steps(sizes)
    assert [st.host_name for st in steps] == ["attention_f32_causal_true_decode",
                                             "attention_f32_causal_true_merge"]
    assert s.splits(sizes) == 64 and steps[0].threads == 8 * 1 * 64 * 128
    assert (steps[1].threads, steps[1].group) == (32 * 2 * 256, 256)
    assert s.merge_parts(sizes) == 2 and s.merge_parts({**sizes, "E": 64}) == 1
    assert len(s.steps({**sizes, "L": 100})) == 1
    assert len(s.steps({**sizes, "S": 1024})) == 1      # 8 x 1024 tiles fill the GPU


@pytest.mark.parametrize("lane_scores,splits", [(True, 0), (False, 0), (True, 2), (False, 3)])
def test_masked_rows_and_nan_follow_softmax(lane_scores, splits):
    """All keys masked: NaN (0 / 0, as softmax of all -inf); a NaN score: a NaN row; with the
    keys in one block or split (the merge kernel carries both)."""
    kernel = padded_attention.with_launch(stage_kv=False, lane_scores=lane_scores,
                                          key_splits=splits)
    q, k, v = torch.randn(2, 1, 3, 8), torch.randn(2, 1, 5, 8), torch.randn(2, 1, 5, 8)
    valid = torch.ones(2, 5, dtype=torch.bool)
    valid[1] = False                                   # every key of sequence 1 masked
    out = kernel(q, k, v, valid)
    assert out[1].isnan().all() and not out[0].isnan().any()
    k[0, 0, 2, 0] = float("nan")                       # a NaN score: that query row is NaN
    out = kernel(q, k, v, valid)
    torch.testing.assert_close(out, padded_attention.reference(q, k, v, valid), equal_nan=True)
    assert out[0].isnan().all()


def test_check_covers_attention():
    """Every kernel launched: E up to 64 selects the narrow decode kernel (key streams in the
    values loop), E up to 128 the decode kernel, E = 129 the wide one."""
    report = check(attention, max_examples=3, dims={"E": [1, 8, 33, 64, 65, 129]})
    assert all(i.launches for i in report.instantiations), report.coverage()
    assert any("L=33" in i.describe() for i in report.instantiations)
    assert any(i.host_name.endswith("_merge") and i.launches for i in report.instantiations)


def test_head_dim_over_the_schedule_is_refused_before_launch():
    q, k = torch.randn(1, 1, 1, 300), torch.randn(1, 1, 4, 300)
    with pytest.raises(mf.LaunchError, match="'E' = 300, over the 256"):
        attention(q, k, k, 0.1)
    wide = attention.with_launch(reads_per_thread=16)          # 32 lanes x 16: E up to 512
    want = F.scaled_dot_product_attention(q, k, k, scale=0.1, attn_mask=causal_mask(1, 4, "cpu"))
    torch.testing.assert_close(wide(q, k, k, 0.1), want, rtol=1e-4, atol=1e-5)


def test_mismatched_shapes_are_clear_errors():
    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 4, 8)
    with pytest.raises(mf.ShapeError, match="'E'"):
        attention(q, k, torch.randn(1, 2, 4, 9), 0.1)
    with pytest.raises(mf.ShapeError, match=r"grouped dim \(G R\) of argument 'q'.*size 2, "
                       r"which is not a multiple of 3 \('G' = 3 from argument 'k'\)"):
        attention(q, torch.randn(1, 3, 4, 8), torch.randn(1, 3, 4, 8), 0.1)
    with pytest.raises(mf.ShapeError, match="'G' is 2 in argument 'k' but 1 in argument 'v'"):
        attention(q, k, torch.randn(1, 1, 4, 8), 0.1)


def test_other_multi_axis_reductions_still_name_the_construct():
    @mf.kernel
    def two_axes(x: "T[R, D]"):
        return mf.sum(x, axis="D") + mf.sum(x, axis="R")     # two sets of axes: {D}, {R}
    with pytest.raises(mf.UnsupportedConstruct, match="several axes"):
        two_axes(torch.randn(3, 4))


# -- launch={'stage_kv': True}: K/V tiles in threadgroup memory, one simdgroup per query row --
STAGED = attention.with_launch(stage_kv=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("heads,kv_heads,s,length,e,splits", [
    (8, 2, 1, 1, 128, 0),         # one key
    (8, 2, 1, 31, 64, 0),         # less than a tile
    (8, 2, 1, 33, 128, 2),        # a tile and one key, split: blocks of 17 and 16 keys
    (8, 2, 1, 4097, 128, 0),      # many tiles, key blocks chosen per call (a partial tile);
                                  # f16/bf16 full tiles take the batched copies
    (8, 2, 1, 300, 64, 2),        # E = 64: 64-key tiles, full ones batched (f16/bf16)
    (4, 4, 1, 100, 96, 3),        # R = 1: one live row in a tile of four
    (8, 2, 1, 70, 256, 3),        # E = 256: tiles of 16 keys (f16) / 8 (f32), lanes share keys
    (6, 3, 1, 50, 33, 4),         # E not a multiple of the vector width: element copies
    (6, 3, 1, 50, 36, 2),         # E = 36: v read 4 a lane at once, k (f16: 8 a chunk) not
    (4, 2, 5, 40, 16, 0),         # S = 5 rows x R = 2: tiles of four rows, some dead
])
def test_stage_kv_matches_sdpa(dtype, heads, kv_heads, s, length, e, splits):
    """stage_kv against SDPA (race detector on): GQA and R = 1, any L and E up to 256, the keys
    in one block or several merged by the second kernel, causal and not."""
    g = torch.Generator().manual_seed(heads * length + e)
    q = torch.randn(1, heads, s, e, generator=g).to(dtype)
    k, v = (torch.randn(1, kv_heads, length, e, generator=g).to(dtype) for _ in range(2))
    kernel = STAGED.with_launch(**({"key_splits": splits} if splits else {}))
    for causal in (True, False):
        mask = causal_mask(s, length, "cpu") if causal else None
        want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), scale=e ** -0.5,
                                              attn_mask=mask, enable_gqa=True).to(dtype)
        torch.testing.assert_close(kernel(q, k, v, e ** -0.5, causal=causal), want, **TOL[dtype])


def test_full_tiles_batch_their_copies():
    """A thread's copies of a full tile (4 at E = 128 in 2-byte types: 32 keys of 16 chunks over
    128 threads) are loaded before any is stored; paged reads and other tiles keep the loop."""
    q, k = torch.randn(1, 8, 1, 128, dtype=torch.float16), torch.randn(1, 2, 64, 128,
                                                                        dtype=torch.float16)
    src = STAGED.source(q, k, k, 0.1)
    decode = src[src.index("kernel void mf_attention_decode("):]
    decode = decode[:decode.index("\n}\n")]
    assert "mf_tn * mf_chunks == 512u" in decode and "mf_kv0_cp[3u] =" in decode
    assert "for (uint mf_i = mf_tid; mf_i < mf_tn * mf_chunks" in decode      # other tiles


@mf.kernel
def row_scaled_keys(q: "T[B, (G R), S, E]", k: "T[B, G, L, E]", v: "T[B, G, L, E]",
                    r: "T[B, (G R), S]", scale: float):
    return mf.sum(mf.softmax(mf.sum(q * (k * r), axis="E") * scale, axis="L") * v, axis="L")


@mf.kernel
def row_scaled_values(q: "T[B, (G R), S, E]", k: "T[B, G, L, E]", v: "T[B, G, L, E]",
                      r: "T[B, (G R), S]", scale: float):
    return mf.sum(mf.softmax(mf.sum(q * k, axis="E") * scale, axis="L") * (v * r), axis="L")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rows_past_the_tile_read_nothing(dtype):
    """Rows past a tile's end are computed unguarded only where the scores' and values' work
    reads nothing but staged rows and tiles: a per-row tensor read inside the contraction or
    the values keeps them guarded (S = 5, R = 2: the last tile of four rows has two; the
    simulator's bounds check catches a read of the others)."""
    g = torch.Generator().manual_seed(7)
    q = torch.randn(1, 4, 5, 32, generator=g).to(dtype)
    k, v = (torch.randn(1, 2, 70, 32, generator=g).to(dtype) for _ in range(2))
    r = (torch.rand(1, 4, 5, generator=g) + 0.5).to(dtype)
    kq, vq = (t.double().repeat_interleave(2, dim=1) for t in (k, v))
    rr = r.double()[..., None]
    p = torch.softmax((q.double() @ kq.transpose(-1, -2)) * rr * 0.2, dim=-1)
    torch.testing.assert_close(row_scaled_keys(q, k, v, r, 0.2), (p @ vq).to(dtype), **TOL[dtype])
    p = torch.softmax((q.double() @ kq.transpose(-1, -2)) * 0.2, dim=-1)
    torch.testing.assert_close(row_scaled_values(q, k, v, r, 0.2), (p @ vq * rr).to(dtype),
                               **TOL[dtype])


def test_stage_kv_launch():
    """One simdgroup per row of the tile (128 threads for R = 4, 32 where the tile is one
    row); 32 keys a tile, fewer where E's rows would not fit the tile's bytes; about 1024
    threadgroups, each block of keys at least two tiles."""
    q, kv = torch.randn(1, 32, 1, 128).half(), torch.randn(1, 8, 65536, 128).half()
    s = runtime.schedule_of(attention.graph(q, kv, kv, 0.1), launch={"stage_kv": True})
    assert s.policy.stage_kv is True
    sizes = dict(B=1, G=8, R=4, S=1, L=65536, E=128)
    decode, merge = s.steps(sizes)
    assert decode.group == 128 and s.splits(sizes) == 128 and decode.threads == 8 * 128 * 128
    assert s.keys_per_tile(sizes) == 32 and s.keys_per_tile({**sizes, "E": 256}) == 16
    assert s.splits({**sizes, "L": 4096}) == 64 and s.splits({**sizes, "L": 2048}) == 32
    assert s.splits({**sizes, "L": 40}) == 1
    f32 = runtime.schedule_of(attention.graph(q.float(), kv.float(), kv.float(), 0.1),
                              launch={"stage_kv": True})
    assert f32.keys_per_tile(sizes) == 16 and f32.keys_per_tile({**sizes, "E": 256}) == 8
    assert f32.policy.threadgroup_bytes <= 32 * 1024
    mha = runtime.schedule_of(attention_divided.graph(q, q, q, 0.1), launch={"stage_kv": True})
    assert mha.steps(dict(B=1, H=32, S=1, L=1, E=128))[0].group == 128   # S is tiled: 4 rows


def test_stage_kv_refuses_what_it_cannot_hold():
    """Asked for, staging needs a simdgroup per row of the tile; left to the schedule, a
    threads_per_group it cannot take runs unstaged."""
    q, k, v = (torch.randn(1, 2, n, 8) for n in (1, 4, 4))
    with pytest.raises(mf.LaunchError, match="stage_kv: one simdgroup per query row.*"
                                             "threads_per_group=256 must be 32 x rows_per_"):
        attention.with_launch(stage_kv=True, threads_per_group=256)(q, k, v, 0.1)
    wide = attention.with_launch(threads_per_group=256)
    assert runtime.schedule_of(wide.graph(q, k, v, 0.1), launch=wide.launch).policy.stage_kv \
        is False
    torch.testing.assert_close(wide(q, k, v, 0.1), attention(q, k, v, 0.1), **TOL[torch.float32])
    with pytest.raises(mf.LaunchError, match="'E' = 300, over the 256"):
        STAGED(torch.randn(1, 1, 1, 300), torch.randn(1, 1, 4, 300), torch.randn(1, 1, 4, 300),
               0.1)


@pytest.mark.parametrize("splits", [0, 3])
def test_stage_kv_masks_and_nan_follow_softmax(splits):
    """Tensor masks with stage_kv: all keys masked gives NaN, a NaN score a NaN row."""
    kernel = padded_attention.with_launch(stage_kv=True, key_splits=splits)
    q, k, v = torch.randn(2, 1, 3, 8), torch.randn(2, 1, 40, 8), torch.randn(2, 1, 40, 8)
    valid = torch.rand(2, 40, generator=torch.Generator().manual_seed(1)) < 0.7
    valid[1] = False
    out = kernel(q, k, v, valid)
    assert out[1].isnan().all() and not out[0].isnan().any()
    torch.testing.assert_close(out, padded_attention.reference(q, k, v, valid), equal_nan=True)
    k[0, 0, 2, 0] = float("nan")
    valid[0, 2] = True
    out = kernel(q, k, v, valid)
    torch.testing.assert_close(out, padded_attention.reference(q, k, v, valid), equal_nan=True)
    assert out[0].isnan().all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_stage_kv_sliding_window_softcap(dtype):
    """A causal sliding window and a soft cap on the scores (runtime scalars) with stage_kv."""
    q, k, v = (torch.randn(2, 3, n, 40).to(dtype) for n in (3, 75, 75))
    kernel = window_softcap.with_launch(stage_kv=True, key_splits=3)
    want = torch_window_softcap(q, k, v, 40 ** -0.5, 20, 15.0)
    torch.testing.assert_close(kernel(q, k, v, 40 ** -0.5, 20, 15.0), want, **TOL[dtype])


def test_check_covers_unstaged():
    """check() on the schedule without K/V staging (the default's is above)."""
    report = check(attention.with_launch(stage_kv=False), max_examples=3,
                   dims={"E": [1, 8, 33, 64]})
    assert all(i.launches for i in report.instantiations), report.coverage()
    assert any(i.host_name.endswith("_merge") and i.launches for i in report.instantiations)


# -- masks that depend only on indices bound the keys a tile reads --------------------------

@pytest.mark.parametrize("launch", [{}, {"key_splits": 3}, {"stage_kv": False},
                                    {"stage_kv": False, "key_splits": 3}])
def test_sliding_window_reads_only_the_window(launch):
    """Decode with a window of 16 over 200 keys: the blocks split the 16 keys the row can see
    and nothing else is read, so NaN planted in K and V outside the window cannot reach the
    output (reading them would: 0 x NaN in p v)."""
    g = torch.Generator().manual_seed(7)
    q = torch.randn(1, 2, 1, 32, generator=g)
    k, v = (torch.randn(1, 2, 200, 32, generator=g) for _ in range(2))
    want = torch_window_softcap(q, k, v, 32 ** -0.5, 16, 20.0)
    k[:, :, :184], v[:, :, :184] = float("nan"), float("nan")
    kernel = window_softcap.with_launch(**launch) if launch else window_softcap
    torch.testing.assert_close(kernel(q, k, v, 32 ** -0.5, 16, 20.0), want,
                               **TOL[torch.float32])


@pytest.mark.parametrize("launch,rows", [({}, 32), ({"matrix_rows": 0}, 4),
                                         ({"stage_kv": False}, 4)])
def test_causal_tiles_stop_at_their_last_row(launch, rows):
    """Causal prefill, S = L = 70: a tile of query rows (32 in the matrix prefill kernel, 4 in
    the decode kernels) reads keys up to its last row's position only. V NaN at key 60: the
    rows of tiles that end before row 60 stay finite and match SDPA without it; the rows of the
    tile holding row 60 and after read the key (p = 0 times NaN) and are NaN, as in torch's
    math attention, which reads every key."""
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(1, 2, 70, 16, generator=g) for _ in range(3))
    mask = causal_mask(70, 70, "cpu")
    v[:, :, 60] = 0.0
    want = F.scaled_dot_product_attention(q, k, v, scale=0.25, attn_mask=mask)
    v[:, :, 60] = float("nan")
    kernel = attention.with_launch(**launch) if launch else attention
    out = kernel(q, k, v, 0.25)
    clean = 60 // rows * rows                    # the first row of the tile that holds row 60
    torch.testing.assert_close(out[:, :, :clean], want[:, :, :clean], **TOL[torch.float32])
    assert out[:, :, clean:].isnan().all()


def test_unbounded_masks_read_every_key():
    """A mask that is not a bound on index(L) alone (a tensor mask; a soft cap applied after
    the mask, which maps -inf to -cap) leaves the keys unbounded: every key is read."""
    q, k = torch.randn(1, 1, 2, 8), torch.randn(1, 1, 4, 8)
    assert "mf_klo" in attention.source(q, k, k, 0.1)                       # causal: bounded
    assert "mf_klo" not in padded_attention.source(q, k, k, torch.ones(1, 4, dtype=torch.bool))

    @mf.kernel
    def capped_after(q: "T[B, H, S, E]", k: "T[B, H, L, E]", v: "T[B, H, L, E]"):
        s = mf.sum(q * k, axis="E")
        s = mf.where(mf.index("L") <= mf.index("S"), s, -mf.inf)
        s = 5.0 * mf.tanh(s / 5.0)
        return mf.sum(mf.softmax(s, axis="L") * v, axis="L")
    assert "mf_klo" not in capped_after.source(q, k, k)
    q, k, v = (torch.randn(1, 1, n, 8) for n in (3, 3, 3))
    sc = (q @ k.transpose(-1, -2)).masked_fill(~causal_mask(3, 3, "cpu"), float("-inf"))
    want = torch.softmax(5.0 * torch.tanh(sc / 5.0), -1) @ v
    torch.testing.assert_close(capped_after(q, k, v), want, **TOL[torch.float32])


@pytest.mark.parametrize("s,length,window", [(1, 200, 16), (4, 1000, 10), (8, 1000, 2),
                                             (70, 70, 5), (3, 50, 100), (1, 30, 0)])
def test_byte_count_has_only_the_keys_the_mask_lets_be_read(s, length, window):
    """schedule.traffic counts K and V for the keys some row of a head can see (the union of
    the rows' windows, from the mask itself here), q and the outputs whole; without the
    window's value it cannot know the bound and counts every key."""
    from metalforge.shapes import bind_shapes
    heads, e = 3, 16
    q, k = torch.randn(1, heads, s, e), torch.randn(1, heads, length, e)
    args = {"q": q, "k": k, "v": k, "scale": 0.1, "window": window, "cap": 20.0}
    g = window_softcap.graph(*args.values())
    sched = runtime.schedule_of(g, args)
    sizes = bind_shapes(g, {"q": q, "k": k, "v": k}).sizes
    pos = torch.arange(s)[:, None] + length - s
    key = torch.arange(length)[None, :]
    visible = int(((key <= pos) & (key > pos - window)).any(0).sum())
    qo = 2 * q.numel() * 4
    assert sched.traffic(sizes, {"window": window}).total == qo + 2 * heads * visible * e * 4
    assert sched.traffic(sizes).total == qo + 2 * k.numel() * 4


# -- the simdgroup_matrix prefill kernel ------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("heads,kv,s,length,e,splits", [
    (4, 2, 16, 40, 64, 0),        # GQA: 4 x 16 rows of a kv head in 2 tiles of 32
    (2, 2, 33, 70, 36, 0),        # a whole tile and one row; E not a multiple of 8
    (2, 1, 40, 129, 128, 0),      # MQA, E = 128, keys over 3 tiles, S < L (bottom-right)
    (1, 1, 70, 50, 8, 0),         # S > L: the first 20 rows see no key (NaN, as softmax)
    (2, 2, 48, 100, 24, 3),       # 3 key blocks merged by the merge kernel
])
def test_matrix_prefill_matches_sdpa(dtype, heads, kv, s, length, e, splits):
    """Calls with at least 32 query rows sharing their keys run the prefill kernel (8x8
    simdgroup_matrix products), causal and not, against torch's math attention: one key
    block (its rows written by the kernel) or several (their states merged)."""
    g = torch.Generator().manual_seed(s * length + e)
    q = torch.randn(1, heads, s, e, generator=g).to(dtype)
    k, v = (torch.randn(1, kv, length, e, generator=g).to(dtype) for _ in range(2))
    kernel = attention.with_launch(key_splits=splits or 1)
    hosts = [h for h, _, _ in kernel.launches(q, k, v, 0.3)]
    assert hosts[0].endswith("_prefill") and (len(hosts) == 2) == bool(splits), hosts
    for causal in (True, False):
        # torch's math attention (SDPA gives 0 where every key is masked; softmax gives NaN)
        kk, vv = (t.double().repeat_interleave(heads // kv, dim=1) for t in (k, v))
        sc = q.double() @ kk.transpose(-1, -2) * 0.3
        if causal:
            sc = sc.masked_fill(~causal_mask(s, length, "cpu"), float("-inf"))
        want = (sc.softmax(-1) @ vv).to(dtype)
        torch.testing.assert_close(kernel(q, k, v, 0.3, causal=causal), want, **TOL[dtype],
                                   equal_nan=True)


def test_matrix_prefill_is_chosen_by_rows_sharing_keys():
    """31 rows sharing keys keep the decode kernel, 32 take the prefill kernel;
    matrix_rows=0 never does, matrix_rows=64 from 64 rows."""
    def host(kernel, heads, s):
        q, k = torch.randn(1, heads, s, 16), torch.randn(1, 1, 64, 16)
        return kernel.launches(q, k, k, 0.1)[0][0]
    assert not host(attention, 1, 31).endswith("_prefill")
    assert host(attention, 1, 32).endswith("_prefill")
    assert host(attention, 4, 8).endswith("_prefill")           # 4 query heads x 8 positions
    assert not host(attention.with_launch(matrix_rows=0), 4, 300).endswith("_prefill")
    assert not host(attention.with_launch(matrix_rows=64), 1, 63).endswith("_prefill")
    assert host(attention.with_launch(matrix_rows=64), 1, 64).endswith("_prefill")
    with pytest.raises(mf.LaunchError, match="matrix_rows must be an int >= 0"):
        attention.with_launch(matrix_rows=-1)(*(torch.randn(1, 1, 4, 8),) * 3, 0.1)


def test_backend_policy_sits_under_explicit_launch(monkeypatch):
    """What a backend changes in the table (BACKEND_POLICIES) applies to its calls only,
    under explicit launch options. Shown on the simulator with an entry of its own (cuda has
    none for attention: its prefill is chosen by target, schedule/attention/build.py)."""
    from metalforge.schedule import policy

    def host(kernel):
        q, k = torch.randn(1, 1, 32, 24), torch.randn(1, 1, 64, 24)
        return kernel.launches(q, k, k, 0.1)[0][0]
    assert policy.backend_launch("cuda", "attention") is None
    assert policy.backend_launch("sim", "attention") is None
    assert host(attention).endswith("_prefill")
    monkeypatch.setitem(policy.BACKEND_POLICIES, "sim", {"attention": {"matrix_rows": 0}})
    assert not host(attention).endswith("_prefill")
    assert host(attention.with_launch(matrix_rows=32)).endswith("_prefill")


def test_matrix_prefill_propagates_nan_per_row_and_key():
    """A NaN in one query row makes that row NaN only; a NaN in a key's K makes every row
    that sees the key NaN (causal: the rows from its position on), as softmax does."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 1, 40, 16, generator=g) for _ in range(3))
    q[0, 0, 5, 3] = float("nan")
    out = attention(q, k, v, 0.25)
    assert out[0, 0, 5].isnan().all()
    assert not out[0, 0, :5].isnan().any() and not out[0, 0, 6:].isnan().any()
    q[0, 0, 5, 3] = 0.0
    k[0, 0, 30, 7] = float("nan")
    out = attention(q, k, v, 0.25)
    assert not out[0, 0, :30].isnan().any() and out[0, 0, 30:].isnan().all()


def test_matrix_prefill_window_softcap_and_padding():
    """The score's elementwise work (a sliding window with a soft cap, a key-padding mask)
    runs on the fragments' elements: 40 query positions against SDPA / the reference."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 2, 40, 40, generator=g)
    k, v = (torch.randn(1, 2, 90, 40, generator=g) for _ in range(2))
    args = (q, k, v, 40 ** -0.5, 20, 15.0)
    assert window_softcap.launches(*args)[0][0].endswith("_prefill")
    torch.testing.assert_close(window_softcap(*args),
                               torch_window_softcap(q, k, v, 40 ** -0.5, 20, 15.0),
                               **TOL[torch.float32])
    valid = torch.rand(1, 90, generator=g) > 0.3
    assert padded_attention.launches(q, k, v, valid)[0][0].endswith("_prefill")
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=valid[:, None, None, :])
    torch.testing.assert_close(padded_attention(q, k, v, valid), want, **TOL[torch.float32])


@mf.kernel
def window_softcap_gqa(q: "T[B, (G R), S, E]", k: "T[B, G, L, E]", v: "T[B, G, L, E]",
                       scale: float, window: int, cap: float):
    """A sliding window reading mf.index("L") twice in one expression, and the soft cap."""
    s = mf.sum(q * k, axis="E") * scale
    s = cap * mf.tanh(s / cap)
    pos = mf.index("S") + mf.size("L") - mf.size("S")
    s = mf.where((mf.index("L") <= pos) & (pos - mf.index("L") < window), s, -mf.inf)
    return mf.sum(mf.softmax(s, axis="L") * v, axis="L")


@pytest.mark.parametrize("launch,s,suffix", [
    ({}, 1, "decode"), ({}, 3, "decode"), ({"stage_kv": False}, 3, "decode"),
    ({"key_splits": 3}, 1, "decode"), ({"stage_kv": False}, 40, "decode"), ({}, 40, "prefill"),
    ({"key_splits": 3}, 40, "prefill")])
def test_mask_reading_an_index_twice(launch, s, suffix):
    """mf.index("L") read twice by a mask (issue #48: was a redeclared mf_index_L in every
    attention kernel): decode (a few query rows, GQA) and prefill, against the reference."""
    g = torch.Generator().manual_seed(7 * s)
    q = torch.randn(1, 4, s, 40, generator=g)
    k, v = (torch.randn(1, 2, 90, 40, generator=g) for _ in range(2))
    kernel = window_softcap_gqa.with_launch(**launch)
    args = (q, k, v, 40 ** -0.5, 20, 15.0)
    assert suffix in kernel.launches(*args)[0][0]
    torch.testing.assert_close(kernel(*args), kernel.reference(*args), **TOL[torch.float32])
