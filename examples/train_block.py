"""Training a pre-norm transformer block through metalforge operators, under torch.compile and
eagerly; its losses match the same block written in torch, step for step.

    python examples/train_block.py                       # tiny sizes, the simulator here
    python examples/train_block.py --device cuda --dim 512 --seq 512 --vocab 4096 --steps 5

The model (Llama-style, one layer, no positional encoding):

    h  = embed(ids)                                       mf.take from the table
    a  = h + W_o attention(rms_norm(h) W_q, .. W_k, .. W_v)   causal, GQA: 4 query heads on 2 kv
    m  = a + W_down swiglu(rms_norm(a) W_gate, rms_norm(a) W_up)
    logits = rms_norm(m) W_head                           the vocabulary projection
    loss = mean(cross_entropy(logits, targets))           next-token targets

Every op metalforge provides is a metalforge kernel registered with `kernel.as_op` (a
torch.library custom operator: fake shapes from the annotations, so torch.compile traces
through it); its backward runs kernels metalforge derives from the kernel's description:
rms_norm's a row kernel for dx and a column kernel for dw, attention's FlashAttention-2 style
kernels (the forward with the rows' logsumexp, delta = rowsum(dO * O), dq, then dk and dv summed
over the query heads of each kv head), swiglu's one elementwise kernel, cross-entropy's one
fused row kernel (softmax minus one-hot, the softmax never written), the embedding's a
scatter-add. The projections are metalforge's contraction family (`linear`, the `matmul`
family: its backward is two matrix products, dx = dy W and dW = dy^T x) with `--linear mf`
(the default), or torch's F.linear with `--linear torch`.

The torch version starts from the same parameters (the same seed), sees the same data and
steps with the same AdamW; the table prints every step's losses. They agree to float32
rounding (rtol 1e-4): the kernels accumulate in fp32 in another order than torch. Runs on Metal
on a Mac, on the cuda backend with `--device cuda`, else on the simulator.
"""
import argparse
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import metalforge as mf
from metalforge.runtime import current_backend


def op(name: str):
    """`@op("rms_norm")` over `@mf.kernel`: register the kernel as the torch operator
    train_block::rms_norm (`kernel.as_op`) and name the operator; call it like the kernel, its
    kernel is `.kernel`. (The module then holds operators, not kernels: the tests that sweep
    every kernel of examples/ leave these to the single-kernel examples they repeat.)"""
    return lambda kernel: kernel.as_op(f"train_block::{name}")


@op("embed")
@mf.kernel
def embed(table: "T[V, D]", ids: "i32[*B]") -> "T[*B, D]":
    return mf.take(table, axis="V", index=ids)           # backward: a scatter-add into dtable


@op("rms_norm")
@mf.kernel
def rms_norm(x: "T[*B, D]", w: "T[D]", eps: float = 1e-5):
    return x * mf.rsqrt(mf.mean(x * x, axis="D") + eps) * w


@op("linear")
@mf.kernel
def linear(x: "T[M, K]", w: "T[N, K]") -> "T[M, N]":
    return mf.sum(x * w, axis="K")                        # x @ w.T: the matmul family


@op("attention")
@mf.kernel                          # causal grouped-query attention: head h = g * R + r
def attention(q: "T[B, (G R), S, E]", k: "T[B, G, L, E]", v: "T[B, G, L, E]", scale: float):
    s = mf.sum(q * k, axis="E") * scale                   # scores [B, G, R, S, L], never stored
    s = mf.where(mf.index("L") <= mf.index("S"), s, -mf.inf)   # causal (L = S here)
    return mf.sum(mf.softmax(s, axis="L") * v, axis="L")


@op("swiglu")
@mf.kernel
def swiglu(gate: "T[*B, F]", up: "T[*B, F]"):
    return gate * mf.sigmoid(gate) * up


@op("cross_entropy")
@mf.kernel
def cross_entropy(logits: "T[R, V]", target: "i32[R]") -> "T[R]":
    return mf.logsumexp(logits, axis="V") - mf.take(logits, axis="V", index=target)


@dataclass(frozen=True)
class Config:
    vocab: int = 64
    dim: int = 32
    heads: int = 4
    kv_heads: int = 2
    hidden: int = 64
    eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


class Block(torch.nn.Module):
    """One pre-norm decoder layer with its embedding, final norm and vocabulary head; `ours`
    picks metalforge's operators (and `linear`: "mf" or "torch" projections) or torch's."""

    def __init__(self, c: Config, ours: bool, linear: str = "mf"):
        super().__init__()
        self.c, self.ours, self.mf_linear = c, ours, ours and linear == "mf"
        e = c.head_dim

        def weight(*shape):
            return torch.nn.Parameter(torch.randn(*shape) / shape[-1] ** 0.5)

        def norm():
            return torch.nn.Parameter(1.0 + 0.1 * torch.randn(c.dim))
        self.table = torch.nn.Parameter(torch.randn(c.vocab, c.dim))
        self.norm1, self.norm2, self.norm_f = norm(), norm(), norm()
        self.wq, self.wk = weight(c.heads * e, c.dim), weight(c.kv_heads * e, c.dim)
        self.wv, self.wo = weight(c.kv_heads * e, c.dim), weight(c.dim, c.heads * e)
        self.w_gate, self.w_up = weight(c.hidden, c.dim), weight(c.hidden, c.dim)
        self.w_down, self.head = weight(c.dim, c.hidden), weight(c.vocab, c.dim)

    def proj(self, x, w):
        """x @ w.T over x's last axis."""
        if not self.mf_linear:
            return F.linear(x, w)
        return linear(x.reshape(-1, x.shape[-1]), w).view(*x.shape[:-1], w.shape[0])

    def norm(self, x, w):
        if self.ours:
            return rms_norm(x, w, eps=self.c.eps)
        return F.rms_norm(x, (x.shape[-1],), w, eps=self.c.eps)

    def attend(self, h):
        b, s, _ = h.shape
        e = self.c.head_dim

        def heads(w, n):                                  # [B, S, n*E] -> [B, n, S, E]
            return self.proj(h, w).view(b, s, n, e).transpose(1, 2)
        q, k, v = (heads(self.wq, self.c.heads), heads(self.wk, self.c.kv_heads),
                   heads(self.wv, self.c.kv_heads))
        if self.ours:
            o = attention(q, k, v, e ** -0.5)     # transposed views: fine
        else:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.proj(o.transpose(1, 2).reshape(b, s, -1), self.wo)

    def forward(self, ids, targets):
        """Mean next-token cross-entropy of the block on token ids [B, S]."""
        if self.ours:
            h = embed(self.table, ids.int())
        else:
            h = F.embedding(ids, self.table)
        a = h + self.attend(self.norm(h, self.norm1))
        n = self.norm(a, self.norm2)
        gate, up = self.proj(n, self.w_gate), self.proj(n, self.w_up)
        m = a + self.proj(swiglu(gate, up) if self.ours else F.silu(gate) * up, self.w_down)
        logits = self.proj(self.norm(m, self.norm_f), self.head).flatten(0, 1)
        if self.ours:
            return cross_entropy(logits, targets.flatten().int()).mean()
        return F.cross_entropy(logits, targets.flatten())


def train(model, forward, data, lr: float = 1e-2) -> list[float]:
    """AdamW steps of `forward` (the model or its compiled version) over (ids, targets) pairs;
    the loss of each step."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for ids, targets in data:
        loss = forward(ids, targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def batches(c: Config, steps: int, batch: int, seq: int, device) -> list:
    """`steps` batches of token sequences [batch, seq + 1] that a model can learn (each token
    is 5 * the previous one + 3 mod vocab, from a random first token): inputs and next-token
    targets."""
    tokens = [torch.randint(0, c.vocab, (steps, batch, 1))]
    for _ in range(seq):
        tokens.append((5 * tokens[-1] + 3) % c.vocab)
    return [(t[:, :-1], t[:, 1:]) for t in torch.cat(tokens, -1).to(device)]


def run(c: Config, steps: int, batch: int, seq: int, device, linear: str = "mf",
        compile_backend: str = "aot_eager", seed: int = 0) -> dict[str, list[float]]:
    """Train three copies of one initialisation on the same data: torch's block, ours eagerly
    and ours under torch.compile(fullgraph=True); every step's loss of each."""
    torch.manual_seed(seed)
    torch_block = Block(c, ours=False).to(device)
    data = batches(c, steps, batch, seq, device)
    losses = {"torch": train(torch_block, torch_block, data)}
    for name in ("eager", "compiled"):
        torch.manual_seed(seed)
        ours = Block(c, ours=True, linear=linear).to(device)
        fwd = ours if name == "eager" else torch.compile(ours, fullgraph=True,
                                                          backend=compile_backend)
        losses[name] = train(ours, fwd, data)
    return losses


def table(losses: dict[str, list[float]]) -> str:
    rows = ["step  torch        metalforge (eager)  metalforge (torch.compile)"]
    for i, (t, e, k) in enumerate(zip(losses["torch"], losses["eager"], losses["compiled"])):
        rows.append(f"{i:4d}  {t:11.6f}  {e:18.6f}  {k:26.6f}")
    want = torch.tensor(losses["torch"], dtype=torch.float64)
    worst = max(((torch.tensor(losses[n], dtype=torch.float64) - want).abs() / want.abs()).max()
                for n in ("eager", "compiled"))
    rows.append(f"largest relative difference from torch: {float(worst):.1e} (allowed: 1e-4)")
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="mps" if torch.backends.mps.is_available() else "cpu")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--linear", choices=("mf", "torch"), default="mf")
    p.add_argument("--compile-backend", default="aot_eager",
                   help="torch.compile's backend (inductor on a GPU)")
    a = p.parse_args()
    c = Config(vocab=a.vocab, dim=a.dim, heads=a.heads, kv_heads=a.kv_heads, hidden=2 * a.dim)
    losses = run(c, a.steps, a.batch, a.seq, a.device, a.linear, a.compile_backend)
    q = torch.randn(a.batch, c.heads, a.seq, c.head_dim, device=a.device)
    kv = torch.randn(a.batch, c.kv_heads, a.seq, c.head_dim, device=a.device)
    print(attention.kernel.backward_source(q, kv, kv, c.head_dim ** -0.5))   # its 4 kernels
    print(table(losses))
    want = torch.tensor(losses["torch"])
    for name in ("eager", "compiled"):
        torch.testing.assert_close(torch.tensor(losses[name]), want, rtol=1e-4, atol=1e-5)
    print(f"train_block: {a.steps} AdamW steps on {current_backend([q])} ({a.linear} "
          f"projections), eager and under torch.compile(fullgraph=True, "
          f"backend={a.compile_backend!r}), match torch")


if __name__ == "__main__":
    main()
