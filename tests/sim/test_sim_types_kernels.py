"""The Metal type and math library inside real kernels run by metalforge.sim.compile_shader.

half/bfloat I/O through 4-wide vector loads, f32 math in f16/bf16 kernels, swizzles, packed
types, metal::array, as_type, numeric_limits, atomics across thread groups, and the headers
torch ships in c10/metal compiled together (indexing.h, which overloads on the constant/device
address spaces, is exercised in test_sim_address_spaces.py). Results are compared with torch
on the CPU.
"""
import pytest
import torch

from metalforge.sim import compile_shader

SRC = r"""
#include <metal_stdlib>
#include <c10/metal/utils.h>
#include <c10/metal/common.h>
#include <c10/metal/reduction_utils.h>
#include <c10/metal/special_math.h>
#include <c10/metal/atomic.h>
#include <c10/metal/error.h>
#include <c10/metal/random.h>
#include <c10/metal/expm1f.h>
#include <c10/metal/igamma.h>
using namespace metal;

// y = silu(x) * scale in f32 math, 4-wide loads/stores and a scalar tail.
template <typename T>
kernel void silu_scale(device const T* x [[buffer(0)]], device T* y [[buffer(1)]],
                       constant float& scale [[buffer(2)]], constant long& n [[buffer(3)]],
                       uint gid [[thread_position_in_grid]]) {
  using V = vec<T, 4>;
  const uint base = gid * 4;
  if (base + 4 <= n) {
    const float4 v = float4(*reinterpret_cast<device const V*>(x + base));
    const float4 r = v / (1.0f + exp(-v)) * scale;
    *reinterpret_cast<device V*>(y + base) = V(r);
  } else {
    for (long i = base; i < n; ++i) {
      const float v = float(x[i]);
      y[i] = T(v / (1.0f + precise::exp(-v)) * scale);
    }
  }
}
template [[host_name("silu_scale_half")]] kernel void silu_scale<half>(
    device const half*, device half*, constant float&, constant long&, uint);
template [[host_name("silu_scale_bfloat")]] kernel void silu_scale<bfloat>(
    device const bfloat*, device bfloat*, constant float&, constant long&, uint);
template [[host_name("silu_scale_float")]] kernel void silu_scale<float>(
    device const float*, device float*, constant float&, constant long&, uint);

// Elementwise library calls at float, one output row per function.
kernel void mathfns(device const float* x [[buffer(0)]], device float* out [[buffer(1)]],
                    constant long& n [[buffer(2)]], uint i [[thread_position_in_grid]]) {
  const float v = x[i];
  out[0 * n + i] = tanh(v);
  out[1 * n + i] = fast::exp(v) - 1.0f;
  out[2 * n + i] = rsqrt(fabs(v) + 1.0f);
  out[3 * n + i] = c10::metal::erf(v);           // c10 special_math (MSL has no erf)
  out[4 * n + i] = c10::metal::log1p(fabs(v));   // c10 utils
  out[5 * n + i] = clamp(v, -0.5f, 0.5f);
  out[6 * n + i] = fmax(v, 0.0f) + fmin(v, 0.0f) * 0.25f;
  out[7 * n + i] = float(half(v) * half(v));      // rounded to half once
}

// packed_float3 rows, swizzles, select, metal::array, as_type, numeric_limits.
kernel void packed_swizzle(device const packed_float3* p [[buffer(0)]],
                           device float4* out [[buffer(1)]], uint i [[thread_position_in_grid]]) {
  const float3 v = p[i];
  ::metal::array<float, 2> mm{min(v.x, min(v.y, v.z)), max(v.x, max(v.y, v.z))};
  float4 o = float4(v.zyx, mm[1] - mm[0]);
  o.xy = select(o.xy, float2(numeric_limits<float>::infinity()), o.xy < -100.0f);
  o.w += float(as_type<uint>(1.0f) == 0x3f800000u);
  out[i] = o;
}

// Histogram with atomics from every group; float sum through atomic_float.
kernel void histogram(device const uint* x [[buffer(0)]], device atomic_uint* bins [[buffer(1)]],
                      device atomic_float* total [[buffer(2)]],
                      uint i [[thread_position_in_grid]]) {
  atomic_fetch_add_explicit(&bins[x[i] % 8], 1u, memory_order_relaxed);
  atomic_fetch_add_explicit(total, 0.25f, memory_order_relaxed);
}

// c10::metal::AtomicType<half>: packed-CAS add on half elements.
kernel void scatter_add_half(device const half* x [[buffer(0)]],
                             device c10::metal::AtomicType_t<half>* out [[buffer(1)]],
                             uint i [[thread_position_in_grid]]) {
  c10::metal::AtomicType<half>::atomic_add(out, i % 4, x[i]);
}

// c10 threadgroup reduction over half inputs, accumulated in float.
kernel void row_sum(device const half* x [[buffer(0)]], device float* out [[buffer(1)]],
                    constant long& cols [[buffer(2)]],
                    uint tid [[thread_position_in_threadgroup]],
                    uint row [[threadgroup_position_in_grid]],
                    uint tptg [[threads_per_threadgroup]]) {
  threadgroup float shared[32];
  float acc = 0.0f;
  for (uint c = tid; c < cols; c += tptg) acc += float(x[row * cols + c]);
  const float total = c10::metal::threadgroup_sum(shared, acc, tid, tptg);
  if (tid == 0) out[row] = total;
}
"""


@pytest.fixture(scope="module")
def lib():
    return compile_shader(SRC)


@pytest.mark.parametrize("dtype,name", [(torch.float16, "half"), (torch.bfloat16, "bfloat"),
                                        (torch.float32, "float")])
def test_vectorised_half_bfloat_io(lib, dtype, name):
    n = 1003  # 250 four-wide loads and a tail of 3
    x = (torch.randn(n, generator=torch.Generator().manual_seed(0)) * 4).to(dtype)
    y = torch.empty_like(x)
    getattr(lib, f"silu_scale_{name}")(x, y, 1.5, n, threads=(n + 3) // 4)
    want = (torch.nn.functional.silu(x.float()) * 1.5).to(dtype)
    tol = {torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float32: 1e-6}[dtype]
    torch.testing.assert_close(y, want, rtol=tol, atol=tol)


def test_math_functions_in_a_kernel(lib):
    x = torch.linspace(-6, 6, 997)
    out = torch.empty(8, x.numel())
    lib.mathfns(x, out, x.numel())
    h = x.to(torch.float16)
    want = torch.stack([
        torch.tanh(x), torch.exp(x) - 1, torch.rsqrt(x.abs() + 1), torch.erf(x),
        torch.log1p(x.abs()), x.clamp(-0.5, 0.5), x.clamp(min=0) + x.clamp(max=0) * 0.25,
        (h * h).float(),
    ])
    torch.testing.assert_close(out, want, rtol=2e-6, atol=2e-6)


def test_packed_swizzle_array_select(lib):
    p = torch.tensor([[1.0, 2.0, 3.0], [-200.0, 5.0, -300.0], [0.5, -0.5, 7.0]])
    out = torch.empty(3, 4)
    lib.packed_swizzle(p, out, threads=3)
    zyx = p.flip(1)
    xy = zyx[:, :2].clone()
    xy[xy < -100] = float("inf")
    w = p.max(1).values - p.min(1).values + 1
    want = torch.cat([xy, zyx[:, 2:], w[:, None]], 1)
    torch.testing.assert_close(out, want)


def test_atomics_from_many_groups(lib):
    x = torch.randint(0, 1000, (5000,), generator=torch.Generator().manual_seed(1)).to(torch.int32)
    bins = torch.zeros(8, dtype=torch.int32)
    total = torch.zeros(1)
    lib.histogram(x, bins, total, group_size=64)
    assert torch.equal(bins, torch.bincount(x % 8, minlength=8).to(torch.int32))
    assert total.item() == 5000 * 0.25


def test_c10_atomic_half_add(lib):
    x = torch.full((256,), 0.5, dtype=torch.float16)
    out = torch.zeros(4, dtype=torch.float16)
    lib.scatter_add_half(x, out, group_size=32)
    assert torch.equal(out, torch.full((4,), 32.0, dtype=torch.float16))


def test_c10_threadgroup_sum_over_half(lib):
    x = torch.randn(6, 1000, generator=torch.Generator().manual_seed(2)).to(torch.float16)
    out = torch.empty(6)
    lib.row_sum(x, out, 1000, threads=6 * 256, group_size=256)
    torch.testing.assert_close(out, x.float().sum(1), rtol=1e-5, atol=1e-4)
