"""The CUDA backend on an NVIDIA GPU (skipped without one): every example kernel through
`check` on CUDA tensors (all three families), Metal's partial edge threadgroups, streams, the
call model and its errors. The simulator is the reference for Metal semantics in the
hand-written kernels below: the same MSL runs on both and must agree."""
import ctypes
import importlib.util
import inspect
import threading
from pathlib import Path

import pytest
import torch

import metalforge as mf
from metalforge import cuda as mfcuda
from metalforge import sim
from metalforge.testing import check
from tests.sim.test_sim_fidelity import GEMM_MSL, GEMM_TYPES, _lane_coords

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.py"))


def _module(path):
    spec = importlib.util.spec_from_file_location(f"mf_example_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _kernels(path):
    return _module_kernels(_module(path))


def _module_kernels(mod):
    """The module's kernels, also those it keeps as operators only (`kernel.as_op`:
    `.kernel`), each once."""
    found: dict[int, tuple] = {}
    for n, k in inspect.getmembers(mod):
        k = getattr(k, "kernel", k)
        if isinstance(k, mf.Kernel):
            found.setdefault(id(k), (n, k))
    return list(found.values())


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_checks_on_cuda(path):
    mod = _module(path)
    kernels = _module_kernels(mod)
    assert kernels
    for n, k in kernels:                # CHECK: an example's check() options per kernel
        report = check(k, backend="cuda", max_examples=25, **getattr(mod, "CHECK", {}).get(n, {}))
        assert report is not None


def _example(name):
    return dict(_kernels(Path(__file__).resolve().parents[2] / "examples" / f"{name}.py"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rows,cols", [(3, 1), (9, 17), (5, 96), (37, 200), (7, 1000), (3, 4096),
                                       (2, 20000)])
def test_row_kernels_every_variant(dtype, rows, cols):
    """simd, group and looped variants (by row length) against torch on the GPU."""
    rms_norm = _example("rms_norm")["rms_norm"]
    softmax = _example("softmax")["softmax"]
    x = torch.randn(rows, cols, dtype=dtype, device="cuda")
    w = torch.randn(cols, dtype=dtype, device="cuda")
    tol = dict(rtol=2e-2, atol=2e-2) if dtype != torch.float32 else dict(rtol=1e-4, atol=1e-5)
    y = rms_norm(x, w)
    ref = torch.nn.functional.rms_norm(x.float(), (cols,), w.float(), eps=1e-6).to(dtype)
    torch.testing.assert_close(y, ref, **tol)
    torch.testing.assert_close(softmax(x), torch.softmax(x.float(), -1).to(dtype), **tol)


@pytest.mark.parametrize("launch", [dict(rows_per_group=4),
                                    dict(threads_per_group=96, looped_limit=384),
                                    dict(threads_per_group=64, looped_limit=64)])
def test_overhang_row_kernels(launch):
    """Grids that the group size does not divide: 5 rows at 4 rows per group (the last group
    has one simdgroup), and threadgroups that are not whole warps."""
    rms_norm = _example("rms_norm")["rms_norm"].with_launch(**launch)
    for rows, cols in [(5, 100), (9, 700), (3, 5000)]:
        x = torch.randn(rows, cols, device="cuda")
        w = torch.randn(cols, device="cuda")
        ref = torch.nn.functional.rms_norm(x, (cols,), w, eps=1e-6)
        torch.testing.assert_close(rms_norm(x, w), ref, rtol=1e-4, atol=1e-5)


def test_overhang_elementwise():
    silu = _example("silu")["silu"]
    for n in [1, 3, 31, 33, 1023, 1025, 4099, 1 << 20 | 7]:
        x = torch.randn(n, device="cuda", dtype=torch.float16)
        torch.testing.assert_close(silu(x), torch.nn.functional.silu(x.float()).half(),
                                   rtol=2e-3, atol=2e-3)


# A kernel that exposes Metal's edge-threadgroup semantics: the actual group size, the simdgroup
# numbering, a simd_sum over a partial simdgroup and a threadgroup reduction with a barrier.
EDGE_MSL = """
#include <metal_stdlib>
using namespace metal;
kernel void edge(device float* out [[buffer(0)]], device const float* x [[buffer(1)]],
                 uint2 gid [[thread_position_in_grid]], uint2 tpg [[threads_per_threadgroup]],
                 uint2 grid [[threads_per_grid]], uint2 lid [[thread_position_in_threadgroup]],
                 uint li [[thread_index_in_threadgroup]], ushort lane [[thread_index_in_simdgroup]],
                 ushort sg [[simdgroup_index_in_threadgroup]],
                 ushort nsg [[simdgroups_per_threadgroup]]) {
    threadgroup float part[32];
    const uint i = gid.y * grid.x + gid.x;
    const float v = x[i];
    const float s = simd_sum(v);
    if (lane == 0) part[sg] = s;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float total = 0.0f;
    for (ushort k = 0; k < nsg; ++k) total += part[k];
    out[6 * i + 0] = float(tpg.x * 1000 + tpg.y);
    out[6 * i + 1] = float(lid.x * 1000 + lid.y);
    out[6 * i + 2] = float(li);
    out[6 * i + 3] = float(sg * 100 + lane);
    out[6 * i + 4] = s;
    out[6 * i + 5] = total;
}
"""


@pytest.mark.parametrize("threads,group", [(100, 64), (70, 32), (45, 48), ([37, 5], [16, 4]),
                                           ([20, 7], [8, 8]), (1000, 1024)])
def test_edge_threadgroups_match_metal_semantics(threads, group):
    grid = threads if isinstance(threads, list) else [threads, 1]
    n = grid[0] * grid[1]
    x = torch.arange(n, dtype=torch.float32) % 7 + 1
    ref = torch.full((6 * n,), -1.0)
    sim.compile_shader(EDGE_MSL).edge(ref, x, threads=threads, group_size=group)
    got = torch.full((6 * n,), -1.0, device="cuda")
    mfcuda.compile_shader(EDGE_MSL).edge(got, x.cuda(), threads=threads, group_size=group)
    torch.testing.assert_close(got.cpu().view(n, 6), ref.view(n, 6), rtol=0, atol=0)


BITS_MSL = """
#include <metal_stdlib>
using namespace metal;
kernel void bits(device uint* out [[buffer(0)]], device const uint* x [[buffer(1)]],
                 device const ulong* y [[buffer(2)]], uint i [[thread_position_in_grid]]) {
    const uint v = x[i];
    out[9 * i + 0] = clz(v);
    out[9 * i + 1] = ctz(v);
    out[9 * i + 2] = popcount(v);
    out[9 * i + 3] = uint(clz(ushort(v)));
    out[9 * i + 4] = uint(ctz(ushort(v)));
    out[9 * i + 5] = uint(popcount(uchar(v)));
    out[9 * i + 6] = uint(clz(uchar(v)));
    out[9 * i + 7] = uint(clz(y[i]));
    out[9 * i + 8] = uint(popcount(y[i]));
}
"""


def test_bit_counts_match_the_simulator():
    """clz / ctz / popcount (the row kernels' lanes-per-row uses clz), 0 included."""
    x = torch.tensor([0, 1, 2, 3, 255, 256, 0x8000, 0xFFFF, 0x10000, 0x7FFFFFFF], dtype=torch.int64)
    x = torch.cat([x, torch.randint(0, 2 ** 32, (22,))]).to(torch.uint32)
    y = torch.randint(0, 2 ** 62, (32,), dtype=torch.int64).to(torch.uint64)
    y[0] = 0
    ref = torch.zeros(9 * 32, dtype=torch.uint32)
    sim.compile_shader(BITS_MSL).bits(ref, x, y, threads=32, group_size=32)
    got = torch.zeros(9 * 32, dtype=torch.uint32, device="cuda")
    mfcuda.compile_shader(BITS_MSL).bits(got, x.cuda(), y.cuda(), threads=32, group_size=32)
    assert torch.equal(got.cpu(), ref)
    assert ref[0] == 32 and ref[1] == 32 and ref[3] == 16 and ref[6] == 8


LITERALS_MSL = r"""
#include <metal_stdlib>
using namespace metal;
kernel void lits(device half* h [[buffer(0)]], device bfloat* b [[buffer(1)]],
                 uint i [[thread_position_in_grid]]) {
    h[i] = 1.5h + half(i) * 2h - 0.25H;
    b[i] = 0.5bf * bfloat(i) + 3bf;
}
"""


def test_half_and_bfloat_literals_match_the_simulator():
    """MSL's literal suffixes (h, H, bf) compile for CUDA and mean what they do in Metal."""
    ref = (torch.zeros(8, dtype=torch.float16), torch.zeros(8, dtype=torch.bfloat16))
    sim.compile_shader(LITERALS_MSL).lits(*ref, threads=8)
    got = tuple(t.cuda() for t in (torch.ones(8, dtype=torch.float16),
                                   torch.ones(8, dtype=torch.bfloat16)))
    mfcuda.compile_shader(LITERALS_MSL).lits(*got, threads=8)
    assert all(torch.equal(g.cpu(), r) for g, r in zip(got, ref))
    assert ref[0][3].item() == 7.25 and ref[1][2].item() == 4.0


@pytest.mark.parametrize("t,u", GEMM_TYPES)
@pytest.mark.parametrize("bt", [0, 1])
def test_simdgroup_matrix_matches_the_simulator(t, u, bt):
    """simdgroup_matrix loads (origins, strides, transposed), multiply-accumulates chained
    over K and stores: half and bfloat products on the tensor cores, float through shuffles;
    the same MSL on the simulator, both against torch, and the lanes own the same elements
    (Apple's layout, which thread_elements() exposes)."""
    dt = {"float": torch.float32, "half": torch.float16, "bfloat": torch.bfloat16}
    g = torch.Generator().manual_seed(3)
    k = 40
    a = torch.randn(16, k, generator=g).to(dt[t])
    b = torch.randn(k, 16, generator=g).to(dt[t])
    c = torch.randn(16, 16, generator=g)
    want = (a.double() @ b.double() + c.double())
    bb = b.T.contiguous() if bt else b
    outs = []
    for backend, dev in ((sim, "cpu"), (mfcuda, "cuda")):
        d = torch.zeros(16, 16, dtype=dt[u], device=dev)
        owned = torch.zeros(64, device=dev)
        lib = backend.compile_shader(GEMM_MSL)
        getattr(lib, f"gemm_{t}_{u}")(a.to(dev), bb.to(dev), c.to(dev), d, owned, k, bt,
                                      threads=128, group_size=128,
                                      arg_casts={5: "int32", 6: "int32"})
        outs.append((d.cpu(), owned.cpu()))
    tol = dict(rtol=1e-5, atol=1e-4) if u == "float" else dict(rtol=2e-3, atol=2e-2)
    for d, owned in outs:
        torch.testing.assert_close(d.double(), want.to(d.dtype).double(), **tol)
        for lane in range(32):
            r, col = _lane_coords(lane)
            assert owned[2 * lane] == d[r, col].float()
            assert owned[2 * lane + 1] == d[r, col + 1].float()
    torch.testing.assert_close(outs[1][0], outs[0][0], **tol)


def test_runs_on_the_current_stream_without_sync():
    silu = _example("silu")["silu"]
    x = torch.randn(1 << 22, device="cuda")
    silu(x)                                        # compiled first: NVRTC would outlast the sleep
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.cuda._sleep(10_000_000)              # keeps the stream busy: a sync would wait
        y = silu(x)
        assert not s.query()                       # queued behind the sleep, not finished
    s.synchronize()
    torch.testing.assert_close(y, torch.nn.functional.silu(x))


def test_compiled_once_per_source_and_device():
    lib = mfcuda.compile_shader(EDGE_MSL)
    k = lib.edge
    assert lib.edge is k
    assert k.max_threads_per_threadgroup <= 1024
    assert k.static_thread_group_memory_length == 32 * 4
    assert len(lib._modules) == 1


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_register_cap_never_spills(dtype):
    # kernels without a declared limit are compiled at <= 32 registers (two groups of 1024 a
    # core) unless that spills: then uncapped. layer_norm's group kernel: 40 registers in f32
    # (fits the cap), 63 in f16 (would spill 160 bytes a thread)
    from metalforge.cuda.library import _CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES as LOCAL
    ln = _module(Path(__file__).resolve().parents[2] / "examples" / "layer_norm.py").layer_norm
    x = torch.randn(8, 8192, device="cuda").to(dtype)
    w, b = torch.randn(8192, device="cuda").to(dtype), torch.randn(8192, device="cuda").to(dtype)
    lib = mfcuda.compile_shader(ln.source(x, w, b))
    m = lib.module(torch.cuda.current_device())
    entries = lib._order
    for e in entries:      # capped at 32 registers, or uncapped because the cap spilled
        assert m.attribute(e.symbol, LOCAL) == 0
        assert (m.attribute(e.symbol, 4) > 32) == (e.symbol in m.uncapped)   # NUM_REGS
    torch.testing.assert_close(ln(x, w, b), ln.reference(x, w, b), rtol=2e-2, atol=2e-2)


def test_middle_cap_where_it_spills_little():
    # attention prefill's narrow twin (E up to 64) uncapped takes about 150 registers (3
    # groups of 128 a core); under its middle cap (128 registers, 4 groups) it spills at most
    # SMALL_SPILL bytes and runs faster: the library keeps it there. The E = 128 kernel is
    # kept under its middle cap or, where that would spill more, stays uncapped without local
    # memory (both seen on an H200 as the kernel changed). Each prefill kernel's result
    # against the reference.
    from metalforge.cuda.library import _CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES as LOCAL
    from metalforge.cuda.library import SMALL_SPILL
    attention = _example("attention")["attention"]
    for e in (64, 128):                       # the narrow twin, the main kernel
        q, k, v = (torch.randn(1, 4, 256, e, device="cuda", dtype=torch.float16)
                   for _ in range(3))
        src = attention.with_launch(target="cuda").source(q, k, v, e ** -0.5)
        lib = mfcuda.compile_shader(src, metal_version=400)
        m = lib.module(torch.cuda.current_device())
        prefill = [x.symbol for x in lib._order if x.host_name.endswith(
            "_prefill_narrow" if e == 64 else "_prefill")]
        assert prefill and (e == 128 or set(prefill) <= m.mid)
        for sym in m.mid:
            assert m.groups_per_core(sym, 128) >= 3 and m.attribute(sym, LOCAL) <= SMALL_SPILL
        for sym in set(prefill) - m.mid:
            assert m.attribute(sym, LOCAL) == 0
        torch.testing.assert_close(attention(q, k, v, e ** -0.5),
                                   attention.reference(q, k, v, e ** -0.5).to(q.dtype),
                                   rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_staged_rows_where_twice_the_groups_fit(dtype):
    # cuda builds the staged row kernel (stage_rows=None) and takes it for rows of whole
    # blocks where the device fits at least twice as many of its groups a core; each kernel
    # against the reference, whichever is taken
    ln = _example("layer_norm")["layer_norm"]
    d = 16384 if dtype != torch.float32 else 8192
    x = torch.randn(64, d, device="cuda").to(dtype)
    w, b = torch.randn(d, device="cuda").to(dtype), torch.randn(d, device="cuda").to(dtype)
    want = ln.reference(x, w, b)
    hosts = {}
    for stage in (True, False, None):
        k = ln.with_launch(stage_rows=stage)
        (hosts[stage], _, group), = k.launches(x, w, b)
        torch.testing.assert_close(k(x, w, b), want, rtol=2e-2, atol=2e-2)
    assert hosts[True].endswith("_staged") and hosts[False].endswith("_group")
    lib = mfcuda.compile_shader(ln.with_launch(stage_rows=None).source(x, w, b))
    fits = {v: getattr(lib, hosts[v]).groups_per_core(group) for v in (True, False)}
    assert hosts[None] == hosts[fits[True] >= 2 * fits[False]], fits
    assert ln.launches(x, w, b)[0][0] == hosts[None]           # the backend's own choice


@pytest.mark.parametrize("rows,cols", [(6, 20000), (64, 65536), (300, 16384)])
def test_layer_norm_centered_on_the_gpu(rows, cols):
    """The launch option centered (layer_norm's mean and variance in one streamed pass: the
    looped kernel, or split rows at few of them) through the shim's simd_max / simd_sum, a
    mean 1e3 from 0, against torch in float64: as accurate as two passes. (Either is off by
    a few ulp of the mean over the standard deviation, times w: 2e-4 to 5e-4 here.)"""
    ln = _example("layer_norm")["layer_norm"]
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(rows, cols, device="cuda", generator=g) * 2 + 1e3
    w = torch.randn(cols, device="cuda", generator=g)
    b = torch.randn(cols, device="cuda", generator=g)
    want = torch.nn.functional.layer_norm(x.double(), (cols,), w.double(), b.double())
    err = {}
    for centered in (True, False):
        k = ln.with_launch(centered=centered)
        host = k.launches(x, w, b)[0][0]
        assert host.endswith(("_looped", "_split")), host
        err[centered] = (k(x, w, b).double() - want).abs().max().item()
    assert err[True] <= 1.5 * err[False] + 1e-6 and err[True] < 1e-3, err


def test_call_errors():
    lib = mfcuda.compile_shader("""
#include <metal_stdlib>
using namespace metal;
kernel void axpy(device float* y [[buffer(0)]], device const float* x [[buffer(1)]],
                 constant float& a [[buffer(2)]], constant uint& n [[buffer(3)]],
                 uint i [[thread_position_in_grid]]) {
    if (i < n) y[i] = a * x[i] + y[i];
}""")
    y, x = torch.zeros(10, device="cuda"), torch.ones(10, device="cuda")
    lib.axpy(y, x, 2.0, 10, threads=10, arg_casts={3: "int32"})
    torch.testing.assert_close(y, torch.full((10,), 2.0, device="cuda"))
    with pytest.raises(TypeError, match="takes 4 arguments"):
        lib.axpy(y, x, 2.0, threads=10)
    with pytest.raises(TypeError, match=r"arg_casts=\{3: 'int32'\}"):
        lib.axpy(y, x, 2.0, 10, threads=10)
    with pytest.raises(TypeError, match="elements are half"):
        lib.axpy(y, x.half(), 2.0, 10, threads=10, arg_casts={3: "int32"})
    with pytest.raises(TypeError, match=r"needs CUDA tensors.*\.cuda\(\)"):
        lib.axpy(y, x.cpu(), 2.0, 10, threads=10, arg_casts={3: "int32"})
    with pytest.raises(TypeError, match="expects a value"):
        lib.axpy(y, x, torch.tensor(2.0, device="cuda"), 10, threads=10, arg_casts={3: "int32"})
    with pytest.raises(ValueError, match="exceeds 1024"):
        lib.axpy(y, x, 2.0, 10, threads=4096, group_size=2048, arg_casts={3: "int32"})
    with pytest.raises(AttributeError, match="no kernel named 'nope'"):
        lib.nope


def test_compile_errors_point_at_the_line():
    bad = ("#include <metal_stdlib>\nusing namespace metal;\n"
           "kernel void k(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {\n"
           "    y[i] = undefined_name;\n}\n")
    with pytest.raises(SyntaxError, match="undefined_name") as e:
        mfcuda.compile_shader(bad).k(torch.zeros(4, device="cuda"), threads=4)
    assert e.value.lineno == 4


def test_backend_selection_on_cuda_tensors():
    silu = _example("silu")["silu"]
    x = torch.randn(1000, device="cuda")
    assert mf.runtime.current_backend([x]) == "cuda"
    y = silu(x)
    assert y.device.type == "cuda"
    assert any(c["backend"] == "cuda" for c in silu.variants(compiled=True))
    with mf.backend("sim"), pytest.raises(mf.runtime.DeviceError, match="backend 'sim'"):
        silu(x)


# --------------------------------------------------------------------------- warm calls (plans)

SCALE = """
#include <metal_stdlib>
using namespace metal;
kernel void scale(device float* y [[buffer(0)]], device const float* x [[buffer(1)]],
                  constant float& a [[buffer(2)]], constant uint& n [[buffer(3)]],
                  uint i [[thread_position_in_grid]]) {
    if (i < n) y[i] = a * x[i];
}"""

# every kind of value parameter, written back as floats: checks the packed parameter buffer
# against the entry point's real parameter layout on the GPU
VALUES = """
#include <metal_stdlib>
using namespace metal;
kernel void values(device float* out [[buffer(0)]], constant char& c [[buffer(1)]],
                   constant half2& h [[buffer(2)]], constant bfloat& b [[buffer(3)]],
                   constant short& s [[buffer(4)]], constant float3& f [[buffer(5)]],
                   constant uchar& u [[buffer(6)]], constant long& l [[buffer(7)]],
                   constant ushort4& us [[buffer(8)]], constant bool& t [[buffer(9)]],
                   constant int2& i2 [[buffer(10)]], constant uint& n [[buffer(11)]],
                   uint i [[thread_position_in_grid]]) {
    if (i != 0) return;
    out[0] = float(c); out[1] = float(h.x); out[2] = float(h.y); out[3] = float(b);
    out[4] = float(s); out[5] = f.x; out[6] = f.y; out[7] = f.z; out[8] = float(u);
    out[9] = float(l); out[10] = float(us.x); out[11] = float(us.w); out[12] = t ? 1.0f : 0.0f;
    out[13] = float(i2.x); out[14] = float(i2.y); out[15] = float(n);
}"""
VALUE_CASTS = {1: "int8", 2: "fp16", 3: "bf16", 4: "int16", 6: "uint8", 8: "int16", 9: "int8",
               10: "int32", 11: "int32"}


def test_warm_calls_with_changing_values_shapes_and_scalars():
    lib = mfcuda.compile_shader(SCALE)
    for rnd in range(3):
        for n, a in [(10, 2.0), (1000, -0.5), (3, 7.25), (4097, 1e-3)]:
            x = torch.randn(n, device="cuda")
            y = torch.full((n,), float("nan"), device="cuda")
            a_arg = torch.tensor(a) if rnd == 2 else a           # a 0-dim CPU tensor too
            lib.scale(y, x, a_arg, n, threads=n, group_size=min(n, 256),
                      arg_casts={3: "int32"})
            torch.testing.assert_close(y, a * x)
    assert len(lib.scale._plans) == 4 + 4           # one per (threads, group) and per a's kind
    with pytest.raises(TypeError, match="elements are half"):         # warm, and still checked
        lib.scale(y.half(), x.half(), 2.0, 3, threads=3, group_size=3, arg_casts={3: "int32"})
    with pytest.raises(TypeError, match=r"arg_casts=\{3: 'int32'\}"):
        lib.scale(y, x, 2.0, 3, threads=3, group_size=3)


def test_every_value_kind_reaches_the_kernel():
    lib = mfcuda.compile_shader(VALUES)
    out = torch.zeros(16, device="cuda")
    for k in range(3):                                   # cold, then warm with other values
        args = (out, -5 - k, [0.5 + k, -2.0], 1.5 * (k + 1), -300 * (k + 1),
                [1.0, 2.0 + k, -3.0], 200 + k, -(2 ** 40) * (k + 1), [1, 2, 3, 60000 - k],
                k % 2 == 0, [-7, 2 ** 20 + k], 2 ** 31 + k)
        lib.values(*args, threads=1, group_size=1, arg_casts=VALUE_CASTS)
        want = [-5 - k, 0.5 + k, -2.0, 1.5 * (k + 1), -300 * (k + 1), 1.0, 2.0 + k, -3.0,
                200 + k, -(2 ** 40) * (k + 1), 1, 60000 - k, float(k % 2 == 0), -7, 2 ** 20 + k,
                2 ** 31 + k]
        torch.testing.assert_close(out.cpu(), torch.tensor(want, dtype=torch.float32))
    assert len(lib.values._plans) == 1


def test_parameter_slots_match_the_driver():
    """Each slot of the parameter buffer has the size (and offset) that the driver reports for
    the entry point's parameter (cuFuncGetParamInfo, CUDA 12.4+)."""
    from metalforge.cuda import call as C
    from metalforge.cuda import library
    lib = mfcuda.compile_shader(VALUES)
    out = torch.zeros(16, device="cuda")
    lib.values(out, 1, [1.0, 1.0], 1.0, 1, [1.0, 1.0, 1.0], 1, 1, [1, 1, 1, 1], True, [1, 1], 1,
               threads=1, group_size=1, arg_casts=VALUE_CASTS)
    drv = library._libcuda()
    if not hasattr(drv, "cuFuncGetParamInfo"):
        pytest.skip("the driver has no cuFuncGetParamInfo (CUDA < 12.4)")
    (plan,) = lib.values._plans._entries.values()
    func, _ = lib.values._compiled(torch.cuda.current_device())
    for k, slot in enumerate(plan.layout.slots):
        off, size = ctypes.c_size_t(), ctypes.c_size_t()
        library._check(drv.cuFuncGetParamInfo(func, ctypes.c_size_t(k), ctypes.byref(off),
                                              ctypes.byref(size)), "cuFuncGetParamInfo")
        assert (off.value, size.value) == (slot.offset, slot.size), k
    assert C.POINTER_SIZE == ctypes.sizeof(ctypes.c_void_p)


def test_metalforge_kernels_warm_across_dtypes_and_shapes():
    rms_norm = _example("rms_norm")["rms_norm"]
    silu = _example("silu")["silu"]
    for _ in range(3):
        for dtype in [torch.float32, torch.float16, torch.bfloat16]:
            for rows, cols, eps in [(3, 100, 1e-6), (7, 1000, 1e-3), (1, 5000, 0.5)]:
                x = torch.randn(rows, cols, dtype=dtype, device="cuda")
                w = torch.randn(cols, dtype=dtype, device="cuda")
                tol = dict(rtol=2e-2, atol=2e-2) if dtype != torch.float32 else {}
                ref = torch.nn.functional.rms_norm(x.float(), (cols,), w.float(), eps=eps)
                torch.testing.assert_close(rms_norm(x, w, eps), ref.to(dtype), **tol)
                torch.testing.assert_close(silu(x), torch.nn.functional.silu(x.float()).to(dtype),
                                           **tol)


def test_two_threads_call_one_kernel_concurrently():
    lib = mfcuda.compile_shader(SCALE)
    rms_norm = _example("rms_norm")["rms_norm"]
    results, errors = {}, []

    def worker(t):
        try:
            x = torch.randn(4099, device="cuda")           # made here: binds this thread's context
            w = torch.randn(4099, device="cuda")
            xs = torch.randn(5, 4099, device="cuda")
            outs = []
            for i in range(200):
                a = float(t * 1000 + i)
                y = torch.empty_like(x)
                lib.scale(y, x, a, 4099, threads=4099, group_size=256, arg_casts={3: "int32"})
                outs.append((a, y, rms_norm(xs, w, 1e-6 * (i + 1))))
            torch.cuda.synchronize()
            results[t] = (x, w, xs, outs)
        except Exception as e:                           # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    for t, (x, w, xs, outs) in results.items():
        for i, (a, y, r) in enumerate(outs):
            torch.testing.assert_close(y, a * x)
            ref = torch.nn.functional.rms_norm(xs, (4099,), w, eps=1e-6 * (i + 1))
            torch.testing.assert_close(r, ref, rtol=1e-4, atol=1e-5)


def test_cuda_prefill_runs_on_tensor_cores_for_half_operands():
    """On the cuda target, f16 prefill runs the matrix-block kernel (Metal 4 tensor ops, which
    the shim runs as mma.sync) and matches the decode kernels; f32 keeps the decode kernels
    (fp32 simdgroup_matrix products are only emulated there); target apple9 runs the
    simdgroup_matrix lowering of the same kernel."""
    attention = _module(EXAMPLES[0].parent / "attention.py").attention
    q, k, v = (torch.randn(1, 4, 40, 24, device="cuda", dtype=torch.float16) for _ in range(3))
    assert "_prefill" in attention.launches(q, k, v, 0.2)[0][0]   # or its narrow twin
    decode = attention.with_launch(matrix_rows=0)
    want = decode(q, k, v, 0.2)
    torch.testing.assert_close(attention(q, k, v, 0.2), want, rtol=2e-3, atol=2e-3)
    simd = attention.with_launch(target="apple9")
    torch.testing.assert_close(simd(q, k, v, 0.2), want, rtol=2e-3, atol=2e-3)
    q32, k32, v32 = (x.float() for x in (q, k, v))
    assert "_prefill" not in attention.launches(q32, k32, v32, 0.2)[0][0]


def test_autotune_times_candidates_on_cuda():
    """CUDA is a GPU: autotune times every candidate (here attention's prefill with its
    matrix-block kernel, the cuda default, and without it) and keeps the fastest, keyed by the
    GPU's name."""
    attention = _module(EXAMPLES[0].parent / "attention.py").attention
    q, k, v = (torch.randn(1, 8, 128, 64, device="cuda", dtype=torch.float16)
               for _ in range(3))
    r = mf.autotune(attention, q, k, v, 0.125, candidates=[{"matrix_rows": 0}],
                    progress=False, save=False)
    ok = [t for t in r.trials if t.status == "ok"]
    assert r.timed and len(ok) == 2 and all(t.seconds and t.seconds > 0 for t in ok)
    assert r.best == min(ok, key=lambda t: t.seconds).launch
    assert r.device == torch.cuda.get_device_name()


def test_gather_in_a_cuda_graph_has_no_report_fill(monkeypatch):
    """Captured in a CUDA graph, a gather's error report is not zeroed (nothing reads it there:
    no fill kernel in every replay); replays gather right; eager calls still zero and read it,
    so an id out of range raises, before and after the capture, and the warm path does too."""
    embed = _example("embedding")["embed"]
    table = torch.randn(1000, 256, dtype=torch.float16, device="cuda")
    ids = torch.randint(0, 1000, (64,), dtype=torch.int32, device="cuda")
    want = torch.nn.functional.embedding(ids, table)
    torch.testing.assert_close(embed(table, ids), want)        # warm: the replayed call path
    zeros = torch.zeros

    def no_fill_while_capturing(*args, **kwargs):
        assert not torch.cuda.is_current_stream_capturing(), "a fill kernel in the graph"
        return zeros(*args, **kwargs)

    monkeypatch.setattr(torch, "zeros", no_fill_while_capturing)
    g, s = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        embed(table, ids)
        with torch.cuda.graph(g, stream=s):
            out = embed(table, ids)
    torch.cuda.current_stream().wait_stream(s)
    ids.copy_(torch.randint(0, 1000, (64,), dtype=torch.int32, device="cuda"))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        g.replay()
        torch.cuda.synchronize()
    ran = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert len(ran) == 1, ran                                   # the gather kernel alone
    torch.testing.assert_close(out, torch.nn.functional.embedding(ids, table))
    bad = ids.clone()
    bad[5] = 1000
    for _ in range(2):                                          # checked, then warm
        with pytest.raises(IndexError, match="index 1000 is out of range"):
            embed(table, bad)
    torch.testing.assert_close(embed(table, ids), torch.nn.functional.embedding(ids, table))
