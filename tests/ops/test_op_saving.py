"""Training through `kernel.as_op(...)` runs the forward once (`metalforge.op_saving`): the
op's forward for a call that needs gradients (`<name>_saving`; eagerly on plain tensors the
direct call itself, `op.dispatched` forces the operators) is the direct path's (attention
with its rows' logsumexp; cross-entropy's forward that saves the row's logsumexp where
`saving.choose` picks it) and the backward op runs only the backward kernels; eagerly and under
torch.compile(fullgraph=True); torch.export records the op itself. Gradients against the
direct path and torch in float64. Each backward kernel takes only the launch options its family
accepts (`grad_fp32` reaches the attention-grad kernels, not the forward's). Cross-entropy's
kernels and sizes are those test_xent_backward compiles (the simulator's cache)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from examples.rms_norm import rms_norm
from metalforge import autodiff
from metalforge.runtime import gradwarm, saving
from metalforge.runtime.grad_launch import options_for

from .test_attention_backward import _inputs, _torch_masked, masked
from .test_row_gather import cross_entropy_full


@pytest.fixture
def launched(monkeypatch):
    """The kernels the differentiable paths launch, in order: (graph name, launch options)."""
    seen: list[tuple[str, object]] = []
    run = gradwarm.GraphPath.run

    def counting(self, values):
        seen.append((self.graph.name, self.launch))
        return run(self, values)
    monkeypatch.setattr(gradwarm.GraphPath, "run", counting)
    return seen


def _grads(fn, leaves):
    return torch.autograd.grad(fn(*leaves).sum(), leaves)


def test_attention_op_runs_its_forward_once_eager_and_compiled(launched):
    # test_f32_soft_cap_and_masks_match_torch's inputs: its kernels, compiled once
    q, k, v, valid, _ = _inputs(torch.float32, 1, length=37, e=40)
    extra = (valid, 0.5, 9, 2.0)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    want64 = _grads(lambda *a: _torch_masked(*a, *extra), [x.double().requires_grad_()
                                                           for x in (q, k, v)])
    direct = _grads(lambda *a: masked(*a, *extra), leaves)
    op = masked.as_op("mf_test::attention_saving")
    compiled = torch.compile(lambda *a: op(*a, *extra), fullgraph=True, backend="aot_eager")
    kernels = ["masked_backward1", "masked_backward2", "masked_backward3", "masked_backward4"]
    for fn in (lambda *a: op(*a, *extra), lambda *a: op.dispatched(*a, *extra), compiled):
        launched.clear()
        got = _grads(fn, leaves)
        # the forward with lse once; delta, dq, dk/dv: no second forward
        assert [n for n, _ in launched] == kernels
        for name, a, b, w in zip("qkv", got, direct, want64):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=f"d{name}")
            torch.testing.assert_close(a.double(), w, rtol=1e-4, atol=1e-4, msg=f"d{name}")
    with torch.no_grad():           # no gradient asked: the op alone, no logsumexp
        assert op._grad_wrt((*leaves, *extra)) == []
    assert op._grad_wrt((*leaves, *extra)) == [0, 1, 2]
    torch.library.opcheck(op.saving_op, (*leaves, *extra, [0, 1, 2]),
                          test_utils=("test_schema", "test_faketensor"))


# V 17000 f32: the row is longer than a threadgroup holds, the forward saves the row's lse
# (4 bytes a row) and the backward is one elementwise pass; V 33: recomputing moves less
@pytest.mark.parametrize("v, saves", [(17000, True), (33, False)])
def test_cross_entropy_op_saves_what_the_direct_path_saves(launched, v, saves):
    g = torch.Generator().manual_seed(v)
    x = torch.randn(4, v, generator=g, dtype=torch.float64) * 3
    t = torch.randint(0, v, (4,), generator=g, dtype=torch.int32)
    t[1] = -100
    args = (0.1, 1e-3)
    xr = x.clone().requires_grad_()
    loss = F.cross_entropy(xr, t.long(), reduction="none", label_smoothing=0.1)
    want64 = torch.autograd.grad((loss + 1e-3 * torch.logsumexp(xr, -1) ** 2 * (t != -100))
                                 .sum(), xr)[0]
    leaf = x.float().requires_grad_()
    direct = _grads(lambda a: cross_entropy_full(a, t, *args), [leaf])[0]
    want_kernels = [n for n, _ in launched]
    graph = cross_entropy_full.graph(leaf, t, *args)
    bw = saving.choose(graph, ("logits",), {"logits": leaf, "target": t}, None, "sim")
    assert (bw is not None) == saves and len(want_kernels) == 2
    op = cross_entropy_full.as_op(f"mf_test::xent_op_{v}")
    compiled = torch.compile(lambda a: op(a, t, *args), fullgraph=True, backend="aot_eager")
    for fn in (lambda a: op(a, t, *args), lambda a: op.dispatched(a, t, *args), compiled):
        launched.clear()
        got = _grads(fn, [leaf])[0]
        assert [n for n, _ in launched] == want_kernels      # the direct path's two kernels
        torch.testing.assert_close(got, direct, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(got.double(), want64, rtol=1e-4, atol=1e-5)
    if saves:
        assert launched[0][0] == graph.name and len(launched) == 2   # the forward that saves

        class Loss(torch.nn.Module):
            def forward(self, a):
                return op(a, t, *args)
        ep = torch.export.export(Loss(), (leaf,))      # a forward graph: the op, not _saving
        targets = {n.target for n in ep.graph.nodes if n.op == "call_function"}
        assert targets == {torch.ops.mf_test.xent_op_17000.default}


def test_each_kernel_takes_only_its_familys_launch_options(launched):
    """grad_fp32, given on the attention forward's launch, reaches its attention-grad
    kernels only (f32 inputs: the same fp32 kernels, nothing compiled anew); a call without
    grad accepts it and launches what it would without. A row option of rms_norm's forward
    does not reach its column kernel, nor cross-entropy's elementwise backward (in
    `saving.choose`'s measure either)."""
    q, k, v, valid, _ = _inputs(torch.float32, 1, length=37, e=40)
    extra = (valid, 0.5, 9, 2.0)
    fp32 = masked.with_launch(grad_fp32=True)
    assert fp32.source(q, k, v, *extra) == masked.source(q, k, v, *extra)   # no grad
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    got = _grads(lambda *a: fp32(*a, *extra), leaves)
    assert launched == [("masked_backward1", None), ("masked_backward2", None),
                        ("masked_backward3", {"grad_fp32": True}),
                        ("masked_backward4", {"grad_fp32": True})]
    for a, b in zip(got, _grads(lambda *a: masked(*a, *extra), leaves)):
        torch.testing.assert_close(a, b)
    graph = rms_norm.graph(T="f32")
    kernels = autodiff.backward_of(graph).kernels
    opts = [options_for(k, {"keep_narrow": True, "index64": False}) for k in kernels]
    assert {"keep_narrow": True, "index64": False} in opts and {"index64": False} in opts
    x, t = torch.randn(4, 17000), torch.zeros(4, dtype=torch.int32)   # the bytes measured
    graph = cross_entropy_full.graph(x, t)                           # under a row option
    assert saving.choose(graph, ("logits",), {"logits": x, "target": t}, {"keep_narrow": True},
                         "sim") is not None
