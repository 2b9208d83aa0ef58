"""Row argmax: the index (int64) of the first maximum of each row; a NaN counts as the maximum.

    python examples/row_argmax.py

Prints the generated Metal library, runs it on rows with ties and NaN and checks it against the
reference and torch.argmax.
"""
import torch

import metalforge as mf
from metalforge.runtime import current_backend


@mf.kernel
def row_argmax(x: "T[R, D]"):
    return mf.argmax(x, axis="D")


if __name__ == "__main__":
    device = "mps" if torch.backends.mps.is_available() else "cpu"
    x = torch.randn(64, 50000, device=device).round()      # many ties
    x[3, 10] = x[3, 4000] = 100.0                          # the first of two maxima
    x[5, 123] = x[5, 7] = float("nan")                     # the first NaN
    print(row_argmax.source(x))
    y = row_argmax(x)
    assert torch.equal(y, row_argmax.reference(x))
    assert torch.equal(y, torch.argmax(x, dim=-1))
    print(f"row_argmax: {tuple(y.shape)} {y.dtype} on {current_backend([x])} matches the "
          f"reference")
