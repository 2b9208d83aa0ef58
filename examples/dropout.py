"""Dropout with counter-based random numbers: each element is kept with probability 1 - p
and scaled by 1 / (1 - p), or zeroed, by a Philox draw at its position (mf.rand).

    python examples/dropout.py

Nothing but the seed and the step is kept between forward and backward: the backward kernel
draws the same numbers again from the seed (no mask in memory). A training loop passes its
step number as `offset`, a runtime int: a new mask every step, no recompile.
Prints the generated Metal of the backward (the Philox helper and its call), runs forward and
backward and checks them against torch with the same mask.
"""
import torch

import metalforge as mf
from metalforge.runtime import current_backend


@mf.kernel
def dropout(x: "T[*B, D]", seed: int, p: float = 0.5, offset: int = 0):
    keep = mf.rand(seed, like=x, offset=offset) >= p
    return mf.where(keep, x / (1 - p), 0.0)


if __name__ == "__main__":
    device = "mps" if torch.backends.mps.is_available() else "cpu"
    x = torch.randn(4, 8, 1000, device=device, requires_grad=True)
    print(dropout.backward_source(x, 1234, 0.1, 7))
    y = dropout(x, 1234, 0.1, 7)
    keep = y.detach() != 0                            # the mask, read off the output
    dy = torch.randn_like(y)
    y.backward(dy)
    torch.testing.assert_close(y, torch.where(keep, x / 0.9, 0.0))
    torch.testing.assert_close(x.grad, torch.where(keep, dy / 0.9, 0.0))
    print(f"dropout: {tuple(y.shape)} on {current_backend([x])}, kept "
          f"{keep.float().mean().item():.3f} (p = 0.1); forward and backward match torch "
          "with the same mask")
