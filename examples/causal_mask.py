"""A causal mask built from positions: scores above the diagonal become -inf.

    python examples/causal_mask.py

`mf.index("L")` is the position along axis L; comparing positions gives the mask, with no
mask tensor in memory.
"""
import torch

import metalforge as mf
from metalforge.runtime import current_backend


@mf.kernel
def causal_mask(scores: "T[S, L]"):
    keep = mf.index("L") <= mf.index("S") + mf.size("L") - mf.size("S")
    return mf.where(keep, scores, -mf.inf)


if __name__ == "__main__":
    device = "mps" if torch.backends.mps.is_available() else "cpu"
    s = torch.randn(33, 47, dtype=torch.float32, device=device)
    print(causal_mask.source(s))
    y = causal_mask(s)
    torch.testing.assert_close(y, causal_mask.reference(s))
    keep = torch.ones(33, 47, dtype=torch.bool, device=device).tril(47 - 33)
    torch.testing.assert_close(y, s.masked_fill(~keep, float("-inf")))
    print(f"causal_mask: {tuple(y.shape)} {y.dtype} on {current_backend([s])} matches the "
          f"reference")
