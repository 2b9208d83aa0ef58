"""Integer arithmetic wraps at the value's own width, as torch computes it on the CPU.

MSL (like C++) promotes char/short operands to int, so `uchar - uchar` is an int that can be
negative or above 255; the kernel must convert every narrow result back to its type (torch's
uint8 arithmetic wraps at 8 bits). Signed 32-bit overflow is undefined in C++/MSL, so the
generated code does it in unsigned arithmetic. Shifts by the width or more, and INT_MIN // -1,
follow torch too. Expected values come from torch on the CPU (uint16 through int64 arithmetic
masked to 16 bits, since torch's CPU kernels do not implement uint16 arithmetic).
"""
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import metalforge as mf
from metalforge.frontend.errors import TraceError

WIDTH = {torch.uint8: 8, torch.int8: 8, torch.int16: 16, torch.uint16: 16, torch.int32: 32}
DTYPES = list(WIDTH)


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)


@mf.kernel
def int_arith(a: "T[N]", b: "T[N]", s: "T[N]"):
    # every output is converted to f32 (exact for these magnitudes, and rounded the same way as
    # torch's conversion for i32), so an unwrapped intermediate cannot hide behind the store
    f = mf.f32
    return ((a + b).to(f), (a - b).to(f), (a * b).to(f), (-a).to(f), (~a).to(f),
            ((a + b) >> 1).to(f), (a << s).to(f), (a >> s).to(f), (a // b).to(f),
            (a % b).to(f), (a ** 3).to(f), (a + b) > a, mf.abs(a).to(f),
            # Python-int operands of helpers that are templates over one type (a literal is an
            # int in MSL, not a char)
            (a // 7).to(f), mf.maximum(a, 5).to(f), (a ** (b & 7)).to(f), (a << 3).to(f))


@mf.kernel
def int_reduce(a: "T[R, D]", b: "T[R, D]"):
    d = a - mf.max(a, axis="D")                      # <= 0 in ints; wraps in unsigned types
    return (d.to(mf.f32), mf.max(a + b, axis="D").to(mf.f32),
            mf.argmax(a * b, axis="D"), mf.min(a - b, axis="D").to(mf.f32))


@mf.kernel
def int_column(a: "T[R, D]", b: "T[R, D]"):
    return mf.max(a * b, axis="R").to(mf.f32), mf.argmin(a + b, axis="R")


def wrap(t: torch.Tensor, dtype) -> torch.Tensor:
    """An int64 tensor reduced to `dtype`'s range (two's complement), as int64."""
    w = WIDTH[dtype]
    t = t & ((1 << w) - 1)
    if dtype.is_signed:
        t = torch.where(t >= 1 << (w - 1), t - (1 << w), t)
    return t


def draw(shape, dtype) -> torch.Tensor:
    """Values over the whole range of `dtype` (sums and products overflow), as int64."""
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max + 1, shape, dtype=torch.int64)


def ipow(a, e):
    """a ** e for int64 tensors, by repeated multiplication (e >= 0)."""
    r = torch.ones_like(a)
    for k in range(int(e.max()) + 1):
        r = torch.where(e > k, r * a, r)
    return r


def torch_ops(a, b, s, dtype):
    """What torch computes for int_arith, with torch's own dtype arithmetic where it exists."""
    if dtype == torch.uint16:                 # no CPU kernels for uint16: int64, then wrapped
        w = WIDTH[dtype]

        def sh(x, n, left):
            r = (x << n) if left else (x >> n)
            return torch.where((n < 0) | (n >= w), torch.zeros_like(x), wrap(r, dtype))
        return [wrap(a + b, dtype), wrap(a - b, dtype), wrap(a * b, dtype), wrap(-a, dtype),
                wrap(~a, dtype), wrap(a + b, dtype) >> 1, sh(a, s, True), sh(a, s, False),
                a // b, a % b, wrap(a * a * a, dtype), wrap(a + b, dtype) > a, a,
                a // 7, a.clamp(min=5), wrap(ipow(a, b & 7), dtype), wrap(a << 3, dtype)]
    a, b, s = a.to(dtype), b.to(dtype), s.to(dtype)
    return [a + b, a - b, a * b, -a, ~a, (a + b) >> 1, a << s, a >> s, a // b,
            torch.remainder(a, b), a ** 3, (a + b) > a, a.abs(), a // 7,
            torch.clamp(a, min=5),
            a ** (b & 7), a << 3]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_elementwise_integer_arithmetic_wraps_like_torch(dtype):
    n = 300
    a, b = draw((n,), dtype), draw((n,), dtype)
    b[b == 0] = 1                                      # torch raises on integer division by 0
    info = torch.iinfo(dtype)
    if dtype.is_signed:                                # min // -1 == min, as in torch
        a[:4] = torch.tensor([info.min, info.max, info.min, -1])
        b[:4] = torch.tensor([-1, info.max, info.min, info.min])
    else:
        a[:4] = torch.tensor([info.max, info.max, 0, 1])
        b[:4] = torch.tensor([info.max, 2, 1, info.max])
    s = torch.randint(0, WIDTH[dtype] + 8, (n,))       # shifts past the width give 0 / -1
    s = torch.clamp(s, max=info.max)
    want = torch_ops(a, b, s, dtype)
    got = int_arith(a.to(dtype), b.to(dtype), s.to(dtype))
    names = ["a+b", "a-b", "a*b", "-a", "~a", "(a+b)>>1", "a<<s", "a>>s", "a//b", "a%b",
             "a**3", "(a+b)>a", "abs(a)", "a//7", "maximum(a,5)", "a**(b&7)", "a<<3"]
    for name, g, w in zip(names, got, want):
        w = w.to(g.dtype)
        bad = (g != w).nonzero()
        assert bad.numel() == 0, (f"{name} at {dtype}: element {bad[0].item()}: got "
                                  f"{g[bad[0]].item()}, torch {w[bad[0]].item()} "
                                  f"(a={a[bad[0]].item()}, b={b[bad[0]].item()}, "
                                  f"s={s[bad[0]].item()})")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_integer_reductions_of_wrapped_values(dtype):
    for r, d in ((3, 7), (2, 100), (2, 5000)):            # simd, group, looped row variants
        a, b = draw((r, d), dtype), draw((r, d), dtype)
        got = int_reduce(a.to(dtype), b.to(dtype))
        m = a.amax(-1, keepdim=True)
        want = [wrap(a - m, dtype), wrap(a + b, dtype).amax(-1),
                wrap(a * b, dtype).argmax(-1), wrap(a - b, dtype).amin(-1)]
        for g, w in zip(got, want):
            assert torch.equal(g, w.to(g.dtype)), (dtype, r, d)
    for rows in (5, 700):                                  # column; split
        a, b = draw((rows, 40), dtype), draw((rows, 40), dtype)
        mx, am = int_column(a.to(dtype), b.to(dtype))
        assert torch.equal(mx, wrap(a * b, dtype).amax(0).float())
        assert torch.equal(am, wrap(a + b, dtype).argmin(0))


def test_generated_code_has_no_signed_overflow():
    """Signed overflow is undefined in MSL as in C++; the simulator compiles with -fwrapv (Metal
    GPUs wrap), which would hide it. Built with -ftrapv instead, any signed int overflow left in
    the generated code (i32 a + b, u16 * u16 promoted to int, ...) aborts: run in a subprocess."""
    code = textwrap.dedent("""
        import sys, torch
        sys.path.insert(0, "tests/dsl")
        from metalforge.sim import compiler
        compiler.COMMON_FLAGS = ["-ftrapv" if f == "-fwrapv" else f for f in compiler.COMMON_FLAGS]
        import metalforge as mf
        import test_integer_wrap as T
        strict = mf.kernel(name="int_arith_trapv")(T.int_arith.fn)
        torch.manual_seed(1)
        for dt in (torch.int32, torch.uint16, torch.int16):
            a, b = T.draw((200,), dt), T.draw((200,), dt)
            b[b == 0] = 1
            s = torch.randint(0, T.WIDTH[dt], (200,))
            for g, w in zip(strict(a.to(dt), b.to(dt), s.to(dt)), T.torch_ops(a, b, s, dt)):
                assert torch.equal(g, w.to(g.dtype)), dt
        print("no overflow")
    """)
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0 and "no overflow" in r.stdout, (r.returncode, r.stderr[-3000:])


def test_u8_log_softmax_is_refused_and_logsumexp_converts_like_torch():
    @mf.kernel
    def lsm(x: "u8[R, D]"):
        return mf.log_softmax(x, axis="D")

    @mf.kernel
    def sm(x: "i32[R, D]"):
        return mf.softmax(x, axis="D")

    @mf.kernel
    def lse(x: "T[R, D]"):
        return mf.logsumexp(x, axis="D")

    x = torch.randint(0, 256, (3, 40), dtype=torch.uint8)
    with pytest.raises(NotImplementedError):
        torch.log_softmax(x, -1)                     # torch refuses integer softmax ...
    with pytest.raises(TraceError, match=r"test_integer_wrap\.py:\d+.*mf\.log_softmax.*u8.*"
                                         r"x\.to\(mf\.f32\)"):
        lsm(x)                                       # ... and so does the tracer, at the line
    with pytest.raises(TraceError, match=r"mf\.softmax.*i32"):
        sm(x.to(torch.int32))
    for dt in (torch.uint8, torch.int8, torch.int16, torch.int32):
        xi = x.to(dt)                                # int8: 128..255 wrap to negatives
        want = torch.logsumexp(xi, -1)               # torch: converts to its default float
        got = lse(xi)
        assert got.dtype == want.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6)
