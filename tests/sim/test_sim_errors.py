"""metalforge.sim: every error path gives a clear Python exception, and the process survives."""
import pytest
import torch

from metalforge.sim import CompilerNotFound, KernelError, compile_shader

SRC = r"""
#include <metal_stdlib>
using namespace metal;

kernel void copy(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                 constant int& n [[buffer(2)]], uint i [[thread_position_in_grid]]) {
  if (int(i) < n) y[i] = x[i];
}

kernel void write_one_past(device float* out, uint i [[thread_position_in_grid]]) {
  out[i + 1] = 1.0f;
}

kernel void write_far(device float* a, device float* out, uint i [[thread_position_in_grid]]) {
  out[i + 100000] = a[i];
}

kernel void read_far(device const float* x, device float* out, uint i [[thread_position_in_grid]]) {
  out[i] = x[i + 100000];
}

template <typename T>
kernel void read_one_past(device const T* x, device float* out,
                          uint i [[thread_position_in_grid]]) {
  out[i] = float(x[i + 1]);
}
template [[host_name("read_one_past_f32")]] kernel void read_one_past<float>(
    device const float*, device float*, uint);
template [[host_name("read_one_past_f16")]] kernel void read_one_past<half>(
    device const half*, device float*, uint);
template [[host_name("read_one_past_bf16")]] kernel void read_one_past<bfloat>(
    device const bfloat*, device float*, uint);

kernel void null_write(device float* out, uint i [[thread_position_in_grid]]) {
  device float* p = (device float*)(out[i] > 100.0f ? out : nullptr);
  p[i] = 1.0f;
}

kernel void div_zero(device const int* d, device int* out, uint i [[thread_position_in_grid]]) {
  out[i] = 10 / d[i];
}

int remainder_of(int a, int b) { return a % b; }

kernel void mod_zero(device const int* d, device int* out, uint i [[thread_position_in_grid]]) {
  out[i] = remainder_of(10, d[i]);
}

kernel void early_return(device float* out, uint tid [[thread_position_in_threadgroup]]) {
  threadgroup float buf[64];
  if (tid >= 40) return;
  buf[tid] = 1.0f;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[tid] = buf[0];
}

kernel void two_barriers(device float* out, uint tid [[thread_position_in_threadgroup]]) {
  if (tid < 16) {
    threadgroup_barrier(mem_flags::mem_threadgroup);
  } else {
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  out[tid] = 1.0f;
}

kernel void simd_barrier_split(device float* out, uint lane [[thread_index_in_simdgroup]]) {
  if (lane < 8) return;
  simdgroup_barrier(mem_flags::mem_none);
  out[lane] = 1.0f;
}

static int deep(int n, device const int* d) {
  volatile char pad[4096];
  pad[n % 4096] = char(n);
  return n <= 0 ? pad[0] : deep(n - 1 + d[0], d) + pad[n % 4096];
}
kernel void recurse(device const int* d, device int* out, uint i [[thread_position_in_grid]]) {
  out[i] = deep(1000000, d);
}
"""


@pytest.fixture(scope="module")
def lib():
    return compile_shader(SRC)


def test_compile_error_maps_to_user_line():
    src = "#include <metal_stdlib>\nusing namespace metal;\n\nkernel void f(device float* x) {\n" \
          "  x[0] = undefined_name;\n}\n"
    with pytest.raises(SyntaxError) as ei:
        compile_shader(src)
    assert ei.value.lineno == 5
    assert "program_source:5" in str(ei.value) and "undefined_name" in str(ei.value)


def test_missing_compiler(monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    with pytest.raises(CompilerNotFound, match="not found"):
        compile_shader("kernel void g(device float* x, uint i [[thread_position_in_grid]]) "
                       "{ x[i] = 0; }")


def test_argument_mismatches(lib):
    x, y = torch.randn(8), torch.zeros(8)
    with pytest.raises(TypeError, match=r"kernel 'copy' argument 2 'n'.*Python float.*int"):
        lib.copy(x, y, 8.0)
    with pytest.raises(TypeError, match=r"argument 2 'n'.*arg_casts=\{2: 'int32'\}"):
        lib.copy(x, y, 8)
    with pytest.raises(TypeError, match=r"argument 2 'n'.*single value, got a tensor"):
        lib.copy(x, y, torch.ones(8, dtype=torch.int32))
    with pytest.raises(TypeError, match=r"takes 3 arguments.*got 2"):
        lib.copy(x, y)
    with pytest.raises(TypeError, match=r"argument 0 'x'.*torch.int64 tensor.*float"):
        lib.copy(torch.zeros(8, dtype=torch.int64), y, 8, arg_casts={2: "int32"})
    with pytest.raises(TypeError, match=r"argument 1 'y'.*torch.float16 tensor"):
        lib.copy(x, y.half(), 8, arg_casts={2: "int32"})
    with pytest.raises(RuntimeError, match="Empty list/tuple"):
        lib.copy(x, y, [])
    lib.copy(x, y, 8, arg_casts={2: "int32"})
    torch.testing.assert_close(y, x)


def test_write_one_past_end_names_buffer(lib):
    out = torch.zeros(10)
    with pytest.raises(KernelError, match=r"'write_one_past' wrote out of bounds of buffer "
                                          r"'out' \(argument 0\) at byte offset 40"):
        lib.write_one_past(out)


@pytest.mark.parametrize("dtype,name", [(torch.float32, "f32"), (torch.float16, "f16"),
                                        (torch.bfloat16, "bf16")])
def test_read_inside_the_alignment_gap_gives_nan(lib, dtype, name):
    # 3 elements end short of the 16-byte boundary: the read one past the end lands in the
    # gap, where no guard page faults; the gap holds a NaN of the buffer's type, so the value
    # read poisons the result instead of passing for a small number
    x, out = torch.ones(3, dtype=dtype), torch.zeros(3)
    getattr(lib, f"read_one_past_{name}")(x, out)
    assert out[:2].tolist() == [1.0, 1.0] and torch.isnan(out[2])


def test_write_into_the_gap_of_a_float_buffer_is_reported(lib):
    out = torch.zeros(3)             # a write one past the end lands in the NaN-filled gap
    with pytest.raises(KernelError, match=r"'write_one_past' wrote out of bounds of buffer "
                                          r"'out' \(argument 0\) at byte offset 12"):
        lib.write_one_past(out)


def test_far_write_faults_in_guard_page(lib):
    a, out = torch.zeros(4096), torch.zeros(4096)
    with pytest.raises(KernelError, match=r"out-of-bounds write of buffer 'out' \(argument 1\)"
                                          r" at byte offset 400000"):
        lib.write_far(a, out, threads=1)


def test_far_read_faults_and_names_buffer(lib):
    x, out = torch.zeros(2048), torch.zeros(2048)
    with pytest.raises(KernelError, match=r"out-of-bounds read of buffer 'x' \(argument 0\)"):
        lib.read_far(x, out, threads=4)


def test_fault_outside_buffers_and_process_survives(lib):
    out = torch.zeros(64)
    with pytest.raises(KernelError, match=r"kernel 'null_write' faulted: SIGSEGV"):
        lib.null_write(out)
    d = torch.tensor([1, 2, 0, 5], dtype=torch.int32)
    with pytest.raises(KernelError, match=r"kernel 'div_zero' faulted: SIGFPE: integer division "
                                          r"or remainder by zero.* in div_zero\(.*\(2,0,0\)"):
        lib.div_zero(d, torch.zeros(4, dtype=torch.int32))
    # the function that divides is named, here a helper
    with pytest.raises(KernelError, match=r"by zero.* in remainder_of\(int, int\) in "
                                          r"thread_position_in_grid \(2,0,0\)"):
        lib.mod_zero(d, torch.zeros(4, dtype=torch.int32))
    # the simulator (and the interpreter) keep working
    x, y = torch.randn(100), torch.zeros(100)
    lib.copy(x, y, 100, arg_casts={2: "int32"})
    torch.testing.assert_close(y, x)


def test_stack_overflow_is_reported(lib):
    with pytest.raises(KernelError, match="stack overflow"):
        lib.recurse(torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32))


def test_barrier_after_early_return(lib):
    with pytest.raises(KernelError,
                       match=r"'early_return': threadgroup_barrier divergence in threadgroup "
                             r"\(0,0,0\): threads 0-39 wait at threadgroup_barrier "
                             r"\(program_source:\d+.*threads 40-63 have returned"):
        lib.early_return(torch.zeros(64))


def test_barriers_at_different_sites(lib):
    with pytest.raises(KernelError, match=r"threads 0-15 wait at threadgroup_barrier "
                                          r"\(program_source:\d+.*threads 16-31 wait at "
                                          r"threadgroup_barrier"):
        lib.two_barriers(torch.zeros(32))


def test_simdgroup_barrier_divergence(lib):
    with pytest.raises(KernelError, match=r"simdgroup_barrier divergence.*threads 0-7 have "
                                          r"returned.*threads 8-31 wait at simdgroup_barrier"):
        lib.simd_barrier_split(torch.zeros(32))
