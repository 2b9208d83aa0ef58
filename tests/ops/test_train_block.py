"""examples/train_block.py: a transformer block trained through metalforge operators (embedding,
RMSNorm, the matmul family, causal GQA attention, SwiGLU, cross-entropy) on the simulator,
against the same block written in torch. Every parameter's gradient is compared directly (AdamW
normalises its steps, so matching losses alone would let a gradient wrong by a factor pass),
then the losses of a few AdamW steps, eagerly and under torch.compile(fullgraph=True)."""
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from metalforge.testing import load_module

ex = load_module(Path(__file__).resolve().parents[2] / "examples" / "train_block.py")
C = ex.Config(vocab=64, dim=32, heads=4, kv_heads=2, hidden=64)   # the script's own sizes:
BATCH, SEQ = 2, 16                                    # test_examples compiles the same kernels


def torch_loss(p: dict, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The block computed directly in torch from its parameters (not through ex.Block)."""
    b, s = ids.shape
    e = C.dim // C.heads

    def norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + C.eps) * w
    h = p["table"][ids]
    n = norm(h, p["norm1"])
    q = (n @ p["wq"].T).view(b, s, C.heads, e).transpose(1, 2)
    k = (n @ p["wk"].T).view(b, s, C.kv_heads, e).transpose(1, 2)
    v = (n @ p["wv"].T).view(b, s, C.kv_heads, e).transpose(1, 2)
    rep = C.heads // C.kv_heads                       # query head h reads kv head h // rep
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    scores = (q @ k.transpose(-1, -2)) * e ** -0.5
    scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    o = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, -1)
    a = h + o @ p["wo"].T
    n = norm(a, p["norm2"])
    m = a + (F.silu(n @ p["w_gate"].T) * (n @ p["w_up"].T)) @ p["w_down"].T
    logits = (norm(m, p["norm_f"]) @ p["head"].T).flatten(0, 1)
    return (logits.logsumexp(-1) - logits.gather(1, targets.reshape(-1, 1))[:, 0]).mean()


@pytest.fixture(scope="module")
def ours():
    """Our block and its compiled forward (compiled once for both tests)."""
    torch.manual_seed(1)
    block = ex.Block(C, ours=True)
    return block, torch.compile(block, fullgraph=True, backend="aot_eager")


def test_every_gradient_matches_torch_eager_and_compiled(ours):
    block, compiled = ours
    ids, targets = ex.batches(C, 1, BATCH, SEQ, "cpu")[0]
    params = {n: t.detach().clone().requires_grad_() for n, t in block.named_parameters()}
    want_loss = torch_loss(params, ids, targets)
    want = dict(zip(params, torch.autograd.grad(want_loss, list(params.values()))))
    for fwd in (block, compiled):
        block.zero_grad()
        loss = fwd(ids, targets)
        loss.backward()
        torch.testing.assert_close(loss, want_loss, rtol=1e-5, atol=1e-6)
        for name, p in block.named_parameters():
            torch.testing.assert_close(p.grad, want[name], rtol=1e-4, atol=1e-5,
                                       msg=lambda m, name=name: f"d{name}: {m}")


def test_compiled_losses_match_torch_step_for_step(ours):
    """(the script, run by tests/runtime/test_examples.py, checks the eager losses too)"""
    block, compiled = ours
    theirs = ex.Block(C, ours=False)
    theirs.load_state_dict(block.state_dict())
    data = ex.batches(C, 3, BATCH, SEQ, "cpu")
    want = ex.train(theirs, theirs, data)
    assert want[-1] < want[0]                                 # it learns the sequences
    torch.testing.assert_close(torch.tensor(ex.train(block, compiled, data)),
                               torch.tensor(want), rtol=1e-4, atol=1e-5)
