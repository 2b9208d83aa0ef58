"""Fused bias + scale: y = (x + bias) * scale, the bias broadcast over rows by axis name.

    python examples/bias_scale.py
"""
import torch

import metalforge as mf
from metalforge.runtime import current_backend


@mf.kernel
def bias_scale(x: "T[R, D]", bias: "T[D]", scale: float = 0.5):
    return (x + bias) * scale


if __name__ == "__main__":
    device = "mps" if torch.backends.mps.is_available() else "cpu"
    x = torch.randn(31, 1024, dtype=torch.float16, device=device)
    bias = torch.randn(1024, dtype=torch.float16, device=device)
    print(bias_scale.source(x, bias))
    y = bias_scale(x, bias, 0.125)          # scale is a runtime argument: no recompile
    torch.testing.assert_close(y, bias_scale.reference(x, bias, 0.125), rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(y, ((x.float() + bias.float()) * 0.125).half(), rtol=1e-3,
                               atol=1e-3)
    print(f"bias_scale: {tuple(y.shape)} {y.dtype} on {current_backend([x])} matches the "
          f"reference")
