"""GELU, tanh form: y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).

    python examples/gelu.py
"""
import math

import torch

import metalforge as mf
from metalforge.runtime import current_backend


@mf.kernel
def gelu(x: "T[*B, D]"):
    inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)
    return 0.5 * x * (1.0 + mf.tanh(inner))


if __name__ == "__main__":
    device = "mps" if torch.backends.mps.is_available() else "cpu"
    x = torch.randn(4, 33, 65, dtype=torch.float32, device=device) * 3
    print(gelu.source(x))
    y = gelu(x)
    torch.testing.assert_close(y, gelu.reference(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y, torch.nn.functional.gelu(x, approximate="tanh"),
                               rtol=1e-5, atol=1e-5)
    print(f"gelu: {tuple(y.shape)} {y.dtype} on {current_backend([x])} matches the reference")
