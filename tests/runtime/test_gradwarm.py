"""A warm training step re-plans nothing (runtime/gradwarm.py, #53): the differentiable call's
forward and each backward kernel replay the closure their first call recorded, keyed as a
kernel's own warm calls, and the forward's saving plan is kept per key. Counted on the stages of
the full path (`launcher.check_call`, `launcher.bind`, `saving.choose`) and on the frontend's
binding (`Kernel._bound`, kept per key by `runtime.gradbind`): the second step on new values of
the same layout makes none of them, and its gradients are those of torch (float64) on those
values; another shape takes the full path again; a scalar the frontend converts (an int for a
float) binds again, and one it refuses raises its error; create_graph=True is still refused.
Kernels run through the simulator."""
import pytest
import torch

import metalforge as mf
from metalforge.autodiff import NotDifferentiable
from metalforge.errors import BindingError
from metalforge.runtime import launcher, saving

from ..ops.test_row_gather import cross_entropy_full


@mf.kernel
def gate(x: "T[R, D]", w: "T[D]", a: float):
    return x * mf.sigmoid(x * w) * a


def _want(x, w, a, dy):
    x64, w64 = (t.double().requires_grad_() for t in (x, w))
    y = x64 * torch.sigmoid(x64 * w64) * a
    return torch.autograd.grad(y, (x64, w64), dy.double())


@pytest.fixture
def stages(monkeypatch):
    """How many times each stage of the full path ran."""
    seen = {"check_call": 0, "bind": 0, "choose": 0, "_bound": 0}
    for owner, name in ((launcher, "check_call"), (launcher, "bind"), (saving, "choose"),
                        (gate, "_bound")):
        real = getattr(owner, name)

        def counting(*args, _real=real, _name=name, **kwargs):
            seen[_name] += 1
            return _real(*args, **kwargs)
        monkeypatch.setattr(owner, name, counting)
    return seen


def _step(rows, seed, a=0.75):
    g = torch.Generator().manual_seed(seed)
    x, w, dy = torch.randn(rows, 33, generator=g), torch.randn(33, generator=g), \
        torch.randn(rows, 33, generator=g)
    leaves = (x.clone().requires_grad_(), w.clone().requires_grad_())
    got = torch.autograd.grad(gate(*leaves, a), leaves, dy)
    for d, want, name in zip(got, _want(x, w, a, dy), ("dx", "dw")):
        torch.testing.assert_close(d.double(), want, rtol=1e-5, atol=1e-5, msg=name)
    return got


def test_a_warm_step_plans_nothing(stages):
    _step(5, 0)
    first = dict(stages)
    assert first["check_call"] >= 2 and first["bind"] >= 2 and first["choose"] == 1
    assert first["_bound"] == 1
    _step(5, 1, a=-2.0)                 # new values, same layout: every kernel replayed
    assert stages == first, (stages, first)
    _step(5, 3, a=3)                    # an int for the float: bound again, as 3.0
    assert stages == {**first, "_bound": 2}, stages
    x = torch.randn(5, 33, requires_grad=True)
    with pytest.raises(BindingError, match="too large for a float scalar"):
        gate(x, torch.randn(33), 10**400)
    _step(7, 2)                         # another shape: the full path again
    assert stages["check_call"] > first["check_call"] and stages["choose"] == 2
    x = torch.randn(5, 33, requires_grad=True)
    w = torch.randn(33, requires_grad=True)
    y = gate(x, w, 1.0)
    with pytest.raises(NotDifferentiable, match="double backward"):
        torch.autograd.grad(y, (x, w), torch.ones_like(y), create_graph=True)


def test_a_warm_step_still_checks_its_gathers():
    """The replays keep the index check of a gather (`mf.take` of cross-entropy's target): on a
    warm step an index out of range raises as on a cold one, and the next step is right (V 33,
    4 rows: test_op_saving's kernels)."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(4, 33, generator=g)
    t = torch.randint(0, 33, (4,), generator=g, dtype=torch.int32)
    dy = torch.randn(4, generator=g)

    def step(target):
        leaf = x.clone().requires_grad_()
        return torch.autograd.grad(cross_entropy_full(leaf, target, 0.1, 1e-3), leaf, dy)[0]
    first = step(t)
    bad = t.clone()
    bad[2] = 40
    with pytest.raises(mf.GatherIndexError, match="index 40 is out of range"):
        step(bad)
    assert torch.equal(step(t), first)
    x64 = x.double().requires_grad_()
    lse = torch.logsumexp(x64, -1)
    loss = 0.9 * (lse - x64.gather(1, t.long()[:, None])[:, 0]) + 0.1 * (lse - x64.mean(-1)) \
        + 1e-3 * lse * lse
    want, = torch.autograd.grad(loss, x64, dy.double())
    torch.testing.assert_close(first.double(), want, rtol=1e-5, atol=1e-6)
