"""Column sum: reduce the first (non-contiguous) axis of a matrix, out[d] = sum_r x[r, d].

    python examples/column_sum.py

Threads run along the contiguous axis D and loop over R; tall inputs split R across 8 slices of a
threadgroup whose partials meet in threadgroup memory, and, where the columns are too few to
fill the GPU, into chunks whose fp32 partials a second kernel merges in order. Prints the
generated Metal library, runs it on a short and a tall input and checks both against the
reference and torch.
"""
import torch

import metalforge as mf
from metalforge.runtime import current_backend


@mf.kernel
def column_sum(x: "T[R, D]"):
    return mf.sum(x, axis="R")


if __name__ == "__main__":
    device = "mps" if torch.backends.mps.is_available() else "cpu"
    print(column_sum.source(torch.randn(64, 100, device=device)))
    for shape in ((64, 100), (5000, 40)):                 # one thread per column; tall: split
        x = torch.randn(*shape, device=device)
        y = column_sum(x)
        torch.testing.assert_close(y, column_sum.reference(x), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(y, x.sum(dim=0), rtol=1e-4, atol=1e-4)
    print(f"column_sum: {tuple(y.shape)} {y.dtype} on {current_backend([x])} matches the "
          f"reference")
