"""The tiled quantized matmul on the matrix block (schedule/quant/blocked.py): half or bfloat x
as A, the weight tile dequantized in fp32 and rounded once to x's type as B, products by the
target's lowering (simdgroup_matrix at apple9, Metal 4 tensor ops at apple10), fp32 sums;
against torch computed directly on the rounded weight (what F.linear on the f16 weight does).
tests/ops/test_quant_kernels.py (test_tiled_kernel_half) runs f16 / bf16 x apple9 / apple10 at
partial tiles of M and N over several tiles."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import metalforge as mf
from metalforge import quant
from metalforge.testing import check


@mf.kernel(launch={"qmm_min_rows": 8})
def q4_linear(wq: "u32[N, K/8]", scales: "T[N, K/GS]", biases: "T[N, K/GS]", x: "T[M, K]",
              GS: mf.Const[int] = 64) -> "T[M, N]":
    return mf.sum((mf.unpack(wq, bits=4) * scales + biases) * x, axis="K")


@mf.kernel(launch={"qmm_min_rows": 8, "qmm_tile_m": 32, "qmm_tile_n": 64, "qmm_tile_k": 64,
                   "qmm_splits": 2})
def q4_two(wq: "u32[N, K/8]", scales: "T[N, K/GS]", biases: "T[N, K/GS]",
           x: "T[B, M, K]", bias: "T[N]", res: "T[B, M, N]", GS: mf.Const[int] = 8):
    """A batch axis, GS 8, an epilogue (bias, SiLU, a residual) and two outputs; two teams
    splitting K."""
    y = mf.sum(x * (mf.unpack(wq, bits=4) * scales + biases), axis="K") + bias
    return y * mf.sigmoid(y) + res, y


def _weights(n: int, k: int, gs: int, dt: torch.dtype, seed: int):
    """Packed random codes, scales and biases in dt, and the weight they give rounded to dt
    (fp32 arithmetic, as the kernel dequantizes), computed directly."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (n, k), generator=g)
    s = (torch.rand(n, k // gs, generator=g) * 0.1 + 0.02).to(dt)
    b = (torch.randn(n, k // gs, generator=g) * 0.1).to(dt)
    w = codes.float() * s.float().repeat_interleave(gs, 1) + b.float().repeat_interleave(gs, 1)
    return quant.pack(codes, bits=4), s, b, w.to(dt)


def _host(kernel, *args):
    return kernel.launches(*args)[0]


def test_epilogue_two_outputs_batch_and_a_step_past_k():
    """K = 40 in steps of 64: team 0's step partly past K (x read element by element, the
    weights 0 past K), team 1's wholly; tiles of 32 rows x 64 weight rows (launch options),
    2 x 2 tiles a batch, 2 teams of 128 threads a tile."""
    wq, s, b, w = _weights(70, 40, 8, torch.float16, seed=3)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 33, 40, generator=g).half()
    bias, res = torch.randn(70, generator=g).half(), torch.randn(2, 33, 70, generator=g).half()
    want = x.double() @ w.double().T + bias.double()
    for kern in (q4_two, q4_two.with_launch(qmm_prefetch=False)):     # loads a step ahead, not
        with mf.target("apple10"):
            assert _host(kern, wq, s, b, x, bias, res)[1:] == (2 * 2 * 2 * 256, 256)
            out, y = kern(wq, s, b, x, bias, res)
        torch.testing.assert_close(y.double(), want, rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(out.double(), F.silu(want) + res.double(), rtol=1e-2,
                                   atol=2e-2)


def test_check_covers_the_tensor_op_lowering():
    """check's sizes include the tiled kernel's selected example (a partial tile of each,
    two steps of each of 4 teams along K) at the tensor-op target."""
    with mf.target("apple10"):
        report = check(q4_linear.with_launch(qmm_splits=4), max_examples=2,
                       dtypes={"T": "bf16"})
    assert "N=65" in report.coverage() and "_qmm" in report.coverage()


def test_kernel_text_by_target_and_options():
    src9 = q4_linear.source(T="f16")
    qmm = src9[src9.index("kernel void mf_q4_linear_qmm"):]
    assert "simdgroup_matrix<half, 8, 8>" in qmm and "threadgroup half mf_bs[2048];" in qmm
    assert "mf_bs[((mf_q * 8u + mf_j) / 16u * 64u + mf_wr) * 16u + (mf_q * 8u + mf_j) % 16u]" \
        " = half(mf_wv[mf_j]);" in qmm                         # rounded once, when stored
    # the next step's loads in registers while the products run: one word, scale and bias a
    # run (2 runs a thread), x's 16-byte vectors; with qmm_prefetch=False loaded when staged
    loop = qmm[qmm.index("for (mf_index_t mf_k0"):]
    assert "uint mf_pf0[2];" in qmm and "mf_pf0[mf_i] = uint(wq[" in loop
    assert loop.index("threadgroup_barrier") < loop.index("mf_xv[mf_i] = *reinterpret_cast") \
        < loop.index("simdgroup_multiply_accumulate")
    assert "mf_pf0" not in q4_linear.with_launch(qmm_prefetch=False).source(T="f16")
    with mf.target("apple10"):
        src10 = q4_linear.source(T="bf16")
        assert "matmul2d<mf_desc, execution_simdgroup>" in src10
        assert "tensor<threadgroup bfloat," in src10
        # f32 x, and the qmm_fp32 option, keep the fp32 kernel (schedule/quant/tiled.py)
        for src in (q4_linear.source(T="f32"), q4_linear.with_launch(qmm_fp32=True).source(
                T="f16")):
            assert "matmul2d" not in src and "threadgroup float mf_ws[2112];" in src
    wide = q4_linear.with_launch(qmm_tile_m=128, qmm_tile_n=128).source(T="f16")
    assert "threadgroup half mf_as[4096];" in wide and "simdgroup_float8x8 mf_acc[64];" in wide
    # 4 teams: each its own staged tiles in one array, every 4th step of K; the tile's sums
    # added in turn into floats parked where the tiles were
    teams = q4_linear.with_launch(qmm_splits=4).source(T="f16")
    teams = teams[teams.index("kernel void mf_q4_linear_qmm"):]
    assert "threadgroup half mf_shared[16384];" in teams
    assert "threadgroup half* mf_as = mf_shared + mf_team * 4096u;" in teams
    assert "for (mf_index_t mf_k0 = 0u; mf_k0 < mf_size_K; mf_k0 += 128u) {" in teams
    assert teams.count("threadgroup_barrier") == 2 + 3


def test_tile_option_errors():
    with pytest.raises(mf.LaunchError, match="qmm_tile_m must be 32, 64 or 128, got 48"):
        q4_linear.with_launch(qmm_tile_m=48).source(T="f16")
    with pytest.raises(mf.LaunchError, match="qmm_fp32 must be True or False, got 1"):
        q4_linear.with_launch(qmm_fp32=1)
    with pytest.raises(mf.LaunchError, match=r"qmm_tile_m=128 x qmm_tile_n=128 x qmm_tile_k=32 "
                       r"with qmm_splits=2 needs 65536 bytes of threadgroup memory"):
        q4_linear.with_launch(qmm_tile_m=128, qmm_tile_n=128, qmm_splits=2).source(T="f16")
    with pytest.raises(mf.LaunchError, match="qmm_splits must be 1, 2 or 4, got 3"):
        q4_linear.with_launch(qmm_splits=3).source(T="f16")
    with pytest.raises(mf.LaunchError, match="target must be one of"):
        q4_linear.with_launch(target="m5").source(T="f16")


def test_cuda_translation_passes_host_syntax_check(tmp_path):
    """The cuda target's kernel (matmul2d through the shim's tensor cores) translates and
    reads as C++ against the shim's headers."""
    from metalforge.cuda.translate import translate

    from ..cuda_host import assert_host_syntax
    with mf.target("cuda"):
        src = q4_two.source(T="bf16")
    assert "matmul2d_descriptor(16, 32, 16," in src and "mf_op.run(mf_left3," in src
    assert_host_syntax(translate(src).text, tmp_path, metal_version=400)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16])
def test_on_tensor_cores(dt):
    """The cuda backend (target cuda: tensor ops on tensor cores) at partial tiles."""
    wq, s, b, w = _weights(4096 + 40, 512, 64, dt, seed=5)
    x = torch.randn(200, 512, generator=torch.Generator().manual_seed(6)).to(dt)
    args = [t.cuda() for t in (wq, s, b, x)]
    got = q4_linear(*args).cpu()
    want = x.double() @ w.double().T
    torch.testing.assert_close(got.double(), want, rtol=3e-2, atol=6e-2)
