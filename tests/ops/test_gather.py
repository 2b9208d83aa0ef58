"""Gathers (mf.take): RoPE variants, embeddings and paged-KV reads against independent torch
implementations; index errors; what a gather may be."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import metalforge as mf
from metalforge.testing import check

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from embedding import CHECK as EMBED_CHECK  # noqa: E402
from embedding import embed, embed_scaled
from paged_kv_gather import paged_gather  # noqa: E402
from rope import (  # noqa: E402
    angles,
    qk_norm_rope,
    rope,
    rope_cached,
    rope_interleaved,
    rope_partial,
    torch_rope,
    torch_rope_interleaved,
    torch_rope_partial,
)

# the kernels compute angles pos * base^(-2j/E) in fp32 (as torch RoPE code does): at positions
# up to 8192 the angle itself is off by up to 8192 * 2^-24 rad, the reference computes in f64
TOL = {torch.float32: dict(rtol=1e-5, atol=2e-3), torch.float16: dict(rtol=2e-3, atol=3e-3),
       torch.bfloat16: dict(rtol=2e-2, atol=3e-2)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 1, 1, 2), (2, 3, 33, 64), (1, 2, 5, 128)])
def test_rope_variants_match_torch(dtype, shape):
    g = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(*shape, generator=g).to(dtype)
    pos = torch.randint(0, 8192, (shape[0], shape[2]), generator=g, dtype=torch.int32)
    torch.testing.assert_close(rope(x, pos), torch_rope(x, pos), **TOL[dtype])
    torch.testing.assert_close(rope_interleaved(x, pos), torch_rope_interleaved(x, pos),
                               **TOL[dtype])
    if shape[-1] >= 4:
        r = shape[-1] // 2
        torch.testing.assert_close(rope_partial(x, pos, rot_dims=r), torch_rope_partial(x, pos, r),
                                   **TOL[dtype])
    th = angles(torch.arange(shape[2]), shape[-1])
    seq = torch.arange(shape[2], dtype=torch.int32).expand(shape[0], -1).contiguous()
    torch.testing.assert_close(rope_cached(x, th.cos().to(dtype), th.sin().to(dtype)),
                               torch_rope(x, seq), **TOL[dtype])


@pytest.mark.parametrize("e", [2, 64, 128, 256, 8194])     # simd, group and looped rows
def test_fused_qk_norm_rope_matches_torch(e):
    g = torch.Generator().manual_seed(e)
    x, w = torch.randn(2, 2, 3, e, generator=g), torch.randn(e, generator=g)
    pos = torch.randint(0, 64, (2, 3), generator=g, dtype=torch.int32)
    want = torch_rope(torch.nn.functional.rms_norm(x, (e,), w, eps=1e-6), pos)
    torch.testing.assert_close(qk_norm_rope(x, w, pos), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("v,d,n", [(1, 1, 1), (1000, 33, 17), (7, 256, 300)])
def test_embedding_matches_f_embedding(v, d, n):
    table = torch.randn(v, d, dtype=torch.float16)
    ids = torch.randint(0, v, (n,), dtype=torch.int32)
    torch.testing.assert_close(embed(table, ids), torch.nn.functional.embedding(ids, table))
    batch = ids[: n - n % 1].reshape(1, n)
    want = (torch.nn.functional.embedding(batch, table).float() * 0.5).half()
    torch.testing.assert_close(embed_scaled(table, batch, 0.5), want)


def test_paged_gather_matches_indexing():
    cache = torch.randn(32, 4, 2, 8)
    table = torch.randperm(32)[:12].reshape(3, 4).to(torch.int32)
    torch.testing.assert_close(paged_gather(cache, table), cache[table.long()])


@pytest.mark.parametrize("bad", [-1, 1000, 2 ** 31 - 1])
def test_out_of_range_index_raises_and_reads_nothing(bad):
    table = torch.randn(1000, 8)
    ids = torch.tensor([3, bad, 5], dtype=torch.int32)
    for _ in range(2):                              # the full path, then the warm one
        with pytest.raises(mf.GatherIndexError,
                           match=rf"'table' along 'V' \(size 1000.*index {bad} "):
            embed(table, ids)
        torch.testing.assert_close(embed(table, ids.clamp(0, 999)),
                                   table[ids.clamp(0, 999).long()])
    with pytest.raises(mf.GatherIndexError, match="out of range"):   # the same class
        embed.reference(table, ids)


def test_expression_index_out_of_range_raises():
    @mf.kernel
    def shifted(x: "T[N]"):
        return mf.take(x, axis="N", index=mf.index("N") + 1)     # the last one reads past N
    with pytest.raises(IndexError, match="index 5 is out of range"):
        shifted(torch.randn(5))


def test_check_draws_valid_indices_and_covers_gathers():
    for k, dims in ((embed, None), (paged_gather, None), (rope, {"E": [2, 8, 64]})):
        report = check(k, max_examples=3, dims=dims, dtypes={"T": ["f32"]})
        assert all(i.launches for i in report.instantiations), report.coverage()


def test_check_sets_indices_one_past_the_axis_and_needs_the_error():
    # the generated range check made one too lenient (`< V` -> `<= V`): every in-range example
    # still passes, so only check's out-of-range examples (an index of V, and -1) can show it
    from metalforge.testing.mutate import applied, f32_source, mutants
    src, _ = f32_source(embed)
    lenient = [m for m in mutants(src) if "mf_take1 <= long(mf_size_V)" in m.after]
    assert lenient
    for m in lenient:
        with applied(m), pytest.raises(AssertionError, match=r"set to \d+ \(outside 'V', size"):
            check(embed, dtypes={"T": ["f32"]}, **EMBED_CHECK["embed"])
    report = check(embed, dtypes={"T": ["f32"]}, **EMBED_CHECK["embed"])   # unchanged: passes
    assert report.examples > 0


def test_traffic_counts_gathered_rows():
    from metalforge import runtime
    from metalforge.shapes import bind_shapes
    table, ids = torch.randn(1000, 64), torch.zeros(10, dtype=torch.int32)
    g = embed.graph(table, ids)
    s = runtime.schedule_of(g, {"table": table, "ids": ids})
    sizes = bind_shapes(g, {"table": table, "ids": ids}).sizes
    # 10 rows of 64 floats read, 10 ids, 10 rows written: not the whole table
    assert s.traffic(sizes).read == 10 * 64 * 4 + 10 * 4
    assert s.traffic(sizes).written == 10 * 64 * 4


def test_gather_errors():
    @mf.kernel
    def from_value(x: "T[N]"):
        return mf.take(x * 2, axis="N", index=0)
    with pytest.raises(mf.UnsupportedConstruct, match="gathers a computed value, not a tensor "
                       "argument: only a quantized matvec's epilogue"):
        from_value(torch.randn(3))

    @mf.kernel
    def float_index(x: "T[N]", f: "T[N]"):
        return mf.take(x, axis="N", index=f)
    with pytest.raises(mf.TraceError, match="integer"):
        float_index(torch.randn(3), torch.randn(3))

    @mf.kernel
    def in_column_sum(x: "T[R, D]", ids: "i32[R]"):
        return mf.sum(mf.take(x, axis="D", index=ids), axis="R")
    with pytest.raises(mf.UnsupportedConstruct, match="not in column"):
        in_column_sum(torch.randn(3, 4), torch.zeros(3, dtype=torch.int32))

    table = torch.randn(5, 3, requires_grad=True)              # the gradient: a scatter-add
    ids = torch.tensor([4, 0, 4], dtype=torch.int32)
    embed(table, ids).sum().backward()
    torch.testing.assert_close(table.grad, torch.zeros(5, 3).index_add_(
        0, ids.long(), torch.ones(3, 3)))
