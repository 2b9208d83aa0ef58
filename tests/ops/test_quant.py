"""metalforge.quant: MLX-layout affine quantization on torch tensors.

Hand-computed cases and round-trip bounds need nothing else; the cross-checks against MLX
(bit-exact words, scales, biases and dequantized values) run where `mlx` is installed
(`pip install 'metalforge[mlx]'`) and are skipped otherwise.
"""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from metalforge import quant

try:
    import mlx.core as mx
except ImportError:          # pragma: no cover - depends on the environment
    mx = None

needs_mlx = pytest.mark.skipif(mx is None, reason="mlx is not installed (extra 'mlx')")

BITS = quant.SUPPORTED_BITS
GROUP_SIZES = quant.SUPPORTED_GROUP_SIZES
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
F32_EPS = float(np.float32(1e-7))


def words(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64).to(torch.uint32)


def float_bits(t: torch.Tensor) -> np.ndarray:
    """Bit patterns of a float tensor, widened exactly to float32 (tells -0.0 from 0.0)."""
    return t.detach().float().numpy().view(np.uint32)


# ---------------------------------------------------------------------------------------------
# Hand-computed cases

def test_ascending_values_4bit():
    # w = 0..15, 0..15: max 15 is the edge -> bias 15, scale 15 / round(15 / -1) = -1, q = 15 - w
    w = (torch.arange(32) % 16).float().reshape(1, 32)
    wq, s, b = quant.quantize(w, group_size=32, bits=4)
    assert torch.equal(wq, words(0x89ABCDEF, 0x01234567, 0x89ABCDEF, 0x01234567).reshape(1, 4))
    assert s.tolist() == [[-1.0]] and b.tolist() == [[15.0]]
    assert torch.equal(quant.dequantize(wq, s, b, group_size=32, bits=4), w)


def test_negative_edge_2bit():
    # w in {-3, -2, -1, 0}: |min| > |max| -> the edge is -3, scale +1, q = w + 3
    w = (torch.arange(32) % 4 - 3).float().reshape(1, 32)
    wq, s, b = quant.quantize(w, group_size=32, bits=2)
    assert torch.equal(wq, words(0xE4E4E4E4, 0xE4E4E4E4).reshape(1, 2))   # 0b11_10_01_00
    assert s.tolist() == [[1.0]] and b.tolist() == [[-3.0]]
    assert torch.equal(quant.dequantize(wq, s, b, group_size=32, bits=2), w)


def test_codes_round_half_to_even():
    # scale -1, bias 15: w = 0.5 -> 14.5 -> 14, w = 2.5 -> 12.5 -> 12 (half away from zero: 15, 13)
    w = torch.zeros(1, 32)
    w[0, :3] = torch.tensor([15.0, 0.5, 2.5])
    wq, s, b = quant.quantize(w, group_size=32, bits=4)
    assert s.tolist() == [[-1.0]] and b.tolist() == [[15.0]]
    assert int(wq[0, 0]) == 0xFFFFFCE0
    assert quant.unpack(wq, 4)[0, :4].tolist() == [0, 14, 12, 15]


def test_zero_group_keeps_a_tiny_negative_scale():
    w = torch.zeros(2, 64)
    wq, s, b = quant.quantize(w, group_size=32, bits=4)
    assert not wq.to(torch.int64).any()
    assert s.flatten().tolist() == [-F32_EPS] * 4
    assert (float_bits(b) == 0).all()                       # +0.0, not -0.0
    assert (float_bits(quant.dequantize(wq, s, b, group_size=32, bits=4)) == 0).all()


def test_constant_group_is_exact():
    # edge 1.0, q0 = round(1 / -1e-7) = -1e7 -> scale = 1 / -1e7, bias 1, every code 0
    w = torch.ones(1, 64)
    wq, s, b = quant.quantize(w, group_size=64, bits=4)
    assert not wq.to(torch.int64).any()
    assert s.item() == float(np.float32(1.0) / np.float32(-1e7)) and b.item() == 1.0
    assert torch.equal(quant.dequantize(wq, s, b, group_size=64, bits=4), w)


@pytest.mark.parametrize("bits, k, code, expected", [
    (3, 10, 7, (0xC0000000, 0x1, 0x0)),                     # bits 30..32
    (5, 6, 31, (0xC0000000, 0x7, 0x0, 0x0, 0x0)),           # bits 30..34
    (6, 5, 63, (0xC0000000, 0xF, 0x0)),                     # bits 30..35
    (8, 5, 0xAB, (0x0, 0xAB00)),
    (2, 17, 3, (0x0, 0xC)),
])
def test_codes_straddle_words_as_one_bit_stream(bits, k, code, expected):
    per_pack, n_words = quant.pack_layout(bits)
    codes = torch.zeros(1, per_pack * len(expected) // n_words, dtype=torch.int32)
    codes[0, k] = code
    wq = quant.pack(codes, bits)
    assert torch.equal(wq, words(*expected).reshape(1, -1))
    assert torch.equal(quant.unpack(wq, bits), codes)


def test_pack_layout():
    assert [quant.pack_layout(b) for b in BITS] == [(16, 1), (32, 3), (8, 1), (32, 5), (16, 3),
                                                    (4, 1)]


def test_shapes_dtypes_and_leading_dims():
    w = torch.randn(2, 3, 256, dtype=torch.bfloat16)
    wq, s, b = quant.quantize(w, group_size=128, bits=6)
    assert wq.shape == (2, 3, 48) and wq.dtype == torch.uint32
    assert s.shape == b.shape == (2, 3, 2) and s.dtype == b.dtype == torch.bfloat16
    out = quant.dequantize(wq, s, b, group_size=128, bits=6)
    assert out.shape == w.shape and out.dtype == torch.bfloat16
    assert quant.unpack(wq, 6).shape == (2, 3, 256) and quant.unpack(wq, 6).dtype == torch.int32
    # one row at a time gives the same as the whole tensor, and strides do not matter
    assert torch.equal(quant.quantize(w[1, 2], group_size=128, bits=6)[0], wq[1, 2])
    wt = torch.randn(256, 8).t()
    for a, c in zip(quant.quantize(wt, 64, 4), quant.quantize(wt.contiguous(), 64, 4)):
        assert torch.equal(a, c)


def test_empty_rows():
    wq, s, b = quant.quantize(torch.zeros(0, 64), group_size=64, bits=3)
    assert wq.shape == (0, 6) and s.shape == b.shape == (0, 1)
    assert quant.dequantize(wq, s, b, group_size=64, bits=3).shape == (0, 64)


# ---------------------------------------------------------------------------------------------
# Properties that need no reference

@settings(max_examples=200, deadline=None, database=None)
@given(bits=st.sampled_from(BITS), rows=st.integers(1, 3), packs=st.integers(1, 4),
       seed=st.integers(0, 2**32 - 1))
def test_pack_and_unpack_are_inverse(bits, rows, packs, seed):
    per_pack, n_words = quant.pack_layout(bits)
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 1 << bits, (rows, packs * per_pack), generator=g, dtype=torch.int32)
    assert torch.equal(quant.unpack(quant.pack(codes, bits), bits), codes)
    raw = torch.randint(0, 1 << 32, (rows, packs * n_words), generator=g).to(torch.uint32)
    assert torch.equal(quant.pack(quant.unpack(raw, bits), bits), raw)


DISTRIBUTIONS = ("normal", "positive", "negative", "constant", "zeros", "some_constant",
                 "integers", "tiny", "large", "outlier")


def sample(dist: str, shape: tuple[int, int], group_size: int, dtype: torch.dtype,
           seed: int) -> torch.Tensor:
    """Weights of one kind of distribution, exactly representable in `dtype`."""
    rng = np.random.default_rng(seed)
    scale = 10.0 ** rng.uniform(-6, 4)
    x = rng.standard_normal(shape) * scale
    groups = x.reshape(shape[0], -1, group_size)
    if dist == "positive":
        x = rng.uniform(0, scale, shape)
    elif dist == "negative":
        x = -np.abs(x)
    elif dist == "constant":
        groups[:] = groups[..., :1]
    elif dist == "zeros":
        x = np.zeros(shape)
    elif dist == "some_constant":
        groups[rng.random(groups.shape[:2]) < 0.5] = rng.standard_normal()
    elif dist == "integers":                    # many exact ties between grid points
        x = rng.integers(-8, 8, shape) * 0.5
    elif dist == "tiny":                        # below 5e-8: the whole group maps to code 0
        x = rng.uniform(-4e-8, 4e-8, shape)
    elif dist == "large":                       # near the top of the dtype's range
        x = np.clip(rng.standard_normal(shape), -3, 3) * (torch.finfo(dtype).max / 8)
    elif dist == "outlier":
        groups[..., int(rng.integers(group_size))] *= 1000
        x = np.clip(x, -torch.finfo(dtype).max / 4, torch.finfo(dtype).max / 4)
    return torch.from_numpy(np.asarray(x, dtype=np.float32)).to(dtype)


@settings(max_examples=200, deadline=None, database=None)
@given(bits=st.sampled_from(BITS), group_size=st.sampled_from(GROUP_SIZES),
       dtype=st.sampled_from(DTYPES), rows=st.integers(1, 3), groups=st.integers(1, 3),
       dist=st.sampled_from(DISTRIBUTIONS), seed=st.integers(0, 2**32 - 1))
def test_round_trip_error_is_at_most_one_step(bits, group_size, dtype, rows, groups, dist, seed):
    w = sample(dist, (rows, groups * group_size), group_size, dtype, seed)
    wq, s, b = quant.quantize(w, group_size, bits)
    n_bins = (1 << bits) - 1
    codes = quant.unpack(wq, bits)
    assert 0 <= int(codes.min()) and int(codes.max()) <= n_bins

    # in float64, from the stored scales and biases
    q = codes.double().reshape(rows, groups, group_size)
    wg = w.double().reshape(rows, groups, group_size)
    step = s.double().abs().unsqueeze(-1)
    err = (q * s.double().unsqueeze(-1) + b.double().unsqueeze(-1) - wg).abs()
    finfo = torch.finfo(dtype)
    u = finfo.eps / 2
    # storing the float32 scale in the dtype moves it by up to this (subnormals included)
    scale_err = step * u + finfo.smallest_normal * finfo.eps / 2
    slack = (n_bins + 1) * scale_err + step * 1e-5 + wg.abs() * 1e-6
    # a code is off by at most half a step, except the far end, which the clamp may cut by one
    assert (err <= step + slack).all()
    inner = q < n_bins
    assert (err[inner] <= (step / 2 + slack)[inner]).all()
    # the value of largest magnitude in each group (the max on a tie) is exact: code 0 + bias
    hi, lo = wg.amax(-1, keepdim=True), wg.amin(-1, keepdim=True)
    edge = torch.where(lo.abs() > hi.abs(), lo, hi)
    exact = b.double().unsqueeze(-1) != 0
    assert torch.equal(edge[exact], b.double().unsqueeze(-1)[exact])

    # dequantize: the product and the sum each rounded once to the dtype
    out = quant.dequantize(wq, s, b, group_size, bits).double().reshape(q.shape)
    qs, bias = q * s.double().unsqueeze(-1), b.double().unsqueeze(-1)
    bound = 2.01 * u * (qs.abs() + bias.abs()) + finfo.smallest_normal * finfo.eps
    assert ((out - (qs + bias)).abs() <= bound).all()


# ---------------------------------------------------------------------------------------------
# Errors

@pytest.mark.parametrize("call, error, words_in_message", [
    (lambda: quant.quantize(torch.randn(2, 64), group_size=16), ValueError,
     ["group_size=16", "(32, 64, 128)"]),
    (lambda: quant.quantize(torch.randn(2, 64), bits=7), ValueError,
     ["bits=7", "(2, 3, 4, 5, 6, 8)"]),
    (lambda: quant.quantize(torch.randn(2, 96), group_size=64), ValueError,
     ["group_size=64", "(2, 96)"]),
    (lambda: quant.quantize(torch.tensor(1.0)), ValueError, ["group_size=64", "()"]),
    (lambda: quant.quantize(torch.ones(2, 64, dtype=torch.int32)), TypeError, ["w", "int32"]),
    (lambda: quant.quantize(torch.ones(2, 64, dtype=torch.float64)), TypeError,
     ["w", "float64", "bfloat16"]),
    (lambda: quant.quantize(np.ones((2, 64), np.float32)), TypeError, ["torch.Tensor"]),
    (lambda: quant.unpack(torch.zeros(2, 8, dtype=torch.int32), 4), TypeError,
     ["unpack", "uint32", "int32"]),
    (lambda: quant.unpack(torch.zeros(2, 4).to(torch.uint32), 3), ValueError,
     ["multiple of 3 words", "bits=3", "(2, 4)"]),
    (lambda: quant.unpack(torch.zeros(2, 4).to(torch.uint32), 1), ValueError, ["bits=1"]),
    (lambda: quant.pack(torch.full((1, 8), 16), 4), ValueError, ["[0, 15]", "16"]),
    (lambda: quant.pack(torch.zeros(1, 12, dtype=torch.int32), 3), ValueError,
     ["multiple of 32", "(1, 12)"]),
    (lambda: quant.pack(torch.zeros(1, 8), 4), TypeError, ["integer", "float32"]),
    (lambda: quant.dequantize(torch.zeros(2, 8).to(torch.uint32), torch.ones(2, 2),
                              torch.zeros(2, 2)), ValueError,
     ["scales", "(2, 1)", "(2, 8)", "64 values", "group_size=64", "(2, 2)"]),
    (lambda: quant.dequantize(torch.zeros(2, 8).to(torch.uint32), torch.ones(2, 1),
                              torch.zeros(1, 1)), ValueError, ["biases", "(2, 1)", "(1, 1)"]),
    (lambda: quant.dequantize(torch.zeros(2, 8).to(torch.uint32), torch.ones(2, 1),
                              torch.zeros(2, 1, dtype=torch.float16)), TypeError,
     ["biases", "float16", "float32"]),
    (lambda: quant.dequantize(torch.zeros(2, 8, dtype=torch.int64), torch.ones(2, 1),
                              torch.zeros(2, 1)), TypeError, ["uint32", "int64"]),
    (lambda: quant.dequantize(torch.zeros(2, 8).to(torch.uint32), torch.ones(2, 1),
                              torch.zeros(2, 1), group_size=256), ValueError, ["group_size=256"]),
])
def test_errors_name_the_argument_and_what_is_allowed(call, error, words_in_message):
    with pytest.raises(error) as info:
        call()
    for word in words_in_message:
        assert word in str(info.value)


@pytest.mark.parametrize("bad, what", [(float("nan"), "NaN or inf"), (float("inf"), "NaN or inf"),
                                       (3e38, "overflows float32")])
def test_non_finite_weights_and_overflowing_ranges_are_refused(bad, what):
    w = torch.zeros(2, 3, 128)
    w[1, 2, 70] = bad
    w[1, 2, 71] = -3e38
    with pytest.raises(ValueError, match=r"w\[1, 2, 64:128\].*" + what):
        quant.quantize(w, group_size=64)


# ---------------------------------------------------------------------------------------------
# Cross-checks against MLX (bit-exact)

MX_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def to_mx(t: torch.Tensor):
    if t.dtype == torch.uint32:
        return mx.array(t.numpy())
    return mx.array(t.float().numpy()).astype(getattr(mx, MX_DTYPES[t.dtype]))   # exact


def mx_float_bits(a) -> np.ndarray:
    return np.array(a.astype(mx.float32)).view(np.uint32)


@needs_mlx
@settings(max_examples=300, deadline=None, database=None)
@given(bits=st.sampled_from(BITS), group_size=st.sampled_from(GROUP_SIZES),
       dtype=st.sampled_from(DTYPES), rows=st.integers(1, 4), groups=st.integers(1, 3),
       dist=st.sampled_from(DISTRIBUTIONS), seed=st.integers(0, 2**32 - 1))
def test_quantize_and_dequantize_match_mlx_bit_for_bit(bits, group_size, dtype, rows, groups,
                                                       dist, seed):
    w = sample(dist, (rows, groups * group_size), group_size, dtype, seed)
    wq, s, b = quant.quantize(w, group_size, bits)
    mwq, ms, mb = mx.quantize(to_mx(w), group_size=group_size, bits=bits)
    np.testing.assert_array_equal(wq.numpy(), np.array(mwq))
    np.testing.assert_array_equal(float_bits(s), mx_float_bits(ms))
    np.testing.assert_array_equal(float_bits(b), mx_float_bits(mb))
    out = quant.dequantize(wq, s, b, group_size, bits)
    mout = mx.dequantize(mwq, ms, mb, group_size=group_size, bits=bits)
    np.testing.assert_array_equal(float_bits(out), mx_float_bits(mout))


@needs_mlx
@settings(max_examples=150, deadline=None, database=None)
@given(bits=st.sampled_from(BITS), group_size=st.sampled_from(GROUP_SIZES),
       dtype=st.sampled_from(DTYPES), lead=st.lists(st.integers(1, 3), min_size=1, max_size=2),
       groups=st.integers(1, 3), seed=st.integers(0, 2**32 - 1))
def test_unpack_and_dequantize_match_mlx_on_any_words(bits, group_size, dtype, lead, groups,
                                                      seed):
    g = torch.Generator().manual_seed(seed)
    n_words = groups * group_size * bits // 32
    wq = torch.randint(0, 1 << 32, (*lead, n_words), generator=g).to(torch.uint32)
    s = (torch.randn(*lead, groups, generator=g) * 0.1).to(dtype)
    b = torch.randn(*lead, groups, generator=g).to(dtype)
    ones, zeros = mx.ones(s.shape, dtype=mx.float32), mx.zeros(s.shape, dtype=mx.float32)
    codes = mx.dequantize(to_mx(wq), ones, zeros, group_size=group_size, bits=bits)
    np.testing.assert_array_equal(quant.unpack(wq, bits).numpy(), np.array(codes))
    out = quant.dequantize(wq, s, b, group_size, bits)
    mout = mx.dequantize(to_mx(wq), to_mx(s), to_mx(b), group_size=group_size, bits=bits)
    np.testing.assert_array_equal(float_bits(out), mx_float_bits(mout))


@needs_mlx
def test_three_dim_weights_match_mlx():
    w = torch.randn(2, 3, 384, generator=torch.Generator().manual_seed(1)).to(torch.float16)
    for bits in BITS:
        wq, s, b = quant.quantize(w, 128, bits)
        mwq, ms, mb = mx.quantize(to_mx(w), group_size=128, bits=bits)
        np.testing.assert_array_equal(wq.numpy(), np.array(mwq))
        np.testing.assert_array_equal(float_bits(s), mx_float_bits(ms))
        np.testing.assert_array_equal(float_bits(b), mx_float_bits(mb))
