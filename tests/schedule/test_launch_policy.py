"""Launch policy overrides: per kernel and per call site, their precedence, and host-side checks
that reject a bad configuration before anything is launched."""
from pathlib import Path

import pytest
import torch

import metalforge as mf
from metalforge.runtime import backends, launcher
from metalforge.schedule import policy
from metalforge.schedule.policy import LaunchError
from metalforge.testing import load_module
from metalforge.tuning import check_options, known_options


@mf.kernel
def axpb(x: "T[R, D]", w: "T[D]", b: float = 1.0):
    return x * w + b


def want(x, w, b=1.0):
    return x * w + b


class Spy:
    """Records each launch's policy and group size, and each compile."""

    def __init__(self, monkeypatch):
        self.launches, self.compiles = [], []
        real_bind, real_compile = launcher.bind, backends._compile

        def bind(call):
            bound = real_bind(call)
            self.launches.append((dict(call.spec.launch or {}), bound.group_size))
            return bound

        monkeypatch.setattr(launcher, "bind", bind)
        monkeypatch.setattr(backends, "_compile",
                            lambda b, s: self.compiles.append(s) or real_compile(b, s))


class CountingKernels:
    """Wraps compiled kernel objects: counts real launches; can report a lower pipeline limit."""

    def __init__(self, monkeypatch, max_threads=None, tg_bytes=None):
        self.calls = 0
        real = launcher.kernel_object
        outer = self

        class Wrapped:
            def __init__(self, k):
                self.k = k
                self.max_threads_per_threadgroup = max_threads or k.max_threads_per_threadgroup
                self.static_thread_group_memory_length = \
                    tg_bytes or k.static_thread_group_memory_length

            def __call__(self, *a, **kw):
                outer.calls += 1
                return self.k(*a, **kw)

        monkeypatch.setattr(launcher, "kernel_object", lambda *a: Wrapped(real(*a)))


def test_call_site_override_wins_and_shares_traces(monkeypatch):
    spy = Spy(monkeypatch)
    k = mf.kernel(axpb.fn, name="axpb_tuned", launch={"threads_per_group": 64, "vector_width": 2})
    x, w = torch.randn(3, 50), torch.randn(50)
    torch.testing.assert_close(k(x, w), want(x, w))
    view = k.with_launch(threads_per_group=32)
    torch.testing.assert_close(view(x, w, 2.0), want(x, w, 2.0))
    view2 = k.with_launch({"vectors_per_thread": 2}, vector_width=4)
    torch.testing.assert_close(view2(x, w), want(x, w))
    assert spy.launches == [
        ({"threads_per_group": 64, "vector_width": 2}, 64),    # 75 threads: 150 elements / 2
        ({"threads_per_group": 32, "vector_width": 2}, 32),    # call site over kernel
        ({"threads_per_group": 64, "vector_width": 4, "vectors_per_thread": 2}, 19)]  # 8 each
    assert k.launch == {"threads_per_group": 64, "vector_width": 2}       # kernel unchanged
    assert view._graphs is k._graphs and len(k._graphs) == 1               # one trace
    assert len(spy.compiles) == 2          # the threads-only change reused the first kernel


def test_threads_per_group_changes_do_not_recompile(monkeypatch):
    spy = Spy(monkeypatch)

    @mf.kernel
    def relu6(x: "T[N]"):
        return mf.clamp(x, 0.0, 6.0)

    x = torch.randn(1000) * 5
    for tpg in (32, 64, 128, 256, 512, 1024):
        torch.testing.assert_close(relu6.with_launch(threads_per_group=tpg)(x), x.clamp(0, 6))
    assert [g for _, g in spy.launches] == [32, 64, 128, 250, 250, 250]   # 250 threads in all
    assert len(spy.compiles) == 1


@pytest.mark.parametrize("options, match", [
    ({"threads_per_group": 2048}, "threads_per_group=2048 exceeds Metal's limit of 1024"),
    ({"threads_per_group": 0}, "threads_per_group must be a positive int, got 0"),
    ({"threads_per_group": "128"}, "threads_per_group must be a positive int, got '128'"),
    ({"vector_width": 3}, "vector_width must be 1, 2, 4 or 8, got 3"),
    ({"vectors_per_thread": True}, "vectors_per_thread must be a positive int, got True"),
    ({"index64": "yes"}, "index64 must be None, True or False"),
    ({"threads": 128}, r"unknown launch option\(s\) 'threads'; the options are: .*"
                       r"threads_per_group"),
])
def test_bad_overrides_raise_where_written(monkeypatch, options, match):
    kl = CountingKernels(monkeypatch)
    with pytest.raises(LaunchError, match=r"kernel 'axpb' \(.*test_launch_policy\.py:\d+\), "
                                          r"with_launch: " + match):
        axpb.with_launch(**options)
    with pytest.raises(LaunchError, match=r"kernel 'bad' .*test_launch_policy\.py:\d+\), "
                                          r"launch=: " + match):
        mf.kernel(axpb.fn, name="bad", launch=options)
    assert kl.calls == 0


def test_option_of_another_family_raises_at_the_call_before_launch(monkeypatch):
    # an option some family takes (rows_per_group: row reductions) passes the generic check,
    # and is refused, naming the kernel, once the kernel is known to be elementwise
    monkeypatch.setitem(policy.TUNABLE, "rows_family", ("threads_per_group", "rows_per_group"))
    assert "rows_per_group" in known_options()
    kl = CountingKernels(monkeypatch)
    view = axpb.with_launch(rows_per_group=4)
    x, w = torch.randn(2, 8), torch.randn(8)
    with pytest.raises(LaunchError, match=r"kernel 'axpb' \(.*\): launch option\(s\) "
                                          r"'rows_per_group' do not apply to a elementwise "
                                          r"kernel; it takes: threads_per_group, vector_width"):
        view(x, w)
    assert kl.calls == 0


def test_pipeline_limit_checked_before_launch(monkeypatch):
    kl = CountingKernels(monkeypatch, max_threads=128)

    @mf.kernel
    def heavy(x: "T[N]"):
        return mf.erf(x) * mf.tanh(x)

    x = torch.randn(600)
    with pytest.raises(LaunchError, match="threads_per_group=256 exceeds this pipeline's "
                                          "max_threads_per_threadgroup=128"):
        heavy(x)
    assert kl.calls == 0
    y = heavy.with_launch(threads_per_group=128)(x)             # within the limit: runs
    torch.testing.assert_close(y, torch.erf(x) * torch.tanh(x))
    assert kl.calls == 1


def test_threadgroup_memory_checked_before_launch(monkeypatch):
    kl = CountingKernels(monkeypatch, tg_bytes=40000)   # as if the pipeline declared 40 KB

    @mf.kernel
    def sq(x: "T[N]"):
        return x * x

    with pytest.raises(LaunchError, match=r"kernel sq_f32: 40000 bytes of threadgroup memory, "
                                          r"over the 32768-byte limit"):
        sq(torch.randn(10))
    assert kl.calls == 0


def test_group_size_checked_on_every_launch(monkeypatch):
    kl = CountingKernels(monkeypatch)

    @mf.kernel
    def neg(x: "T[N]"):
        return -x

    x = torch.randn(4000)
    torch.testing.assert_close(neg(x), -x)
    # the pipeline limit the launcher recorded shrinks (as if another device's pipeline):
    # the next launch is refused before it reaches the kernel
    spec = launcher.specialisation(neg.graph(x), None)
    (lib,) = spec._libraries.values()
    (host,) = lib.kernels
    lib.kernels[host] = launcher.Compiled(lib.kernels[host].kernel, 128)
    with pytest.raises(LaunchError, match=r"kernel 'neg' .*threadgroup of 256 threads, but "
                                          r"this pipeline allows 1 to 128"):
        neg(x)
    assert kl.calls == 1


def test_check_options_passes_good_values_through():
    assert check_options({"threads_per_group": 64, "vector_width": 1}, "here") == \
        {"threads_per_group": 64, "vector_width": 1}
    with pytest.raises(LaunchError, match="here: launch options must be a dict"):
        check_options([("threads_per_group", 64)], "here")


def test_reduction_policies_refused_before_launch(monkeypatch):
    examples = Path(__file__).resolve().parents[2] / "examples"
    rms_norm = load_module(examples / "rms_norm.py").rms_norm
    column_sum = load_module(examples / "column_sum.py").column_sum
    kl = CountingKernels(monkeypatch)
    x, w = torch.randn(4, 40), torch.randn(40)
    with pytest.raises(LaunchError, match=r"kernel 'rms_norm' .*threads_per_group=100 must be "
                                          r"a multiple of 32: the kernel uses simdgroup"):
        rms_norm.with_launch(threads_per_group=100)(x, w)
    with pytest.raises(LaunchError, match=r"kernel 'column_sum' .*threads_per_group=128 must "
                                          r"equal 32 columns x rows_per_group=8"):
        column_sum.with_launch(threads_per_group=128)(x)
    with pytest.raises(LaunchError, match=r"'simd_reads_per_thread' do not apply to a column "
                                          r"kernel"):
        column_sum.with_launch(simd_reads_per_thread=2)(x)
    with pytest.raises(LaunchError, match=r"vector_width=8: adjacent columns a thread of the "
                                          r"wide kernel takes .* at most 4"):
        column_sum.with_launch(vector_width=8)(x)
    assert kl.calls == 0
    got = column_sum.with_launch(threads_per_group=128, rows_per_group=4)(x)
    torch.testing.assert_close(got, x.sum(0), rtol=1e-5, atol=1e-5)
    assert kl.calls == 1


def test_backend_policies_are_valid_options_of_their_families():
    """Each backend's changes to the table name options its family takes and resolve to a
    valid policy (they are applied without a user to blame for a bad one); a backend or
    family without an entry changes nothing."""
    from metalforge.runtime.backends import DEVICE_OF
    for backend, families in policy.BACKEND_POLICIES.items():
        assert backend in DEVICE_OF, backend
        for family, options in families.items():
            assert set(options) <= set(policy.TUNABLE[family]), (backend, family)
            policy.resolve(family, options)
            assert policy.backend_launch(backend, family) == options
    assert policy.backend_launch("sim", "row") is None
    assert policy.backend_launch("cuda", "column") is None
    assert policy.backend_launch("cuda", "row") == {"stage_rows": None,    # per call
                                                    "fill_groups": 128}   # few rows split
