"""LayerNorm, two reductions in one kernel: the mean, then the variance of (x - mean).

    python examples/layer_norm.py

Prints the generated Metal library, runs it (Metal on a Mac, else the simulator) and checks it
against the reference and torch.nn.functional.layer_norm.
"""
import torch

import metalforge as mf
from metalforge.runtime import current_backend


@mf.kernel
def layer_norm(x: "T[*B, D]", w: "T[D]", b: "T[D]", eps: float = 1e-5):
    mu = mf.mean(x, axis="D")
    var = mf.mean((x - mu) * (x - mu), axis="D")
    return (x - mu) * mf.rsqrt(var + eps) * w + b


if __name__ == "__main__":
    device = "mps" if torch.backends.mps.is_available() else "cpu"
    x = torch.randn(16, 768, dtype=torch.bfloat16, device=device)
    w = torch.randn(768, dtype=torch.bfloat16, device=device)
    b = torch.randn(768, dtype=torch.bfloat16, device=device)
    print(layer_norm.source(x, w, b))
    y = layer_norm(x, w, b)
    torch.testing.assert_close(y, layer_norm.reference(x, w, b), rtol=2e-2, atol=2e-2)
    expect = torch.nn.functional.layer_norm(x.float(), (768,), w.float(), b.float()).bfloat16()
    torch.testing.assert_close(y, expect, rtol=2e-2, atol=2e-2)
    print(f"layer_norm: {tuple(y.shape)} {y.dtype} on {current_backend([x])} matches the "
          f"reference")
