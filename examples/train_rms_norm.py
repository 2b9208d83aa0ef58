"""Training through metalforge kernels: RMSNorm + a SiLU MLP as PyTorch operators, under
torch.compile, for a few optimizer steps; the loss matches the same model written in torch.

    python examples/train_rms_norm.py

`kernel.as_op("ns::name")` registers a kernel as a torch.library custom op (fake shapes from the
annotations, so torch.compile(fullgraph=True) traces through it); its backward runs kernels that
metalforge derives from the kernel: rms_norm's is one row-reduction kernel for dx and a column
reduction for dw, silu's is one elementwise kernel. Prints the backward MSL of rms_norm.
"""
import torch

import metalforge as mf


@mf.kernel
def rms_norm(x: "T[*B, D]", w: "T[D]", eps: float = 1e-6):
    return x * mf.rsqrt(mf.mean(x * x, axis="D") + eps) * w


@mf.kernel
def silu(x: "T[*B, D]"):
    return x * mf.sigmoid(x)


rms_norm_op = rms_norm.as_op("examples::rms_norm")
silu_op = silu.as_op("examples::silu")


class Block(torch.nn.Module):
    """x + down(silu(up(rms_norm(x) * w))): the pre-norm MLP block of a transformer."""

    def __init__(self, dim: int, hidden: int, metalforge: bool):
        super().__init__()
        self.mf = metalforge
        self.norm = torch.nn.Parameter(1.0 + 0.1 * torch.randn(dim))
        self.up = torch.nn.Linear(dim, hidden)
        self.down = torch.nn.Linear(hidden, dim)

    def forward(self, x):
        if self.mf:
            return x + self.down(silu_op(self.up(rms_norm_op(x, self.norm, eps=1e-5))))
        h = torch.nn.functional.rms_norm(x, (x.shape[-1],), self.norm, eps=1e-5)
        return x + self.down(torch.nn.functional.silu(self.up(h)))


def train(model, xs, ys, steps: int):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for i in range(steps):
        loss = torch.nn.functional.mse_loss(model(xs[i]), ys[i])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


if __name__ == "__main__":
    torch.manual_seed(0)
    steps, dim, hidden = 4, 64, 128
    ours = Block(dim, hidden, metalforge=True)
    theirs = Block(dim, hidden, metalforge=False)
    theirs.load_state_dict(ours.state_dict())
    xs = torch.randn(steps, 2, 8, dim)
    ys = torch.randn(steps, 2, 8, dim)
    print(rms_norm.backward_source(xs[0], ours.norm.detach(), 1e-5))
    compiled = torch.compile(ours, fullgraph=True, backend="eager")   # no graph break
    got = train(compiled, xs, ys, steps)
    want = train(theirs, xs, ys, steps)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours.norm, theirs.norm, rtol=1e-4, atol=1e-5)
    print("step  metalforge loss  torch loss")
    for i, (a, b) in enumerate(zip(got, want)):
        print(f"{i:4d}  {a:15.6f}  {b:10.6f}")
    print(f"train_rms_norm: {steps} AdamW steps under torch.compile(fullgraph=True) match torch")
