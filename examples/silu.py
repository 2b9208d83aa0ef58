"""SiLU, elementwise: y = x * sigmoid(x).

    python examples/silu.py

Prints the generated Metal kernel, runs it (on the GPU through Metal on a Mac, else on the CPU
through metalforge's simulator) and checks it against the reference.
"""
import torch

import metalforge as mf
from metalforge.runtime import current_backend


@mf.kernel
def silu(x: "T[*B, D]"):
    return x * mf.sigmoid(x)


if __name__ == "__main__":
    device = "mps" if torch.backends.mps.is_available() else "cpu"
    x = torch.randn(8, 1000, dtype=torch.float16, device=device)
    print(silu.source(x))
    y = silu(x)
    torch.testing.assert_close(y, silu.reference(x), rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(y, torch.nn.functional.silu(x.float()).half(), rtol=1e-3, atol=1e-3)
    print(f"silu: {tuple(y.shape)} {y.dtype} on {current_backend([x])} matches the reference")
