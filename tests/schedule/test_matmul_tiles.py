"""The contraction kernel's tile options (launch options of the matmul family): padded staged
rows (stage_pad), tiles read a step ahead (prefetch), steps of 64 values of K (k_step), 8
simdgroups a tile (tile_simdgroups), bands of tiles (tile_groups). Each run in the simulator
against torch computed directly, at partial tiles, partial and whole steps of K, with both
lowerings (Metal 4 tensor ops over strided threadgroup tensors; simdgroup_matrix); the cuda
table's kernel through the cuda shim's host syntax check."""

import pytest
import torch

import metalforge as mf
from metalforge.cuda.translate import translate
from metalforge.errors import LaunchError
from metalforge.testing import check

from ..cuda_host import assert_host_syntax
from .matmul_kernels import linear_gelu


@mf.kernel
def linear(x: "T[M, K]", w: "T[N, K]", bias: "T[N]") -> "T[M, N]":  # noqa: F821
    """Both operands tensors of the operand type: both tiles read as 16-byte vectors (and a
    step ahead under prefetch)."""
    return mf.sum(x * w, axis="K") + bias


PADDED = dict(tile=32, stage_pad=8, prefetch=True, tile_groups=2)


def test_padded_tiles_read_a_step_ahead_match_torch():
    """Metal 4 tensor ops over strided tensors: 2 x 4 simdgroups of 32 x 16, 64 values of K a
    step; x read a step ahead, the cast weights (f32 -> T: a prologue) staged element by
    element. M = 130: three rows of tiles (a band of 2, then one of 1); K = 136: two whole
    steps read ahead, then a partial one element by element; K = 41: not a multiple of 8
    (every step element by element)."""
    g = torch.Generator().manual_seed(1)
    kernel = linear_gelu.with_launch(target="apple10", tile=64, tile_simdgroups=8, k_step=64,
                                     stage_pad=8, prefetch=True, tile_groups=2)
    for m, n, k in ((130, 20, 136), (9, 17, 41)):
        x = torch.randn(1, m, k, generator=g).half()
        w, b = torch.randn(n, k, generator=g), torch.randn(n, generator=g).half()
        h = x.double() @ w.half().double().T + b.double()
        torch.testing.assert_close(kernel(x, w, b).double(), torch.nn.functional.gelu(h),
                                   rtol=2e-2, atol=2e-2)


def test_check_covers_padded_prefetched_tiles_of_simdgroup_matrices():
    """simdgroup_matrix products from 48-byte staged rows (bfloat operands), at check's
    boundary sizes of K and partial tiles."""
    check(linear.with_launch(target="apple9", **PADDED), dtypes={"T": ["bf16"]},
          max_examples=2, dims={"M": (1, 40), "N": (1, 40)})


def test_the_padded_read_ahead_kernel_and_its_shim_translation(tmp_path):
    """tile 128, stage_pad 8, prefetch, tile_groups 8: strided threadgroup tensors over 48-byte
    rows, 16-byte threadgroup stores, registers read a step ahead, capacity loops marked for
    unrolling; the translation passes the shim's host syntax check."""
    opts = dict(tile=128, stage_pad=8, prefetch=True, tile_groups=8)
    src = linear.with_launch(target="cuda", **opts).source(T="f16")
    for part in ("array<int32_t, 2>({1, 24})", "*reinterpret_cast<threadgroup mf_pack8<half>*>",
                 "mf_pack8<T> mf_pa[4];", '_Pragma("unroll") for (int mf_c', "mf_band_rows",
                 "matmul2d_descriptor(64, 64, 16,"):
        assert part in src, part
    assert_host_syntax(translate(src).text, tmp_path, metal_version=400)


@pytest.mark.parametrize("opts,says", [
    (dict(prefetch=True), "give stage_pad=8 with it"),
    (dict(tile=32, tile_simdgroups=8), "tile_simdgroups=8 needs tile 64 or 128"),
    (dict(k_step=48), "k_step must be 32 or 64"),
    (dict(tile=128, k_step=64, stage_pad=8), "49152 bytes of threadgroup memory"),
])
def test_bad_tile_options_are_refused(opts, says):
    x = torch.ones(8, 8).half()
    with pytest.raises(LaunchError, match=says):
        linear.with_launch(target="apple10", **opts)(x, x, x[0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("opts", [{}, dict(tile=64, stage_pad=0, prefetch=False, tile_groups=0),
                                  dict(tile_simdgroups=8)])
def test_the_cuda_backend_on_tensor_cores(dtype, opts):
    """The cuda table's kernel (the shim's ldmatrix path over 48-byte rows), the unpadded one
    and 8 simdgroups, at partial tiles and steps, against torch on the GPU."""
    g = torch.Generator().manual_seed(2)
    kernel = linear.with_launch(target="cuda", **opts)
    for m, n, k in ((300, 200, 328), (33, 17, 41)):
        x, w, b = (torch.randn(*s, generator=g).to(dtype).cuda() for s in ((m, k), (n, k), (n,)))
        want = x.double() @ w.double().T + b.double()
        torch.testing.assert_close(kernel(x, w, b).double(), want, rtol=2e-2, atol=5e-2)


def _tf32(t: torch.Tensor) -> torch.Tensor:
    """f32 values rounded to TF32 (10 mantissa bits, to nearest even), computed directly."""
    i = t.view(torch.int32)
    return ((i + 0x0FFF + ((i >> 13) & 1)) & ~0x1FFF).view(torch.float32)


def test_tf32_only_when_asked(tmp_path):
    """launch tf32=True: f32 operands on Metal 4 tensor ops with relaxed_precision (each
    operand rounded to TF32, fp32 sums): against torch on TF32-rounded operands, at partial
    tiles and a partial step of K; exact fp32 without it, and on simdgroup_matrix targets
    (no relaxed products there); the cuda translation (mma.sync m16n8k8 on TF32) passes the
    host syntax check."""
    g = torch.Generator().manual_seed(3)
    x, w, b = (torch.randn(*s, generator=g) for s in ((70, 100), (50, 100), (50,)))
    exact = x.double() @ w.double().T + b.double()
    got = linear.with_launch(target="apple10", tf32=True)(x, w, b).double()
    torch.testing.assert_close(got, _tf32(x).double() @ _tf32(w).double().T + b.double(),
                               rtol=1e-5, atol=1e-4)
    assert (got - exact).abs().max() > 1e-3                  # the products lost their bits
    for kernel in (linear.with_launch(target="apple10"),
                   linear.with_launch(target="apple9", tf32=True)):
        torch.testing.assert_close(kernel(x, w, b).double(), exact, rtol=1e-5, atol=1e-4)
    src = linear.with_launch(target="cuda", tf32=True, tile=128).source(T="f32")
    assert "matmul2d_descriptor(64, 64, 16, false, true, true," in src
    assert "matmul2d_descriptor" not in linear.with_launch(target="cuda").source(T="f32")
    assert_host_syntax(translate(src).text, tmp_path, metal_version=400)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("tile", [64, 128])
def test_tf32_on_tensor_cores(tile):
    """The cuda shim's TF32 path (mma.sync m16n8k8, operands rounded to nearest with ties
    away: at most one TF32 step from the simulator's even ties) against torch on TF32-rounded
    operands, at partial tiles and steps."""
    g = torch.Generator().manual_seed(4)
    kernel = linear.with_launch(target="cuda", tf32=True, tile=tile)
    for m, n, k in ((300, 200, 328), (33, 17, 41)):
        x, w, b = (torch.randn(*s, generator=g) for s in ((m, k), (n, k), (n,)))
        want = _tf32(x).double() @ _tf32(w).double().T + b.double()
        got = kernel(x.cuda(), w.cuda(), b.cuda()).double().cpu()
        torch.testing.assert_close(got, want, rtol=1e-3, atol=2e-2)
