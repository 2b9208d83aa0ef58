"""Cross-entropy's derived backward as one fused row kernel (softmax minus the smoothed one-hot,
the z-loss term; no softmax written): recomputing the row's logsumexp where the row is held in
registers, loading the forward's saved one where the row is longer (`runtime.saving`), against
torch.autograd on F.cross_entropy; ignored rows get zero gradient; float64 gradcheck of the
derived backward graphs on the reference path; check(grad=True)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from metalforge import autodiff, reference, runtime
from metalforge.runtime import saving
from metalforge.shapes import bind_shapes
from metalforge.testing import check
from tests.ops.test_row_gather import cross_entropy_full


def torch_loss(x, t, smoothing, z_loss):
    """F.cross_entropy (reduction none) plus the z-loss where not ignored, in x's dtype."""
    loss = F.cross_entropy(x, t.long(), reduction="none", label_smoothing=smoothing)
    return loss + z_loss * torch.logsumexp(x, -1) ** 2 * (t != -100)


def inputs(rows, v, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, v, generator=g, dtype=torch.float64) * 3).to(dtype)
    t = torch.randint(0, v, (rows,), generator=g, dtype=torch.int32)
    t[1] = -100                                  # an ignored row
    return x, t, torch.randn(rows, generator=g, dtype=torch.float64).to(dtype)


# V 33: the row in registers (the backward recomputes lse, reading the row once); 17000 f32:
# longer than a threadgroup holds (the forward saves lse, the backward is one elementwise pass)
@pytest.mark.parametrize("v, saves", [(33, False), (17000, True)])
def test_gradient_matches_torch_and_reads_the_row_once(v, saves):
    x, t, g = inputs(4, v, v)
    args = (0.1, 1e-3)
    graph = cross_entropy_full.graph(x, t, *args)
    values = {"logits": x, "target": t, "smoothing": 0.1, "z_loss": 1e-3, "ignore_index": -100}
    bw = saving.choose(graph, ("logits",), values, None)
    assert (bw is not None) == saves
    bw = bw or autodiff.backward_of(graph, ("logits",))
    (k,) = bw.kernels                            # one kernel writes dlogits
    sizes = bind_shapes(graph, {"logits": x, "target": t}).sizes
    traffic = runtime.schedule_of(k, sizes=sizes).traffic(sizes)
    # the logits once, the targets, dy (and lse where saved), dlogits written
    assert traffic.read == 4 * v * 4 + 4 * 4 + 4 * 4 + (4 * 4 if saves else 0)
    assert traffic.written == 4 * v * 4
    xa = x.clone().requires_grad_()
    cross_entropy_full(xa, t, *args).backward(g)
    xb = x.clone().requires_grad_()
    torch_loss(xb, t, *args).backward(g)
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-5, atol=1e-6)
    assert not xa.grad[1].any()                  # the ignored row: exactly zero


def _derived(saved: bool):
    """A float64 function whose forward is torch's loss and whose backward runs the derived
    backward graphs through `reference.evaluate` (saved: with the lse the forward graph that
    saves it writes, also evaluated by the reference)."""
    x0, t, _ = inputs(3, 7, 0, torch.float64)
    graph = cross_entropy_full.graph(x0.float(), t, 0.1, 1e-3)
    bw = autodiff.backward_of(graph, ("logits",), saved=saved)

    class Loss(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return torch_loss(x, t, 0.1, 1e-3)

        @staticmethod
        def backward(ctx, dy):
            (x,) = ctx.saved_tensors
            vals = {"logits": x, "target": t, "smoothing": 0.1, "z_loss": 1e-3,
                    "ignore_index": -100}
            if saved:
                vals["lse_V"] = reference.evaluate(saving.forward_saving(graph, bw), vals)[1]
            return autodiff.run_backward(bw, vals, (dy,), reference.evaluate)["logits"]
    return x0, Loss.apply


@pytest.mark.parametrize("saved", [False, True])
def test_gradcheck_float64_on_the_reference(saved):
    x0, fn = _derived(saved)
    # the reference rounds each value to fp32: Jacobians agree to fp32's precision
    assert torch.autograd.gradcheck(fn, (x0.requires_grad_(),), eps=1e-6, atol=1e-5,
                                    rtol=1e-4)


@settings(max_examples=12, deadline=None)
@given(rows=st.integers(2, 5), v=st.integers(1, 40), saved=st.booleans(),
       smoothing=st.sampled_from([0.0, 0.1, 0.5]), z_loss=st.sampled_from([0.0, 1e-3, 0.5]),
       seed=st.integers(0, 2 ** 16))
def test_derived_graphs_match_torch_on_the_reference(rows, v, saved, smoothing, z_loss, seed):
    # the derivation itself (no kernel compiled): both plans' backward graphs evaluated by the
    # reference against torch.autograd on F.cross_entropy, ignored rows included
    x, t, g = inputs(rows, v, seed)
    t[seed % rows] = -100
    vals = {"logits": x, "target": t, "smoothing": smoothing, "z_loss": z_loss,
            "ignore_index": -100}
    graph = cross_entropy_full.graph(x, t, smoothing, z_loss)
    bw = autodiff.backward_of(graph, ("logits",), saved=saved)
    assert bool(bw.saved) == saved
    if saved:
        vals["lse_V"] = reference.evaluate(saving.forward_saving(graph, bw), vals)[1]
    got = autodiff.run_backward(bw, vals, (g,), reference.evaluate)["logits"]
    xr = x.clone().requires_grad_()
    torch_loss(xr, t, smoothing, z_loss).backward(g)
    torch.testing.assert_close(got, xr.grad, rtol=1e-5, atol=1e-6)
    assert not got[t == -100].any()


def test_check_grad():
    assert check(cross_entropy_full, dtypes={"T": ["f32"]}, max_examples=2,
                 grad=True).examples >= 2
