"""GroupNorm, two reductions over three axes in one kernel: per group, the mean over
("C", "H", "W"), then the variance of (x - mean), and a per-channel affine.

    python examples/group_norm.py

x[N, C, H, W] in G groups is annotated as the view x.view(N, G, C // G, H, W) sees it, the
weight and bias as w.view(G, C // G). Prints the generated Metal library, runs it (Metal on a
Mac, else the simulator) and checks it against the reference and
torch.nn.functional.group_norm.
"""
import torch

import metalforge as mf
from metalforge.runtime import current_backend


@mf.kernel
def group_norm(x: "T[N, G, C, H, W]", w: "T[G, C]", b: "T[G, C]", eps: float = 1e-5):
    mean = mf.mean(x, axis=("C", "H", "W"))
    d = x - mean
    var = mf.mean(d * d, axis=("C", "H", "W"))
    return d * mf.rsqrt(var + eps) * w + b


if __name__ == "__main__":
    device = "mps" if torch.backends.mps.is_available() else "cpu"
    n, c, h, wd, g = 2, 32, 8, 8, 4
    x = torch.randn(n, c, h, wd, dtype=torch.float16, device=device)
    w = torch.randn(c, dtype=torch.float16, device=device)
    b = torch.randn(c, dtype=torch.float16, device=device)
    args = (x.view(n, g, c // g, h, wd), w.view(g, c // g), b.view(g, c // g))
    print(group_norm.source(*args))
    y = group_norm(*args)
    torch.testing.assert_close(y, group_norm.reference(*args), rtol=4e-3, atol=4e-3)
    expect = torch.nn.functional.group_norm(x.float(), g, w.float(), b.float()).half()
    torch.testing.assert_close(y.view(n, c, h, wd), expect, rtol=4e-3, atol=4e-3)
    print(f"group_norm: {tuple(y.shape)} {y.dtype} on {current_backend([x])} matches the "
          f"reference")
