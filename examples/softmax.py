"""Softmax over the last axis: a max, then a sum of exp(x - max), then the division.

    python examples/softmax.py

Prints the generated Metal library (its looped kernel, for rows over 8192 elements, computes the
max and the sum in one online pass), runs it on rows with -inf and NaN, and checks it against the
reference and torch.softmax (an all -inf row gives NaN, as in torch).
"""
import torch

import metalforge as mf
from metalforge.runtime import current_backend


@mf.kernel
def softmax(x: "T[*B, D]"):
    return mf.softmax(x, axis="D")


if __name__ == "__main__":
    device = "mps" if torch.backends.mps.is_available() else "cpu"
    x = torch.randn(8, 3000, device=device)
    x[0] = -float("inf")               # all -inf: NaN, as torch
    x[1, :100] = -float("inf")         # a causal-style mask
    x[2, 7] = float("nan")
    print(softmax.source(x))
    y = softmax(x)
    torch.testing.assert_close(y, softmax.reference(x), equal_nan=True)
    torch.testing.assert_close(y, torch.softmax(x, dim=-1), equal_nan=True)
    print(f"softmax: {tuple(y.shape)} {y.dtype} on {current_backend([x])} matches the reference")
