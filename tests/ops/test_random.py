"""Counter-based random numbers (mf.rand, mf.randn; Philox-4x32-10) against a plain-Python
Philox written here from the algorithm's definition (Salmon et al., SC'11), itself checked
against Random123's published known-answer vectors: the kernel's uniforms bit-identical to it
and to the reference, normals within f32 rounding, statistics, streams (seed, offset), boundary
sizes, f16/bf16/f32 draws, draws inside a row reduction, dropout forward and its derived
backward (which draws the mask again), and the errors for a seed that is not an integer."""
from __future__ import annotations

import math
import shutil
import subprocess

import pytest
import torch

import metalforge as mf
from metalforge import philox as mf_philox
from metalforge.cuda import translate
from metalforge.cuda.library import INCLUDE_DIR
from metalforge.testing import check

M32 = 0xFFFFFFFF


# -- an independent Philox-4x32-10, plain Python ints ------------------------------------------

def philox4x32_10(ctr: tuple[int, int, int, int], key: tuple[int, int]) -> tuple[int, ...]:
    """Random123's philox4x32 with 10 rounds: each round two 32x32->64 products of the
    counter's words 0 and 2, the key bumped by the Weyl constants between rounds."""
    c0, c1, c2, c3 = ctr
    k0, k1 = key
    for rnd in range(10):
        if rnd:
            k0, k1 = (k0 + 0x9E3779B9) & M32, (k1 + 0xBB67AE85) & M32
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & M32, (p0 >> 32) ^ c3 ^ k1, p0 & M32
    return c0, c1, c2, c3


def _words(seed: int, offset: int, block: int) -> tuple[int, ...]:
    s, o = seed & (2 ** 64 - 1), offset & (2 ** 64 - 1)
    return philox4x32_10((block & M32, block >> 32, o & M32, o >> 32), (s & M32, s >> 32))


def want_rand(seed: int, offset: int, n: int, bits: int = 24) -> torch.Tensor:
    """The documented mapping: element i is lane i % 4 of block i // 4, its high `bits` bits
    times 2^-bits."""
    out = []
    for blk in range((n + 3) // 4):
        out += [(w >> (32 - bits)) * 2.0 ** -bits for w in _words(seed, offset, blk)]
    return torch.tensor(out[:n], dtype=torch.float64)


def want_randn(seed: int, offset: int, n: int) -> torch.Tensor:
    """Box-Muller on lanes (0, 1) (even i) or (2, 3) (odd i) of block i // 2, in float64."""
    out = []
    for blk in range((n + 1) // 2):
        w = _words(seed, offset, blk)
        for a, c in ((w[0], w[1]), (w[2], w[3])):
            u1, u2 = ((a >> 8) + 1) * 2.0 ** -24, (c >> 8) * 2.0 ** -24
            out.append(math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * u2))
    return torch.tensor(out[:n], dtype=torch.float64)


# Random123's kat_vectors for philox4x32_R(10): counter, key -> the four words
KAT = [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
       ((M32, M32, M32, M32), (M32, M32), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
       ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]


@pytest.mark.parametrize("ctr,key,words", KAT)
def test_plain_philox_matches_random123(ctr, key, words):
    assert philox4x32_10(ctr, key) == words


def test_reference_philox_matches_plain_philox():
    """metalforge.philox (torch int64, vectorised) on random counters and keys."""
    g = torch.Generator().manual_seed(0)
    ctr = torch.randint(0, 2 ** 32, (4, 200), generator=g, dtype=torch.int64)
    for key in ((0, 0), (M32, 1), (0x12345678, 0x9ABCDEF0)):
        got = torch.stack(mf_philox.philox(tuple(ctr), key))
        want = [philox4x32_10(tuple(int(c) for c in ctr[:, j]), key) for j in range(200)]
        assert torch.equal(got, torch.tensor(want, dtype=torch.int64).T)
    for ctr_, key, words in KAT:
        got = mf_philox.philox(tuple(torch.tensor([c]) for c in ctr_), key)
        assert tuple(int(w) for w in got) == words


# -- kernels ------------------------------------------------------------------------------------

@mf.kernel
def draws(x: "T[R, D]", seed: int, offset: int = 0):
    return (mf.rand(seed, like=x, offset=offset, dtype="T"),
            mf.randn(seed, like=x, offset=offset, dtype="T"))


@mf.kernel
def noisy_centre(x: "f32[R, D]", seed: int):
    """A draw over the row kernel's element values, and one over D alone (one row of numbers
    shared by every row)."""
    y = x * mf.rand(seed, like=x) + mf.rand(seed, "D", offset=1)
    return y - mf.mean(y, axis="D")


@mf.kernel
def column_noise(x: "f32[R, D]", seed: int):
    """A draw in a column reduction: each column's thread draws its own column's numbers
    (the kernel that takes two adjacent columns a thread is not used for it)."""
    return mf.sum(x * mf.rand(seed, like=x), axis="R")


@mf.kernel
def dropout(x: "T[*B, D]", seed: int, p: float = 0.5, offset: int = 0):
    keep = mf.rand(seed, like=x, offset=offset) >= p
    return mf.where(keep, x / (1 - p), 0.0)


@pytest.mark.parametrize("shape", [(1, 1), (1, 31), (1, 33), (3, 37)])
def test_uniforms_bit_identical_at_boundary_sizes(shape):
    """Vector bodies and scalar tails: every uniform equals the plain-Python Philox's exactly,
    and the reference's; normals agree within f32 rounding of log, cos and sqrt."""
    x = torch.zeros(shape)
    seed, offset = 0x1234_5678_9ABC, 3
    u, z = draws(x, seed, offset)
    ru, rz = draws.reference(x, seed, offset)
    n = x.numel()
    assert torch.equal(u.double().flatten(), want_rand(seed, offset, n))
    assert torch.equal(u, ru)
    torch.testing.assert_close(z.double().flatten(), want_randn(seed, offset, n),
                               rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(z, rz, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("dtype,bits", [(torch.float16, 11), (torch.bfloat16, 8)])
def test_half_draws_are_exact_and_below_one(dtype, bits):
    x = torch.zeros(3, 37, dtype=dtype)
    u, z = draws(x, 7)
    assert u.dtype == z.dtype == dtype
    assert torch.equal(u.double().flatten(), want_rand(7, 0, x.numel(), bits))
    assert float(u.max()) < 1.0
    assert torch.equal(u, draws.reference(x, 7)[0])
    torch.testing.assert_close(z, want_randn(7, 0, x.numel()).to(dtype).view(3, 37),
                               rtol=1e-2, atol=1e-2)


def test_statistics_and_streams():
    """65536 draws: uniform mean 1/2, variance 1/12, 16 equal histogram bins (chi-square);
    normal mean 0, variance 1, the fraction within one sigma; other seeds, offsets and the
    seed's high word give other numbers."""
    x = torch.zeros(64, 1024)
    u, z = draws(x, 2024)
    assert torch.equal(u.double().flatten(), want_rand(2024, 0, x.numel()))
    assert abs(u.mean().item() - 0.5) < 0.006 and abs(u.var().item() - 1 / 12) < 0.003
    counts = torch.histc(u, bins=16, min=0.0, max=1.0)
    chi2 = ((counts - 4096) ** 2 / 4096).sum().item()
    assert chi2 < 37.7                               # 15 degrees of freedom, p = 0.001
    assert abs(z.mean().item()) < 0.02 and abs(z.var().item() - 1) < 0.03
    assert abs((z.abs() < 1).double().mean().item() - 0.6827) < 0.01
    assert float(z.abs().max()) <= 5.77
    others = [draws(x, 2025)[0], draws(x, 2024, 1)[0], draws(x, 2024 + (1 << 32))[0]]
    for v in others:
        assert (v == u).double().mean().item() < 0.01
    assert torch.equal(draws(x, 2024)[0], u)          # the same stream again


def test_draws_inside_a_row_reduction_and_its_backward():
    """Forward in the row kernel; the derived backward (d/dx = the draw, centred) draws the
    same numbers again from the seed."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 300, generator=g, requires_grad=True)
    dy = torch.randn(5, 300, generator=g)
    xd = x.detach().double().requires_grad_()
    y = xd * want_rand(11, 0, x.numel()).view(5, 300) + want_rand(11, 1, 300)
    want = y - y.mean(1, keepdim=True)
    got = noisy_centre(x, 11)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    got.backward(dy)
    want.backward(dy.double())
    torch.testing.assert_close(x.grad.double(), xd.grad, rtol=1e-5, atol=1e-5)
    assert "mf_philox(" in noisy_centre.backward_source(x, 11)


def test_draws_inside_a_column_reduction():
    x = torch.randn(37, 70, generator=torch.Generator().manual_seed(3))
    want = (x.double() * want_rand(4, 0, x.numel()).view(37, 70)).sum(0)
    torch.testing.assert_close(column_noise(x, 4).double(), want, rtol=1e-5, atol=1e-5)


def test_dropout_forward_and_backward_regenerate_the_mask():
    """The gradient is torch's for the same mask (from the plain-Python Philox), and the
    backward kernel draws that mask again (its source calls Philox; nothing is stored)."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 3, 33, generator=g, requires_grad=True)
    dy = torch.randn(2, 3, 33, generator=g)
    seed, p, step = -5, 0.25, 9                       # a negative seed: its 64-bit pattern
    keep = (want_rand(seed, step, x.numel()) >= p).view(x.shape)
    y = dropout(x, seed, p, step)
    torch.testing.assert_close(y, torch.where(keep, x / (1 - p), 0.0))
    y.backward(dy)
    torch.testing.assert_close(x.grad, torch.where(keep, dy / (1 - p), 0.0))
    src = dropout.backward_source(x, seed, p, step)
    assert "mf_philox(" in src and "mf_rand_bits(" in src
    assert abs(keep.double().mean().item() - 0.75) < 0.1
    op = dropout.as_op("mf_test::dropout")
    assert torch.equal(op(x.detach(), seed, p, step), y.detach())


def test_check_dropout():
    check(dropout, dtypes={"T": "f32"}, dims={"D": [1, 31, 33]}, max_examples=3)


# -- bad seeds ------------------------------------------------------------------------------------

def test_seed_not_an_integer_at_the_call():
    x = torch.zeros(2, 5)
    with pytest.raises(mf.BindingError, match=r"argument 'seed': expected a Python int, got "
                                              r"float 1.5"):
        dropout(x, 1.5)
    with pytest.raises(mf.BindingError, match=r"argument 'offset': expected a Python int"):
        dropout(x, 1, 0.5, 2.0)
    with pytest.raises(mf.BindingError, match=r"argument 'seed': 18446744073709551616 does not "
                                              r"fit a 64-bit signed integer"):
        dropout(x, 2 ** 64)


def test_float_seed_values_are_trace_errors():
    @mf.kernel
    def float_seed(x: "f32[N]", s: float):
        return mf.rand(s, like=x)

    @mf.kernel
    def literal_seed(x: "f32[N]"):
        return mf.randn(0.5, like=x)

    @mf.kernel
    def float_offset(x: "f32[N]", s: int):
        return mf.rand(s, like=x, offset=x)

    @mf.kernel
    def no_axes(x: "f32[N]", s: int):
        return x + mf.rand(s)

    x = torch.zeros(3)
    cases = [(float_seed, (x, 1.0), r"test_random.py:\d+: in kernel 'float_seed': "
                                    r"mf.rand: seed must be an integer, got a f32 "
                                    r"value.*`seed: int`"),
             (literal_seed, (x,), r"mf.randn: seed must be an integer, got float 0.5"),
             (float_offset, (x, 1), r"mf.rand: offset must be an integer, got a f32 value"),
             (no_axes, (x, 1), r"say which axes the draw varies over.*like=x")]
    for k, args, message in cases:
        with pytest.raises(mf.TraceError, match=message):
            k.graph(*args)


# -- the other backends' source -----------------------------------------------------------------

def test_cuda_translation_compiles_against_the_shim(tmp_path):
    """Philox (mulhi on uint, ulong counters) through the cuda backend's translation and shim
    (a host syntax check)."""
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no host C++ compiler for the syntax check")
    f = tmp_path / "draws.cu"
    f.write_text(translate(draws.source(torch.zeros(2, 3))).text)
    r = subprocess.run([cxx, "-std=c++17", "-fsyntax-only", "-DMF_CUDA_HOST_CHECK",
                        f"-I{INCLUDE_DIR}", "-x", "c++", str(f)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[:4000]


def test_mlx_runs_the_same_source():
    mx = pytest.importorskip("mlx.core")
    import numpy as np

    from metalforge.runtime import mlx as mfx
    with mf.backend("sim"):
        u, _ = draws(mx.zeros((3, 37)), 5)
    assert mfx.is_array(u)
    assert torch.equal(torch.from_numpy(np.array(u)).double().flatten(), want_rand(5, 0, 111))
