"""RMSNorm, a row reduction: y = x * rsqrt(mean(x^2) + eps) * w.

    python examples/rms_norm.py

Prints the generated Metal library (three kernels: a few lanes of a simdgroup per row for short
rows, one threadgroup per row with the row held in registers, and a looped one for long rows;
the host picks one per call from the row length), runs it (Metal on a Mac, else the simulator)
and checks it against the reference and torch.
"""
import torch

import metalforge as mf
from metalforge.runtime import current_backend


@mf.kernel
def rms_norm(x: "T[*B, D]", w: "T[D]", eps: float = 1e-6):
    return x * mf.rsqrt(mf.mean(x * x, axis="D") + eps) * w


if __name__ == "__main__":
    device = "mps" if torch.backends.mps.is_available() else "cpu"
    x = torch.randn(4, 8, 1000, dtype=torch.float16, device=device)
    w = torch.randn(1000, dtype=torch.float16, device=device)
    print(rms_norm.source(x, w))
    y = rms_norm(x, w)
    torch.testing.assert_close(y, rms_norm.reference(x, w), rtol=2e-3, atol=2e-3)
    expect = torch.nn.functional.rms_norm(x.float(), (1000,), w.float(), eps=1e-6).half()
    torch.testing.assert_close(y, expect, rtol=2e-3, atol=2e-3)
    print(f"rms_norm: {tuple(y.shape)} {y.dtype} on {current_backend([x])} matches the reference")
