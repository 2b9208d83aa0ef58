"""log_softmax over the last axis: (x - max) - log(sum(exp(x - max))).

    python examples/log_softmax.py

Prints the generated Metal library, runs it and checks it against the reference and
torch.log_softmax.
"""
import torch

import metalforge as mf
from metalforge.runtime import current_backend


@mf.kernel
def log_softmax(x: "T[*B, D]"):
    return mf.log_softmax(x, axis="D")


if __name__ == "__main__":
    device = "mps" if torch.backends.mps.is_available() else "cpu"
    x = torch.randn(4, 6, 513, dtype=torch.float16, device=device)
    print(log_softmax.source(x))
    y = log_softmax(x)
    torch.testing.assert_close(y, log_softmax.reference(x), rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(y, torch.log_softmax(x.float(), dim=-1).half(), rtol=2e-3,
                               atol=2e-3)
    print(f"log_softmax: {tuple(y.shape)} {y.dtype} on {current_backend([x])} matches the "
          f"reference")
