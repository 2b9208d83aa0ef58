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
