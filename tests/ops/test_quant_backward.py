"""The quantized matvec / matmul's gradient with respect to x: dx = dy @ W with W dequantized on
the fly from the packed int4 words (MLX layout), a column reduction over the weight rows that
reads the words once (`schedule.quant.transposed`), against torch on a weight unpacked here
directly; the scales and biases have no gradient (a clear error)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import metalforge as mf
from metalforge import autodiff, quant, runtime
from metalforge.shapes import bind_shapes
from metalforge.testing import check

try:
    import mlx.core as mx
except ImportError:                     # mlx[cpu] not installed: the direct unpack alone
    mx = None


@mf.kernel
def q4_matmul(wq: "u32[N, K/8]", scales: "T[N, K/GS]", biases: "T[N, K/GS]", x: "T[*B, M, K]",
              GS: mf.Const[int] = 64) -> "T[*B, M, N]":
    w = mf.unpack(wq, bits=4) * scales + biases
    return mf.sum(w * x, axis="K")


def dequantized(wq, scales, biases, gs):
    """The weight from the words, directly: nibble j of word w is value 8 w + j."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int64)
    codes = (wq.to(torch.int64)[..., None] >> shifts) & 15          # [N, K/8, 8]
    codes = codes.reshape(wq.shape[0], -1).double()
    per = lambda t: t.double().repeat_interleave(gs, dim=-1)        # noqa: E731
    return codes * per(scales) + per(biases)


# N 12: one thread per column of dx; N 300: the wide kernel (a thread per word, slices of N,
# then chunks), x batched [2, 3, K] (f32 only: one library of backward kernels for these
# tests and test_check_grad)
@pytest.mark.parametrize("batch, m, n, k, dtype", [((), 1, 12, 256, torch.float32),
                                                   ((2,), 3, 300, 128, torch.float32)])
def test_dx_matches_torch(batch, m, n, k, dtype):
    g = torch.Generator().manual_seed(n)
    wq, scales, biases = quant.quantize(torch.randn(n, k, generator=g).to(dtype),
                                        group_size=64, bits=4)
    x = torch.randn(*batch, m, k, generator=g).to(dtype)
    dy = torch.randn(*batch, m, n, generator=g).to(dtype)
    graph = q4_matmul.graph(wq, scales, biases, x)
    bw = autodiff.backward_of(graph, ("x",))
    # the backward kernel alone (test_check_grad runs the call path, forward included)
    values = {"wq": wq, "scales": scales, "biases": biases, "x": x}
    dx = autodiff.run_backward(bw, values, (dy,), runtime.run)["x"]
    w = dequantized(wq, scales, biases, 64)
    if mx is not None:                  # the direct unpack agrees with MLX's own
        got = mx.dequantize(mx.array(wq.numpy()), mx.array(scales.numpy()),
                            mx.array(biases.numpy()), group_size=64, bits=4)
        torch.testing.assert_close(torch.from_numpy(np.array(got)).double(), w, rtol=1e-6,
                                   atol=1e-6)              # MLX's f32 rounding
    want = dy.double() @ w
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-3, atol=2e-2)
    torch.testing.assert_close(dx.double(), want, **tol)
    (kernel,) = bw.kernels
    sizes = bind_shapes(graph, {"wq": wq, "scales": scales, "biases": biases, "x": x}).sizes
    s = runtime.schedule_of(kernel, sizes=sizes)
    assert s.family == "column"
    host = runtime.launches(kernel, {**values, "dy": dy})[0][0]
    if n > 16:           # a thread per word: the word, scale and bias loaded once a row
        assert host.endswith("_wide")
        assert "wq: one element for the thread's 8 columns" in runtime.source(kernel, sizes=sizes)
    per = dtype.itemsize
    # the words, scales and biases once, dy once; dx written
    rows = m * (batch[0] if batch else 1)
    assert s.traffic(sizes).read == n * k // 2 + 2 * n * (k // 64) * per + rows * n * per
    assert s.traffic(sizes).written == rows * k * per


def test_scales_and_biases_have_no_gradient():
    wq, scales, biases = quant.quantize(torch.randn(8, 64), group_size=64, bits=4)
    x = torch.randn(1, 64, requires_grad=True)
    with pytest.raises(mf.MetalforgeError, match="argument 'scales' is read per group along "
                       "'K/64'.*quantized weight's scales or biases.*detach it"):
        q4_matmul(wq, scales.requires_grad_(), biases, x)


def test_check_grad():
    # x's gradient against torch.autograd on the reference; scales and biases not asked for
    report = check(q4_matmul, dtypes={"T": ["f32"]}, max_examples=2, grad=True)
    assert report.examples >= 2
