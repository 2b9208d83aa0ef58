"""A 4-bit quantized linear layer (decode: a matrix-vector product), in MLX's affine layout.

    python examples/q4_matvec.py

Quantizes an nn.Linear weight with metalforge.quant (bit for bit what mx.quantize gives), prints
the generated kernel (one simdgroup per block of weight rows; 16-byte loads of packed words,
unpacked in registers; x shared across the rows), runs it (Metal on a Mac, else the simulator)
and checks it against F.linear on the dequantized weight.
"""
import torch

import metalforge as mf
from metalforge import quant
from metalforge.runtime import current_backend


@mf.kernel            # 8 nibbles per u32, lowest bits first; one scale and bias per group of GS
def q4_matvec(wq: "u32[N, K/8]", scales: "T[N, K/GS]", biases: "T[N, K/GS]", x: "T[M, K]",
              GS: mf.Const[int] = 64) -> "T[M, N]":
    w = mf.unpack(wq, bits=4) * scales + biases      # [N, K]; K/GS broadcasts over K as k // GS
    return mf.sum(w * x, axis="K")                   # [M, N]


if __name__ == "__main__":
    device = "mps" if torch.backends.mps.is_available() else "cpu"
    torch.manual_seed(0)
    linear = torch.nn.Linear(512, 96, bias=False).half().to(device)
    wq, scales, biases = quant.quantize(linear.weight.detach(), group_size=64, bits=4)
    x = torch.randn(1, 512, dtype=torch.float16, device=device)
    print(q4_matvec.source(wq, scales, biases, x))
    y = q4_matvec(wq, scales, biases, x)
    w_hat = quant.dequantize(wq, scales, biases, group_size=64, bits=4)
    expect = torch.nn.functional.linear(x.float(), w_hat.float()).half()
    torch.testing.assert_close(y, expect, rtol=2e-3, atol=2e-2)
    torch.testing.assert_close(y, q4_matvec.reference(wq, scales, biases, x), rtol=2e-3,
                               atol=2e-2)
    err = (y.float() - linear(x).float()).abs().max().item()
    print(f"q4_matvec: {tuple(y.shape)} {y.dtype} on {current_backend([x])} matches F.linear on "
          f"the dequantized weight (4-bit quantization error vs the f16 layer: {err:.3g})")
