"""Fused residual add + RMSNorm, two outputs from one kernel: h = x + r; y = rms_norm(h) * w.

    python examples/add_rms_norm.py

Returns both the new residual stream h and the normalised y; x and r are each read from global
memory once. Prints the generated Metal library, runs it and checks both outputs.
"""
import torch

import metalforge as mf
from metalforge.runtime import current_backend


@mf.kernel
def add_rms_norm(x: "T[*B, D]", r: "T[*B, D]", w: "T[D]", eps: float = 1e-6):
    h = x + r
    return h, h * mf.rsqrt(mf.mean(h * h, axis="D") + eps) * w


if __name__ == "__main__":
    device = "mps" if torch.backends.mps.is_available() else "cpu"
    x = torch.randn(2, 16, 2048, dtype=torch.float16, device=device)
    r = torch.randn(2, 16, 2048, dtype=torch.float16, device=device)
    w = torch.randn(2048, dtype=torch.float16, device=device)
    print(add_rms_norm.source(x, r, w))
    h, y = add_rms_norm(x, r, w)
    rh, ry = add_rms_norm.reference(x, r, w)
    torch.testing.assert_close(h, rh)
    torch.testing.assert_close(y, ry, rtol=2e-3, atol=2e-3)
    hf = x.float() + r.float()
    expect = torch.nn.functional.rms_norm(hf, (2048,), w.float(), eps=1e-6).half()
    torch.testing.assert_close(h, hf.half())
    torch.testing.assert_close(y, expect, rtol=4e-3, atol=4e-3)
    print(f"add_rms_norm: {tuple(y.shape)} {y.dtype} (two outputs) on {current_backend([x])} "
          f"matches the reference")
