"""Attention with a sliding window and a soft cap on the scores (Gemma-2 / Mistral style).

    python examples/sliding_window_softcap.py

The window and the cap are runtime scalars (no recompile when they change); both are plain DSL
on the scores, fused into the attention kernel. Checked against a torch implementation.
"""
import torch

import metalforge as mf
from metalforge.runtime import current_backend


@mf.kernel
def window_softcap(q: "T[B, H, S, E]", k: "T[B, H, L, E]", v: "T[B, H, L, E]", scale: float,
                   window: int, cap: float):
    s = mf.sum(q * k, axis="E") * scale
    s = cap * mf.tanh(s / cap)                                          # soft cap
    pos = mf.index("S") + mf.size("L") - mf.size("S")                   # the query's position
    key = mf.index("L")
    s = mf.where((key <= pos) & (key > pos - window), s, -mf.inf)       # causal sliding window
    return mf.sum(mf.softmax(s, axis="L") * v, axis="L")


# check(): windows of at least one key (a window of 0 masks every key: NaN, as in torch), up
# to past one tile of 32 keys
CHECK = {"window_softcap": {"values": {"window": (1, 48)}}}


def torch_window_softcap(q, k, v, scale, window, cap):
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    s = cap * torch.tanh(s / cap)
    n, length = q.shape[-2], k.shape[-2]
    pos = torch.arange(n)[:, None] + length - n
    key = torch.arange(length)[None, :]
    s = s.masked_fill(~((key <= pos) & (key > pos - window)), float("-inf"))
    return (torch.softmax(s, -1) @ v.double()).to(q.dtype)


if __name__ == "__main__":
    device = "mps" if torch.backends.mps.is_available() else "cpu"
    q, k, v = (torch.randn(2, 3, n, 32, device=device) for n in (5, 40, 40))
    print(window_softcap.source(q, k, v, 32 ** -0.5, 8, 20.0))
    out = window_softcap(q, k, v, 32 ** -0.5, 8, 20.0)
    torch.testing.assert_close(out, torch_window_softcap(q.cpu(), k.cpu(), v.cpu(), 32 ** -0.5, 8,
                                                         20.0).to(device), rtol=1e-4, atol=1e-5)
    print(f"window_softcap: {tuple(out.shape)} on {current_backend([q])} matches torch")
