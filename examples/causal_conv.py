"""Depthwise causal 1-D convolution of a fixed width (Mamba's `causal_conv1d`), with literal dims.

    python examples/causal_conv.py

The filter is annotated with a literal size, `w: "T[C, 4]"`: a call checks that its last dim is
4, and the generated kernel indexes it with the constant 4. `w[:, j]` reads tap j (a Python int,
so `for j in range(4)` unrolls while tracing, one term per tap); the input shifted by 3 - j is a
gather along L whose index is clamped into range (`mf.maximum(src, 0)`) and masked where it
would read before the sequence start (`mf.where(src >= 0, ...)`): the causal zero padding.

    y[b, c, l] = bias[c] + sum_j w[c, j] * x[b, c, l - (W - 1) + j]     (x = 0 before l = 0)

`causal_conv_silu` takes the width as an `mf.Const[int]` (`w: "T[C, W]"`: a literal dim whose
size is the Const, one kernel per width) and fuses the bias and SiLU, as Mamba's block does.
Both are checked against torch.nn.functional.conv1d with groups=C and left padding. Runs on
Metal on a Mac, else on the simulator.
"""
import torch
import torch.nn.functional as F

import metalforge as mf
from metalforge.runtime import current_backend


@mf.kernel
def causal_conv(x: "T[*B, C, L]", w: "T[C, 4]"):
    y = 0.0
    for j in range(4):                      # unrolled while tracing: 4 taps
        src = mf.index("L") - (3 - j)       # the position tap j reads
        xs = mf.take(x, "L", mf.maximum(src, 0))
        y = y + w[:, j] * mf.where(src >= 0, xs, 0.0)
    return y.to("T")


@mf.kernel
def causal_conv_silu(x: "T[*B, C, L]", w: "T[C, W]", bias: "T[C]", W: mf.Const[int] = 4):
    y = bias.to(mf.f32)
    for j in range(W):
        src = mf.index("L") - (W - 1 - j)
        y = y + w[:, j] * mf.where(src >= 0, mf.take(x, "L", mf.maximum(src, 0)), 0.0)
    return (y * mf.sigmoid(y)).to("T")


def torch_causal_conv(x, w, bias=None):
    """The same convolution with torch: depthwise conv1d over L, padded on the left."""
    width = w.shape[-1]
    xd = F.pad(x.double().flatten(0, -3), (width - 1, 0))
    y = F.conv1d(xd, w.double()[:, None, :], None if bias is None else bias.double(),
                 groups=x.shape[-2])
    return y.reshape(x.shape)


if __name__ == "__main__":
    device = "mps" if torch.backends.mps.is_available() else "cpu"
    torch.manual_seed(0)
    x = torch.randn(2, 8, 37, device=device)
    w = torch.randn(8, 4, device=device)
    print(causal_conv.source(x, w))
    torch.testing.assert_close(causal_conv(x, w), torch_causal_conv(x, w).float())
    xh = x.half()
    w3, b = torch.randn(8, 3, device=device).half(), torch.randn(8, device=device).half()
    ref = F.silu(torch_causal_conv(xh, w3, b)).half()
    torch.testing.assert_close(causal_conv_silu(xh, w3, b, W=3), ref, rtol=2e-3, atol=2e-3)
    print(f"causal_conv: {tuple(x.shape)} with a width-4 filter, and the fused width-3 SiLU "
          f"variant in f16, on {current_backend([x])} match torch's conv1d(groups=C)")
