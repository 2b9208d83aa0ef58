"""The wrapper and the sim backend: broadcasting, batches, layouts, errors, empties, caching."""
import pytest
import torch

import metalforge as mf
from metalforge import errors, runtime, sim
from metalforge.runtime import backends, launcher


@mf.kernel
def scale_rows(x: "T[R, D]", w: "T[D]", r: "T[R]", beta: float = 1.0):
    return x * w + r * beta


@mf.kernel
def gate(x: "T[*B, D]", g: "T[*B, D]"):
    return x * mf.sigmoid(g)


def torch_scale_rows(x, w, r, beta=1.0):
    return (x.float() * w.float() + r.float()[:, None] * beta).to(x.dtype)


TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float16: dict(rtol=1e-3, atol=1e-3),
       torch.bfloat16: dict(rtol=1e-2, atol=1e-2)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_broadcast_by_axis_name(dtype):
    # D = 64: the w[D] vector path; D = 33: rows not a multiple of 4 (scalar path throughout)
    for rows, d in ((5, 64), (3, 33), (1, 1)):
        x, w, r = torch.randn(rows, d, dtype=dtype), torch.randn(d, dtype=dtype), \
            torch.randn(rows, dtype=dtype)
        y = scale_rows(x, w, r, 0.5)
        torch.testing.assert_close(y, torch_scale_rows(x, w, r, 0.5), **TOL[dtype])


def test_batch_dims_any_rank():
    for shape in ((7,), (2, 3, 10), (2, 1, 3, 5)):
        x, g = torch.randn(shape), torch.randn(shape)
        y = gate(x, g)
        assert y.shape == shape
        torch.testing.assert_close(y, x * torch.sigmoid(g))


def test_non_contiguous_and_offset_inputs():
    base = torch.randn(9, 70)
    x = base[1:, 3:67]                     # storage offset 73 (not a multiple of 4), strided
    xt = torch.randn(64, 8).t()            # transposed
    w = torch.randn(80)[5:69]              # offset 5: vector loads need a realigned copy
    r = torch.randn(16)[::2]               # stepped
    for xx in (x, xt):
        y = scale_rows(xx, w, r)
        torch.testing.assert_close(y, torch_scale_rows(xx, w, r))
    y = gate(torch.randn(4, 6, 9).transpose(0, 2), torch.randn(9, 6, 4))
    assert y.shape == (9, 6, 4)


def test_launch_variants_agree():
    x, g = torch.randn(3, 1003), torch.randn(3, 1003)
    want = x * torch.sigmoid(g)
    for launch in ({"vector_width": 1}, {"vectors_per_thread": 3, "threads_per_group": 32},
                   {"index64": True}):
        k = mf.kernel(gate.fn, name="gate", launch=launch)
        torch.testing.assert_close(k(x, g), want)
    assert "mf_gate<float, ulong>" in k.source(x, g)


def test_empty_inputs_return_empty_without_launch(monkeypatch):
    def no_launch(*a, **k):
        raise AssertionError("launched for an empty tensor")
    monkeypatch.setattr(launcher, "bind", no_launch)
    y = scale_rows(torch.randn(0, 8), torch.randn(8), torch.randn(0))
    assert y.shape == (0, 8) and y.dtype == torch.float32
    y = gate(torch.randn(2, 0, 4), torch.randn(2, 0, 4))
    assert y.shape == (2, 0, 4)


@mf.kernel
def row_softmax(x: "T[*B, D]"):
    return mf.softmax(x, axis="D")


def test_launches_says_what_a_call_launches(monkeypatch):
    """`kernel.launches(...)` names the kernels (variant by row length, split attention's
    merge) with their threads, runs nothing, and matches what the call then launches."""
    seen = []
    real = launcher.dispatch
    monkeypatch.setattr(launcher, "dispatch", lambda b: (seen.append(b.plan), real(b))[1])
    for d, variant in ((100, "simd"), (1000, "group"), (9000, "looped")):
        x = torch.randn(3, d)
        plan = row_softmax.launches(x)
        assert [h for h, _, _ in plan] == [f"row_softmax_f32_{variant}"]
        assert not seen
        torch.testing.assert_close(row_softmax(x), torch.softmax(x, -1))
        assert seen.pop() == plan
    assert gate.launches(torch.randn(2, 0, 4), torch.randn(2, 0, 4)) == ()
    with pytest.raises(errors.ShapeError):
        gate.launches(torch.randn(2, 3), torch.randn(2, 4))


def test_compiles_once_per_specialisation(monkeypatch):
    calls = []
    real = backends._compile
    monkeypatch.setattr(backends, "_compile", lambda b, s: calls.append(s) or real(b, s))

    @mf.kernel
    def twice(x: "T[N]"):
        return x * 2 + 1

    for n in (5, 100, 7):
        torch.testing.assert_close(twice(torch.ones(n)), torch.full((n,), 3.0))
    assert len(calls) == 1
    twice(torch.ones(4, dtype=torch.float16))          # a new dtype is a new specialisation
    assert len(calls) == 2


# --------------------------------------------------------------------------- errors


def test_wrong_device():
    with pytest.raises(runtime.DeviceError, match=r"'w' is on device 'meta'.*'mps'.*'cpu'"):
        scale_rows(torch.randn(2, 4), torch.empty(4, device="meta"), torch.randn(2))


def test_backend_device_mismatch():
    x, w, r = torch.randn(2, 4), torch.randn(4), torch.randn(2)
    with pytest.raises(runtime.DeviceError, match=r"backend 'mps' runs on mps tensors.*cpu"):
        runtime.run(scale_rows.graph(x, w, r), {"x": x, "w": w, "r": r, "beta": 1.0},
                    backend="mps")
    with mf.backend("mps"):
        assert runtime.current_backend([x]) == "mps"
        with pytest.raises(runtime.DeviceError, match="backend 'mps'"):
            scale_rows(x, w, r)
        with mf.backend("sim"):
            torch.testing.assert_close(scale_rows(x, w, r), torch_scale_rows(x, w, r))
        assert runtime.current_backend([x]) == "mps"
    assert runtime.current_backend([x]) == "sim"
    with pytest.raises(ValueError, match="unknown metalforge backend 'vulkan'.*mps, sim, cuda"):
        mf.backend("vulkan")


def test_rank_mismatch():
    with pytest.raises(mf.ShapeError, match=r"'x'.*\"T\[R, D\]\".*exactly 2.*\(2, 3, 4\)"):
        scale_rows(torch.randn(2, 3, 4), torch.randn(4), torch.randn(2))


def test_mismatched_dims_name_both_arguments():
    with pytest.raises(mf.ShapeError, match=r"dim 'D' is 8 in argument 'x' but 5 in argument 'w'"):
        scale_rows(torch.randn(3, 8), torch.randn(5), torch.randn(3))
    with pytest.raises(mf.ShapeError, match=r"'\*B'.*\(2, 3\).*'x'.*\(3, 2\).*'g'"):
        gate(torch.randn(2, 3, 4), torch.randn(3, 2, 4))


def test_non_tensor_argument():
    with pytest.raises((TypeError, mf.BindingError), match=r"'x'.*[Tt]ensor.*list"):
        scale_rows([[1.0]], torch.randn(1), torch.randn(1))


def test_dtype_mismatch_against_specialisation():
    x, w, r = torch.randn(2, 4), torch.randn(4), torch.randn(2)
    g = scale_rows.graph(x, w, r)
    with pytest.raises(TypeError, match=r"'w' has dtype torch.float16.*torch.float32"):
        runtime.run(g, {"x": x, "w": w.half(), "r": r, "beta": 1.0})


@mf.kernel
def row_and_vector(x: "T[R, D]", w: "T[D]"):
    return x * w, w * 3


@mf.kernel
def transposed(x: "T[R, D]") -> "T[D, R]":
    return x + 1


def test_outputs_over_fewer_or_reordered_axes():
    x, w = torch.randn(5, 12), torch.randn(12)
    a, b = row_and_vector(x, w)                     # b over [D] only: written once per D
    torch.testing.assert_close(a, x * w)
    torch.testing.assert_close(b, w * 3)
    y = transposed(x)                               # grid over [D, R]; x read by position
    torch.testing.assert_close(y, (x + 1).t())
    assert "x[mf_pos_R * mf_size_D + mf_pos_D]" in transposed.source(x)


def test_source_and_ir_from_sizes_pick_the_index_width():
    assert "mf_transposed<half, uint>" in transposed.source(T="f16")
    big = transposed.source(T="f16", R=2 ** 16, D=2 ** 16)
    assert "mf_transposed<half, ulong>" in big and 'host_name("transposed_f16_idx64")' in big
    assert "instance transposed_f32: T=float, mf_index_t=uint" in transposed.ir(T="f32")


def test_reductions_over_two_axes_say_so_with_the_line():
    @mf.kernel
    def total(x: "T[R, D]"):
        return mf.sum(x, axis="D") + mf.sum(x, axis="R")     # two sets of axes: {D}, {R}

    with pytest.raises(ValueError, match=r"several axes.*mf\.sum\(\.\.\., axis='R'\) at "
                                         r".*test_runtime\.py:\d+"):
        total(torch.randn(2, 8))


def test_every_user_error_is_a_metalforge_error_and_keeps_its_builtin_base():
    for name in ("AnnotationError", "TraceError", "BindingError", "ShapeError", "DeviceError",
                 "LaunchError", "UnsupportedConstruct", "CandidateMismatch"):
        cls = getattr(mf, name)
        assert cls is getattr(errors, name) and issubclass(cls, mf.MetalforgeError)
    assert issubclass(mf.AnnotationError, ValueError) and issubclass(mf.BindingError, TypeError)
    assert issubclass(sim.KernelError, mf.MetalforgeError)


def test_same_argument_mistake_same_class_through_the_runtime():
    x, w, r = torch.randn(2, 8), torch.randn(8), torch.randn(2)
    g = scale_rows.graph(x, w, r)
    with pytest.raises(mf.BindingError, match="missing tensor argument 'w'"):
        runtime.run(g, {"x": x, "r": r, "beta": 1.0})
    with pytest.raises(mf.BindingError, match="argument 'w'.*must be a torch.Tensor"):
        runtime.run(g, {"x": x, "w": [1.0] * 8, "r": r, "beta": 1.0})
    with pytest.raises(mf.BindingError, match="argument 'w'.*dtype"):
        scale_rows(x, w.half(), r)


def test_reduction_over_zero_batch_dims_writes_its_0dim_output():
    """`*B` with no leading dims makes a 0-dim output; it must be bound as a buffer (a 0-dim
    CPU tensor binds by value under compile_shader's call model, so writes to it were lost)."""
    @mf.kernel
    def row_total(x: "T[*B, D]"):
        return mf.sum(x, axis="D")

    torch.manual_seed(0)
    for d in (1, 7, 300, 5000):                       # simd, group and looped row kernels
        x = torch.randn(d)
        y = row_total(x)
        assert y.shape == ()
        torch.testing.assert_close(y, x.sum(), rtol=1e-5, atol=1e-5)
