"""A training step through an `as_op` operator costs what the kernel's direct call costs (#53).

Eagerly on plain tensors the operator runs the direct call's autograd (`torch_ops.plain_eager`):
the same kernels, bit-identical gradients, no dispatcher layers. Through the operators
(`op.dispatched`, and whenever something traces or a mode is active: torch.compile runs these)
the step may run no aten op on a logits-sized tensor that the direct call does not (a copy,
`.contiguous()`, a clone, a dtype conversion of the logits or their gradient), and no fill
(a gradient materialised as zeros). Counted under a TorchDispatchMode that also runs the
operator's own custom ops inside it, so that what their implementations run is counted.
Cross-entropy's kernels and sizes are those test_op_saving compiles (the simulator's cache)."""
from __future__ import annotations

import contextlib
from collections import Counter

import torch
from torch.utils._pytree import tree_leaves

from .test_row_gather import cross_entropy_full

R, V = 4, 17000
ARGS = (0.1, 1e-3)


class Logged(torch.utils._python_dispatch.TorchDispatchMode):
    """(op, the largest numel it touches, whether it makes a tensor that aliases no input) of
    every op dispatched; the custom ops in `impls` (name -> implementation) run inside."""

    def __init__(self, impls):
        super().__init__()
        self.impls, self.ops = impls, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        impl = self.impls.get(func.name())
        if impl is not None:
            self.ops.append((func.name(), 0, False))
            with self:
                return impl(*args, **kwargs)
        out = func(*args, **kwargs)
        ins = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        seen = {t.untyped_storage().data_ptr() for t in ins}
        fresh = any(t.untyped_storage().data_ptr() not in seen for t in outs)
        if func.name().startswith(("aten::empty", "aten::new_empty")):   # an allocation:
            ins = []                    # its size is what it makes (`new_empty` of the logits
            name = "allocation"         # making a row buffer is not a pass over them)
        else:
            name = str(func)
        self.ops.append((name, max([t.numel() for t in ins + outs] or [0]), fresh))
        return out


def _step(fn, x, t, dy, mode=None):
    leaf = x.clone().requires_grad_()
    with mode or contextlib.nullcontext():
        return torch.autograd.grad(fn(leaf, t, *ARGS), leaf, dy)[0]


def _logged(fn, impls, x, t, dy):
    log = Logged(impls)
    return _step(fn, x, t, dy, log), log.ops


def test_operator_step_runs_no_pass_the_direct_call_does_not():
    g = torch.Generator().manual_seed(53)
    x = torch.randn(R, V, generator=g) * 3
    t = torch.randint(0, V, (R,), generator=g, dtype=torch.int32)
    dy = torch.randn(R, generator=g)
    op = cross_entropy_full.as_op("mf_test::xent_cost")
    impls = {f"{op.name}_saving": op._saving_impl, f"{op.name}_backward": op._backward_impl}

    direct = _step(cross_entropy_full, x, t, dy)
    eager = cross_entropy_full.as_op("mf_test::xent_cost")(x.clone().requires_grad_(), t, *ARGS)
    assert type(eager.grad_fn).__name__ == "_KernelFunctionBackward"   # the direct autograd
    assert torch.equal(_step(op, x, t, dy), direct)
    assert torch.equal(_step(op.dispatched, x, t, dy), direct)

    want, direct_ops = _logged(cross_entropy_full, impls, x, t, dy)
    got, op_ops = _logged(op, impls, x, t, dy)      # a mode is active: through the operators
    assert torch.equal(got, direct) and torch.equal(want, direct)
    assert f"{op.name}_saving" in [n for n, _, _ in op_ops]

    def passes(ops):        # what makes or computes a tensor of the logits' size
        return Counter(n for n, numel, fresh in ops if fresh and numel >= R * V)
    assert passes(direct_ops) == Counter({"allocation": 1})    # dx
    assert passes(op_ops) <= passes(direct_ops), (passes(op_ops), passes(direct_ops))
    fills = [n for n, _, _ in op_ops + direct_ops if "zero" in n or "fill" in n]
    assert fills == []


def test_plain_eager_only_where_nothing_traces_or_wraps():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from metalforge.torch_ops import plain_eager

    class Sub(torch.Tensor):
        pass
    x = torch.randn(3)
    assert plain_eager((x, 2.0)) and plain_eager((torch.nn.Parameter(x),))
    assert not plain_eager((torch.Tensor._make_subclass(Sub, x),))
    with Logged({}):
        assert not plain_eager((x,))
    with torch.device("cpu"):                    # a torch-function mode
        assert not plain_eager((x,))
    with FakeTensorMode() as fake:
        assert not plain_eager((fake.from_tensor(x),))
    seen = []
    torch.func.grad(lambda a: seen.append(plain_eager((a,))) or a.sum())(x)
    torch.func.vmap(lambda a: seen.append(plain_eager((a,))) or a)(x[None])
    assert seen == [False, False]
