"""Row reductions, issue #54: few long rows split over several threadgroups (launch option
fill_groups, the `split` and `finish` kernels) and the values a later phase recomputes instead
of holding in fp32 registers (keep_narrow). Through the simulator, against torch computed
directly (float64)."""
import math

import pytest
import torch
import torch.nn.functional as F

import metalforge as mf
from metalforge import runtime
from metalforge.errors import LaunchError

INF = math.inf
# 3 rows of 5000 at 256 threads x 4 values: 5 chunks of 1024 a row; fill_groups 8 asks for
# 3 slices a row (chunks 0-1, 2-3 and the partial 4)
SPLIT = dict(fill_groups=8, threads_per_group=256, looped_limit=2048)
CENTERED = dict(SPLIT, centered=True)


@mf.kernel
def stats(x: "T[R, D]", w: "T[D]"):                 # one pass: online pair, sum, argmax
    y = mf.softmax(x, axis="D")
    return (y, mf.logsumexp(x, axis="D"), mf.argmax(x, axis="D"),
            x * mf.rsqrt(mf.mean(x * x, axis="D") + 1e-6) * w)


@mf.kernel
def add_norm(x: "T[R, D]", r: "T[R, D]", w: "T[D]"):
    h = x + r
    return h, h * mf.rsqrt(mf.mean(h * h, axis="D") + 1e-6) * w


@mf.kernel
def layer_norm(x: "T[R, D]"):
    mu = mf.mean(x, axis="D")
    d = x - mu
    return d * mf.rsqrt(mf.mean(d * d, axis="D") + 1e-5)


@mf.kernel
def softmax_t(x: "T[R, D]", t: float = 1.0):
    return mf.softmax(x / t, axis="D")


def hosts(kernel, *args):
    return [h for h, _, _ in kernel.launches(*args)]


def test_few_long_rows_split_over_threadgroups_match_torch():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 5000, generator=g) * 4
    x[0, :2100] = -INF                    # the first slice's partial is empty: (-inf, 0)
    x[1, 4500] = 50.0                     # the max and argmax in the last, partial, slice
    x[2, 100] = x[2, 3000] = 60.0         # a tie across slices: the first index
    w = torch.randn(5000, generator=g)
    k = stats.with_launch(**SPLIT)
    assert hosts(k, x, w) == ["stats_f32_split", "stats_f32_finish"]
    y, lse, am, rms = k(x, w)
    xd = x.double()
    torch.testing.assert_close(y, torch.softmax(xd, -1).float(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lse, torch.logsumexp(xd, -1).float(), rtol=1e-5, atol=1e-5)
    assert am.tolist() == torch.argmax(x, -1).tolist() and am.tolist()[1:] == [4500, 100]
    want = xd * torch.rsqrt((xd * xd).mean(-1, keepdim=True) + 1e-6) * w.double()
    torch.testing.assert_close(rms, want.float(), rtol=1e-5, atol=1e-5, equal_nan=True)
    # fill_groups 0 (the Metal table's): one looped launch
    plain = stats.with_launch(fill_groups=0, threads_per_group=256, looped_limit=2048)
    s = runtime.schedule_of(stats.graph(x, w), {"x": x, "w": w}, launch=plain.launch)
    assert [st.host_name for st in s.steps({"R": 3, "D": 5000})] == ["stats_f32_looped"]


def test_split_rows_slices_scratch_and_traffic():
    x = torch.randn(2, 9000).half()
    w = torch.randn(9000).half()
    k = add_norm.with_launch(**SPLIT)
    s = runtime.schedule_of(add_norm.graph(x, x, w), {"x": x, "r": x, "w": w},
                            launch=k.launch)
    sizes = {"R": 2, "D": 9000}              # 9 chunks of 1024 a row, 4 slices asked
    assert s.slices(sizes) == 3 and s.scratch_floats(sizes) == 2 * 3 * 1
    assert [st.host_name for st in s.steps(sizes)] == ["add_norm_f16_split",
                                                       "add_norm_f16_finish"]
    assert all(st.threads == 2 * 3 * 256 for st in s.steps(sizes))
    # x and r read by both launches, h and y written once: the looped kernel's count
    assert s.traffic(sizes, "split").total == s.traffic(sizes, "looped").total
    assert s.slices({"R": 8, "D": 9000}) == 1            # rows enough to fill the groups
    assert s.slices({"R": 2, "D": 2048}) == 1            # not the looped kernel's rows


@mf.kernel
def spread(x: "T[R, D]"):                 # squares around the max: no sum to pair them with
    d = x - mf.max(x, axis="D")
    return d * mf.rsqrt(mf.mean(d * d, axis="D") + 1e-5)


@mf.kernel
def centers(x: "T[R, D]", a: float):      # squares around the mean and around a * sum
    s = mf.sum(x, axis="D")
    m = mf.mean(x, axis="D")
    return mf.sum((x - m) * (x - m), axis="D"), mf.sum((x - a * s) ** 2, axis="D"), s


@pytest.mark.parametrize("launch", [dict(SPLIT, centered=False), SPLIT, CENTERED],
                         ids=["two_passes", "default", "centered"])
def test_layer_norm_split_rows(launch):
    """layer_norm's mean, then the variance around it: with centered=False a launch per phase
    (the second merges the first's partials), then the finish; by default and with
    centered=True both in one pass (count, shift, shifted sum and squares, merged slice by
    slice), the looped kernel centered only where asked; a mean far from 0, where squares
    around 0 would cancel; against torch."""
    g = torch.Generator().manual_seed(8)
    x = torch.randn(2, 9000, generator=g) * 3 + 1000.0
    k = layer_norm.with_launch(**launch)
    centered = launch.get("centered")
    passes = ["split", "split_2", "finish"] if centered is False else ["split", "finish"]
    assert hosts(k, x) == [f"layer_norm_f32_{p}" for p in passes]
    xd = x.double()
    torch.testing.assert_close(k(x), F.layer_norm(xd, (9000,), eps=1e-5).float(),
                               rtol=1e-4, atol=1e-4)
    s = runtime.schedule_of(layer_norm.graph(x), {"x": x}, launch=k.launch)
    sizes = {"R": 2, "D": 9000}
    looped = len(passes) if centered is not None else 3
    assert s.passes["looped"] == {"x": looped}
    if looped == len(passes):
        assert s.traffic(sizes, "split").total == s.traffic(sizes, "looped").total


def test_two_phase_rows_split_one_launch_per_phase():
    """Squares around the max (no sum to pair them with, even with `centered`): a launch per
    phase, then the finish; against torch."""
    x = torch.randn(2, 9000, generator=torch.Generator().manual_seed(9)) * 3 + 100.0
    k = spread.with_launch(**CENTERED)
    assert hosts(k, x) == ["spread_f32_split", "spread_f32_split_2", "spread_f32_finish"]
    d = x.double() - x.double().amax(-1, keepdim=True)
    want = d * torch.rsqrt((d * d).mean(-1, keepdim=True) + 1e-5)
    torch.testing.assert_close(k(x), want.float(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("launch", [dict(CENTERED, fill_groups=0), CENTERED],
                         ids=["looped", "split"])
def test_centered_pairs_match_two_passes(launch):
    """A centered pair's squares, sum((x - c)^2) = q + n (mean - c)^2, against float64 two
    passes: around the mean (1e4 away from 0, std 1: squares around 0 would lose every digit;
    std 0.01), around a * sum (far from the mean), rows with inf, NaN, both infinities, zeros,
    an outlier as the first element (every thread's and lane's shift), and a partial chunk
    (5000 = 4 x 1024 + 904)."""
    g = torch.Generator().manual_seed(10)
    x = torch.randn(7, 5000, generator=g) + 1e4           # 7 rows: fewer than fill_groups
    x[1, 77] = INF
    x[2, 4999] = math.nan
    x[3, 5], x[3, 4000] = INF, -INF
    x[4] = 0.0
    x[5] = torch.randn(5000, generator=g) * 0.01 + 1e4
    x[6, 0] = 1e6
    k = centers.with_launch(**launch)
    assert len(hosts(k, x, 0.5)) == (1 if launch["fill_groups"] == 0 else 2)
    sched = runtime.schedule_of(centers.graph(x, 0.5), {"x": x, "a": 0.5}, launch=k.launch)
    assert sched.passes["looped"] == {"x": 1}              # both squares ride along with a sum
    around_mean, around_half_sum, s = k(x, 0.5)
    xd = x.double()
    sd = xd.sum(-1, keepdim=True)
    want_mean = ((xd - sd / 5000) ** 2).sum(-1)
    want_half = ((xd - 0.5 * sd) ** 2).sum(-1)
    torch.testing.assert_close(s, sd.squeeze(-1).float(), rtol=1e-6, atol=1e-3, equal_nan=True)
    torch.testing.assert_close(around_mean, want_mean.float(), rtol=1e-5, atol=1e-6,
                               equal_nan=True)
    torch.testing.assert_close(around_half_sum, want_half.float(), rtol=1e-5, atol=1e-6,
                               equal_nan=True)


@mf.kernel
def batched(x: "T[*B, D]"):
    return mf.softmax(x, axis="D")


@mf.kernel
def extremes(x: "T[R, D]"):
    return mf.max(x, axis="D"), mf.min(x, axis="D"), mf.sum(x, axis="D")


@pytest.mark.parametrize("fill", [0, 8], ids=["looped", "split"])
def test_streamed_rows_fold_each_chunk_once(fill):
    """The streamed kernels fold a chunk of a thread's elements once: a sum's values added in
    plain fp32 first, then one compensated add; a max / min's with fmax / fmin, a NaN among
    them put back. NaN, inf and -inf anywhere in a chunk, and a row of -inf, as torch gives."""
    k = extremes.with_launch(looped_limit=256, threads_per_group=64, fill_groups=fill)
    x = torch.randn(6, 1000, generator=torch.Generator().manual_seed(3))
    x[1, 517] = math.nan
    x[2, 3] = INF
    x[3, 999] = -INF
    x[4, 100], x[4, 101] = math.nan, INF
    x[5] = -INF
    assert hosts(k, x)[0] == ("extremes_f32_split" if fill else "extremes_f32_looped")
    src = k.source(x)
    assert "// fold the chunk into its max and its min and its sum at once" in src
    mx, mn, sm = k(x)
    torch.testing.assert_close(mx, x.amax(-1), equal_nan=True)
    torch.testing.assert_close(mn, x.amin(-1), equal_nan=True)
    torch.testing.assert_close(sm, x.double().sum(-1).float(), equal_nan=True, rtol=1e-6,
                               atol=1e-5)


def test_check_pins_rows_enough_for_the_looped_kernel():
    """With split kernels built, few rows never reach the looped kernel: `check` runs it at
    fill_groups rows (a batch axis by its leading shape) and the shortest looped row."""
    x = torch.randn(2, 100)
    for kernel, rows in ((stats, 8), (batched, (8,))):
        args = (x, x[0]) if kernel is stats else (x,)
        k = kernel.with_launch(**SPLIT)
        g = kernel.graph(*args)
        s = runtime.schedule_of(g, {p.name: a for p, a in zip(g.params, args)},
                                launch=k.launch)
        axis = s.rows[0]
        assert s.selecting(s.variants["looped"].host_name) == [{axis: rows, "D": 2049}]
        assert s.selecting(s.variants["split"].host_name) == []


def test_fill_groups_is_checked():
    x = torch.randn(2, 100)
    with pytest.raises(LaunchError, match="fill_groups"):
        stats.with_launch(fill_groups=-1)(x, x[0])


@pytest.mark.parametrize("keep", [False, True])
def test_softmax_of_a_scaled_f16_row_recomputes_the_scaled_value(keep):
    """keep_narrow=False (default): x / t is recomputed from x's registers in the sum's phase,
    not held in an fp32 block (twice the registers of x's half block); True: held."""
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(3, 1000, generator=g) * 3).half()
    k = softmax_t.with_launch(keep_narrow=keep)
    src = k.source(x, 0.7)
    group = src[src.index("kernel void mf_softmax_t_group"):]
    group = group[:group.index("template [[host_name")]
    assert ("mf_keep1" in group) == keep
    assert "mf_keep2" in group                    # exp(x / t - max): kept either way
    if not keep:                 # (the kept path is every f32 kernel's, run in test_reductions)
        y = k(x, 0.7)
        torch.testing.assert_close(y, torch.softmax(x.double() / 0.7, -1).half(), rtol=2e-3,
                                   atol=2e-4)
    # f32 rows: holding x / t costs no more registers than x: kept
    assert "mf_keep1" in softmax_t.source(x.float(), 0.7)


def test_cuda_builds_the_staged_kernel_and_the_split_kernels():
    x = torch.randn(2, 16384, dtype=torch.float16)
    with runtime.backend("cuda"):
        src = softmax_t.source(x, 0.5)
    assert "kernel void mf_softmax_t_staged" in src
    assert "kernel void mf_softmax_t_split" in src and "kernel void mf_softmax_t_finish" in src
