"""Running (cumulative) sums along a row, fused with the work around them: the running mean
of the masked-in values of each row, out[b, l] = sum(x * m over 0..l) / max(count, 1).

    python examples/cumsum.py

One threadgroup per row streams it in chunks: each thread scans its 8 contiguous elements in
registers, a simdgroup prefix sum and a threadgroup carry give each thread the sum before it,
and the division runs on the scanned values before they are stored (schedules.md, Scans).
Prints the generated Metal, runs it on short and long rows and checks it against torch.
"""
import torch

import metalforge as mf
from metalforge.runtime import current_backend


@mf.kernel
def masked_running_mean(x: "T[B, L]", m: "T[B, L]"):
    return mf.cumsum(x * m, "L") / mf.maximum(mf.cumsum(m, "L"), 1.0)


# check(): m is a mask (weights in [0, 1]): with signed m the count cancels, and a quotient of
# two cancelled running sums is not the example's op
CHECK = {"masked_running_mean": {"values": {"m": (0.0, 1.0)}}}


if __name__ == "__main__":
    device = "mps" if torch.backends.mps.is_available() else "cpu"
    print(masked_running_mean.source(torch.randn(4, 100, device=device),
                                     torch.ones(4, 100, device=device)))
    for shape in ((4, 100), (2, 10000)):           # one chunk; several chunks of a long row
        x = torch.randn(*shape, device=device)
        m = (torch.rand(*shape, device=device) > 0.3).float()
        y = masked_running_mean(x, m)
        want = torch.cumsum(x * m, 1) / torch.cumsum(m, 1).clamp(min=1.0)
        torch.testing.assert_close(y, want, rtol=1e-4, atol=1e-4)
    print(f"masked_running_mean: {tuple(y.shape)} {y.dtype} on {current_backend([x])} "
          f"matches torch.cumsum")
