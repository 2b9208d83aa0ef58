"""Packed-int kernels: mf.unpack, derived axes broadcast by k // GS, the dequantize kernel
(elementwise) and the quantized matvec schedule, against metalforge.quant / torch / MLX."""
from __future__ import annotations

import pytest
import torch

import metalforge as mf
from metalforge import quant
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
