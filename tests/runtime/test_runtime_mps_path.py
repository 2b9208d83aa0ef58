"""The `mps` backend's code path, exercised without a Mac: `torch.mps.compile_shader` is replaced
by a recorder that forwards to the simulator, and MPS is declared available, so every line of
the mps path runs. What this witnesses is the call model the research notes describe: one
compile per source, the kernel object looked up by host name, positional buffers, `threads` /
`group_size` as dispatchThreads sizes, `arg_casts` for the non-default scalar widths, and no
synchronisation inside the call."""
import pytest
import torch

import metalforge as mf
from metalforge import sim
from metalforge.runtime import backends


@pytest.fixture
def fake_mps(monkeypatch):
    calls = {"compile": [], "launch": []}

    class RecordingKernel:
        def __init__(self, k, name):
            self.k, self.name = k, name
            self.max_threads_per_threadgroup = k.max_threads_per_threadgroup
            self.thread_execution_width = k.thread_execution_width
            self.static_thread_group_memory_length = k.static_thread_group_memory_length

        def __call__(self, *args, **kw):
            assert set(kw) <= {"threads", "group_size", "arg_casts"}       # keyword-only options
            calls["launch"].append((self.name, args, kw))
            return self.k(*args, **kw)

    class RecordingLibrary:
        def __init__(self, lib):
            self.lib = lib

        def __getattr__(self, name):
            return RecordingKernel(getattr(self.lib, name), name)

    def compile_shader(src):
        assert isinstance(src, str)
        calls["compile"].append(src)
        return RecordingLibrary(sim.compile_shader(src))

    def no_sync():
        raise AssertionError("the mps path must not synchronize inside a kernel call")

    monkeypatch.setattr(torch.mps, "compile_shader", compile_shader, raising=False)
    monkeypatch.setattr(torch.mps, "synchronize", no_sync)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setitem(backends.DEVICE_OF, "mps", "cpu")   # CPU tensors stand in for MPS ones
    backends.clear_caches()
    yield calls
    backends.clear_caches()


@mf.kernel(backend="mps")
def axpb(x: "T[R, D]", b: "T[D]", a: float, n: int, flag: bool):
    return mf.where(flag, x * a + b + n, x)


@mf.kernel(backend="mps")
def rms(x: "T[R, D]", w: "T[D]", eps: float = 1e-6):
    return x * mf.rsqrt(mf.mean(x * x, axis="D") + eps) * w


def test_elementwise_call_model(fake_mps):
    x, b = torch.randn(5, 12), torch.randn(12)
    for _ in range(3):
        y = axpb(x, b, 0.5, 2, True)
    torch.testing.assert_close(y, x * 0.5 + b + 2)
    assert len(fake_mps["compile"]) == 1                      # compiled once, then cached
    name, args, kw = fake_mps["launch"][0]
    assert name == "axpb_f32"
    # positional buffers: inputs, output, then scalars and sizes, in buffer order
    assert args[0] is x and args[1] is b and args[2].shape == (5, 12)
    assert args[3:6] == (0.5, 2, 1)
    # python float binds as float32 and int as int64 by default; bool and 32-bit sizes are cast
    casts = kw["arg_casts"]
    assert 3 not in casts and 4 not in casts and casts[5] == "uint8"
    assert all(casts[i] == "int32" for i in range(6, len(args)))
    assert kw["threads"] == -(-60 // 4) and kw["group_size"] == kw["threads"]   # dispatchThreads


def test_reduction_call_model(fake_mps):
    x, w = torch.randn(3, 1000), torch.randn(1000)
    y = rms(x, w)
    torch.testing.assert_close(y, x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w)
    name, args, kw = fake_mps["launch"][-1]
    assert name.startswith("rms_f32_")
    # one threadgroup per row: threads counts threads (not groups), a multiple of the group
    assert kw["threads"] % kw["group_size"] == 0 and kw["threads"] // kw["group_size"] == 3
    assert kw["group_size"] % 32 == 0
