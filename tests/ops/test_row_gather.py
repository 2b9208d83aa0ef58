"""Gathers of one value per row (or column) in reductions: cross-entropy as users write it
(plain, label smoothing, z-loss, ignored rows), its backward by hand and derived, a column
reduction's per-column gather, against torch computed directly; index errors; `check`."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import metalforge as mf
from metalforge import runtime
from metalforge.shapes import bind_shapes
from metalforge.testing import check


@mf.kernel
def cross_entropy_full(logits: "T[R, V]", target: "i32[R]", smoothing: float = 0.0,
                       z_loss: float = 0.0, ignore_index: int = -100) -> "T[R]":
    lse = mf.logsumexp(logits, axis="V")
    ignored = target == ignore_index
    x_t = mf.take(logits, axis="V", index=mf.where(ignored, 0, target))   # clamped
    loss = ((1 - smoothing) * (lse - x_t) + smoothing * (lse - mf.mean(logits, axis="V"))
            + z_loss * lse * lse)
    return mf.where(ignored, 0.0, loss)


@mf.kernel
def cross_entropy_backward(logits: "T[R, V]", target: "i32[R]", grad: "T[R]") -> "T[R, V]":
    one_hot = mf.where(mf.index("V") == target, 1.0, 0.0)
    return ((mf.softmax(logits, axis="V") - one_hot) * grad).to("T")


@mf.kernel
def cross_entropy_fused(logits: "T[R, V]", target: "i32[R]", scale: float = 1.0):
    lse = mf.logsumexp(logits, axis="V")
    loss = lse - mf.take(logits, axis="V", index=target)
    one_hot = mf.where(mf.index("V") == target, 1.0, 0.0)
    return loss, ((mf.exp(logits - lse) - one_hot) * scale).to("T")


def column_nll_fn(x: "T[N, C]", target: "i32[C]") -> "T[C]":
    return mf.logsumexp(x, axis="N") - mf.take(x, axis="N", index=target)


column_nll = mf.kernel(column_nll_fn, name="column_nll", launch={"fill_groups": 0})
# the long axis split into chunks: partials to scratch, the combine kernel gathers
column_nll_chunked = mf.kernel(column_nll_fn, name="column_nll", launch={"fill_groups": 64})


TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float16: dict(rtol=2e-3, atol=4e-3),
       torch.bfloat16: dict(rtol=1.6e-2, atol=3e-2)}


def torch_loss(x, t, smoothing=0.0, z_loss=0.0):
    """F.cross_entropy in f32 on the same values, plus the z-loss where not ignored."""
    xf = x.float()
    loss = F.cross_entropy(xf, t.long(), reduction="none", label_smoothing=smoothing)
    return loss + z_loss * torch.logsumexp(xf, -1) ** 2 * (t != -100)


def inputs(rows, v, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, v, generator=g) * 3).to(dtype)
    t = torch.randint(0, v, (rows,), generator=g, dtype=torch.int32)
    t[0], t[-1] = v - 1, 0                       # the row's last and first element
    return x, t


# V: one element, around a simdgroup's rows (31, 33), a threadgroup's row, and rows longer than
# a threadgroup holds (the looped kernel, one online pass: f32 above 8192, f16/bf16 above 16384)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("v", [1, 31, 33, 3000, 17000])
def test_cross_entropy_matches_torch(dtype, v):
    x, t = inputs(5, v, dtype, v)
    tol = TOL[dtype]
    torch.testing.assert_close(cross_entropy_full(x, t).float(), torch_loss(x, t), **tol)
    t[2] = -100                                  # ignored row
    for eps, z in ((0.1, 0.0), (0.0, 1e-3), (0.2, 1e-4)):
        torch.testing.assert_close(cross_entropy_full(x, t, eps, z).float(),
                                   torch_loss(x, t, eps, z), **tol)


@pytest.mark.parametrize("v", [33, 17000])
def test_backward_by_hand_is_one_row_kernel(v):
    x, t = inputs(4, v, torch.float32, v + 1)
    g = torch.randn(4, generator=torch.Generator().manual_seed(v))
    xr = x.clone().requires_grad_()
    F.cross_entropy(xr, t.long(), reduction="none").backward(g)
    torch.testing.assert_close(cross_entropy_backward(x, t, g), xr.grad, rtol=1e-5, atol=1e-6)
    assert runtime.schedule_of(cross_entropy_backward.graph(x, t, g),
                               {"logits": x, "target": t, "grad": g}).family == "row"


@pytest.mark.parametrize("v", [33, 17000])
def test_loss_and_gradient_in_one_kernel(v):
    x, t = inputs(4, v, torch.float32, v + 3)
    xr = x.clone().requires_grad_()
    want = F.cross_entropy(xr, t.long(), reduction="none")
    want.backward(torch.full((4,), 0.25))
    ce_op = cross_entropy_fused.as_op("mf_test_row_gather::cross_entropy_fused")
    for fn in (cross_entropy_fused, ce_op):
        loss, dx = fn(x, t, 0.25)
        torch.testing.assert_close(loss, want.detach())
        torch.testing.assert_close(dx, xr.grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("v", [33, 3000])
def test_derived_gradient_matches_torch(v):
    x, t = inputs(6, v, torch.float32, v + 2)
    t[3] = -100
    g = torch.randn(6, generator=torch.Generator().manual_seed(v))
    xa = x.clone().requires_grad_()
    cross_entropy_full(xa, t, 0.1, 1e-3).backward(g)
    xb = x.clone().requires_grad_()
    torch_loss(xb, t, 0.1, 1e-3).backward(g)
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-5, atol=1e-6)


def test_gradient_through_other_gathers_is_refused():
    @mf.kernel
    def by_position(x: "T[R, V]", i: "i32[V]"):
        return mf.sum(mf.take(x, axis="V", index=i), axis="V")   # a permutation: scatter-add
    with pytest.raises(mf.MetalforgeError, match="scatter-add"):
        by_position(torch.randn(2, 3, requires_grad=True), torch.zeros(3, dtype=torch.int32))


@pytest.mark.parametrize("v", [31, 17000])
def test_target_out_of_range_raises(v):
    x, t = inputs(3, v, torch.float32, 0)
    for bad in (v, -1, -101):        # -100 is the ignored rows' target
        t[1] = bad
        with pytest.raises(mf.GatherIndexError, match=f"along 'V' .*index {bad} is out"):
            cross_entropy_full(x, t)
        with pytest.raises(mf.GatherIndexError, match=f"index {bad} is out of range"):
            cross_entropy_full.reference(x, t)
    t[1] = 0
    torch.testing.assert_close(cross_entropy_full(x, t), torch_loss(x, t))   # report cleared


def test_gathered_element_read_once_per_row():
    x, t = inputs(3, 100, torch.float32, 1)
    src = cross_entropy_full.source(x, t)
    # the epilogue, in the row's first thread only, checks the index and reads the element
    epilogue = src.split("epilogue: the row's results, computed and stored by its first")[1]
    assert "if (mf_t == 0u) {" in epilogue.splitlines()[1]
    g = cross_entropy_full.graph(x, t)
    s = runtime.schedule_of(g, {"logits": x, "target": t})
    sizes = bind_shapes(g, {"logits": x, "target": t}).sizes
    # the rows, the targets, one gathered element per row, the losses
    assert s.traffic(sizes).read == 3 * 100 * 4 + 3 * 4 + 3 * 4
    assert s.traffic(sizes).written == 3 * 4
    assert s.passes["looped"] == {"logits": 1}     # long rows: one online pass, no softmax


@mf.kernel
def lse(x: "T[R, D]"):
    return mf.logsumexp(x, axis="D")


@pytest.mark.parametrize("d", [100, 20000])         # rows in registers; one online pass
def test_logsumexp_special_values(d):
    inf, nan = float("inf"), float("nan")
    x = torch.randn(7, d, generator=torch.Generator().manual_seed(d))
    x[0] = -inf
    x[1, 5] = inf
    x[2, 7] = nan
    x[3, 3], x[3, 9] = inf, nan
    x[4], x[4, d - 1] = -inf, 2.0
    x[5, 1], x[5, d - 2] = inf, -inf
    x[6] = inf
    torch.testing.assert_close(lse(x), torch.logsumexp(x, -1), equal_nan=True)


@mf.kernel
def inverse_p(x: "T[R, V]", t: "i32[R]"):
    return mf.sum(mf.exp(x - mf.take(x, axis="V", index=t)), axis="V")   # 1 / softmax(x)[t]


@pytest.mark.parametrize("v", [33, 3000, 17000])   # the gathered value before the reduction
def test_per_row_gather_inside_the_reduced_values(v):
    x, t = inputs(3, v, torch.float32, v + 4)
    want = torch.exp(x - x.gather(1, t.long()[:, None])).sum(-1)
    torch.testing.assert_close(inverse_p(x, t), want, rtol=1e-5, atol=0)


# one thread per column; the split kernel, one chunk or several (then the combine kernel)
@pytest.mark.parametrize("n, k", [(3, column_nll), (5000, column_nll),
                                  (5000, column_nll_chunked)])
def test_column_reduction_gathers_one_value_per_column(n, k):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, 37, generator=g)
    t = torch.randint(0, n, (37,), generator=g, dtype=torch.int32)
    want = torch.logsumexp(x, 0) - x.gather(0, t.long()[None])[0]
    torch.testing.assert_close(k(x, t), want)
    assert len(k.launches(x, t)) == (2 if k is column_nll_chunked else 1)
    t[36] = n
    with pytest.raises(mf.GatherIndexError, match=f"along 'N' .*index {n} is out"):
        k(x, t)


def test_check_cross_entropy():
    # ignore_index -1: check's index -1 is then clamped by the kernel, which must not refuse it
    report = check(cross_entropy_full, dtypes={"T": ["bf16"]}, max_examples=3,
                   values={"ignore_index": [-100, -1]})
    assert any("looped" in i.host_name and i.launches for i in report.instantiations)
