"""The warm-call fast path (runtime/fastpath.py): a call whose key matches a checked call replays
its closure. Every test warms a kernel first, then changes one thing the key holds (dtype,
shape, strides, storage offset, device, Const value, backend override, launch override, autotune
entry) and checks the answer against torch, or bad input and checks the error is the one a cold
call raises. Kernels run through the simulator."""
import threading

import pytest
import torch
import torch.nn.functional as F

import metalforge as mf
from metalforge.errors import BindingError, DeviceError, ShapeError
from metalforge.runtime import launcher
from metalforge.tuning import cache as cache_mod


def k_silu(x: "T[*B, D]"):
    return x * mf.sigmoid(x)


def k_rms(x: "T[*B, D]", w: "T[D]", eps: float = 1e-6):
    return x * mf.rsqrt(mf.mean(x * x, axis="D") + eps) * w


def k_scaled(x: "T[R, D]", k: mf.Const[int], neg: mf.Const[bool] = False):
    y = x * k
    return -y if neg else y


def k_axpb(x: "T[R, D]", b: "f32[D]", a: float, n: int):
    return x * a + b + n


def k_two(x: "T[*B, D]", r: "T[*B, D]"):
    h = x + r
    return h, h * mf.sigmoid(h)


def rms_ref(x, w, eps=1e-6):
    return F.rms_norm(x.double(), (x.shape[-1],), w.double(), eps=eps).to(x.dtype)


def close(a, b, dtype=torch.float32):
    tol = 2e-3 if dtype == torch.float16 else 1e-5
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


@pytest.fixture
def launches(monkeypatch):
    """Every kernel launch of kernels compiled from now on: (host name, group_size, threads)."""
    seen = []
    real = launcher.kernel_object

    class Recording:
        def __init__(self, k, name):
            self.k, self.name = k, name
            self.max_threads_per_threadgroup = k.max_threads_per_threadgroup
            self.static_thread_group_memory_length = k.static_thread_group_memory_length

        def __call__(self, *args, **kw):
            seen.append((self.name, kw["group_size"], kw["threads"]))
            return self.k(*args, **kw)

    monkeypatch.setattr(launcher, "kernel_object",
                        lambda be, src, name, *opts: Recording(real(be, src, name, *opts), name))
    return seen


def test_warm_calls_replay_one_closure():
    silu = mf.kernel(k_silu)
    x = torch.randn(5, 40)
    for _ in range(3):
        close(silu(x), F.silu(x))
    assert len(silu._calls.warm) == 1


def test_dtype_shape_stride_and_offset_changes_get_their_own_closure():
    rms = mf.kernel(k_rms)
    x, w = torch.randn(6, 48), torch.randn(48)
    close(rms(x, w), rms_ref(x, w))
    xh, wh = x.half(), w.half()
    close(rms(xh, wh), rms_ref(xh, wh), torch.float16)                 # dtype
    close(rms(x[:3], w), rms_ref(x[:3], w))                            # shape
    x3 = torch.randn(2, 3, 48)
    close(rms(x3, w), rms_ref(x3, w))                                  # batch dims
    xt = torch.randn(48, 6).t()
    wt = torch.randn(48)
    close(rms(xt, wt), rms_ref(xt, wt))                                # strides
    ws = torch.randn(96)[::2]
    close(rms(x, ws), rms_ref(x, ws))                                  # strided weight
    base = torch.randn(6 * 48 + 1)
    for off in (0, 1, 0, 1):                                           # same key, offset moves
        xo = base[off:off + 6 * 48].view(6, 48)
        close(rms(xo, w), rms_ref(xo, w))
    close(rms(x, w, eps=0.5), rms_ref(x, w, 0.5))                      # runtime scalar value
    close(rms(x, w, 1), rms_ref(x, w, 1.0))                            # ... and Python type
    close(rms(x, w), rms_ref(x, w))


def test_elementwise_offsets_strides_and_empty():
    silu = mf.kernel(k_silu)
    base = torch.randn(7 * 33 + 3)
    for off in (0, 1, 2, 3, 0):
        x = base[off:off + 7 * 33].view(7, 33)
        close(silu(x), F.silu(x))
    xt = torch.randn(33, 7).t()
    close(silu(xt), F.silu(xt))
    for _ in range(2):
        e = silu(torch.randn(0, 33))
        assert e.shape == (0, 33)


def test_const_values_and_types():
    scaled = mf.kernel(k_scaled)
    x = torch.randn(4, 9)
    for k, neg in [(2, False), (3, False), (3, True), (2, False), (1, False)]:
        close(scaled(x, k, neg=neg), -x * k if neg else x * k)
    with pytest.raises(BindingError, match=r"mf.Const\[int\] needs a Python int, got bool"):
        scaled(x, True)                         # True == 1 and hashes like it: not the same key


def test_scalars_keep_their_checks():
    axpb = mf.kernel(k_axpb)
    x, b = torch.randn(3, 8), torch.randn(8)
    close(axpb(x, b, 0.5, 2), x * 0.5 + b + 2)
    close(axpb(x, b, 2, 1), x * 2 + b + 1)                    # an int where a float goes
    with pytest.raises(BindingError, match="expected a Python float, got bool"):
        axpb(x, b, True, 2)
    with pytest.raises(BindingError, match="expected a Python int, got float"):
        axpb(x, b, 0.5, 2.0)


def test_two_outputs():
    two = mf.kernel(k_two)
    x, r = torch.randn(2, 3, 17), torch.randn(2, 3, 17)
    for _ in range(2):
        h, y = two(x, r)
        close(h, x + r)
        close(y, F.silu(x + r))


def _error(fn, *args, **kwargs) -> str:
    with pytest.raises((BindingError, ShapeError, DeviceError, ValueError)) as e:
        fn(*args, **kwargs)
    return f"{type(e.value).__name__}: {e.value}"


BAD = {
    "dtype": lambda x, w: ((x.half(), w), {}),
    "mixed dtypes": lambda x, w: ((x, w.half()), {}),
    "dim mismatch": lambda x, w: ((x, w[:-1]), {}),
    "rank": lambda x, w: ((x, w[None]), {}),
    "not a tensor": lambda x, w: ((x, w.tolist()), {}),
    "scalar type": lambda x, w: ((x, w, "0.1"), {}),
    "bool scalar": lambda x, w: ((x, w, False), {}),
    "missing": lambda x, w: ((x,), {}),
    "extra": lambda x, w: ((x, w), {"epsilon": 0.1}),
    "duplicate": lambda x, w: ((x, w), {"x": x}),
    "too many": lambda x, w: ((x, w, 0.1, 2), {}),
    "meta device": lambda x, w: ((x.to("meta"), w.to("meta")), {}),
    "mixed devices": lambda x, w: ((x, w.to("meta")), {}),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_raises_the_cold_error_when_warm(case):
    warm, cold = mf.kernel(k_rms), mf.kernel(k_rms)
    x, w = torch.randn(4, 16), torch.randn(16)
    for _ in range(2):
        close(warm(x, w), rms_ref(x, w))
    args, kwargs = BAD[case](x, w)
    expected = _error(cold, *args, **kwargs)
    assert _error(warm, *args, **kwargs) == expected
    close(warm(x, w), rms_ref(x, w))            # and the good key still works


def test_backend_override_is_part_of_the_key():
    silu = mf.kernel(k_silu)
    x = torch.randn(4, 16)
    close(silu(x), F.silu(x))
    with pytest.raises(DeviceError, match="backend 'cuda' runs on cuda tensors"):
        with mf.backend("cuda"):
            silu(x)
    with mf.backend("sim"):
        close(silu(x), F.silu(x))
    explicit = mf.kernel(backend="cuda")(k_silu)
    with pytest.raises(DeviceError, match="backend 'cuda'"):
        explicit(x)
    with pytest.raises(DeviceError, match="backend 'cuda'"):
        explicit(x)


def test_launch_overrides_get_their_own_closures(launches):
    silu = mf.kernel(k_silu)
    x = torch.randn(64, 64)
    small = silu.with_launch(threads_per_group=32)
    for k, group in [(silu, None), (small, 32), (silu, None), (small, 32)]:
        close(k(x), F.silu(x))
        if group is not None:
            assert launches[-1][1] == group
        else:
            assert launches[-1][1] > 32
    silu.launch = {"threads_per_group": 64}     # reassigned on the object itself
    close(silu(x), F.silu(x))
    assert launches[-1][1] == 64


def test_an_autotune_entry_written_later_is_used(tmp_path, monkeypatch, launches):
    path = tmp_path / "autotune.json"
    monkeypatch.setattr(cache_mod, "cache_path", lambda: path)
    monkeypatch.setattr(cache_mod, "_CACHES", {})
    silu = mf.kernel(k_silu)
    x = torch.randn(64, 64)
    close(silu(x), F.silu(x))
    default_group = launches[-1][1]
    assert default_group != 32
    g = silu.graph(x)
    key = cache_mod.key_for(g, "sim", {"B": 64, "D": 64})
    cache_mod.default_cache().put(key, {"launch": {"threads_per_group": 32}, "time_ms": 1.0})
    close(silu(x), F.silu(x))
    assert launches[-1][1] == 32
    monkeypatch.setattr(cache_mod, "_CACHES", {})            # another cache: the file again
    monkeypatch.setattr(cache_mod, "cache_path", lambda: tmp_path / "none.json")
    close(silu(x), F.silu(x))
    assert launches[-1][1] == default_group


def test_a_cache_directory_set_later_is_seen_when_warm(tmp_path, monkeypatch, launches):
    """$METALFORGE_CACHE_DIR is read on every call (cheaply): set while a kernel is warm, the
    next call uses the autotune entries found there; unset, the previous cache again."""
    monkeypatch.setattr(cache_mod, "_CACHES", {})
    silu = mf.kernel(k_silu)
    x = torch.randn(64, 64)
    close(silu(x), F.silu(x))
    default_group = launches[-1][1]
    monkeypatch.setenv("METALFORGE_CACHE_DIR", str(tmp_path))
    key = cache_mod.key_for(silu.graph(x), "sim", {"B": 64, "D": 64})
    cache_mod.default_cache().put(key, {"launch": {"threads_per_group": 32}, "time_ms": 1.0})
    close(silu(x), F.silu(x))
    assert launches[-1][1] == 32 != default_group
    monkeypatch.delenv("METALFORGE_CACHE_DIR")
    close(silu(x), F.silu(x))
    assert launches[-1][1] == default_group


def test_replay_is_straight_line_python():
    """The closure's call is generated code that names what it does (for debugging)."""
    rms = mf.kernel(k_rms)
    x, w = torch.randn(6, 48), torch.randn(48)
    rms(x, w)
    (warm,) = rms._calls.warm._entries.values()
    src = warm.source
    assert src.startswith("def replay(values):") and "for " not in src
    assert "o0 = _empty_like(values[0])" in src and "_kernel(" in src    # allocated like x
    close(warm((x, w, 1e-6)), rms_ref(x, w))


def test_requires_grad_takes_the_full_path(monkeypatch):
    silu = mf.kernel(k_silu)
    x = torch.randn(4, 16, requires_grad=True)
    close(silu(x), F.silu(x.detach()))
    assert len(silu._calls.warm) == 0
    with torch.no_grad():
        close(silu(x), F.silu(x.detach()))
    assert len(silu._calls.warm) == 1
    used = []
    (key, warm), = silu._calls.warm._entries.items()
    silu._calls.warm._entries[key] = type("Spy", (), {"replay": lambda self, values: used.append(1),
                                                "current": warm.current})()
    y = silu(x)                                  # grad mode on again: autograd's path
    assert not used and y.requires_grad


def test_threads_calling_at_once():
    rms, scaled = mf.kernel(k_rms), mf.kernel(k_scaled)
    cases = [torch.randn(3, 32), torch.randn(5, 32).half(), torch.randn(32, 7).t().contiguous(),
             torch.randn(2, 2, 32)]
    for x in cases:                              # compile first: the test is about the cache
        rms(x, torch.ones(x.shape[-1], dtype=x.dtype))
    errors = []

    def worker(i: int) -> None:
        try:
            for j in range(12):
                x = cases[(i + j) % len(cases)]
                w = torch.full((x.shape[-1],), 1.5, dtype=x.dtype)
                close(rms(x, w), rms_ref(x, w), x.dtype)
                k = 1 + (i + j) % 3
                close(scaled(cases[0], k), cases[0] * k)
        except BaseException as e:               # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_the_cache_is_bounded():
    silu = mf.kernel(k_silu)
    silu._calls.warm.size = 3
    for n in range(1, 7):
        x = torch.randn(n, 4)
        close(silu(x), F.silu(x))
    assert len(silu._calls.warm) == 3


def test_mlx_backend_on_torch_tensors_keeps_its_error():
    silu, cold = mf.kernel(k_silu), mf.kernel(k_silu)
    x = torch.randn(4, 16)
    close(silu(x), F.silu(x))
    with mf.backend("mlx"):
        expected = _error(cold, x)
        assert "backend 'mlx' runs on mlx.core.array" in expected
        assert _error(silu, x) == expected
        assert _error(silu, x) == expected


def k_total(x: "T[*B, D]"):
    return mf.sum(x, axis="D")


def k_double(x: "T[*B]"):
    return x * 2


def test_0dim_inputs_and_outputs_bind_as_one_element_buffers_when_warm():
    total, double = mf.kernel(k_total), mf.kernel(k_double)
    for d in (7, 300, 7, 300):
        x = torch.randn(d)
        y = total(x)
        assert y.shape == ()
        torch.testing.assert_close(y, x.sum(), rtol=1e-5, atol=1e-5)
    for v in (1.5, -2.0, 3.0):
        y = double(torch.tensor(v))
        assert y.shape == () and y.item() == 2 * v
