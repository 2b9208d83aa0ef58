"""The MLX backend: every example kernel as `mx.fast.metal_kernel` on MLX arrays.

mlx[cpu] cannot run Metal, but it still writes the full source it would compile (traced by
`mx.export_function` with verbose=True). Under `mf.backend("sim")` MLX arrays run exactly that
source in the simulator, bound in MLX's buffer order with MLX's grid and clamped threadgroup;
the results are compared with the kernel's reference.
"""
import importlib.util
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import metalforge as mf
from metalforge.cli import main as cli_main
from metalforge.frontend.errors import BindingError
from metalforge.graph import ScalarParam, TensorParam, take_sites
from metalforge.runtime import DeviceError
from metalforge.runtime import mlx as mfx
from metalforge.schedule.ranges import proven_sites

mx = pytest.importorskip("mlx.core")

ROOT = Path(__file__).resolve().parents[2]
MX = {"f32": mx.float32, "f16": mx.float16, "bf16": mx.bfloat16}
TOL = {"f32": 1e-4, "f16": 3e-3, "bf16": 2e-2}


def _examples():
    out = {}
    for path in sorted((ROOT / "examples").glob("*.py")):
        spec = importlib.util.spec_from_file_location(f"mf_mlx_{path.stem}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        out.update({n: k for n, k in vars(mod).items() if isinstance(k, mf.Kernel)})
    return out


EXAMPLES = _examples()


def to_torch(a):
    if a.dtype == mx.bfloat16:
        return torch.from_numpy(np.array(mx.view(a, mx.uint16))).view(torch.bfloat16)
    return torch.from_numpy(np.array(a))


def inputs(kernel, sizes, dtype="f32", seed=0):
    """MLX arrays for every tensor parameter; batch dims get shape (2, 3)."""
    mx.random.seed(seed)
    args = []
    for p in kernel.params:
        if isinstance(p, TensorParam):
            shape = []
            for axes in p.storage:          # a grouped dim "(G R)" is one dim of G*R
                d = axes[0]
                if d.batch:
                    shape += [2, 3]
                elif d.derived:
                    shape.append(sizes[d.base] * d.mul // d.div + d.add)
                elif d.size is not None:    # a literal dim: its fixed size
                    shape.append(d.size)
                else:
                    shape.append(math.prod(sizes[a.name] for a in axes))
            if p.dtype is None or p.dtype.is_float:
                args.append(mx.random.normal(tuple(shape)).astype(MX[dtype]))
            else:                       # packed words: every bit; int tensors: small values
                hi = 2 ** 32 if p.dtype.name == "u32" else 2
                name = "bool_" if p.dtype.name == "bool" else str(p.dtype.torch).split(".")[1]
                args.append(mx.random.randint(0, hi, tuple(shape)).astype(getattr(mx, name)))
    return args


def check_against_reference(kernel, args, dtype, **kw):
    with mf.backend("sim"):
        got = kernel(*args, **kw)
    ref = kernel.reference(*[to_torch(a) for a in args], **kw)
    got, ref = (got, ref) if isinstance(got, tuple) else ((got,), (ref,))
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert mfx.is_array(g)
        g = to_torch(g)
        assert g.shape == r.shape and g.dtype == r.dtype
        if r.is_floating_point():
            tol = TOL[dtype]
            torch.testing.assert_close(g.float(), r.float(), rtol=tol, atol=tol)
        else:
            assert torch.equal(g, r)


SIZES = {"D": 100, "R": 37, "S": 7, "L": 9, "F": 33, "N": 5, "K": 128, "M": 3, "B": 2, "H": 3,
         "E": 64, "V": 11, "NB": 6, "BS": 4, "G": 2, "P": 3, "C": 3, "W": 5}
# kernels with a gather whose index is not proven in range (they bind an error report); those
# whose gathers are all proven (RoPE's partner) run on MLX like any other
GATHERS = {n for n, k in EXAMPLES.items()
           if len(take_sites(g := k.graph(T="f32"))) > len(proven_sites(g))}


@pytest.mark.parametrize("dtype", ["f32", "f16"])
@pytest.mark.parametrize("name", sorted(set(EXAMPLES) - GATHERS))
def test_every_example_runs_the_source_mlx_builds(name, dtype):
    k = EXAMPLES[name]
    check_against_reference(k, inputs(k, SIZES, dtype), dtype, **required_scalars(k))


def required_scalars(kernel):
    """A value for each runtime scalar without a default."""
    return {p.name: p.pytype(8) for p in kernel.params
            if isinstance(p, ScalarParam) and not p.has_default}


@pytest.mark.parametrize("name", sorted(GATHERS))
def test_gather_kernels_are_refused_clearly(name):
    k = EXAMPLES[name]
    with pytest.raises(NotImplementedError, match="mf.take"):
        check_against_reference(k, inputs(k, SIZES | {"L": 32}, "f32"), "f32",   # L/16 > 0
                                **required_scalars(k))


@pytest.mark.parametrize("m", [3, 70])
def test_quantized_matvec_and_tiled_kernels(m):
    """Under 64 rows of x the matvec kernel, from 64 the tiled one (threadgroup float4 tiles)."""
    k = EXAMPLES["q4_matvec"]
    check_against_reference(k, inputs(k, {"N": 40, "K": 128, "M": m}, "f32", seed=m), "f32")


@pytest.mark.parametrize("name,d", [("rms_norm", 1), ("rms_norm", 33), ("rms_norm", 1000),
                                    ("rms_norm", 5000), ("softmax", 3000),
                                    ("layer_norm", 4099), ("row_argmax", 2049)])
def test_row_variants(name, d):
    """Short rows (a few lanes of a simdgroup per row), medium (one threadgroup), long (looped)."""
    k = EXAMPLES[name]
    check_against_reference(k, inputs(k, {"D": d, "R": 5}, "f32", seed=d), "f32")


def test_column_sum_tall_splits_rows():
    k = EXAMPLES["column_sum"]
    check_against_reference(k, inputs(k, {"R": 5000, "D": 40}), "f32")


def test_bf16_and_runtime_scalars():
    k = EXAMPLES["rms_norm"]
    check_against_reference(k, inputs(k, {"D": 1000}, "bf16"), "bf16", eps=0.5)
    k = EXAMPLES["bias_scale"]
    check_against_reference(k, inputs(k, {"R": 3, "D": 70}, "bf16"), "bf16", scale=-3.0)


def test_inputs_under_eight_elements_are_device_buffers():
    """MLX passes arrays of < 8 elements in the constant address space, where the body's
    `device` vector loads cannot point (Metal rejects the cast; the simulator, which maps
    `constant` to `const`, would not notice): such inputs are padded to 8 elements."""
    k = EXAMPLES["silu"]
    x = mx.array([-1.0, 0.5, 2.0, 3.0])
    call, _ = mfx.prepare(k.graph(x), {"x": x})
    assert "reinterpret_cast<device const vec<T, 4>*>(x" in call.kernel.source
    assert call.inputs[0].size == mfx.CONSTANT_LIMIT
    assert "const device float* x" in mfx.captured_source(call)
    check_against_reference(k, [x], "f32")
    k = EXAMPLES["bias_scale"]
    check_against_reference(k, inputs(k, {"R": 5, "D": 3}), "f32")


@settings(max_examples=12, deadline=None)
@given(rows=st.integers(1, 6), d=st.integers(1, 4200), name=st.sampled_from(["rms_norm",
                                                                            "softmax"]))
def test_row_lengths_property(rows, d, name):
    k = EXAMPLES[name]
    x = mx.random.normal((rows, d), key=mx.random.key(d))
    args = [x] + ([mx.random.normal((d,), key=mx.random.key(1))] if name == "rms_norm" else [])
    check_against_reference(k, args, "f32")


# --------------------------------------------------------------------------- the MLX source

def test_source_follows_mlx_signature_rules():
    """MLX (not our reproduction) writes the signature: inputs then outputs by buffer index,
    scalars and sizes as 0-d constant references, the attributes the body names, and the
    dtype/index-width template instantiation."""
    k = EXAMPLES["rms_norm"]
    x, w = inputs(k, {"D": 1000}, "f16")
    call, _ = mfx.prepare(k.graph(x, w), {"x": x, "w": w, "eps": 1e-6})
    src = mfx.captured_source(call)
    start = src.index("[[kernel]]")
    sig = src[start:src.index(") {", start)]
    params = re.findall(r"\n  (.*?) \[\[(\w+)(?:\((\d+)\))?\]\]", sig)
    assert [p[0] for p in params[:6]] == [
        "const device float16_t* x", "const device float16_t* w", "const constant float& eps",
        "const constant uint32_t& mf_size_D", "const constant uint32_t& mf_size_B",
        "device float16_t* mf_out"]
    assert [int(p[2]) for p in params[:6]] == list(range(6))
    assert {p[1] for p in params[6:]} == set(call.kernel.attributes)
    assert "template <typename T, typename mf_index_t>" in src
    assert re.search(r"decltype\(\w+<float16_t, uint32_t>\)", src)
    assert call.kwargs["grid"][1:] == (1, 1) and call.kwargs["threadgroup"][1:] == (1, 1)


@mf.kernel
def collide(grid_size: "T[R, ndim]", size: "T[ndim]", threads_per_grid: float = 2.0):
    return grid_size * threads_per_grid + size


def test_names_mlx_would_misread_are_renamed():
    """A parameter named like a Metal attribute, or a body identifier holding
    `<input>_ndim` (here `mf_size_ndim`, with an input named `size`), would make MLX add
    parameters (a redeclaration, or a shifted buffer index); they are renamed."""
    g = collide.graph(T="f32")
    s = mfx.specialisation(g, None).schedule(False)
    k = s.kernel
    raw = mf.runtime.source(g)
    body = raw[raw.index("{\n"):]
    attrs, shapes = mfx.scan(body, [p.name for p in k.params])
    assert {"grid_size", "threads_per_grid"} <= set(attrs) and "size_ndim" in shapes
    mk = mfx.translate(k, k.host_name)
    assert "grid_size" not in mk.input_names and "threads_per_grid" not in mk.input_names
    attrs, shapes = mfx.scan(mk.source, mk.input_names)
    assert set(attrs) == set(mk.attributes) == {"thread_position_in_grid"} and not shapes
    x = mx.random.normal((4, 50))
    b = mx.random.normal((50,))
    check_against_reference(collide, [x, b], "f32", threads_per_grid=-1.5)
    call, _ = mfx.prepare(g, {"grid_size": x, "size": b, "threads_per_grid": 1.0})
    src = mfx.captured_source(call)
    assert "_ndim" not in src and "[[grid_size]]" not in src and "[[threads_per_grid]]" not in src


def test_kernel_objects_are_built_once_per_specialisation(monkeypatch):
    made = []
    real = mx.fast.metal_kernel
    monkeypatch.setattr(mx.fast, "metal_kernel", lambda **kw: made.append(kw) or real(**kw))

    @mf.kernel
    def twice(x: "T[N]"):
        return x + x

    for n in (10, 20, 30):
        with mf.backend("sim"):
            twice(mx.ones((n,)))
    assert len(made) == 1
    with mf.backend("sim"):
        twice(mx.ones((5,), dtype=mx.float16))
    assert len(made) == 2


def test_empty_outputs_without_launch(monkeypatch):
    monkeypatch.setattr(mfx, "simulate", lambda call: pytest.fail("launched"))
    with mf.backend("sim"):
        y = EXAMPLES["silu"](mx.zeros((0, 5)))
    assert y.shape == (0, 5) and y.dtype == mx.float32


# --------------------------------------------------------------------------- errors

def test_unsupported_dtype():
    with pytest.raises(BindingError, match=r"argument 'x'.*MLX dtype complex64 is not "
                                           r"supported.*float16"):
        EXAMPLES["silu"](mx.zeros((4,), dtype=mx.complex64))


def test_mixing_torch_and_mlx():
    with pytest.raises(BindingError, match=r"'w' is a torch.Tensor but 'x' is an mlx.core.array"
                                           r"|'x' is a torch.Tensor but 'w' is an mlx"):
        EXAMPLES["rms_norm"](mx.zeros((2, 8)), torch.zeros(8))


def test_mlx_without_metal_says_so():
    if mx.metal.is_available():
        pytest.skip("this machine has Metal")
    with pytest.raises(RuntimeError, match=r"no Metal back-end.*mf.backend\('sim'\)"):
        EXAMPLES["silu"](mx.zeros((4,)))


def test_backend_and_argument_kind_must_agree():
    with pytest.raises(DeviceError, match="backend 'mlx' runs on mlx.core.array"):
        with mf.backend("mlx"):
            EXAMPLES["silu"](torch.zeros(4))
    with pytest.raises(DeviceError, match="backend 'mps' runs on torch tensors"):
        with mf.backend("mps"):
            EXAMPLES["silu"](mx.zeros((4,)))


def test_mlx_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "mlx", None)
    monkeypatch.setitem(sys.modules, "mlx.core", None)
    with pytest.raises(ImportError, match=r"pip install 'metalforge\[mlx\]'"):
        mfx.mx()


# --------------------------------------------------------------------------- show

def test_cli_show_backend_mlx(capsys):
    assert cli_main(["show", str(ROOT / "examples" / "rms_norm.py") + "::rms_norm",
                     "--backend", "mlx", "--dtype", "f16"]) == 0
    out = capsys.readouterr().out
    for host in ("rms_norm_f16_simd", "rms_norm_f16_group", "rms_norm_f16_looped"):
        assert f"{host} = mx.fast.metal_kernel(" in out
    assert "input_names=['x', 'w', 'eps', 'mf_size_D', 'mf_size_B']" in out
    assert "template=[('T', mx.float16), ('mf_index_t', mx.uint32)]" in out
    assert "kernel void" not in out and "[[buffer(" not in out
    assert "const uint mf_tid = uint(thread_position_in_grid.x);" in out


# --------------------------------------------------------------------------- more dtypes

@mf.kernel
def shift_mask(x: "T[N]", k: int, on: bool = True):
    return mf.where(on, x * k, x) > 3


@mf.kernel
def affine(x: "T[R, D]", a: "f32[D]", scale: float = 2.0):
    return x.to(mf.f32) * scale + a


def test_integer_dtypes_int_and_bool_scalars_bool_output():
    x = mx.array([-4, 0, 1, 2, 3, 7, 100, -100, 5], dtype=mx.int16)
    with mf.backend("sim"):
        y = shift_mask(x, 2, on=True)
        n = shift_mask(x, 2, on=False)
    assert y.dtype == mx.bool_
    assert np.array(y).tolist() == [v * 2 > 3 for v in np.array(x).tolist()]
    assert np.array(n).tolist() == [v > 3 for v in np.array(x).tolist()]
    xu = mx.arange(40, dtype=mx.uint8).reshape(4, 10)
    a = mx.random.normal((10,))
    with mf.backend("sim"):
        got = affine(xu, a, scale=0.25)
    ref = affine.reference(xu, a, scale=0.25)
    assert mfx.is_array(ref)
    np.testing.assert_allclose(np.array(got), np.array(ref), rtol=1e-6, atol=1e-6)


def test_64_bit_indexing_variant():
    k = EXAMPLES["silu"].with_launch(index64=True)
    x = mx.random.normal((3, 33))
    call, _ = mfx.prepare(k.graph(x), {"x": x}, launch=k.launch)
    assert dict(call.kernel.template)["mf_index_t"] == "ulong"
    assert "const constant uint64_t& mf_numel" in mfx.captured_source(call)
    with mf.backend("sim"):
        y = k(x)
    np.testing.assert_allclose(np.array(y), np.array(EXAMPLES["silu"].reference(x)), rtol=1e-6,
                               atol=1e-6)


def test_the_mlx_call_itself(monkeypatch):
    """With Metal present the call goes to the metal_kernel object with the same inputs and
    keyword arguments the simulator path uses; outputs come back in the kernel's order."""
    calls = []

    class Fake:
        def __init__(self, **kw):
            self.made = kw

        def __call__(self, *, inputs, output_shapes, output_dtypes, grid, threadgroup,
                     template):
            calls.append(dict(inputs=inputs, grid=grid, threadgroup=threadgroup,
                              template=template, names=self.made["output_names"]))
            return [mx.full(s, float(i + 1), dtype=d)
                    for i, (s, d) in enumerate(zip(output_shapes, output_dtypes))]

    monkeypatch.setattr(mx.metal, "is_available", lambda: True)
    monkeypatch.setattr(mx.fast, "metal_kernel", Fake)
    mfx._built.clear()
    x = mx.zeros((4, 100), dtype=mx.float16)
    h, s = EXAMPLES["add_silu"](x, x)
    (c,) = calls
    # 400 halves: fewer than small_grid, the small kernel's 4 a thread
    assert c["grid"] == (100, 1, 1) and c["threadgroup"][1:] == (1, 1)
    assert c["template"] == [("T", mx.float16), ("mf_index_t", mx.uint32)]
    assert [a.shape for a in c["inputs"]] == [(4, 100), (4, 100), ()]
    first = c["names"][0]
    out0 = h if first == "mf_out0" else s
    assert float(out0[0, 0]) == 1.0
    mfx._built.clear()
