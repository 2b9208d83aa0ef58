"""Attention written in the DSL: causal grouped-query (GQA) decode and prefill, compiled to one
pass over the keys.

    python examples/attention.py

q has G*R heads, k and v have G: the annotation "(G R)" reads q's head dim as the axes G and R,
so each key/value head serves R query heads (R = 1 is plain multi-head attention, G = 1
multi-query). The scores (q . k over E, scaled, causally masked) and their softmax over L are
never stored:
the kernel keeps a running max, a running sum and a rescaled fp32 accumulator of the E outputs
per query row (online softmax). Runs on Metal on a Mac, else on the simulator; checked against
torch.nn.functional.scaled_dot_product_attention.
"""
import torch
import torch.nn.functional as F

import metalforge as mf
from metalforge.runtime import current_backend


@mf.kernel
def attention(q: "T[B, (G R), S, E]", k: "T[B, G, L, E]", v: "T[B, G, L, E]", scale: float,
              causal: mf.Const[bool] = True):
    s = mf.sum(q * k, axis="E") * scale                       # scores [B, G, R, S, L], never stored
    if causal:                                                # bottom-right aligned when S < L
        s = mf.where(mf.index("L") <= mf.index("S") + mf.size("L") - mf.size("S"), s, -mf.inf)
    return mf.sum(mf.softmax(s, axis="L") * v, axis="L")      # -> [B, (G R), S, E]


def causal_mask(s: int, length: int, device) -> torch.Tensor:
    """SDPA's boolean mask for bottom-right aligned causal attention (S query rows at the end
    of L keys)."""
    return torch.ones(s, length, dtype=torch.bool, device=device).tril(length - s)


if __name__ == "__main__":
    device = "mps" if torch.backends.mps.is_available() else "cpu"
    torch.manual_seed(0)
    for s, length in ((1, 77), (16, 16)):                     # decode: one query; prefill
        q = torch.randn(1, 8, s, 64, dtype=torch.float16, device=device)    # 8 query heads
        k = torch.randn(1, 2, length, 64, dtype=torch.float16, device=device)  # 2 kv heads
        v = torch.randn(1, 2, length, 64, dtype=torch.float16, device=device)
        out = attention(q, k, v, 0.125)
        want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=0.125,
                                              attn_mask=causal_mask(s, length, device),
                                              enable_gqa=True).half()
        torch.testing.assert_close(out, want, rtol=2e-3, atol=2e-3)
    print(attention.source(q, k, v, 0.125))
    print(f"attention: causal GQA decode and prefill on {current_backend([q])} match "
          "scaled_dot_product_attention")
