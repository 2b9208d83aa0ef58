"""Two outputs from one kernel: a residual add and the activation of its result.

    python examples/two_outputs.py

`return h, act` gives two output tensors, both written by the same launch.
"""
import torch

import metalforge as mf
from metalforge.runtime import current_backend


@mf.kernel
def add_silu(x: "T[*B, D]", residual: "T[*B, D]"):
    h = x + residual
    return h, h * mf.sigmoid(h)


if __name__ == "__main__":
    device = "mps" if torch.backends.mps.is_available() else "cpu"
    x = torch.randn(3, 5, 96, dtype=torch.float16, device=device)
    r = torch.randn(3, 5, 96, dtype=torch.float16, device=device)
    print(add_silu.source(x, r))
    h, act = add_silu(x, r)
    ref_h, ref_act = add_silu.reference(x, r)
    torch.testing.assert_close(h, ref_h, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(act, ref_act, rtol=1e-3, atol=1e-3)
    h32 = x.float() + r.float()
    torch.testing.assert_close(h, h32.half(), rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(act, torch.nn.functional.silu(h32.half().float()).half(),
                               rtol=1e-3, atol=1e-3)
    print(f"add_silu: two outputs {tuple(h.shape)} {h.dtype} on {current_backend([x])} "
          f"match the reference")
