"""A quantized matvec's epilogue gathering its own results (RoPE's partner row inside the q/k
projection: the staged kernel) and sums of x alone beside the projection (an RMSNorm fused into
it), on the simulator against torch computed directly from the dequantized weights."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import metalforge as mf
from metalforge import quant
from metalforge.errors import LaunchError, UnsupportedConstruct
from metalforge.testing import check


def rope(y, pos, base):
    i, half = mf.index("E"), mf.size("E") // 2
    partner = mf.take(y, axis="E", index=mf.where(i < half, i + half, i - half))
    theta = pos * base ** (-2.0 * (i % half) / mf.size("E"))
    return y * mf.cos(theta) + mf.where(i < half, -partner, partner) * mf.sin(theta)


@mf.kernel            # the affine form, K a multiple of the chunk: the register path only
def q_rope(wq: "u32[H, E, K/8]", s: "T[H, E, K/64]", b: "T[H, E, K/64]", x: "T[M, K]",
           pos: int, base: float = 10000.0) -> "T[M, H, E]":
    return rope(mf.sum((mf.unpack(wq, bits=4) * s + b) * x, axis="K"), pos, base).to("T")


@mf.kernel            # an RMSNorm's scale beside the sum; K a multiple of 8 only: guarded chunks
def norm_rope(wq: "u32[H, E, K/8]", x: "T[M, K]", w: "T[K]", pos: int,
              base: float = 10000.0) -> "T[M, H, E]":
    r = mf.rsqrt(mf.mean(x * x, axis="K") + 1e-5)
    y = r * mf.sum((mf.unpack(wq, bits=4) - 8.0) * (x * w), axis="K")
    return rope(y, pos, base).to("T")


@mf.kernel            # the norm alone (no gather): the qmv kernel, every row of x
def norm_linear(wq: "u32[N, K/8]", x: "T[M, K]", w: "T[K]") -> "T[M, N]":
    r = mf.rsqrt(mf.mean(x * x, axis="K") + 1e-5)
    return (r * mf.sum((mf.unpack(wq, bits=4) - 8.0) * (x * w), axis="K")).to("T")


def _codes(n: int, k: int, seed: int) -> torch.Tensor:
    """Random 4-bit codes packed as MLX's words ([n, k/8] u32) and the codes ([n, k])."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), generator=g)
    shifts = 4 * torch.arange(8)
    words = (q.view(n, k // 8, 8) << shifts).sum(-1)
    return words.to(torch.int64).to(torch.uint32), q


@pytest.mark.parametrize("H, K, kernel", [(3, 256, "qmv_paired"), (1, 2048, "qmv_paired_split")])
def test_rope_in_the_projection_reads_the_partner_row(H, K, kernel):
    E, M, pos = 34, 2, 5           # 34 rows: a part-filled block; K = 2048: split, few blocks
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(H * E, K, generator=g) / 16).half()
    wq, s, b = quant.quantize(w, group_size=64, bits=4)
    x = torch.randn(M, K, generator=g).half()
    got = q_rope(wq.view(H, E, -1), s.view(H, E, -1), b.view(H, E, -1), x, pos)
    y = (x.double() @ quant.dequantize(wq, s, b, group_size=64, bits=4).double().T)
    half = E // 2
    th = pos * 10000.0 ** (-2.0 * (torch.arange(E, dtype=torch.float64) % half) / E)
    y = y.view(M, H, E)
    want = y * th.cos() + torch.cat([-y[..., half:], y[..., :half]], -1) * th.sin()
    torch.testing.assert_close(got.double(), want, rtol=2e-3, atol=4e-3)
    args = (wq.view(H, E, -1), s.view(H, E, -1), b.view(H, E, -1), x, pos)
    # rows i and i + 17 in one simdgroup (9 blocks of 2 + 2 rows a head), the partner from its
    # registers (split: 4 simdgroups a block, partials merged first); no index report (the
    # partner index is proven in range)
    splits = 4 if kernel.endswith("split") else 1
    threads = M * H * 9 * splits * 32                 # (split: whole groups of 128)
    threads = -(-threads // 128) * 128 if splits > 1 else threads
    assert q_rope.launches(*args) == ((f"q_rope_f16_{kernel}", threads, 128),)
    assert "mf_err" not in q_rope.source(*args)
    # paired_rows 2 (the cuda backend's): a row and its partner a simdgroup, 17 blocks a head
    two = q_rope.with_launch(paired_rows=2)
    torch.testing.assert_close(two(*args).double(), want, rtol=2e-3, atol=4e-3)
    threads = M * H * 17 * splits * 32
    threads = -(-threads // 128) * 128 if splits > 1 else threads
    assert two.launches(*args) == ((f"q_rope_f16_{kernel}", threads, 128),)
    with pytest.raises(ValueError, match="paired_rows=3: .*an even number"):
        q_rope.with_launch(paired_rows=3)(*args)


def test_norm_in_the_projection_with_guarded_chunks():
    H, E, K, M, pos = 2, 7, 104, 3, 3             # K = 104: three whole chunks and a part;
    wq, codes = _codes(H * E, K, 1)
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(M, K, generator=g).half(), (1 + 0.1 * torch.randn(K, generator=g)).half()
    h = F.rms_norm(x.double(), (K,), w.double(), eps=1e-5)
    y = (h @ (codes.double() - 8).T).view(M, H, E)
    half = E // 2
    th = pos * 10000.0 ** (-2.0 * (torch.arange(E, dtype=torch.float64) % half) / E)
    i = torch.arange(E)                           # E odd: rows 3..6 pair with 0..3
    partner = y[..., torch.where(i < half, i + half, i - half)]
    want = y * th.cos() + torch.where(i < half, -partner, partner) * th.sin()
    got = norm_rope(wq.view(H, E, -1), x, w, pos)
    # E = 7 is no 2 x half: one threadgroup a head, every row's sums in threadgroup memory
    assert norm_rope.launches(wq.view(H, E, -1), x, w, pos)[0][0].endswith("qmv_staged")
    torch.testing.assert_close(got.double(), want, rtol=2e-3, atol=2e-2)
    got = norm_linear(wq, x, w)
    torch.testing.assert_close(got.double(), (h @ (codes.double() - 8).T), rtol=2e-3, atol=2e-2)
    assert "mf_xs_0 = simd_sum(mf_xs_0)" in norm_linear.source(wq, x, w)
    # K split over 4 simdgroups a block: the sum of x * x merged with the rows' partials
    wq, codes = _codes(6, 2048, 6)
    x, w = torch.randn(1, 2048, generator=g).half(), (1 + 0.1 * torch.randn(2048)).half()
    h = F.rms_norm(x.double(), (2048,), w.double(), eps=1e-5)
    assert norm_linear.launches(wq, x, w)[0][0].endswith("qmv_split")
    torch.testing.assert_close(norm_linear(wq, x, w).double(), h @ (codes.double() - 8).T,
                               rtol=2e-3, atol=2e-2)


def _refused(kernel, *args) -> str:
    with pytest.raises(UnsupportedConstruct) as e:
        kernel(*args)
    return str(e.value)


def test_gathers_the_staged_kernel_cannot_serve_are_refused():
    @mf.kernel
    def shifted(wq: "u32[H, E, K/8]", x: "T[K]") -> "T[H, E]":
        y = mf.sum((mf.unpack(wq, bits=4) - 8.0) * x, axis="K")
        return (y + mf.take(y, axis="E", index=mf.index("E") + 1)).to("T")

    @mf.kernel
    def across_heads(wq: "u32[H, E, K/8]", x: "T[K]") -> "T[H, E]":
        y = mf.sum((mf.unpack(wq, bits=4) - 8.0) * x, axis="K")
        return (y + mf.take(y, axis="H", index=mf.size("H") - 1 - mf.index("H"))).to("T")

    @mf.kernel
    def elementwise(x: "T[N]") -> "T[N]":
        return mf.take(x * 2.0, axis="N", index=mf.size("N") - 1 - mf.index("N"))

    wq, _ = _codes(2 * 8, 64, 3)
    wq, x = wq.view(2, 8, -1), torch.randn(64).half()
    msg = _refused(shifted, wq, x)
    assert "not provably in [0, size('E'))" in msg
    assert "test_quant_epilogue.py" in msg and "mf.clamp" in msg
    assert "along its weight rows only" in _refused(across_heads, wq, x)
    assert "gathers a computed value" in _refused(elementwise, x)


def test_a_head_over_the_staged_rows_is_refused_at_the_call():
    wq, _ = _codes(1025, 64, 4)
    with pytest.raises(LaunchError, match="1025 rows are over the 1024"):
        q_rope(wq.view(1, 1025, -1), torch.ones(1, 1025, 1).half(), torch.zeros(1, 1025, 1).half(),
               torch.randn(1, 64).half(), 0)


@mf.kernel            # silu(g) * u computed once per threadgroup for its simdgroups' rows
def down_swiglu(wq: "u32[N, F/8]", s: "T[N, F/64]", b: "T[N, F/64]", g: "T[M, F]",
                u: "T[M, F]", r: "T[M, N]") -> "T[M, N]":
    return r + mf.sum((mf.unpack(wq, bits=4) * s + b) * (g * mf.sigmoid(g) * u), axis="F")


def test_the_fused_activation_is_staged_once_per_group():
    N, Fd, M = 37, 1088, 2           # a part-filled group of blocks; a stretch and 2 chunks
    gen = torch.Generator().manual_seed(5)
    wq, s, b = quant.quantize((torch.randn(N, Fd, generator=gen) / 32).half(), group_size=64,
                              bits=4)
    g, u, r = (torch.randn(*shape, generator=gen).half() for shape in ((M, Fd), (M, Fd), (M, N)))
    got = down_swiglu(wq, s, b, g, u, r)
    m = F.silu(g.double()) * u.double()
    want = r.double() + m @ quant.dequantize(wq, s, b, group_size=64, bits=4).double().T
    torch.testing.assert_close(got.double(), want, rtol=2e-3, atol=4e-3)
    # 10 blocks of 4 rows padded to 3 groups of 4 simdgroups, for each row of x
    assert down_swiglu.launches(wq, s, b, g, u, r) == (("down_swiglu_f16_qmv_prologue",
                                                        M * 12 * 32, 128),)
    check(down_swiglu, dtypes={"T": ["f32"]}, max_examples=6)
