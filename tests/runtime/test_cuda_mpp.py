"""Metal 4 tensor ops (matmul2d) through the cuda shim, on tensor cores (mma.sync m16n8k16):
the simulator's hand-written MPP kernels (tests/sim/test_sim_mpp.py) at full and partial
tiles, f16 and bf16, against torch's fp32 matmul (skipped without a GPU), and a host syntax
check of their translation against the shim (runs anywhere with g++)."""

import pytest
import torch

from metalforge.cuda.translate import translate
from tests.sim.test_sim_mpp import SRC, _dims

from ..cuda_host import assert_host_syntax

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_mpp_translation_passes_host_syntax_check(tmp_path):
    assert_host_syntax(translate(SRC).text, tmp_path, metal_version=400)


@pytest.fixture(scope="module")
def lib():
    from metalforge import cuda as mfcuda
    return mfcuda.compile_shader(SRC, metal_version=400)


@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_tiled_product_on_tensor_cores(lib, dtype):
    g = torch.Generator().manual_seed(1)
    a, b = (torch.randn(64, 64, generator=g).to(dtype) for _ in range(2))
    c = torch.full((64, 64), float("nan"), device="cuda")
    kernel = lib.tiled_half if dtype == torch.float16 else lib.tiled_bfloat
    kernel(a.cuda(), b.cuda(), c, _dims(64, 64, 64).cuda(), threads=(2 * 32, 2 * 2),
           group_size=(32, 2))
    torch.testing.assert_close(c.cpu(), 2 * (a.float() @ b.float()), rtol=1e-4, atol=1e-3)


@gpu
@pytest.mark.parametrize("acc", [False, True])
def test_partial_tiles_transposed_right_and_modes_on_tensor_cores(lib, acc):
    m, n, k = 70, 45, 40
    g = torch.Generator().manual_seed(2)
    a = torch.randn(m, k, generator=g).bfloat16()
    bt = torch.randn(n, k, generator=g).bfloat16()
    c0 = torch.randn(m, n, generator=g)
    c = c0.clone().cuda()
    kernel = lib.edges_acc if acc else lib.edges_mul
    kernel(a.cuda(), bt.cuda(), c, _dims(m, n, k).cuda(), threads=(2 * 128, 2),
           group_size=(128, 1))
    want = a.float() @ bt.float().T + (c0 if acc else 0)
    torch.testing.assert_close(c.cpu(), want, rtol=1e-4, atol=1e-3)


@gpu
def test_metal3_source_with_mpp_is_refused(lib):
    from metalforge import cuda as mfcuda
    # refused by the Metal front-end check where libclang is installed, else by NVRTC when
    # the module is built
    with pytest.raises(SyntaxError, match=r"MetalPerformancePrimitives needs Metal 4\.0"):
        mfcuda.compile_shader(SRC).module(torch.cuda.current_device())


@gpu
def test_threadgroup_tensors_and_multidimensional_index_on_tensor_cores(lib):
    g = torch.Generator().manual_seed(4)
    a = torch.randn(16, 32, generator=g).half()
    b = torch.randn(32, 32, generator=g).half()
    c = torch.full((16, 32), float("nan"), device="cuda")
    lib.staged(a.cuda(), b.cuda(), c, threads=32, group_size=32)
    torch.testing.assert_close(c.cpu(), a.float() @ b.float() + 1, rtol=1e-4, atol=1e-3)


# A left operand resident in registers (schedule/matrix/resident.py's pattern): 16 x 128 of A
# loaded once into a left input cooperative tensor, times B (32 rows x 128, K contiguous, rows
# padded to 136) in threadgroup memory transposed, twice (multiply_accumulate): the cuda shim's
# coop_ldsm_run (ldmatrix for B, the cooperative tensor's registers as mma.sync's A).
RESIDENT = """
#include <metal_stdlib>
#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>
using namespace metal;
using namespace mpp::tensor_ops;

kernel void resident(device half* A [[buffer(0)]], device half* B [[buffer(1)]],
                     device float* C [[buffer(2)]], ushort lane [[thread_index_in_simdgroup]]) {
  threadgroup half a_s[16 * 136];
  threadgroup half b_s[32 * 136];
  for (int i = lane; i < 16 * 128; i += 32) a_s[(i / 128) * 136 + i % 128] = A[i];
  for (int i = lane; i < 32 * 128; i += 32) b_s[(i / 128) * 136 + i % 128] = B[i];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  constexpr auto desc = matmul2d_descriptor(16, 32, 128, false, true, false,
                                            matmul2d_descriptor::mode::multiply_accumulate);
  matmul2d<desc, execution_simdgroup> op;
  auto a = op.get_left_input_cooperative_tensor<half, half, float>();
  a.load(tensor<threadgroup half, dextents<int32_t, 2>, tensor_inline>(
      a_s, dextents<int32_t, 2>(128, 16), array<int, 2>{1, 136}));
  tensor<threadgroup half, dextents<int32_t, 2>, tensor_inline> tb(
      b_s, dextents<int32_t, 2>(128, 32), array<int, 2>{1, 136});
  auto c = op.get_destination_cooperative_tensor<decltype(a), decltype(tb), float>();
  for (int i = 0; i < c.get_capacity(); ++i) c[i] = 0.0f;
  op.run(a, tb, c);
  op.run(a, tb, c);
  for (int i = 0; i < c.get_capacity(); ++i) {
    if (!c.is_valid_element(i)) continue;
    auto idx = c.get_multidimensional_index(i);
    C[idx[1] * 32 + idx[0]] = c[i];
  }
}
"""


def _resident_case():
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(16, 128, generator=g).half(), torch.randn(32, 128, generator=g).half()
    return a, b, 2 * (a.float() @ b.float().T)


def test_resident_left_operand_host_syntax(tmp_path):
    """(The simulator runs the same pattern in tests/ops/test_attention_backward.py's wide
    kernels.)"""
    assert_host_syntax(translate(RESIDENT).text, tmp_path, metal_version=400)


@gpu
def test_resident_left_operand_on_tensor_cores():
    from metalforge import cuda as mfcuda
    a, b, want = _resident_case()
    c = torch.full((16, 32), float("nan"), device="cuda")
    mfcuda.compile_shader(RESIDENT, metal_version=400).resident(
        a.cuda(), b.cuda(), c, threads=32, group_size=32)
    torch.testing.assert_close(c.cpu(), want, rtol=1e-4, atol=1e-3)
