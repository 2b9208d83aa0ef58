"""Reductions over several axes in one kernel (schedule/multiaxis): group norm and instance
norm against torch.nn.functional, full reductions of every kind (NaN included), softmax over
two axes, batch-norm statistics over axes split by the kept one, the split of long rows into
chunks (deterministic: the same bits every run), refusals, and `check` on group norm."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import metalforge as mf
from metalforge import schedule
from metalforge.runtime import schedule_of
from metalforge.testing import check


def group_norm_fn(x: "T[N, G, C, H, W]", w: "T[G, C]", b: "T[G, C]", eps: float = 1e-5):
    mean = mf.mean(x, axis=("C", "H", "W"))
    d = x - mean
    var = mf.mean(d * d, axis=("C", "H", "W"))
    return d * mf.rsqrt(var + eps) * w + b


group_norm = mf.kernel(group_norm_fn, name="group_norm")
# the same kernel where every call takes one threadgroup per row, however few the rows
group_norm_whole = mf.kernel(group_norm_fn, name="group_norm", launch={"fill_groups": 0})


@mf.kernel
def instance_norm(x: "T[N, C, H, W]", eps: float = 1e-5):
    mean = mf.mean(x, axis=("H", "W"))
    d = x - mean
    return d * mf.rsqrt(mf.mean(d * d, axis=("H", "W")) + eps)


@mf.kernel
def every_kind(x: "T[A, B, C]"):
    return (mf.sum(x, axis=None), mf.max(x, axis=None), mf.min(x, axis=("A", "B", "C")),
            mf.mean(x, axis=None), mf.prod(x, axis=None))


@mf.kernel
def full_sum(x: "T[R, D]"):
    return mf.sum(x, axis=("R", "D"))


@mf.kernel
def softmax_hw(x: "T[N, H, W]"):
    return mf.softmax(x, axis=("H", "W")), mf.logsumexp(x, axis=("H", "W"))


@mf.kernel
def channel_stats(x: "T[N, C, H, W]"):
    mean = mf.mean(x, axis=("N", "H", "W"))
    d = x - mean
    return mean, mf.mean(d * d, axis=("N", "H", "W"))


TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float16: dict(rtol=2e-3, atol=4e-3),
       torch.bfloat16: dict(rtol=1.6e-2, atol=3e-2)}


def torch_group_norm(x, w, b, groups):
    return F.group_norm(x.float(), groups, w.float(), b.float(), eps=1e-5)


def run_group_norm(kernel, x, w, b, groups):
    n, c, h, wd = x.shape
    y = kernel(x.view(n, groups, c // groups, h, wd), w.view(groups, c // groups),
               b.view(groups, c // groups))
    return y.view(n, c, h, wd)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_group_norm_matches_torch(dtype):
    g = torch.Generator().manual_seed(0)
    # odd sizes; one group per channel; one-sized spatial axes; rows of two elements; W a
    # multiple of 4 (the vector walk)
    for n, c, h, wd, groups in ((2, 6, 5, 7, 3), (1, 4, 3, 1, 4), (3, 8, 1, 1, 2),
                                (1, 3, 1, 2, 3), (2, 6, 3, 8, 3)):
        x = (torch.randn(n, c, h, wd, generator=g) * 2 + 0.5).to(dtype)
        w, b = torch.randn(c, generator=g).to(dtype), torch.randn(c, generator=g).to(dtype)
        got = run_group_norm(group_norm, x, w, b, groups)
        assert got.dtype == dtype
        torch.testing.assert_close(got.float(), torch_group_norm(x, w, b, groups), **TOL[dtype])


def test_long_rows_split_into_chunks_and_merge_the_same_every_run():
    # one row of 2 * 40 * 400 = 32000 elements: three chunks (of at least chunk_rows 8192,
    # a whole number of 512-thread steps: 10752, the last one shorter)
    x = torch.randn(1, 2, 40, 400) * 3 + 1
    w, b = torch.randn(2), torch.randn(2)
    sizes = {"N": 1, "G": 1, "C": 2, "H": 40, "W": 400}
    s = schedule_of(group_norm.graph(T="f32"), sizes=sizes)
    assert s.family == "multiaxis" and s.chunks(sizes) == 3
    assert [st.host_name.split("_")[-1] for st in s.steps(sizes)] == [
        "part0", "merge0", "part1", "merge1", "out"]
    first = run_group_norm(group_norm, x, w, b, 1)
    torch.testing.assert_close(first, torch_group_norm(x, w, b, 1), rtol=1e-5, atol=1e-5)
    assert torch.equal(first, run_group_norm(group_norm, x, w, b, 1))        # bit for bit
    # the same rows in one threadgroup each (one launch) agree to rounding
    whole = run_group_norm(group_norm_whole, x, w, b, 1)
    torch.testing.assert_close(whole, first, rtol=1e-5, atol=1e-5)


@mf.kernel
def vector_max(x: "T[N]"):
    return mf.max(x, axis="N")            # one axis, one value: split like a full reduction


def test_full_sum_of_a_long_tensor_is_deterministic():
    x = torch.randn(700, 300) + 0.25                   # 210000 elements: 25 chunks
    got = full_sum(x)
    assert got.shape == () and torch.equal(got, full_sum(x))
    torch.testing.assert_close(got, x.double().sum().float(), rtol=1e-6, atol=1e-3)
    v = torch.randn(30001)
    v[20000] = 9.0
    assert schedule.family(vector_max.graph(T="f32")) == "multiaxis"
    assert vector_max(v) == 9.0 and vector_max(v[:20000]) == v[:20000].max()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_instance_norm_matches_torch(dtype):
    x = torch.randn(3, 5, 9, 11, generator=torch.Generator().manual_seed(1)).to(dtype)
    torch.testing.assert_close(instance_norm(x).float(), F.instance_norm(x.float()),
                               **TOL[dtype])


def test_every_kind_over_every_axis_and_nan():
    x = torch.rand(3, 5, 7, generator=torch.Generator().manual_seed(2)) + 0.5
    want = (x.sum(), x.amax(), x.amin(), x.mean(), x.double().prod().float())
    for got, ref in zip(every_kind(x), want):
        assert got.shape == ()
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
    x[1, 2, 3] = float("nan")
    for got in every_kind(x):
        assert got.isnan()
    h = x.half()
    h[1, 2, 3] = -float("inf")
    s, mx, mn, _, _ = every_kind(h)
    assert mn == -float("inf") and mx == h.amax() and s.dtype == torch.float16
    torch.testing.assert_close(s.float(), h.float().sum().half().float())


def test_empty_axes_and_rows():
    assert full_sum(torch.randn(0, 5)) == 0                          # an empty sum is 0
    with pytest.raises(mf.ShapeError, match=r"mf.max.*over an empty axis \(B = 0\)"):
        every_kind(torch.randn(3, 0, 2))
    x = torch.randn(0, 2, 3, 4, 5)                                   # no rows: no launch
    assert group_norm(x, torch.randn(2, 3), torch.randn(2, 3)).shape == x.shape


def test_softmax_and_logsumexp_over_two_axes():
    # small rows; one row of 16900 elements in two chunks (the online max and sum merged)
    for x in (torch.randn(2, 6, 9) * 4, torch.randn(1, 130, 130) * 4):
        p, lse = softmax_hw(x)
        torch.testing.assert_close(p, torch.softmax(x.flatten(1), dim=1).view_as(x),
                                   rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(lse, torch.logsumexp(x, dim=(1, 2)), rtol=1e-5, atol=1e-5)


def test_statistics_over_axes_the_kept_one_splits():
    # batch norm's statistics: (N, H, W) of x[N, C, H, W] are not one contiguous run
    x = torch.randn(4, 3, 5, 6, dtype=torch.float16) * 2 + 1
    mean, var = channel_stats(x)
    xf = x.float()
    torch.testing.assert_close(mean.float(), xf.mean(dim=(0, 2, 3)), rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(var.float(), xf.var(dim=(0, 2, 3), unbiased=False), rtol=1e-3,
                               atol=1e-3)


def test_refusals_name_the_construct():
    with pytest.raises(mf.TraceError, match=r"argmax reduces one axis; the flat index"):
        @mf.kernel
        def flat_argmax(x: "T[R, D]"):
            return mf.argmax(x, axis=("R", "D"))
        flat_argmax.graph(T="f32")

    @mf.kernel
    def int_sum(x: "i32[R, D]"):
        return mf.sum(x, axis=("R", "D"))
    with pytest.raises(mf.UnsupportedConstruct, match="integer sums"):
        schedule.plan(int_sum.graph())


def test_check_group_norm():
    report = check(group_norm_whole, dtypes={"T": ["f16"]}, max_examples=4)
    assert report.examples > 0
    print(report.coverage())
