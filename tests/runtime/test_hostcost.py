"""The warm call's host cost, kept without losing a check: the replay launches through the
backend's planned launch (`CudaFunction.planned`, stood in for here by one over the simulator's
kernel, which checks that each replayed call is the kind of call it was planned for), and
checked gather calls reuse a zeroed report instead of zeroing one per call."""
from __future__ import annotations

import ctypes
import struct
import sys
from pathlib import Path

import pytest
import torch

import metalforge as mf
from metalforge.cuda import call as C
from metalforge.cuda.translate import translate
from metalforge.once import OnceMap
from metalforge.runtime import backends, launcher
from metalforge.runtime.fastpath import MISS
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


# --------------------------------------------------------------------------- the inlined plan

class Recorder:
    """cuLaunchKernelEx / cuLaunchKernel of a fake driver: each launch's function, blocks,
    group, stream and parameter buffer (its slots read back through kernelParams)."""

    def __init__(self):
        self.launches = []

    def launch_ex(self, config, func, params, extra):
        raw = ctypes.string_at(ctypes.addressof(config), C.CONFIG_SIZE)
        *dims, shared, stream, attrs = struct.unpack(C.CONFIG, raw)
        assert shared == 0 and attrs == 0 and raw[40:48] == bytes(8) and extra is None
        return self.launch(func, *dims, 0, ctypes.c_void_p(stream), params, None)

    def launch(self, func, bx, by, bz, gx, gy, gz, shared, stream, params, extra):
        self.launches.append(dict(func=func.value, blocks=(bx, by, bz), group=(gx, gy, gz),
                                  stream=stream.value, params=params))
        return 0


class CudaLike:
    """A simulator kernel whose warm launches go through a real `metalforge.cuda` plan (made
    from the kernel's MSL as `plan_call` makes it, CPU tensors standing in for CUDA ones) on
    a recording driver: what the replay inlines is the plan's own launch code."""

    def __init__(self, kernel, source, host, driver):
        self._kernel, self._host, self._driver = kernel, host, driver
        (self._entry,) = [e for e in translate(source).entries if e.host_name == host]

    def __getattr__(self, name):
        return getattr(self._kernel, name)

    def __call__(self, *args, **kw):
        return self._kernel(*args, **kw)

    def launch_plan(self, *args, threads, group_size, arg_casts=None):
        return C.plan_unchecked(self._entry, args, threads, group_size, arg_casts,
                                ctypes.c_void_p(id(self._entry)), self._driver)


@pytest.fixture(params=[True, False], ids=["cuLaunchKernelEx", "cuLaunchKernel"])
def inlined(monkeypatch, request):
    rec = Recorder()
    driver = C.Driver(rec.launch, lambda device: 0x5000 + device, None, lambda d: None,
                      rec.launch_ex if request.param else None)
    made: dict[int, CudaLike] = {}
    real = backends.kernel_object

    def kernel_object(backend_name, source, host_name, options=()):
        k = real(backend_name, source, host_name, options)
        return made.setdefault(id(k), CudaLike(k, source, host_name, driver))
    monkeypatch.setattr(launcher, "kernel_object", kernel_object)
    monkeypatch.setattr(launcher, "_specs", OnceMap())     # libraries made anew, through it
    return rec, made


def _slots(launch, plan_layout, n):
    """The first `n` parameter slots of a recorded launch, as ints / bytes."""
    params = launch["params"]
    return [ctypes.string_at(params[k], plan_layout.slots[k].size) for k in range(n)]


def test_the_replay_inlines_the_plans_launch_and_never_uses_a_stale_one(inlined):
    """Warm calls launch through the cuda plan's code inlined in the replay: each launch
    packs this call's pointers (a fresh output; an input whose start is not 16-byte aligned
    copied first) and scalars, and the plan of this call's key: a call of another shape or
    strides gets its own closure and plan (its grid, its kernel), never the previous one's."""
    rec, made = inlined
    k = rms_norm
    k._calls.warm.clear()                          # closures made through the fixture
    gen = torch.Generator().manual_seed(3)
    base = torch.randn(6 * 40 + 1, generator=gen)
    w = torch.randn(40, generator=gen)
    cases = [(torch.randn(6, 40, generator=gen), 1e-6), (torch.randn(6, 40, generator=gen), 0.5),
             (base[1:].view(6, 40), 0.25),            # same key, misaligned start
             (torch.randn(3, 40, generator=gen), 1e-6), (torch.randn(3, 40, generator=gen), 2.0),
             (torch.randn(40, 6, generator=gen).t(), 1e-6),
             (torch.randn(40, 6, generator=gen).t(), 0.5)]
    seen = set()
    for x, eps in cases:
        before = len(rec.launches)
        out = k(x, w, eps)
        key = (tuple(x.shape), x.stride())
        if key not in seen:                        # the full path: the simulator computes it
            seen.add(key)
            want = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w
            torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
            assert len(rec.launches) == before
            continue
        (launch,) = rec.launches[before:]          # a replay: one launch through the plan
        (host, threads, group), = k.launches(x, w, eps)
        (kernel,) = [m for m in made.values() if m._host == host]
        assert launch["func"] == id(kernel._entry) and launch["stream"] == 0x5000
        assert launch["group"] == (group, 1, 1)
        assert launch["blocks"] == (-(-threads // group), 1, 1)
        params = launch["params"]                  # the Metal grid after the parameters
        assert [struct.unpack("<I", ctypes.string_at(params[len(params) - 3 + d], 4))[0]
                for d in range(3)] == [threads, 1, 1]
        xp, wp, op, e = _slots(launch, C.layout([(8, "Q")] * 3 + [(4, "f")]), 4)
        xp, wp, op = (struct.unpack("<Q", p)[0] for p in (xp, wp, op))
        assert wp == w.data_ptr() and op == out.data_ptr() != x.data_ptr()
        assert out.shape == x.shape and out.is_contiguous()
        assert xp % 16 == 0
        assert (xp == x.data_ptr()) == (x.storage_offset() == 0 and x.is_contiguous())
        assert e == struct.pack("<f", eps)
    assert len(rec.launches) == 4
    x = cases[0][0]                                # eps left to its default: the fast path
    assert k._calls.fast((x, w)) is not MISS and len(rec.launches) == 5
    assert struct.unpack("<f", _slots(rec.launches[-1], C.layout([(8, "Q")] * 3 + [(4, "f")]),
                                      4)[3]) == struct.unpack("<f", struct.pack("<f", 1e-6))
