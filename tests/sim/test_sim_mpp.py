"""Metal 4 tensor operations (<MetalPerformancePrimitives/MetalPerformancePrimitives.h>) in the
simulator: hand-written kernels using mpp::tensor_ops::matmul2d over cooperative tensors and
tensor views, at Metal 4.0 on GPU family 9 (M3/M4 layout) and 10 (M5 layout), against torch's
fp32 matmul; the per-family cooperative-tensor layout; and the compile-time refusals."""
import pytest
import torch

from metalforge.sim import KernelError, compile_shader
from metalforge.sim.compiler import build

HEAD = r"""
#include <metal_stdlib>
#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>
using namespace metal;
using namespace mpp::tensor_ops;
"""

SRC = HEAD + r"""
// C (M x N, float) = A (M x K) * B (K x N): each simdgroup one 16 x 32 tile of C, K in steps of
// 16, operands loaded into cooperative tensors from tensor slices (layout-independent code).
template <typename T>
kernel void tiled(device T* A [[buffer(0)]], device T* B [[buffer(1)]],
                  device float* C [[buffer(2)]], constant int* dims [[buffer(3)]],
                  uint2 tg [[threadgroup_position_in_grid]],
                  uint sg [[simdgroup_index_in_threadgroup]]) {
  const int M = dims[0], N = dims[1], K = dims[2];
  tensor<device T, dextents<int32_t, 2>, tensor_inline> tA(A, dextents<int32_t, 2>(K, M));
  tensor<device T, dextents<int32_t, 2>, tensor_inline> tB(B, dextents<int32_t, 2>(N, K));
  tensor<device float, dextents<int32_t, 2>, tensor_inline> tC(C, dextents<int32_t, 2>(N, M));
  constexpr auto desc = matmul2d_descriptor(16, 32, 16, false, false, true,
                                            matmul2d_descriptor::mode::multiply_accumulate);
  matmul2d<desc, execution_simdgroup> op;
  const int m0 = tg.y * 32 + sg * 16, n0 = tg.x * 32;
  auto a = op.get_left_input_cooperative_tensor<T, T, float>();
  auto b = op.get_right_input_cooperative_tensor<T, T, float>();
  auto c = op.get_destination_cooperative_tensor<decltype(a), decltype(b), float>();
  for (int i = 0; i < c.get_capacity(); ++i) c[i] = 0.0f;
  for (int k = 0; k < K; k += 16) {
    a.load(tA.slice(k, m0));
    b.load(tB.slice(n0, k));
    op.run(a, b, c);
  }
  for (int i = 0; i < c.get_capacity(); ++i) c[i] = 2.0f * c[i];   // element-wise epilogue
  c.store(tC.slice(n0, m0));
}
template [[host_name("tiled_half")]] kernel void tiled<half>(
    device half*, device half*, device float*, constant int*, uint2, uint);
template [[host_name("tiled_bfloat")]] kernel void tiled<bfloat>(
    device bfloat*, device bfloat*, device float*, constant int*, uint2, uint);

// Tensor operands, four simdgroups on one 64 x 32 tile, K dynamic, the right operand stored
// transposed (N x K); partial tiles at the edges are cut by the tensors' extents.  Mode
// multiply overwrites C, multiply_accumulate adds to it.
template <bool Acc>
kernel void edges(device bfloat* A [[buffer(0)]], device bfloat* Bt [[buffer(1)]],
                  device float* C [[buffer(2)]], constant int* dims [[buffer(3)]],
                  uint2 tg [[threadgroup_position_in_grid]]) {
  const int M = dims[0], N = dims[1], K = dims[2];
  tensor<device bfloat, dextents<int32_t, 2>, tensor_inline> tA(A, dextents<int32_t, 2>(K, M));
  tensor<device bfloat, dextents<int32_t, 2>, tensor_inline> tB(Bt, dextents<int32_t, 2>(K, N));
  tensor<device float, dextents<int32_t, 2>, tensor_inline> tC(C, dextents<int32_t, 2>(N, M));
  constexpr auto desc = matmul2d_descriptor(
      64, 32, static_cast<int>(dynamic_extent), false, true, false,
      Acc ? matmul2d_descriptor::mode::multiply_accumulate : matmul2d_descriptor::mode::multiply);
  matmul2d<desc, execution_simdgroups<4>> op;
  const int m0 = tg.y * 64, n0 = tg.x * 32;
  op.run(tA.slice(0, m0), tB.slice(0, n0), tC.slice(n0, m0));
}
template [[host_name("edges_mul")]] kernel void edges<false>(
    device bfloat*, device bfloat*, device float*, constant int*, uint2);
template [[host_name("edges_acc")]] kernel void edges<true>(
    device bfloat*, device bfloat*, device float*, constant int*, uint2);

// One 16 x 32 x 16 product whose cooperative tensors are filled and read with M5's element
// layout hard-coded (MLX's BaseNAXFrag), instead of load/store/get_multidimensional_index.
kernel void m5_layout(device half* A [[buffer(0)]], device half* B [[buffer(1)]],
                      device float* C [[buffer(2)]], ushort lane [[thread_index_in_simdgroup]]) {
  constexpr auto desc = matmul2d_descriptor(16, 32, 16, false, false, true,
                                            matmul2d_descriptor::mode::multiply);
  matmul2d<desc, execution_simdgroup> op;
  auto a = op.get_left_input_cooperative_tensor<half, half, float>();
  auto b = op.get_right_input_cooperative_tensor<half, half, float>();
  auto c = op.get_destination_cooperative_tensor<decltype(op), decltype(a), decltype(b), float>();
  const short fm = ((lane >> 2) & 4) | ((lane >> 1) & 3), fn = (((lane >> 2) & 2) | (lane & 1)) * 4;
  for (short i = 0; i < 8; ++i) {
    const short r = fm + (i >> 2) * 8, col = fn + i % 4;
    a[i] = A[r * 16 + col];
    b[i] = B[r * 32 + col];
    b[8 + i] = B[r * 32 + 16 + col];
  }
  op.run(a, b, c);
  for (short i = 0; i < 8; ++i) {
    const short r = fm + (i >> 2) * 8, col = fn + i % 4;
    C[r * 32 + col] = c[i];
    C[r * 32 + 16 + col] = c[8 + i];
  }
}

// Operands staged in threadgroup memory (threadgroup tensors with static extents and explicit
// strides), a 16 x 32 x 32 product into a cooperative destination that is written out through
// get_multidimensional_index, each element plus one (element-wise, layout-independent).
kernel void staged(device half* A [[buffer(0)]], device half* B [[buffer(1)]],
                   device float* C [[buffer(2)]], ushort lane [[thread_index_in_simdgroup]]) {
  threadgroup half a_s[16 * 40];                  // 16 x 32, rows padded to 40
  threadgroup half b_s[32 * 32];
  for (int i = lane; i < 16 * 32; i += 32) a_s[(i / 32) * 40 + i % 32] = A[i];
  for (int i = lane; i < 32 * 32; i += 32) b_s[i] = B[i];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  tensor<threadgroup half, extents<int32_t, 32, 16>, tensor_inline> ta(
      a_s, extents<int32_t, 32, 16>(), array<int, 2>{1, 40});
  tensor<threadgroup half, extents<int32_t, 32, 32>, tensor_inline> tb(
      b_s, extents<int32_t, 32, 32>());
  constexpr auto desc = matmul2d_descriptor(16, 32, 32);
  matmul2d<desc, execution_simdgroup> op;
  auto c = op.get_destination_cooperative_tensor<decltype(ta), decltype(tb), float>();
  op.run(ta, tb, c);
  for (int i = 0; i < c.get_capacity(); ++i) {
    if (!c.is_valid_element(i)) continue;
    auto idx = c.get_multidimensional_index(i);
    C[idx[1] * 32 + idx[0]] = c[i] + 1.0f;
  }
}

// Half the lanes reach the run: every lane of the executing simdgroup must.
kernel void diverge(device half* A [[buffer(0)]], device float* C [[buffer(1)]],
                    ushort lane [[thread_index_in_simdgroup]]) {
  constexpr auto desc = matmul2d_descriptor(16, 16, 16);
  matmul2d<desc, execution_simdgroup> op;
  tensor<device half, dextents<int32_t, 2>, tensor_inline> t(A, dextents<int32_t, 2>(16, 16));
  tensor<device float, dextents<int32_t, 2>, tensor_inline> tc(C, dextents<int32_t, 2>(16, 16));
  if (lane < 16) op.run(t, t, tc);
}
"""

_FAMILIES = (9, 10)


@pytest.fixture(scope="module", params=_FAMILIES, ids=lambda f: f"family{f}")
def lib(request):
    return compile_shader(SRC, metal_version=400, gpu_family=request.param), request.param


def _dims(m, n, k):
    return torch.tensor([m, n, k], dtype=torch.int32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_tiled_product_over_cooperative_tensors(lib, dtype):
    lib, _ = lib
    g = torch.Generator().manual_seed(1)
    a, b = (torch.randn(64, 64, generator=g).to(dtype) for _ in range(2))
    c = torch.full((64, 64), float("nan"))
    kernel = lib.tiled_half if dtype == torch.float16 else lib.tiled_bfloat
    kernel(a, b, c, _dims(64, 64, 64), threads=(2 * 32, 2 * 2), group_size=(32, 2))
    torch.testing.assert_close(c, 2 * (a.float() @ b.float()), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("acc", [False, True])
def test_partial_tiles_transposed_right_and_modes(lib, acc):
    lib, _ = lib
    m, n, k = 70, 45, 40                       # no dimension a multiple of the tile
    g = torch.Generator().manual_seed(2)
    a = torch.randn(m, k, generator=g).bfloat16()
    bt = torch.randn(n, k, generator=g).bfloat16()
    c0 = torch.randn(m, n, generator=g)
    c = c0.clone()
    kernel = lib.edges_acc if acc else lib.edges_mul
    kernel(a, bt, c, _dims(m, n, k), threads=(2 * 128, 2), group_size=(128, 1))
    want = a.float() @ bt.float().T + (c0 if acc else 0)
    torch.testing.assert_close(c, want, rtol=1e-5, atol=1e-4)


def test_code_that_hard_codes_m5_layout_is_right_only_on_m5(lib):
    lib, family = lib
    g = torch.Generator().manual_seed(3)
    a = torch.randn(16, 16, generator=g).half()
    b = torch.randn(16, 32, generator=g).half()
    c = torch.zeros(16, 32)
    lib.m5_layout(a, b, c, threads=32, group_size=32)
    want = a.float() @ b.float()
    if family >= 10:
        torch.testing.assert_close(c, want, rtol=1e-5, atol=1e-4)
    else:
        assert (c - want).abs().max() > 1.0


def test_threadgroup_tensors_and_multidimensional_index(lib):
    lib, _ = lib
    g = torch.Generator().manual_seed(4)
    a = torch.randn(16, 32, generator=g).half()
    b = torch.randn(32, 32, generator=g).half()
    c = torch.full((16, 32), float("nan"))
    lib.staged(a, b, c, threads=32, group_size=32)
    torch.testing.assert_close(c, a.float() @ b.float() + 1, rtol=1e-5, atol=1e-4)


def test_every_lane_must_reach_the_run(lib):
    lib, _ = lib
    with pytest.raises(KernelError, match="simdgroup_barrier divergence"):
        lib.diverge(torch.zeros(256).half(), torch.zeros(256), threads=32, group_size=32)


def test_each_family_is_its_own_cache_entry():
    one, _ = build(SRC, metal_version=400, gpu_family=9)
    two, _ = build(SRC, metal_version=400, gpu_family=10)
    assert one != two and one is not None and two is not None


_TINY = HEAD + r"""
kernel void k(device {A}* a [[buffer(0)]], device {B}* b [[buffer(1)]],
              device float* c [[buffer(2)]]) {{
  constexpr auto desc = matmul2d_descriptor({M}, {N}, 16);
  matmul2d<desc, execution_simdgroup> op;
  tensor<device {A}, dextents<int32_t, 2>, tensor_inline> ta(a, dextents<int32_t, 2>(16, 16));
  tensor<device {B}, dextents<int32_t, 2>, tensor_inline> tb(b, dextents<int32_t, 2>(16, 16));
  tensor<device float, dextents<int32_t, 2>, tensor_inline> tc(c, dextents<int32_t, 2>(16, 16));
  op.run(ta, tb, tc);
}}
"""


@pytest.mark.parametrize("case, version, match", [
    (dict(A="half", B="half", M=16, N=16), 320, r"MetalPerformancePrimitives needs Metal 4\.0"),
    (dict(A="half", B="half", M=8, N=8), 400, r"M and N must be multiples of 16"),
    (dict(A="half", B="bfloat", M=16, N=16), 400, r"the left operand is half and the right "
                                                  r"bfloat"),
], ids=["metal3", "8x8", "half-bfloat"])
def test_refusals(case, version, match):
    with pytest.raises(SyntaxError, match=match):
        compile_shader(_TINY.format(**case), metal_version=version, gpu_family=10)
