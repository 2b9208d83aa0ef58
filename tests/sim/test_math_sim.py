"""Every DSL math function against torch, through the simulator, for f32/f16/bf16.

All float functions live in one kernel (one output each), so each dtype costs one compile; the
integer operations share a second kernel. Inputs include NaN and ±inf where the size allows.
"""
import pytest
import torch

import metalforge as mf
from metalforge import sim
from metalforge.codegen.msl import HELPERS

SIZES = (1, 31, 33, 1000, 4099)
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-6), torch.float16: dict(rtol=1e-3, atol=1e-3),
       torch.bfloat16: dict(rtol=1e-2, atol=1e-2)}


@mf.kernel
def float_math(x: "T[N]", y: "T[N]", p: "T[N]"):
    return (mf.exp(x), mf.exp2(x), mf.log(p), mf.log2(p), mf.sqrt(p), mf.rsqrt(p), mf.sin(x),
            mf.cos(x), mf.tanh(x), mf.sigmoid(x), mf.erf(x), mf.abs(x), mf.floor(x * 3),
            mf.ceil(x * 3), -x, mf.maximum(x, y), mf.minimum(x, y), mf.clamp(x, -1.0, 1.0),
            mf.where(x > y, x, y), x + y, x - y, x * y, x / y, p ** y, x ** 3,
            (x * 4).to(mf.i32).to(x.dtype))


def float_math_torch(x, y, p):
    f = lambda t: t.float()                                      # noqa: E731  (math in f32)
    x, y, p = f(x), f(y), f(p)
    return (torch.exp(x), torch.exp2(x), torch.log(p), torch.log2(p), torch.sqrt(p),
            torch.rsqrt(p), torch.sin(x), torch.cos(x), torch.tanh(x), torch.sigmoid(x),
            torch.erf(x), torch.abs(x), torch.floor(x * 3), torch.ceil(x * 3), -x,
            torch.maximum(x, y), torch.minimum(x, y), torch.clamp(x, -1.0, 1.0),
            torch.where(x > y, x, y), x + y, x - y, x * y, x / y, p ** y, x ** 3,
            (x * 4).to(torch.int32).float())


def inputs(n, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = (torch.rand(n, generator=g) * 8 - 4).to(dtype)
    y = (torch.rand(n, generator=g) * 6 - 3).to(dtype)
    y = torch.where(y.abs() < 0.05, torch.full_like(y, 0.5), y)
    p = (torch.rand(n, generator=g) * 10 + 0.01).to(dtype)
    if n >= 33:                       # special values where there is room
        x[:4] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0])
        y[4:6] = torch.tensor([float("nan"), -float("inf")])
    return x, y, p


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_float_math(dtype):
    names = ("exp exp2 log log2 sqrt rsqrt sin cos tanh sigmoid erf abs floor ceil neg maximum "
             "minimum clamp where add sub mul div pow cube to_int").split()
    for n in SIZES:
        x, y, p = inputs(n, dtype, seed=n)
        got = float_math(x, y, p)
        want = float_math_torch(x, y, p)
        assert len(got) == len(want) == len(names)
        for name, g, w in zip(names, got, want):
            assert g.dtype == dtype, name
            if name == "to_int":         # float → int of ±inf/NaN is undefined in C++ and torch
                g, w = g[4:], w[4:]
            ok = torch.isclose(g.float(), w.to(dtype).float(), equal_nan=True, **TOL[dtype])
            assert ok.all(), (f"{name} n={n} {dtype}: first bad at {(~ok).nonzero()[0].item()}: "
                              f"got {g[~ok][:4].tolist()} want {w.to(dtype)[~ok][:4].tolist()}")


@mf.kernel
def int_math(a: "i32[N]", b: "i32[N]"):
    return (a // b, a % b, a & b, a | b, a ^ b, a << 2, a >> 1, ~a, mf.abs(a), mf.maximum(a, b),
            mf.minimum(a, b), a * b, a - b, a + 7, a == b, a < b, mf.where(a > 0, a, b))


def test_int_math():
    for n in (1, 33, 1000):
        g = torch.Generator().manual_seed(n)
        a = torch.randint(-1000, 1000, (n,), generator=g, dtype=torch.int32)
        b = torch.randint(1, 50, (n,), generator=g, dtype=torch.int32)
        b = torch.where(torch.rand(n, generator=g) < 0.5, -b, b)
        got = int_math(a, b)
        want = (torch.div(a, b, rounding_mode="floor"), torch.remainder(a, b), a & b, a | b,
                a ^ b, a << 2, a >> 1, ~a, a.abs(), torch.maximum(a, b), torch.minimum(a, b),
                a * b, a - b, a + 7, a == b, a < b, torch.where(a > 0, a, b))
        for i, (x, w) in enumerate(zip(got, want)):
            assert x.dtype == w.dtype, i
            assert torch.equal(x, w), (i, n)



LONG_DIV = """#include <metal_stdlib>
using namespace metal;
%s
%s
kernel void long_div(device const long* a [[buffer(0)]], device const long* b [[buffer(1)]],
                     device long* q [[buffer(2)]], device long* r [[buffer(3)]],
                     uint i [[thread_position_in_grid]]) {
    q[i] = mf_floordiv(a[i], b[i]);
    r[i] = mf_remainder(a[i], b[i]);
}
""" % (HELPERS["mf_floordiv"], HELPERS["mf_remainder"])


def test_int64_division_on_both_sides_of_32_bits():
    """The helpers' 64-bit floor division and remainder (index arithmetic is 64-bit) at and
    around the edges of 32 and 64 bits give torch's answers."""
    edge = [0, 1, 7, 2 ** 31 - 1, 2 ** 31, 2 ** 32 + 5, 2 ** 62, 2 ** 63 - 1]
    vals = torch.tensor(edge + [-v for v in edge] + [-2 ** 63], dtype=torch.int64)
    a = vals.repeat_interleave(len(vals))
    b = vals.repeat(len(vals))
    keep = (b != 0) & ~((a == -2 ** 63) & (b == -1))      # min // -1: wraps, checked elsewhere
    a, b = a[keep].contiguous(), b[keep].contiguous()
    q, r = torch.empty_like(a), torch.empty_like(a)
    sim.compile_shader(LONG_DIV).long_div(a, b, q, r, threads=a.numel())
    assert torch.equal(q, torch.div(a, b, rounding_mode="floor"))
    assert torch.equal(r, torch.remainder(a, b))


@mf.kernel
def divide(x: "T[N]", y: "T[N]"):
    return x / y, mf.sigmoid(x)


def test_division_keeps_ieee_quotients_at_the_edges():
    """x / y is `mf_divide` (fast::divide with the divisor scaled into its stated range): zero,
    subnormal, huge and infinite divisors still give IEEE's quotients; sigmoid's fast division
    keeps its limits and NaN."""
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([1.0, 0.0, -1.0, 1e-30, 3e38, 1.0, inf, inf, nan, 1.0, 5.0, 1e38, -7.0,
                      -100.0, 100.0, -inf, inf, nan, 2.5, -3.0])
    y = torch.tensor([0.0, 0.0, -0.0, 1e-39, 1e-39, inf, inf, 2.0, 1.0, nan, 3e38, 2e38, 1e-45,
                      1.0, 1.0, 1.0, 1.0, 1.0, 0.5, 3.0])
    q, s = divide(x, y)
    torch.testing.assert_close(q, x / y, equal_nan=True, rtol=3e-7, atol=0)
    torch.testing.assert_close(s, torch.sigmoid(x), equal_nan=True, rtol=3e-7, atol=1e-38)
