"""Attention over padded batches: a key-padding mask from a tensor.

    python examples/padded_attention.py

valid[b, l] says which keys of sequence b exist. A query whose keys are all masked gets NaN,
as softmax of all -inf gives (torch's math attention does the same). Checked against
scaled_dot_product_attention with the same boolean mask.
"""
import torch
import torch.nn.functional as F

import metalforge as mf
from metalforge.runtime import current_backend


@mf.kernel
def padded_attention(q: "T[B, H, S, E]", k: "T[B, H, L, E]", v: "T[B, H, L, E]",
                     valid: "bool[B, L]"):
    s = mf.sum(q * k, axis="E") * mf.rsqrt(mf.size("E") * 1.0)
    s = mf.where(valid, s, -mf.inf)
    return mf.sum(mf.softmax(s, axis="L") * v, axis="L")


if __name__ == "__main__":
    device = "mps" if torch.backends.mps.is_available() else "cpu"
    q, k, v = (torch.randn(3, 2, n, 16, device=device) for n in (4, 9, 9))
    lengths = torch.tensor([9, 3, 6], device=device)
    valid = torch.arange(9, device=device)[None, :] < lengths[:, None]
    print(padded_attention.source(q, k, v, valid))
    out = padded_attention(q, k, v, valid)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=valid[:, None, None, :])
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
    print(f"padded_attention: {tuple(out.shape)} on {current_backend([q])} matches "
          "scaled_dot_product_attention")
