"""metalforge.sim: binding rules, thread positions, threadgroup memory, templates, atomics.

Every kernel is hand-written MSL run through the simulator and checked against torch on the CPU.
Kernels are batched into few sources (the simulator caches compiled libraries on disk).
"""
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from metalforge import sim
from metalforge.sim import KernelError, compile_shader

SRC = r"""
#include <metal_stdlib>
using namespace metal;

kernel void add(device const float* a [[buffer(0)]], device const float* b [[buffer(1)]],
                device float* out [[buffer(2)]], uint i [[thread_position_in_grid]]) {
  out[i] = a[i] + b[i];
}

// implicit buffer indices, constant references, Python scalars
kernel void axpy(device float* y, constant float& alpha, device const float* x,
                 constant long& n, uint i [[thread_position_in_grid]]) {
  if (i < n) y[i] = alpha * x[i] + y[i];
}

// 1-D positions, written per thread (16 values each)
kernel void pos1d(device uint* out, uint gid [[thread_position_in_grid]],
                  ushort lid [[thread_position_in_threadgroup]],
                  uint tg [[threadgroup_position_in_grid]],
                  uint tptg [[threads_per_threadgroup]],
                  uint ngroups [[threadgroups_per_grid]],
                  uint tpg [[threads_per_grid]],
                  uint dtptg [[dispatch_threads_per_threadgroup]],
                  uint tiitg [[thread_index_in_threadgroup]],
                  uint lane [[thread_index_in_simdgroup]],
                  uint sg [[simdgroup_index_in_threadgroup]],
                  uint tpsg [[threads_per_simdgroup]],
                  uint sgptg [[simdgroups_per_threadgroup]],
                  uint qi [[thread_index_in_quadgroup]],
                  uint qg [[quadgroup_index_in_threadgroup]],
                  uint gsz [[grid_size]],
                  uint gorg [[grid_origin]]) {
  device uint* o = out + gid * 16;
  o[0] = gid; o[1] = lid; o[2] = tg; o[3] = tptg; o[4] = ngroups; o[5] = tpg; o[6] = dtptg;
  o[7] = tiitg; o[8] = lane; o[9] = sg; o[10] = tpsg; o[11] = sgptg; o[12] = qi; o[13] = qg;
  o[14] = gsz; o[15] = gorg;
}

// 3-D positions in vector forms
kernel void pos3d(device uint* out, uint3 gid [[thread_position_in_grid]],
                  ushort3 lid [[thread_position_in_threadgroup]],
                  uint3 tg [[threadgroup_position_in_grid]],
                  uint3 tptg [[threads_per_threadgroup]],
                  uint2 ngroups [[threadgroups_per_grid]],
                  uint3 tpg [[threads_per_grid]],
                  ushort3 dtptg [[dispatch_threads_per_threadgroup]],
                  uint tiitg [[thread_index_in_threadgroup]]) {
  uint flat = (gid.z * tpg.y + gid.y) * tpg.x + gid.x;
  device uint* o = out + flat * 18;
  o[0] = gid.x; o[1] = gid.y; o[2] = gid.z; o[3] = lid.x; o[4] = lid.y; o[5] = lid.z;
  o[6] = tg.x; o[7] = tg.y; o[8] = tg.z; o[9] = tptg.x; o[10] = tptg.y; o[11] = tptg.z;
  o[12] = ngroups.x; o[13] = ngroups.y; o[14] = dtptg.x; o[15] = dtptg.y; o[16] = dtptg.z;
  o[17] = tiitg;
}

// half in, bfloat out, float math
kernel void scale_cast(device const half* x, device bfloat* y, constant float& s,
                       uint i [[thread_position_in_grid]]) {
  y[i] = bfloat(float(x[i]) * s);
}

// lists: float list -> constant float*, int list cast to int32 -> constant int2&
kernel void poly(device const float* x, device float* y, constant float* c,
                 constant int2& range, uint i [[thread_position_in_grid]]) {
  float v = x[i];
  y[i] = (int(i) >= range.x && int(i) < range.y) ? c[0] + c[1] * v + c[2] * v * v : -1.0f;
}

// small integer casts
kernel void casts(device int* out, constant short& a, constant char& b, constant uchar& c,
                  constant half& d, constant bfloat& e, uint i [[thread_position_in_grid]]) {
  out[0] = a; out[1] = b; out[2] = c; out[3] = int(float(d) * 4); out[4] = int(float(e) * 4);
}

// atomics across threadgroups
kernel void count_positive(device const float* x, device atomic_uint* counter,
                           device atomic_int* total, uint i [[thread_position_in_grid]]) {
  if (x[i] > 0) {
    atomic_fetch_add_explicit(counter, 1u, memory_order_relaxed);
  }
  atomic_fetch_add_explicit(total, int(x[i] > 0 ? 1 : -1), memory_order_relaxed);
}

// threadgroup memory handed to helper functions as pointers; tree reduction with barriers
static float tree_sum(threadgroup float* buf, uint tid, uint n) {
  for (uint s = n / 2; s > 0; s /= 2) {
    if (tid < s) buf[tid] += buf[tid + s];
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  return buf[0];
}
inline void stage(threadgroup float* dst, device const float* src, uint tid) {
  dst[tid] = src[tid];
}

[[kernel]] void block_sum(device const float* x [[buffer(0)]], device float* out [[buffer(1)]],
                          uint tid [[thread_position_in_threadgroup]],
                          uint g [[threadgroup_position_in_grid]]) {
  threadgroup float buf[128];
  threadgroup float scratch[4], other[2][3];
  stage(buf, x + g * 128, tid);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float s = tree_sum(buf, tid, 128);
  if (tid == 0) { scratch[0] = s; out[g] = scratch[0]; other[1][2] = s; }
}

// explicit group-size limit
[[max_total_threads_per_threadgroup(256)]]
kernel void limited(device float* y, uint i [[thread_position_in_grid]]) { y[i] = float(i); }

// templates: all three instantiation forms
template <typename T, int K>
kernel void scale_t(device const T* x [[buffer(0)]], device T* y [[buffer(1)]],
                    uint i [[thread_position_in_grid]]) {
  threadgroup T tmp[K * 8];
  if (i < K * 8) tmp[i] = x[i];   // distinct elements: no race
  y[i] = T(float(x[i]) * K);
}
template [[host_name("scale_float_2")]] kernel void scale_t<float, 2>(
    device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
    uint i [[thread_position_in_grid]]);
template [[host_name("scale_half_3")]] [[kernel]] decltype(scale_t<half, 3>) scale_t<half, 3>;

template <typename T>
kernel void addt(constant T* a, constant T* b, device T* c, uint i [[thread_position_in_grid]]) {
  c[i] = a[i] + b[i];
}
template [[host_name("add_int")]] kernel void addt(constant int*, constant int*, device int*, uint);

#define INSTANTIATE_ADD(T) \
  template [[host_name("add_" #T)]] kernel void addt<T>(constant T*, constant T*, device T*, uint);
INSTANTIATE_ADD(float)
INSTANTIATE_ADD(long)
"""


@pytest.fixture(scope="module")
def lib():
    return compile_shader(SRC)


def test_dir_and_unknown_kernel(lib):
    names = dir(lib)
    for n in ["add", "axpy", "pos1d", "pos3d", "scale_float_2", "scale_half_3", "add_int",
              "add_float", "add_long", "block_sum", "limited"]:
        assert n in names
    assert "scale_t" not in names
    with pytest.raises(RuntimeError, match="Failed to create function state object for: nope"):
        lib.nope


def test_elementwise_and_default_threads(lib):
    a, b = torch.randn(1000), torch.randn(1000)
    out = torch.zeros(1000)
    lib.add(a, b, out)
    torch.testing.assert_close(out, a + b)


def test_python_scalars_and_implicit_indices(lib):
    y, x = torch.randn(300), torch.randn(300)
    ref = 2.5 * x + y
    lib.axpy(y, 2.5, x, 300)
    torch.testing.assert_close(y, ref)


def _pos1d_reference(n, g):
    rows = []
    ngroups = (n + g - 1) // g
    for gid in range(n):
        tg, lid = divmod(gid, g)
        actual = min(g, n - tg * g)
        rows.append([gid, lid, tg, actual, ngroups, n, g, lid, lid % 32, lid // 32, 32,
                     (actual + 31) // 32, lid % 4, lid // 4, n, 0])
    return torch.tensor(rows, dtype=torch.int64)


@pytest.mark.parametrize("n,g", [(100, 64), (70, 32), (5, 8)])
def test_positions_1d_partial_edge_groups(lib, n, g):
    out = torch.full((n * 16,), 7777, dtype=torch.int32)
    lib.pos1d(out, threads=n, group_size=g)
    torch.testing.assert_close(out.view(n, 16).long(), _pos1d_reference(n, g))


def test_default_group_size_1d_is_min_threads_max(lib):
    n = 1500
    out = torch.zeros(n * 16, dtype=torch.int32)
    lib.pos1d(out, threads=n)
    torch.testing.assert_close(out.view(n, 16).long(), _pos1d_reference(n, 1024))


@pytest.mark.parametrize("grid,group", [([5, 3, 2], [2, 2, 2]), ([7, 5], [4, 2])])
def test_positions_2d_3d(lib, grid, group):
    grid3, group3 = (grid + [1])[:3], (group + [1])[:3]
    total = grid3[0] * grid3[1] * grid3[2]
    out = torch.full((total * 18,), 9999, dtype=torch.int32)
    lib.pos3d(out, threads=grid, group_size=group)
    got = out.view(total, 18).long()
    ng = [(grid3[d] + group3[d] - 1) // group3[d] for d in range(3)]
    for z in range(grid3[2]):
        for y in range(grid3[1]):
            for x in range(grid3[0]):
                p = [x, y, z]
                tg = [p[d] // group3[d] for d in range(3)]
                lid = [p[d] % group3[d] for d in range(3)]
                act = [min(group3[d], grid3[d] - tg[d] * group3[d]) for d in range(3)]
                flat = (z * grid3[1] + y) * grid3[0] + x
                want = p + lid + tg + act + ng[:2] + group3 + \
                    [lid[0] + lid[1] * act[0] + lid[2] * act[0] * act[1]]
                assert got[flat].tolist() == want, (p, got[flat].tolist(), want)


def test_default_group_size_2d_is_max_1_1(lib):
    out = torch.zeros(3 * 4 * 18, dtype=torch.int32)
    lib.pos3d(out, threads=[3, 4])
    got = out.view(12, 18)
    assert got[:, 14].tolist() == [1024] * 12          # dispatch_threads_per_threadgroup.x
    assert got[:, 15].tolist() == [1] * 12


def test_half_bfloat_io(lib):
    x = torch.randn(257).half()
    y = torch.zeros(257, dtype=torch.bfloat16)
    lib.scale_cast(x, y, 1.5)
    torch.testing.assert_close(y, (x.float() * 1.5).bfloat16())


def test_list_arguments_and_casts(lib):
    x = torch.randn(64)
    y = torch.zeros(64)
    lib.poly(x, y, [0.5, -1.0, 2.0], [3, 40], arg_casts={3: "int32"})
    ref = 0.5 - x + 2 * x * x
    idx = torch.arange(64)
    ref = torch.where((idx >= 3) & (idx < 40), ref, torch.full_like(ref, -1.0))
    torch.testing.assert_close(y, ref)


def test_scalar_casts(lib):
    out = torch.zeros(5, dtype=torch.int32)
    lib.casts(out, -300, -5, 250, 0.75, 1.25, threads=1,
              arg_casts={1: "int16", 2: "int8", 3: "uint8", 4: "fp16", 5: "bf16"})
    assert out.tolist() == [-300, -5, 250, 3, 5]


def test_arg_casts_string_applies_to_all_scalars(lib):
    out = torch.zeros(5, dtype=torch.int32)
    with pytest.raises(TypeError, match=r"argument 2 .b. .*arg_casts=\{2: .int8.\}"):
        lib.casts(out, 1, 2, 3, 0.5, 0.5, threads=1, arg_casts="int16")
    with pytest.raises(RuntimeError, match="Unsupported cast instruction fp64"):
        lib.casts(out, 1, 2, 3, 0.5, 0.5, arg_casts={1: "fp64"})
    with pytest.raises(RuntimeError, match="Unexpected caster arg type"):
        lib.casts(out, 1, 2, 3, 0.5, 0.5, arg_casts=[1])


def test_storage_offset_views(lib):
    base = torch.arange(40, dtype=torch.float32)
    a = base[10:20]
    b = torch.ones(10)
    out_base = torch.zeros(30)
    out = out_base[5:15]
    lib.add(a, b, out)
    torch.testing.assert_close(out, base[10:20] + 1)
    assert out_base[:5].eq(0).all() and out_base[15:].eq(0).all()


def test_aliasing_in_place(lib):
    y = torch.randn(100)
    ref = y * 3
    lib.axpy(y, 2.0, y, 100)
    torch.testing.assert_close(y, ref)


def test_atomics_across_groups(lib):
    x = torch.randn(5000)
    counter = torch.zeros(1, dtype=torch.int32)
    total = torch.zeros(1, dtype=torch.int32)
    lib.count_positive(x, counter, total, group_size=64)
    pos = int((x > 0).sum())
    assert counter.item() == pos
    assert total.item() == pos - (5000 - pos)


def test_threadgroup_arrays_and_pointers(lib):
    x = torch.randn(6 * 128)
    out = torch.zeros(6)
    k = lib.block_sum
    k(x, out, threads=6 * 128, group_size=128)
    torch.testing.assert_close(out, x.view(6, 128).sum(1), rtol=1e-5, atol=1e-4)
    # 128*4 + 4*4 + 6*4 bytes, rounded up to 16
    assert k.static_thread_group_memory_length == 560


HALF_WRITTEN = r"""
#include <metal_stdlib>
using namespace metal;
kernel void half_written(device float* out [[buffer(0)]], device int* iout [[buffer(1)]],
                         uint lid [[thread_position_in_threadgroup]],
                         uint g [[threadgroup_position_in_grid]]) {
  threadgroup float buf[64];
  threadgroup int ibuf[64];
  if (lid < 32) {
    buf[lid] = float(g);
    ibuf[lid] = int(g);
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[g * 64 + lid] = buf[lid];
  iout[g * 64 + lid] = ibuf[lid];
}
"""


FILLS = {"nan": (-1, float("nan")), "high": (0x7BFF7BFF, 65504.0),
         "low": (-0x04000401, -65504.0)}       # int32 bits, the value as half


@pytest.mark.parametrize("order", ["forward", "reverse"])
@pytest.mark.parametrize("first", ["nan", "high", "low"])
def test_threadgroup_memory_read_before_written_holds_the_groups_fill(order, first):
    """On Metal a threadgroup array holds whatever an earlier group left (zeros in the first
    group of a fresh process, say); the simulator fills it at every group start, so a read
    before any thread wrote gives the fill in every group, the first included, not a plausible
    zero or another group's value. The groups take NaN (0xFF bytes), 0x7BFF and 0xFBFF in every
    16-bit unit (+-2.66e36 as float, +-65504 as half) in turn, from the first group's. (With
    the race detector on, as by default, such a read fails the launch: the next test.)"""
    lib = compile_shader(HALF_WRITTEN)
    out, iout = torch.zeros(5 * 64), torch.zeros(5 * 64, dtype=torch.int32)
    with sim.thread_order(order), sim.threadgroup_fill(first), sim.race_detection(False):
        lib.half_written(out, iout, threads=5 * 64, group_size=64)
    out, iout = out.view(5, 64), iout.view(5, 64)
    groups = torch.arange(5).view(5, 1).expand(5, 32)
    assert torch.equal(out[:, :32], groups.float()) and torch.equal(iout[:, :32], groups.int())
    names = list(FILLS)
    for g in range(5):
        fill = names[(names.index(first) + g) % 3]
        assert (iout[g, 32:] == FILLS[fill][0]).all(), (g, fill)
        assert torch.equal(out[g, 32:].view(torch.int32), iout[g, 32:])      # the same bytes
    half = torch.zeros(2 * 64, dtype=torch.half)
    with sim.threadgroup_fill(first), sim.race_detection(False):
        compile_shader(HALF_WRITTEN.replace("float", "half")).half_written(
            half, torch.zeros(2 * 64, dtype=torch.int32), threads=2 * 64, group_size=64)
    for g in range(2):
        want = FILLS[names[(names.index(first) + g) % 3]][1]
        torch.testing.assert_close(half[g * 64 + 32:(g + 1) * 64],
                                   torch.full((32,), want, dtype=torch.half), equal_nan=True)


@pytest.mark.parametrize("order", ["forward", "reverse"])
def test_a_read_of_threadgroup_memory_no_thread_wrote_fails_the_launch(order):
    """Whatever the fill would make of it: the read of buf[32] (lanes 32-63 read slots only
    lanes 0-31 write) is named with the thread, the array and the group (either: both groups
    read it, and the simulator's workers run them at once); the same kernel reading
    only what was written runs, in the second group too (what the first group wrote does not
    count as written for the second), and so does a slot written by an atomic."""
    lib = compile_shader(HALF_WRITTEN)
    out, iout = torch.zeros(2 * 64), torch.zeros(2 * 64, dtype=torch.int32)
    with sim.thread_order(order), \
            pytest.raises(KernelError, match=r"read of threadgroup memory no thread wrote: "
                          r"thread (3[2-9]|[4-5]\d|6[0-3]) \(simdgroup 1, .*reads buf\[\d+\].*"
                          r"'buf' declared at program_source:7, in threadgroup \([01],0,0\)"):
        lib.half_written(out, iout, threads=2 * 64, group_size=64)
    guarded = HALF_WRITTEN.replace("out[g * 64 + lid] = buf[lid];",
                                   "out[g * 64 + lid] = lid < 32 ? buf[lid] : 0.0f;").replace(
        "iout[g * 64 + lid] = ibuf[lid];", "iout[g * 64 + lid] = lid < 32 ? ibuf[lid] : 0;")
    with sim.thread_order(order):
        compile_shader(guarded).half_written(out, iout, threads=2 * 64, group_size=64)
    assert torch.equal(out.view(2, 64)[:, :32], torch.arange(2).view(2, 1).expand(2, 32).float())
    first_group_only = guarded.replace("if (lid < 32) {", "if (lid < 32 && g == 0) {")
    with pytest.raises(KernelError, match=r"reads buf\[\d+\].*in threadgroup \(1,0,0\)"):
        compile_shader(first_group_only).half_written(out, iout, threads=2 * 64, group_size=64)
    atomic = guarded.replace("threadgroup int ibuf[64];", "threadgroup atomic_int ibuf[64];") \
        .replace("ibuf[lid] = int(g);",
                 "atomic_store_explicit(&ibuf[lid], int(g), memory_order_relaxed);") \
        .replace("lid < 32 ? ibuf[lid] : 0",
                 "lid < 32 ? *reinterpret_cast<threadgroup int*>(&ibuf[lid]) : 0")  # plain
    compile_shader(atomic).half_written(out, iout, threads=2 * 64, group_size=64)
    assert torch.equal(iout.view(2, 64)[:, :32], torch.arange(2).view(2, 1).expand(2, 32).int())


def test_threadgroup_fill_names_its_choices():
    with pytest.raises(ValueError, match="one of nan, high, low, got 'zero'"):
        with sim.threadgroup_fill("zero"):
            pass


REVERSE_IN_TG = r"""
#include <metal_stdlib>
using namespace metal;
template <typename T>
kernel void reverse_in_tg(device T* out [[buffer(0)]], uint lid [[thread_position_in_threadgroup]],
                          uint n [[threads_per_threadgroup]]) {
  threadgroup T buf[N];
  buf[lid] = T(lid);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[lid] = buf[n - 1 - lid];
}
template [[host_name("reverse_in_tg")]] kernel void reverse_in_tg<float>(device float*, uint, uint);
"""


def test_threadgroup_arrays_are_private_to_their_library():
    """Two libraries instantiating the same kernel template with different threadgroup array
    sizes (as metalforge's variants compiled for other launch options do) each get their own
    array: the larger group of the second must not write past the first one's array into the
    heap (it did, and the process aborted in free()).  Run in a subprocess, so that a
    regression fails this test instead of killing the test run."""
    code = textwrap.dedent("""
        import torch
        from metalforge.sim import compile_shader
        from tests.sim.test_sim_engine import REVERSE_IN_TG
        for n in (4, 1024, 4, 1024):
            lib = compile_shader(f"#define N {n}\\n" + REVERSE_IN_TG)
            out = torch.zeros(n)
            lib.reverse_in_tg(out, threads=n, group_size=n)
            assert torch.equal(out, torch.arange(n - 1, -1, -1).float()), n
        print("private")
    """)
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and "private" in r.stdout, (r.returncode, r.stderr[-3000:])


def test_kernel_properties(lib):
    assert lib.add.max_threads_per_threadgroup == 1024
    assert lib.add.thread_execution_width == 32
    assert lib.add.static_thread_group_memory_length == 0
    assert lib.limited.max_threads_per_threadgroup == 256
    assert lib.scale_float_2.static_thread_group_memory_length == 64     # float[16]
    assert lib.scale_half_3.static_thread_group_memory_length == 48      # half[24]
    y = torch.zeros(300)
    lib.limited(y)                                    # default group = min(300, 256)
    torch.testing.assert_close(y, torch.arange(300, dtype=torch.float32))
    with pytest.raises(ValueError, match="Threadgroup size exceeds 256 limit"):
        lib.limited(y, group_size=512)


def test_templates_all_instantiation_forms(lib):
    x = torch.randn(50)
    y = torch.zeros(50)
    lib.scale_float_2(x, y)
    torch.testing.assert_close(y, x * 2)
    xh = torch.randn(50).half()
    yh = torch.zeros(50, dtype=torch.half)
    lib.scale_half_3(xh, yh)
    torch.testing.assert_close(yh, (xh.float() * 3).half())
    a, b = torch.randint(-100, 100, (40,), dtype=torch.int32), torch.randint(-9, 9, (40,),
                                                                             dtype=torch.int32)
    c = torch.zeros(40, dtype=torch.int32)
    lib.add_int(a, b, c)
    assert torch.equal(c, a + b)
    af, bf, cf = torch.randn(40), torch.randn(40), torch.zeros(40)
    lib.add_float(af, bf, cf)
    torch.testing.assert_close(cf, af + bf)
    al = torch.randint(-2**40, 2**40, (40,))
    cl = torch.zeros(40, dtype=torch.int64)
    lib.add_long(al, al, cl)
    assert torch.equal(cl, al * 2)


def test_grid_and_group_argument_errors(lib):
    out = torch.zeros(16)
    with pytest.raises(ValueError, match="Threadgroup size exceeds 1024 limit"):
        lib.limited  # noqa: B018  (a different kernel has its own limit)
        lib.add(out, out, out, group_size=2048)
    with pytest.raises(ValueError, match="Threadgroup size exceeds 1024 limit"):
        lib.pos3d(torch.zeros(64 * 18, dtype=torch.int32), threads=[4, 4, 4],
                  group_size=[64, 8, 4])
    with pytest.raises(RuntimeError, match="wrong dimension"):
        lib.add(out, out, out, threads=[1, 2, 3, 4])
    with pytest.raises(RuntimeError, match="as many dimensions"):
        lib.add(out, out, out, threads=[4, 4], group_size=4)
    with pytest.raises(RuntimeError, match="Number of threads is undefined"):
        lib.limited(torch.zeros(4)[0].item())


MISSING_BARRIER = """#include <metal_stdlib>
using namespace metal;
kernel void from_left(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                      uint t [[thread_position_in_threadgroup]]) {
  threadgroup float buf[64];
  buf[t] = x[t];
%s
  y[t] = t == 0 ? 0.0f : buf[t - 1];    // the value the thread to the left wrote
}
"""


@pytest.mark.parametrize("barrier", [False, True])
def test_thread_order_exposes_a_missing_barrier(barrier):
    """Threads run in thread order or last first (`thread_order`): reading what a lower thread
    wrote without a barrier works in one order and reads stale memory in the other; with the
    barrier both orders agree.  (The race detector, which reports the missing barrier in
    either order, is off here: this is about the orders themselves.)"""
    from metalforge.sim import race_detection, thread_order
    line = "  threadgroup_barrier(mem_flags::mem_threadgroup);" if barrier else ""
    k = compile_shader(MISSING_BARRIER % line).from_left
    for order, x in (("forward", torch.arange(1.0, 65.0)),
                     ("reverse", torch.arange(101.0, 165.0))):
        y = torch.empty(64)
        with thread_order(order), race_detection(False):
            k(x, y, threads=64, group_size=64)
        want = torch.cat([torch.zeros(1), x[:-1]])
        assert torch.equal(y, want) == (barrier or order == "forward"), order
    with pytest.raises(ValueError, match="forward' or 'reverse"):
        with thread_order("random"):
            pass


PAST_THE_END = """#include <metal_stdlib>
using namespace metal;
kernel void past(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                 constant uint& n [[buffer(2)]], uint t [[thread_position_in_grid]]) {
  threadgroup float buf[4];
  float r[4];
  for (uint i = 0; i < n; ++i) { r[i] = x[i]; buf[i] = x[i]; }
  y[t] = r[0] + buf[3];
}
"""


def test_array_indices_are_checked():
    """A thread-private or threadgroup array indexed past its end is a KernelError naming the
    kernel, not a silent read of the next variable."""
    from metalforge.sim import KernelError
    k = compile_shader(PAST_THE_END).past
    x, y = torch.arange(8.0), torch.empty(1)
    k(x, y, 4, threads=1, group_size=1, arg_casts={2: "int32"})
    assert y.item() == 3.0
    with pytest.raises(KernelError, match=r"array index out of bounds.* in past\("):
        k(x, y, 5, threads=1, group_size=1, arg_casts={2: "int32"})


def test_vector_components_are_checked():
    from metalforge.sim import KernelError
    src = """#include <metal_stdlib>
using namespace metal;
kernel void comp(device float* y [[buffer(0)]], constant uint& n [[buffer(1)]],
                 uint t [[thread_position_in_grid]]) {
  float4 v = float4(1.0f, 2.0f, 3.0f, 4.0f);
  float s = 0.0f;
  for (uint i = 0; i < n; ++i) s += v[i];
  y[t] = s;
}
"""
    k = compile_shader(src).comp
    y = torch.empty(1)
    k(y, 4, threads=1, group_size=1, arg_casts={1: "int32"})
    assert y.item() == 10.0
    with pytest.raises(KernelError, match=r"out of bounds.* vector's component"):
        k(y, 5, threads=1, group_size=1, arg_casts={1: "int32"})


def test_whole_groups_runs_the_overhang():
    """`whole_groups`: the grid rounded up to whole threadgroups (the cuda backend's launch),
    so a kernel without a guard writes past its buffer there, and one with a guard does not."""
    from metalforge.sim import KernelError, whole_groups
    src = """#include <metal_stdlib>
using namespace metal;
kernel void unguarded(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  y[i] = float(i);
}
kernel void guarded(device float* y [[buffer(0)]], constant uint& n [[buffer(1)]],
                    uint i [[thread_position_in_grid]]) {
  if (i >= n) return;
  y[i] = float(i);
}
"""
    lib = compile_shader(src)
    y = torch.empty(40)
    lib.unguarded(y, threads=40, group_size=32)                    # Metal: exactly 40 threads
    with whole_groups():
        with pytest.raises(KernelError, match="out-of-bounds write"):
            lib.unguarded(y, threads=40, group_size=32)            # 64 threads
        lib.guarded(y, 40, threads=40, group_size=32, arg_casts={1: "int32"})
    assert torch.equal(y, torch.arange(40.0))
