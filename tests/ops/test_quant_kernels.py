"""Packed-int kernels: mf.unpack, derived axes broadcast by k // GS, the dequantize kernel
(elementwise) and the quantized matvec schedule, against metalforge.quant / torch / MLX."""
from __future__ import annotations

import pytest
import torch

import metalforge as mf
from metalforge import quant
from metalforge.schedule.policy import MAX_QUANT_ROWS, POLICIES
from metalforge.testing import check


@mf.kernel
def dequantize4(wq: "u32[N, K/8]", scales: "T[N, K/GS]", biases: "T[N, K/GS]",
                GS: mf.Const[int] = 64) -> "T[N, K]":
    return mf.unpack(wq, bits=4) * scales + biases


@mf.kernel
def q4_matvec(wq: "u32[N, K/8]", scales: "T[N, K/GS]", biases: "T[N, K/GS]", x: "T[M, K]",
              GS: mf.Const[int] = 64) -> "T[M, N]":
    w = mf.unpack(wq, bits=4) * scales + biases
    return mf.sum(w * x, axis="K")


@mf.kernel
def q8_matvec(wq: "u32[N, K/4]", scales: "T[N, K/GS]", biases: "T[N, K/GS]", x: "T[M, K]",
              GS: mf.Const[int] = 32) -> "T[M, N]":
    return mf.sum((mf.unpack(wq, bits=8) * scales + biases) * x, axis="K")


@mf.kernel
def q2_matvec(wq: "u32[N, K/16]", scales: "T[N, K/GS]", biases: "T[N, K/GS]", x: "T[M, K]",
              GS: mf.Const[int] = 32) -> "T[M, N]":
    return mf.sum((mf.unpack(wq, bits=2) * scales + biases) * x, axis="K")


@mf.kernel
def q4_linear_bias(wq: "u32[N, K/8]", scales: "T[N, K/GS]", biases: "T[N, K/GS]",
                   x: "T[M, K]", bias: "T[N]", GS: mf.Const[int] = 8) -> "T[M, N]":
    y = mf.sum((mf.unpack(wq, bits=4) * scales + biases) * x, axis="K")
    return y + bias                    # an epilogue on the sum; GS 8: unaligned word rows


def _quantized(n: int, k: int, dtype=torch.float16, gs: int = 64, bits: int = 4, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g).to(dtype)
    return w, quant.quantize(w, group_size=gs, bits=bits)


_TOL = {torch.float32: (1e-5, 1e-4), torch.float16: (2e-3, 2e-2), torch.bfloat16: (2e-2, 1e-1)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n,k", [(1, 64), (7, 320), (33, 1088)])
def test_dequantize_kernel_matches_metalforge_quant(dtype, n, k):
    _, (wq, s, b) = _quantized(n, k, dtype)
    got = dequantize4(wq, s, b)
    want = quant.dequantize(wq, s, b, group_size=64, bits=4)
    # the kernel rounds once (fp32 code * scale + bias); MLX rounds the product and the sum
    rtol, atol = _TOL[dtype]
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol * float(s.abs().max()))
    torch.testing.assert_close(got, dequantize4.reference(wq, s, b), rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m,n,k", [(1, 1, 64), (1, 7, 4160), (3, 9, 1088), (2, 5, 128)])
def test_q4_matvec_matches_linear_on_dequantized_weights(dtype, m, n, k):
    _, (wq, s, b) = _quantized(n, k, dtype, seed=m + n + k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(1)).to(dtype)
    got = q4_matvec(wq, s, b, x)
    w_hat = quant.dequantize(wq, s, b, group_size=64, bits=4).float()
    want = torch.nn.functional.linear(x.float(), w_hat)
    rtol, atol = _TOL[dtype]
    torch.testing.assert_close(got.float(), want, rtol=rtol, atol=atol * k ** 0.5 * 4)
    torch.testing.assert_close(got, q4_matvec.reference(wq, s, b, x), rtol=rtol, atol=atol)


@pytest.mark.parametrize("kernel,bits,gs", [(q8_matvec, 8, 32), (q2_matvec, 2, 32)])
def test_other_widths(kernel, bits, gs):
    _, (wq, s, b) = _quantized(6, 4096 + 64, torch.float32, gs=gs, bits=bits)
    x = torch.randn(2, 4096 + 64)
    want = x @ quant.dequantize(wq, s, b, group_size=gs, bits=bits).T
    torch.testing.assert_close(kernel(wq, s, b, x), want, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("kernel,bits,gs", [(q2_matvec, 2, 64), (q4_matvec, 4, 64),
                                            (q8_matvec, 8, 32)])
def test_values_masked_in_place(kernel, bits, gs, dtype):
    # groups of whole chunks: the affine form, whose values are masked where they sit in their
    # half word against x pre-scaled by 2^-bit; every place of every width, both halves
    _, (wq, s, b) = _quantized(5, 2048, dtype, gs=gs, bits=bits)
    x = torch.randn(3, 2048).to(dtype)
    for launch in ({}, {"x_rows": 1}):                       # qmvx, qmv
        view = kernel.with_launch(**launch)
        assert "mf_place_weight(" in view.source(wq, s, b, x, GS=gs)
        got = view(wq, s, b, x, GS=gs).float()
        want = _reference(wq, s, b, x, gs, bits)
        tol = 1e-3 if dtype == torch.float32 else 2e-2 * 2048 ** 0.5
        torch.testing.assert_close(got, want, rtol=1e-2, atol=tol)


def test_epilogue_and_unaligned_word_rows():
    # K = 40, GS = 8: rows of 5 words, so no row starts on a 16-byte boundary: every chunk
    # takes the guarded element path; the bias is added after the sum
    n, k = 5, 40
    w = torch.randn(n, k)
    codes = torch.randint(0, 16, (n, k))
    wq = quant.pack(codes, bits=4)
    s, b = torch.rand(n, k // 8) + 0.5, torch.randn(n, k // 8)
    x, bias = torch.randn(3, k), torch.randn(n)
    w_hat = codes.float() * s.repeat_interleave(8, 1) + b.repeat_interleave(8, 1)
    torch.testing.assert_close(q4_linear_bias(wq, s, b, x, bias), x @ w_hat.T + bias,
                               rtol=1e-4, atol=1e-4)
    del w


def test_check_covers_the_quantized_kernels():
    for k in (dequantize4, q4_matvec):
        report = check(k, max_examples=3)
        assert all(i.launches for i in report.instantiations), report.coverage()


def test_unpack_matches_mlx_layout():
    mx = pytest.importorskip("mlx.core")
    import numpy as np
    w = np.random.default_rng(0).standard_normal((8, 256)).astype(np.float32)
    wq, s, b = mx.quantize(mx.array(w), group_size=64, bits=4)
    args = [torch.from_numpy(np.array(a)) for a in (wq, s, b)]
    x = np.random.default_rng(1).standard_normal((1, 256)).astype(np.float32)
    want = np.array(mx.quantized_matmul(mx.array(x), wq, s, b, transpose=True,
                                        group_size=64, bits=4))
    got = q4_matvec(*args, torch.from_numpy(x))
    torch.testing.assert_close(got, torch.from_numpy(want), rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(dequantize4(*args),
                               torch.from_numpy(np.array(mx.dequantize(wq, s, b, 64, 4))))


def test_bad_input_errors():
    _, (wq, s, b) = _quantized(4, 128, torch.float32)
    with pytest.raises(mf.ShapeError, match="K/64"):
        q4_matvec(wq, s[:, :1], b[:, :1], torch.randn(1, 128))       # wrong group count
    with pytest.raises(mf.ShapeError, match="divisible by 64"):
        dequantize4(wq[:, :12], s, b)                                 # K = 96: not whole groups

    @mf.kernel
    def three_bits(wq: "u32[N, K/8]") -> "i32[N, K]":
        return mf.unpack(wq, bits=3)
    with pytest.raises(mf.TraceError, match="1, 2, 4, 8, 16"):
        three_bits(wq)

    @mf.kernel
    def not_words(wq: "i32[N, K/8]") -> "i32[N, K]":
        return mf.unpack(wq, bits=4)
    with pytest.raises(mf.TraceError, match="u32"):
        not_words(wq.to(torch.int32))

    @mf.kernel
    def wrong_axis(wq: "u32[N, K/4]") -> "i32[N, K]":
        return mf.unpack(wq, bits=4)
    with pytest.raises(mf.TraceError, match="K/8"):
        wrong_axis(wq)


# -- launch levers of the qmv schedule: rows per simdgroup, K split across simdgroups ---------

LEVERS = [(rows, splits) for rows in (1, 2, 4, 8) for splits in (1, 2, 4, 8)]


def _levers(rows, splits, **more):
    # k_splits simdgroups share a threadgroup: 8 of them need 256 threads (the table has 128);
    # split_grid 0: every call splits (qmv itself), whatever the sizes
    return dict(rows_per_group=rows, k_splits=splits, threads_per_group=max(128, 32 * splits),
                split_grid=0, **more)


def _reference(wq, s, b, x, gs, bits=4):
    """The independent reference: metalforge.quant's dequantize, then a torch matmul."""
    w_hat = quant.dequantize(wq, s, b, group_size=gs, bits=bits).float()
    return x.float() @ w_hat.T


@pytest.mark.parametrize("rows,splits", LEVERS)
@pytest.mark.parametrize("m,n,k", [
    (1, 7, 4160),      # N not a multiple of the rows; K: 130 chunks, the lanes' last round partial
    (2, 9, 64),        # K under one chunk per lane: 2 chunks, most lanes (and slices) idle
    (3, 5, 1088),      # M > 1: the padded grid of a K split has simdgroups past the end
    (1, 16, 2048),     # whole blocks, 64 chunks: every lane (S <= 2) has work
])
def test_q4_matvec_levers_f32(rows, splits, m, n, k):
    _, (wq, s, b) = _quantized(n, k, torch.float32, seed=n + k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    got = q4_matvec.with_launch(**_levers(rows, splits))(wq, s, b, x)
    torch.testing.assert_close(got, _reference(wq, s, b, x, 64), rtol=1e-4, atol=1e-4 * k ** 0.5)


@pytest.mark.parametrize("rows,splits", [(1, 4), (4, 1), (4, 4), (8, 8), (3, 2)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_q4_matvec_levers_half(rows, splits, dtype):
    m, n, k = 1, 13, 4096 + 128
    _, (wq, s, b) = _quantized(n, k, dtype, seed=3)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(4)).to(dtype)
    got = q4_matvec.with_launch(**_levers(rows, splits))(wq, s, b, x)
    rtol, atol = _TOL[dtype]
    torch.testing.assert_close(got.float(), _reference(wq, s, b, x, 64), rtol=rtol,
                               atol=atol * k ** 0.5 * 4)
    # the same sums as the default launch, up to the order of fp32 additions and the rounding
    # of the output
    torch.testing.assert_close(got, q4_matvec(wq, s, b, x), rtol=rtol, atol=atol)


@pytest.mark.parametrize("rows,splits", LEVERS)
@pytest.mark.parametrize("k", [40, 8, 1064])
def test_q4_levers_k_not_a_multiple_of_the_chunk(rows, splits, k):
    # GS 8: rows of k / 8 words; K = 40 (5 words: not a whole 16-byte chunk, every chunk
    # guarded), K = 8 (one word: under one chunk per lane), K = 1064 (33.25 chunks: lane 0
    # of slice 0 wraps around once when S = 1, the last chunk partial); N = 11 rows
    n, m = 11, 2
    g = torch.Generator().manual_seed(k)
    codes = torch.randint(0, 16, (n, k), generator=g)
    wq = quant.pack(codes, bits=4)
    s, b = torch.rand(n, k // 8, generator=g) + 0.5, torch.randn(n, k // 8, generator=g)
    x, bias = torch.randn(m, k, generator=g), torch.randn(n, generator=g)
    w_hat = quant.unpack(wq, bits=4).float() * s.repeat_interleave(8, 1) + \
        b.repeat_interleave(8, 1)
    got = q4_linear_bias.with_launch(**_levers(rows, splits))(wq, s, b, x, bias)
    torch.testing.assert_close(got, x @ w_hat.T + bias, rtol=1e-4, atol=1e-4 * k ** 0.5)


@pytest.mark.parametrize("vw", [1, 2])
@pytest.mark.parametrize("rows,splits", [(1, 1), (3, 2), (8, 4)])
def test_q4_levers_narrow_word_loads(vw, rows, splits):
    # vector_width 1 or 2 words per lane per chunk (8 or 16 values): scalar word registers,
    # and with GS 8 the affine form at a chunk of one group (vw 1) or two (vw 2, per element)
    n, k = 9, 4096 + 64
    _, (wq, s, b) = _quantized(n, k, torch.float32, seed=vw)
    x = torch.randn(2, k)
    view = q4_matvec.with_launch(**_levers(rows, splits, vector_width=vw))
    torch.testing.assert_close(view(wq, s, b, x), _reference(wq, s, b, x, 64), rtol=1e-4,
                               atol=1e-3)
    g = torch.Generator().manual_seed(vw)
    codes = torch.randint(0, 16, (n, 40), generator=g)
    wq8 = quant.pack(codes, bits=4)
    s8, b8 = torch.rand(n, 5, generator=g) + 0.5, torch.randn(n, 5, generator=g)
    x8, bias = torch.randn(3, 40, generator=g), torch.zeros(n)
    w_hat = codes.float() * s8.repeat_interleave(8, 1) + b8.repeat_interleave(8, 1)
    view8 = q4_linear_bias.with_launch(**_levers(rows, splits, vector_width=vw))
    torch.testing.assert_close(view8(wq8, s8, b8, x8, bias), x8 @ w_hat.T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kernel,bits,gs", [(q8_matvec, 8, 32), (q2_matvec, 2, 32)])
def test_other_widths_with_levers(kernel, bits, gs):
    _, (wq, s, b) = _quantized(7, 2048 + 32, torch.float32, gs=gs, bits=bits)
    x = torch.randn(2, 2048 + 32)
    got = kernel.with_launch(rows_per_group=4, k_splits=4, split_grid=0)(wq, s, b, x)
    torch.testing.assert_close(got, _reference(wq, s, b, x, gs, bits), rtol=1e-4, atol=1e-3)


def test_levers_with_64_bit_indexing():
    _, (wq, s, b) = _quantized(10, 1088, torch.float32)
    x = torch.randn(2, 1088)
    got = q4_matvec.with_launch(rows_per_group=4, k_splits=2, split_grid=0,
                                index64=True)(wq, s, b, x)
    torch.testing.assert_close(got, _reference(wq, s, b, x, 64), rtol=1e-4, atol=1e-3)
    assert "_idx64" in q4_matvec.with_launch(index64=True, k_splits=2).source(wq, s, b, x)


@pytest.mark.parametrize("split_grid,expect", [
    (64, {(1, 1024, 4096): "qmv", (1, 1024, 14336): "qmv_split", (1, 4096, 11008): "qmv",
          (1, 45, 1024): "qmv", (1, 45, 1088): "qmv_split", (2, 256, 4096): "qmvx_split",
          (2, 260, 4096): "qmvx"}),
    (256, {(1, 1024, 4096): "qmv_split", (1, 4096, 4096): "qmv", (1, 4096, 11008): "qmv_split",
           (1, 11008, 4096): "qmv", (1, 8192, 8192): "qmv", (1, 8192, 28672): "qmv_split",
           (1, 28672, 8192): "qmv", (2, 1024, 4096): "qmvx_split", (2, 1024, 14336): "qmvx_split",
           (2, 4096, 11008): "qmvx", (4, 1024, 4096): "qmvx", (2, 1024, 1024): "qmvx"})])
def test_split_kernel_runs_where_the_grid_is_small_for_k(split_grid, expect):
    """The _split kernels where K is longer than one stretch of 32 chunks (1024 values): qmv's
    where it would have fewer than split_grid simdgroups (N / 4 rows) per stretch, qmvx's where
    it would have at most split_grid (N / 4 x M / 2); the Metal table's 64 and the cuda
    backend's 256 (at the sizes bench/README.md timed)."""
    from metalforge import runtime
    view = q4_matvec.with_launch(split_grid=split_grid)
    g = view.graph(T="f16")
    for (m, n, k), want in expect.items():
        sizes = {"M": m, "N": n, "K": k, "K/8": k // 8, "K/64": k // 64}
        s = runtime.schedule_of(g, sizes=sizes, launch=view.launch)
        assert s.host_name(sizes).rsplit("_GS_64_", 1)[1] == want, (m, n, k)
        threads, group = s.launch(sizes)
        simdgroups = -(-n // 4) * (-(-m // 2) if "qmvx" in want else m)
        assert threads == simdgroups * 32 * (4 if want.endswith("_split") else 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("n,k", [(45, 4160), (7, 1088), (64, 2048)])
def test_split_kernel_as_f_linear(dtype, n, k):
    """The default launch's qmv_split (few rows, K past one stretch): N not a multiple of the
    rows, K past the last whole stretch of a slice; as F.linear on the dequantized weight."""
    _, (wq, s, b) = _quantized(n, k, dtype, seed=n + k)
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(k)).to(dtype)
    assert _host(q4_matvec, wq, s, b, x).endswith("_qmv_split")
    tol = 1e-4 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(q4_matvec(wq, s, b, x).float(), _reference(wq, s, b, x, 64),
                               rtol=tol, atol=tol * k ** 0.5)


def test_check_covers_the_k_split():
    view = q4_matvec.with_launch(rows_per_group=4, k_splits=4)
    report = check(view, max_examples=3, dtypes={"T": "f32"})
    assert all(i.launches for i in report.instantiations), report.coverage()
    assert "K=4096" in report.coverage()          # the threshold of 32 chunks x 4 slices


def test_k_split_kernel_text():
    _, (wq, s, b) = _quantized(8, 256, torch.float32)
    x = torch.randn(1, 256)
    src = q4_matvec.with_launch(rows_per_group=4, k_splits=4, split_grid=0).source(wq, s, b, x)
    src = src[:src.index("kernel void mf_q4_matvec_qmm")]   # the matvec kernel
    assert "threadgroup float mf_tg1[128];" in src          # 32 simdgroups x 4 rows
    assert src.count("threadgroup_barrier") == 1
    assert "simdgroup_index_in_threadgroup" in src
    # every row's words are loaded before any row is unpacked
    assert src.index("mf_wq_w[mf_r] = ") < src.index("mf_wq_w[mf_r][mf_j / 8u]")
    plain = q4_matvec.source(wq, s, b, x)
    assert "threadgroup" not in plain.split("kernel void")[1].split("template [[")[0]
    # the table's split kernels: qmv_split, and qmvx_split with a partial per row of x too
    kernels = {k.split("(")[0]: k for k in plain.split("kernel void mf_q4_matvec_")[1:]}
    assert "threadgroup float mf_tg1[128];" in kernels["qmv_split"]
    assert "threadgroup float mf_tg1[256];" in kernels["qmvx_split"]   # x 2 rows of x
    assert [k for k in kernels if "threadgroup_barrier" in kernels[k]] == [
        "qmv_split", "qmvx_split", "qmm"]                       # (qmm stages its tiles)


def test_lever_errors():
    _, (wq, s, b) = _quantized(4, 128, torch.float32)
    x = torch.randn(1, 128)
    with pytest.raises(mf.LaunchError, match="k_splits must be a power of two"):
        q4_matvec.with_launch(k_splits=3)
    with pytest.raises(mf.LaunchError, match="k_splits must be a positive int"):
        q4_matvec.with_launch(k_splits=0)
    with pytest.raises(mf.LaunchError, match=r"multiple of 32 x k_splits=8 = 256"):
        q4_matvec.with_launch(k_splits=8, threads_per_group=128)(wq, s, b, x)
    with pytest.raises(mf.LaunchError, match="rows_per_group=32.*at most 16 rows"):
        q4_matvec.with_launch(rows_per_group=32)(wq, s, b, x)
    with pytest.raises(mf.LaunchError, match="'k_splits' do not apply to a elementwise"):
        dequantize4.with_launch(k_splits=2)(wq, s, b)


def test_autotune_grid_sweeps_the_levers():
    from metalforge.schedule.policy import resolve
    from metalforge.tuning import sweep
    cands = sweep.grid("quant")
    assert {c["k_splits"] for c in cands} == {1, 2, 4, 8}
    assert {c["rows_per_group"] for c in cands} == {1, 2, 4, 8}
    assert {c["qmm_matrix"] for c in cands} == {True, False}
    for c in cands:
        p = resolve("quant", c)
        assert p.threads_per_group % (32 * p.k_splits) == 0
    assert {"threads_per_group": 128, "k_splits": 8} not in [
        {k: c[k] for k in ("threads_per_group", "k_splits")} for c in cands]


# --------------------------------------------------------------------------- tiled (qmm)

@mf.kernel(launch={"qmm_min_rows": 8})
def q4_batched(wq: "u32[N, K/8]", scales: "T[N, K/GS]", biases: "T[N, K/GS]",
               x: "T[B, M, K]", bias: "T[N]", GS: mf.Const[int] = 8) -> "T[B, M, N]":
    w = mf.unpack(wq, bits=4) * scales + biases
    y = mf.sum(x * w, axis="K") + bias                 # x first, an epilogue, a batch axis
    return y * mf.sigmoid(y)


@mf.kernel
def q4_not_a_product(wq: "u32[N, K/8]", scales: "T[N, K/GS]", x: "T[M, K]",
                     GS: mf.Const[int] = 64) -> "T[M, N]":
    return mf.sum(mf.unpack(wq, bits=4) * scales + x, axis="K")


def _host(kernel, *args):
    return kernel.launches(*args)[0][0]


def test_tiled_kernel_from_qmm_min_rows():
    from metalforge import runtime
    g = q4_matvec.graph(T="f16")
    sizes = {"N": 4096, "K": 4096, "K/8": 512, "K/64": 64}
    s = runtime.schedule_of(g, sizes=dict(sizes, M=1))
    assert [s.host_name(dict(sizes, M=m)).rsplit("_", 1)[1] for m in (1, 2, 3, 63, 64, 512)] \
        == ["qmv", "qmvx", "qmvx", "qmvx", "qmm", "qmm"]     # defaults: x_rows 2, qmm from 64


@pytest.mark.parametrize("x_rows", [2, 4, 8])
@pytest.mark.parametrize("m,n,k", [(2, 32, 64), (3, 45, 1088), (9, 7, 128), (13, 70, 4160)])
def test_rows_of_x_blocked(x_rows, m, n, k):
    """From x_rows rows of x the matvec takes x_rows of them per simdgroup (each weight value
    unpacked once for all): a last block partly past M, N not a multiple of the weight rows,
    K past the last whole chunk; as F.linear on the dequantized weight."""
    _, (wq, s, b) = _quantized(n, k, torch.float32, seed=m + n)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    kern = q4_matvec.with_launch(x_rows=x_rows)
    # x_rows x rows_per_group sums at most MAX_QUANT_ROWS: with the table's 4 weight rows, 8
    # rows of x become 4
    blocked = min(x_rows, MAX_QUANT_ROWS // POLICIES["quant"].rows_per_group)
    # each split along K where K passes one stretch of 32 chunks (1024 values) and the grid is
    # small: qmv's are at these N; qmvx's where it has at most split_grid (64) simdgroups
    split = "_split" if k > 1024 else ""
    split_x = split if -(-n // 4) * -(-m // blocked) <= 64 else ""
    assert _host(kern, wq, s, b, x).endswith("_qmvx" + split_x if m >= blocked else
                                             "_qmv" + split)
    assert _host(kern, wq, s, b, x[:blocked - 1]).endswith("_qmv" + split)
    want = _reference(wq, s, b, x, 64)
    torch.testing.assert_close(kern(wq, s, b, x), want, rtol=1e-4, atol=1e-4 * k ** 0.5)


@pytest.mark.parametrize("b,m", [(3, 5), (2, 7)])
def test_rows_of_x_blocked_with_a_batch_axis_and_an_epilogue(b, m):
    """A batch axis before M and an epilogue (q4_batched, below the tiled kernel's 8 rows),
    and an element that is not the affine form (the generic path, per row of x)."""
    n, k = 20, 96                                       # GS = 8: groups inside a chunk
    codes = torch.randint(0, 16, (n, k), generator=torch.Generator().manual_seed(b))
    wq = quant.pack(codes, bits=4)
    s, bi = torch.rand(n, k // 8) + 0.5, torch.randn(n, k // 8)
    x, bias = torch.randn(b, m, k), torch.randn(n)
    w_hat = codes.float() * s.repeat_interleave(8, 1) + bi.repeat_interleave(8, 1)
    assert _host(q4_batched, wq, s, bi, x, bias).endswith("_qmvx")
    want = torch.nn.functional.silu(x @ w_hat.T + bias)
    torch.testing.assert_close(q4_batched(wq, s, bi, x, bias), want, rtol=1e-4, atol=1e-4)
    _, (wq, s, _) = _quantized(20, 128, torch.float32, seed=m)
    x = torch.randn(m, 128)
    assert _host(q4_not_a_product, wq, s, x).endswith("_qmvx")
    torch.testing.assert_close(q4_not_a_product(wq, s, x), q4_not_a_product.reference(wq, s, x),
                               rtol=1e-4, atol=1e-3)



@mf.kernel
def q4_heads(wq: "u32[H, E, K/8]", s: "T[H, E, K/GS]", b: "T[H, E, K/GS]",  # noqa: F821, F722
             x: "T[M, K]", GS: mf.Const[int] = 64) -> "T[M, H, E]":  # noqa: F821, F722
    return mf.sum((mf.unpack(wq, bits=4) * s + b) * x, axis="K")


def test_weights_per_head_with_several_rows_of_x():
    """Weights with a head axis ([H, E, K/8], a q/k/v projection viewed per head) times
    several rows of x: the innermost other output axis is the heads, not x's rows, so no
    rows of x are blocked (qmvx would read the heads' weights as x's rows: it did not
    compile); as a torch matmul on the dequantized weights."""
    _, (wq, s, b) = _quantized(3 * 16, 128, torch.float32, seed=5)
    x = torch.randn(3, 128, generator=torch.Generator().manual_seed(6))
    heads = tuple(t.view(3, 16, -1) for t in (wq, s, b))
    assert _host(q4_heads, *heads, x).endswith("_qmv")
    want = _reference(wq, s, b, x, 64).view(3, 3, 16)
    torch.testing.assert_close(q4_heads(*heads, x), want, rtol=1e-4, atol=1e-3)

Q8 = q4_matvec.with_launch(qmm_min_rows=8)
# the tiled kernel's two ways to multiply its tiles: simdgroup matrices (the table's) and
# per-thread register tiles (the cuda backend's)
PRODUCTS = pytest.mark.parametrize("matrix", [True, False], ids=["matrix", "registers"])


@PRODUCTS
@pytest.mark.parametrize("m,n,k", [(8, 32, 64), (33, 45, 1088), (70, 7, 128), (200, 70, 4160)])
def test_tiled_kernel(m, n, k, matrix):
    """M >= qmm_min_rows: the tiled kernel; tiles past M and N, K past the last step."""
    _, (wq, s, b) = _quantized(n, k, torch.float32, seed=m + n)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    kern = Q8.with_launch(qmm_matrix=matrix)
    assert _host(kern, wq, s, b, x).endswith("_qmm")
    split = "_split" if k > 1024 else ""                         # K past one stretch
    split_x = split if -(-n // 4) * 4 <= 64 else ""             # qmvx's grid: 7 rows of x
    assert _host(kern, wq, s, b, x[:7]).endswith("_qmvx" + split_x)
    assert _host(kern, wq, s, b, x[:1]).endswith("_qmv" + split)
    want = _reference(wq, s, b, x, 64)
    torch.testing.assert_close(kern(wq, s, b, x), want, rtol=1e-4, atol=1e-4 * k ** 0.5)
    one = kern.with_launch(qmm_min_rows=1)                      # the tiled kernel at M = 1
    torch.testing.assert_close(one(wq, s, b, x[:1]), want[:1], rtol=1e-4, atol=1e-4 * k ** 0.5)


@pytest.mark.parametrize("target", ["apple9", "apple10"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_tiled_kernel_half(dtype, target):
    """Half or bfloat x: the tiled kernel on the matrix block (schedule/quant/blocked.py), by
    the target simdgroup_matrix (apple9) or Metal 4 tensor ops (apple10): M = 70 (a tile of 64
    rows of x and 6), N = 40 (32 weight rows and 8), K = 320 (10 steps); as torch's matmul of x
    and the weight dequantized in fp32 and rounded to x's type (what the kernel multiplies),
    computed directly, in double."""
    w, (wq, s, b) = _quantized(40, 320, dtype, seed=5)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(70, 320, generator=g).to(dtype)
    with mf.target(target):
        assert _host(Q8, wq, s, b, x).endswith("_qmm")
        got = Q8(wq, s, b, x)
    codes = torch.stack([(wq.long() >> (4 * i)) & 15 for i in range(8)], -1).reshape(40, 320)
    w_hat = (codes.float() * s.float().repeat_interleave(64, 1)
             + b.float().repeat_interleave(64, 1)).to(dtype)
    tol = {torch.float16: 1e-2, torch.bfloat16: 6e-2}[dtype]
    torch.testing.assert_close(got.double(), x.double() @ w_hat.double().T, rtol=tol, atol=tol)


@PRODUCTS
def test_tiled_kernel_batch_axis_epilogue_and_steps_past_k(matrix):
    # K = 40, GS = 8: the last step of 32 values is 8 long (and the step after it, loaded
    # ahead, is past K); B = 2 batches of M = 9 rows
    n, k = 33, 40
    codes = torch.randint(0, 16, (n, k), generator=torch.Generator().manual_seed(0))
    wq = quant.pack(codes, bits=4)
    s, b = torch.rand(n, k // 8) + 0.5, torch.randn(n, k // 8)
    x, bias = torch.randn(2, 9, k), torch.randn(n)
    w_hat = codes.float() * s.repeat_interleave(8, 1) + b.repeat_interleave(8, 1)
    kern = q4_batched.with_launch(qmm_matrix=matrix)
    assert _host(kern, wq, s, b, x, bias).endswith("_qmm")
    want = torch.nn.functional.silu(x @ w_hat.T + bias)
    torch.testing.assert_close(kern(wq, s, b, x, bias), want, rtol=1e-4, atol=1e-4)


def test_tiled_kernel_only_for_a_product():
    """An argument that is not weights times x has the matvec kernels only (one row of x or
    blocks of them, at any M)."""
    _, (wq, s, _b) = _quantized(5, 128, torch.float32)
    x = torch.randn(70, 128)
    src = q4_not_a_product.source(wq, s, x)
    assert "_qmm" not in src and _host(q4_not_a_product, wq, s, x).endswith("_qmvx")
    torch.testing.assert_close(q4_not_a_product(wq, s, x), q4_not_a_product.reference(wq, s, x),
                               rtol=1e-4, atol=1e-3)


def test_tiled_kernel_text():
    _, (wq, s, b) = _quantized(8, 256, torch.float32)
    src = Q8.source(wq, s, b, torch.randn(8, 256))
    qmm = src[src.index("kernel void mf_q4_matvec_qmm"):]
    assert "threadgroup float mf_ws[2112];" in qmm and "threadgroup float4 mf_xs[512];" in qmm
    assert qmm.count("threadgroup_barrier") == 2
    # each thread stages a run of 8 values of a row (one word, its scale and bias read once),
    # loaded into registers a step ahead, before the step's products run
    assert "const uint mf_wq = uint(wq[mf_n * mf_size_K_div8 + mf_kq / 8u]);" in qmm
    assert "scales[mf_n * mf_size_K_div64 + mf_kq / 64u]" in qmm
    step = qmm[qmm.index("for (mf_index_t mf_k0"):]
    assert step.index("mf_wn[mf_j] = ") < step.index("mf_mma(")
    assert "const mf_index_t mf_k1 = min(mf_k0 + 64u, mf_size_K - 64u);" in step
    # weights staged k-major in rows of 33 floats (no bank conflicts): W^T's 8x8 blocks load as
    # stored; each simdgroup's two output blocks as simdgroup_matrix products, 8 values of k
    assert "mf_ws[(mf_q * 8u + mf_j) * 33u + mf_srow] = mf_wn[mf_j];" in qmm
    assert "mf_xs[mf_srow * 16u + mf_q * 2u + mf_j / 4u][mf_j % 4u] = mf_xn[mf_j];" in qmm
    assert "const float2 mf_a = mf_mat_load(mf_xsf, 64u, mf_kb * 8u, mf_bm * 8u);" in qmm
    assert ("mf_acc[mf_j] = mf_mma(mf_a, mf_mat_load(mf_ws, 33u, (mf_bn + mf_j) * 8u, "
            "mf_kb * 8u), mf_acc[mf_j]);") in qmm
    # register tiles: both tiles k-major in rows of 9 float4s (one more after each 8 rows), 4 x
    # 4 sums a thread over a quarter of each step's k, the quarters' sums added in the tiles'
    # threadgroup memory at the end
    regs = Q8.with_launch(qmm_matrix=False).source(wq, s, b, torch.randn(8, 256))
    regs = regs[regs.index("kernel void mf_q4_matvec_qmm"):]
    assert "mf_mma" not in regs and regs.count("threadgroup_barrier") == 3
    assert "threadgroup float4 mf_tiles[1168];" in regs
    assert ("mf_tiles[(mf_q * 8u + mf_j) * 9u + mf_q + mf_srow / 4u][mf_srow % 4u] = "
            "mf_wn[mf_j];") in regs
    assert "const float4 mf_w4 = mf_tiles[mf_kt * 9u + mf_kt / 8u + mf_tn];" in regs
    assert "mf_acc[mf_r][mf_c] = fma(mf_x4[mf_r], mf_w4[mf_c], mf_acc[mf_r][mf_c]);" in regs
    assert ("const float4 mf_sum = mf_tiles[mf_t] + mf_tiles[mf_t + 256u] + "
            "mf_tiles[mf_t + 512u] + mf_tiles[mf_t + 768u];") in regs


def test_the_cuda_backend_multiplies_tiles_in_registers():
    from metalforge.schedule.policy import backend_launch
    assert backend_launch("cuda", "quant")["qmm_matrix"] is False
    with pytest.raises(mf.LaunchError, match="qmm_matrix must be True or False, got 1"):
        q4_matvec.with_launch(qmm_matrix=1)


def test_check_runs_the_tiled_kernel_past_m_and_n_over_two_steps():
    """The tiled kernel's selected example: a partial tile of rows of x and of weight rows,
    two steps along K (the tiles rewritten after a barrier, a step loaded ahead) and two
    groups a row (a survivor of bench/mutation.py: wq[mf_n / K8 ...] at one group, N = 1)."""
    from metalforge import runtime
    s = runtime.schedule_of(q4_matvec.graph(T="f32"), sizes={"M": 1, "N": 8, "K": 128,
                                                              "K/8": 16, "K/64": 2})
    assert s.selecting(s.variants["qmm"].host_name) == [{"K": 128, "N": 33, "M": 65}]
    report = check(q4_matvec.with_launch(qmm_matrix=False), max_examples=2,
                   dtypes={"T": "f32"})
    assert "N=33,K/8=16,K/64=2,M=65,K=128" in report.coverage()


@PRODUCTS
def test_check_covers_the_tiled_kernel(matrix):
    report = check(q4_batched.with_launch(qmm_matrix=matrix), max_examples=3, dtypes={"T": "f32"})
    assert all(i.launches for i in report.instantiations), report.coverage()
    assert any(i.host_name.endswith("_idx64_qmm") for i in report.instantiations)


def test_index_width_follows_the_largest_tensor():
    """M x N x K may pass 2^31 (prefill: 128 x 4096 x 4096) while every tensor stays under it:
    32-bit indexing still serves; a tensor of 2^31 elements needs the 64-bit kernels."""
    from metalforge import runtime
    g = q4_matvec.graph(T="f32")
    sizes = {"M": 128, "N": 4096, "K": 4096, "K/8": 512, "K/64": 64}
    s = runtime.schedule_of(g, sizes=sizes)
    assert not s.index64 and s.host_name(sizes).endswith("_qmm")
    big = dict(sizes, M=2 ** 20, K=2 ** 11, **{"K/8": 2 ** 8, "K/64": 2 ** 5})   # x: 2^31
    with pytest.raises(mf.LaunchError, match="64-bit indexing"):
        s.host_name(big)


# -- several sums sharing x: gate and up projections in one kernel --------------------------

@mf.kernel
def gate_up(wg: "u32[F, K/8]", sg: "T[F, K/GS]", bg: "T[F, K/GS]",
            wu: "u32[F, K/8]", su: "T[F, K/GS]", bu: "T[F, K/GS]", x: "T[M, K]",
            GS: mf.Const[int] = 64) -> "T[M, F]":
    g = mf.sum((mf.unpack(wg, bits=4) * sg + bg) * x, axis="K")
    u = mf.sum((mf.unpack(wu, bits=4) * su + bu) * x, axis="K")
    return (g * mf.sigmoid(g) * u).to("T")


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("m,n,k", [(1, 40, 512), (3, 33, 256), (1, 5, 4160)])
def test_gate_up_in_one_kernel(dtype, m, n, k):
    """Two sums over one x (the SwiGLU gate and up projections): x read and each weight
    streamed once, silu(gate) * up in the epilogue; against F.silu and matmuls in float64."""
    torch.manual_seed(m * n)
    qg = quant.quantize(torch.randn(n, k).to(dtype), group_size=64, bits=4)
    qu = quant.quantize(torch.randn(n, k).to(dtype), group_size=64, bits=4)
    x = torch.randn(m, k).to(dtype)
    g, u = (x.double() @ quant.dequantize(*q, group_size=64, bits=4).double().T
            for q in (qg, qu))
    want = torch.nn.functional.silu(g) * u
    y = gate_up(*qg, *qu, x)
    tol = 1e-2 if dtype == torch.float16 else 1e-4      # f32 sums of 4160 products
    torch.testing.assert_close(y.double(), want, rtol=tol, atol=tol * want.abs().max().item())
    src = gate_up.source(*qg, *qu, x)
    assert "mf_acc1" in src and "mf_row_scale1" in src      # a second set of accumulators


def test_several_sums_cover_every_matvec_kernel():
    """check() runs every matvec kernel of a two-sum graph (the split ones and qmvx
    included); sums without the affine form take the element path."""
    report = check(gate_up, dtypes={"T": ["f16"]}, max_examples=12)
    names = {i.host_name.rsplit("_", 1)[-1] for i in report.instantiations}
    assert {"qmv", "split", "qmvx"} <= names

    @mf.kernel
    def two_plain(wg: "u32[F, K/8]", sg: "T[F, K/GS]", wu: "u32[F, K/8]", x: "T[M, K]",
                  GS: mf.Const[int] = 32) -> "T[M, F]":
        g = mf.sum(mf.unpack(wg, bits=4) * sg * x, axis="K")
        u = mf.sum((mf.unpack(wu, bits=4) - 8) * x, axis="K")
        return g - 2 * u
    check(two_plain, dtypes={"T": ["f32"]}, max_examples=8)


def test_several_sums_refused_where_one_unpacks_nothing_over_the_rows():
    """A sum of x alone (an RMSNorm's) may sit beside the projection (test_quant_epilogue.py);
    a sum over the weight rows that unpacks nothing may not."""
    @mf.kernel
    def bias_sum(wq: "u32[N, K/8]", s: "T[N, K/GS]", b: "T[N, K/GS]", x: "T[M, K]",
                 GS: mf.Const[int] = 64) -> "T[M, N]":
        y = mf.sum((mf.unpack(wq, bits=4) * s + b) * x, axis="K")
        return y * mf.sum(b * x, axis="K")
    _, (wq, s, b) = _quantized(4, 128, torch.float32)
    with pytest.raises(mf.UnsupportedConstruct, match="sums no unpacked words"):
        bias_sum(wq, s, b, torch.randn(1, 128))
