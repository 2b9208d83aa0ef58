"""logsumexp over the last axis, one value per row: log(sum(exp(x - m))) + m.

    python examples/logsumexp.py

Prints the generated Metal library, runs it (rows of all -inf give -inf, +inf gives +inf, as
torch.logsumexp) and checks it against the reference and torch.
"""
import torch

import metalforge as mf
from metalforge.runtime import current_backend


@mf.kernel
def logsumexp(x: "T[R, D]"):
    return mf.logsumexp(x, axis="D")


if __name__ == "__main__":
    device = "mps" if torch.backends.mps.is_available() else "cpu"
    x = torch.randn(32, 2048, device=device)
    x[0] = -float("inf")
    x[1, 5] = float("inf")
    print(logsumexp.source(x))
    y = logsumexp(x)
    torch.testing.assert_close(y, logsumexp.reference(x))
    torch.testing.assert_close(y, torch.logsumexp(x, dim=-1))
    print(f"logsumexp: {tuple(y.shape)} {y.dtype} on {current_backend([x])} matches the "
          f"reference")
