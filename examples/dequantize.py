"""Dequantize MLX-layout 4-bit weights: an elementwise kernel that unpacks words.

    python examples/dequantize.py

w[n, k] = code(n, k) * scales[n, k // GS] + biases[n, k // GS], where code(n, k) is bits
[(k % 8) * 4, (k % 8) * 4 + 4) of word wq[n, k // 8]. Prints the kernel, runs it (Metal on a
Mac, else the simulator) and checks it against metalforge.quant.dequantize (which matches
mx.dequantize).
"""
import torch

import metalforge as mf
from metalforge import quant
from metalforge.runtime import current_backend


@mf.kernel
def dequantize(wq: "u32[N, K/8]", scales: "T[N, K/GS]", biases: "T[N, K/GS]",
               GS: mf.Const[int] = 64) -> "T[N, K]":
    return mf.unpack(wq, bits=4) * scales + biases


if __name__ == "__main__":
    device = "mps" if torch.backends.mps.is_available() else "cpu"
    w = torch.randn(48, 1024, dtype=torch.bfloat16, device=device)
    wq, scales, biases = quant.quantize(w, group_size=64, bits=4)
    print(dequantize.source(wq, scales, biases))
    got = dequantize(wq, scales, biases)
    # the kernel computes code * scale + bias in fp32 and rounds once; MLX rounds the product
    # and the sum to bf16: at most one bf16 step (2**-7 relative) apart
    expect = quant.dequantize(wq, scales, biases, group_size=64, bits=4)
    torch.testing.assert_close(got, expect, rtol=2 ** -7, atol=2 ** -6)
    torch.testing.assert_close(got, dequantize.reference(wq, scales, biases))
    print(f"dequantize: {tuple(got.shape)} {got.dtype} on {current_backend([w])} matches "
          "metalforge.quant.dequantize")
