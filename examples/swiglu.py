"""SwiGLU, the gated MLP activation: y = silu(gate) * up.

    python examples/swiglu.py
"""
import torch

import metalforge as mf
from metalforge.runtime import current_backend


@mf.kernel
def swiglu(gate: "T[*B, F]", up: "T[*B, F]"):
    return gate * mf.sigmoid(gate) * up


if __name__ == "__main__":
    device = "mps" if torch.backends.mps.is_available() else "cpu"
    gate = torch.randn(2, 7, 256, dtype=torch.bfloat16, device=device)
    up = torch.randn(2, 7, 256, dtype=torch.bfloat16, device=device)
    print(swiglu.source(gate, up))
    y = swiglu(gate, up)
    torch.testing.assert_close(y, swiglu.reference(gate, up), rtol=1e-2, atol=1e-2)
    want = (torch.nn.functional.silu(gate.float()) * up.float()).bfloat16()
    torch.testing.assert_close(y, want, rtol=1e-2, atol=1e-2)
    print(f"swiglu: {tuple(y.shape)} {y.dtype} on {current_backend([gate])} matches the "
          f"reference")
