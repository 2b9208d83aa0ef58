"""The warm call's host cost, kept without losing a check: the replay launches through the
backend's planned launch (`CudaFunction.planned`, stood in for here by one over the simulator's
kernel, which checks that each replayed call is the kind of call it was planned for), and
checked gather calls reuse a zeroed report instead of zeroing one per call."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import metalforge as mf
from metalforge.runtime import backends, launcher
from metalforge.runtime.indexcheck import CLEAN

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from paged_kv_gather import paged_gather  # noqa: E402
from rms_norm import rms_norm  # noqa: E402


class Planned:
    """A simulator kernel with a `planned` launch, like metalforge.cuda's: `planned(*args,
    threads=, group_size=, arg_casts=)` returns a function of the next call's arguments alone.
    Each launch through it must pass arguments of the planned kinds (type, dtype, device, dim
    of each tensor; type of each scalar), as the cuda plan's key would require."""

    def __init__(self, kernel):
        self._kernel = kernel
        self.runs = 0

    def __getattr__(self, name):
        return getattr(self._kernel, name)

    def __call__(self, *args, **kw):
        return self._kernel(*args, **kw)

    def planned(self, *args, threads, group_size, arg_casts=None):
        kinds = [_kind(a) for a in args]

        def run(*now):
            assert [_kind(a) for a in now] == kinds, "a replay passed other kinds of arguments"
            self.runs += 1
            self._kernel(*now, threads=threads, group_size=group_size, arg_casts=arg_casts)
        return run


def _kind(a):
    if isinstance(a, torch.Tensor):
        return (type(a), a.dtype, a.device, a.dim())
    return type(a)


@pytest.fixture
def planned(monkeypatch):
    made: dict[int, Planned] = {}
    real = backends.kernel_object

    def kernel_object(backend_name, source, host_name, options=()):
        k = real(backend_name, source, host_name, options)
        return made.setdefault(id(k), Planned(k))
    monkeypatch.setattr(launcher, "kernel_object", kernel_object)
    return made


def test_the_warm_replay_launches_through_the_planned_launch(planned):
    """First call: the full path (the kernel's own call); later calls with the same key: the
    planned launch, with their own values (tensors, a float scalar, a non-contiguous input
    made contiguous), matching torch each time."""
    gen = torch.Generator().manual_seed(1)
    k = rms_norm.with_launch()                     # its own warm closures
    for eps, t in [(1e-6, False), (0.5, False), (0.25, False), (1e-6, True), (0.5, True)]:
        x = torch.randn(*((40, 6) if t else (6, 40)), generator=gen)
        x = x.t() if t else x
        w = torch.randn(40, generator=gen)
        got = k(x, w, eps)
        want = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert got.stride() == (40, 1)     # fresh and contiguous (like x only where x is)
    (kernel,) = [p for p in planned.values() if p.runs]
    assert kernel.runs == 3            # two keys (contiguous x, transposed x), 2 + 1 replays
    with pytest.raises(mf.BindingError, match="'eps'"):
        k(x, w, 10 ** 400)             # a value check still made on the replay


def test_checked_gathers_reuse_a_zeroed_report_and_drop_a_written_one():
    """A checked call binds a report from the clean pool and gives it back when it reads
    zeros; a call whose report holds an error raises and does not give it back, so the next
    call's report is zeroed and a good table passes."""
    cache = torch.randn(4, 2, 1, 8)
    good = torch.tensor([[0, 3], [2, 1]], dtype=torch.int32)
    bad = torch.tensor([[0, 4], [2, 1]], dtype=torch.int32)
    CLEAN.clear()
    for _ in range(3):                  # the full path, then warm replays
        torch.testing.assert_close(paged_gather(cache, good), cache[good.long()])
        (report,) = CLEAN._free[cache.device]
    with pytest.raises(mf.GatherIndexError, match="index 4 is out of range"):
        paged_gather(cache, bad)
    assert CLEAN._free[cache.device] == []          # the written report was dropped
    torch.testing.assert_close(paged_gather(cache, good), cache[good.long()])
    (fresh,) = CLEAN._free[cache.device]
    assert fresh is not report and not fresh.any()
