"""half/bfloat in the shim's math library (issue #15, item 1).

MSL has no log1p/expm1 (nor erf, lgamma, ...), so the shim has none either; every unary math
function it does have already takes half and bfloat.  What was wrong: a 16-bit float mixed with
integer arguments (`max(h, 0)`, `clamp(h, 0, 1)`, `pow(h, 2)`, `fma(h, 2, 1)`).  On Metal the
integer converts to half as readily as to float, so the half overload is the better match and the
result is a half; in C++ `half` is a class and both overloads needed one user-defined
conversion, so the call was ambiguous.  Also missing: the vector forms of ldexp/frexp/modf/ilogb
and modf/ilogb for bfloat."""
import pytest
import torch

from metalforge.sim import compile_shader

MIXED_INT_SRC = r"""
#include <metal_stdlib>
using namespace metal;
template <typename T>
kernel void mixed(device const T* x [[buffer(0)]], device T* out [[buffer(1)]],
                  uint i [[thread_position_in_grid]]) {
  const uint n = 16;
  T v = x[i];
  // the result type is T itself (no float round trip, no ambiguity)
  static_assert(is_same<decltype(max(v, 0)), T>::value, "max(T, int) is a T");
  static_assert(is_same<decltype(clamp(v, -1, 1)), T>::value, "clamp(T, int, int) is a T");
  static_assert(is_same<decltype(precise::pow(v, 2)), T>::value, "pow(T, int) is a T");
  out[0 * n + i] = max(v, 0);
  out[1 * n + i] = min(1, v);
  out[2 * n + i] = clamp(v, -1, 1);
  out[3 * n + i] = pow(fabs(v), 2);
  out[4 * n + i] = fma(v, 2, 1);
  out[5 * n + i] = fast::fmax(v, 0u);
  out[6 * n + i] = copysign(short(3), v);
  out[7 * n + i] = mix(v, 1, T(0.25f));
  out[8 * n + i] = exp2(v) + log2(fabs(v) + T(1)) + rsqrt(fabs(v) + T(1)) + sign(v) + fract(v);
}
template [[host_name("mixed_half")]] kernel void mixed<half>(
    device const half*, device half*, uint);
template [[host_name("mixed_bfloat")]] kernel void mixed<bfloat>(
    device const bfloat*, device bfloat*, uint);
"""


@pytest.mark.parametrize("dtype,name", [(torch.float16, "mixed_half"),
                                        (torch.bfloat16, "mixed_bfloat")])
def test_16_bit_floats_mixed_with_integers(dtype, name):
    lib = compile_shader(MIXED_INT_SRC)
    x = torch.linspace(-2.5, 2.5, 16).to(dtype)
    out = torch.zeros(9 * 16, dtype=dtype)
    getattr(lib, name)(x, out, threads=16)
    f = x.float()

    def r(t):   # one rounding to the 16-bit type, as the shim computes in float
        return t.to(dtype)
    one = torch.tensor(1.0, dtype=dtype)
    expected = torch.stack([
        r(f.clamp(min=0)), r(f.clamp(max=1)), r(f.clamp(-1, 1)), r(f.abs() ** 2),
        r(f * 2 + 1), r(f.clamp(min=0)), r(torch.copysign(torch.full_like(f, 3.0), f)),
        r(f + (1 - f) * 0.25),
        (((r(torch.exp2(f)) + r(torch.log2(r(f.abs() + one).float())))
          + r(torch.rsqrt(r(f.abs() + one).float()))) + r(torch.sign(f)))
        + r(f - torch.floor(f)),
    ])
    torch.testing.assert_close(out.view(9, 16), expected, rtol=0, atol=0)


VEC_SRC = r"""
#include <metal_stdlib>
using namespace metal;
kernel void vec_fns(device const half4* x [[buffer(0)]], device half4* out [[buffer(1)]],
                    device int4* ints [[buffer(2)]], device const bfloat* b [[buffer(3)]],
                    device bfloat* bout [[buffer(4)]], uint i [[thread_position_in_grid]]) {
  const half4 v = x[i];
  int4 e;
  const half4 m = frexp(v, e);           // v == m * 2^e
  half4 ip;
  const half4 fp = modf(v, ip);
  out[3 * i + 0] = ldexp(m, e);
  out[3 * i + 1] = fp;
  out[3 * i + 2] = ip;
  ints[2 * i + 0] = e;
  ints[2 * i + 1] = ilogb(v);
  bfloat bi;
  bout[2 * i + 0] = modf(b[i], bi);
  bout[2 * i + 1] = bi + bfloat(ilogb(b[i]));
}
"""


def test_vector_ldexp_frexp_modf_ilogb_and_bfloat_modf():
    lib = compile_shader(VEC_SRC)
    x = torch.tensor([[1.5, -3.25, 10.0, 0.75], [-0.375, 6.5, 100.0, -2.0]], dtype=torch.half)
    out = torch.zeros(2, 3, 4, dtype=torch.half)
    ints = torch.zeros(2, 2, 4, dtype=torch.int32)
    b = torch.tensor([2.75, -5.5], dtype=torch.bfloat16)
    bout = torch.zeros(2, 2, dtype=torch.bfloat16)
    lib.vec_fns(x, out, ints, b, bout, threads=2)
    mant, exps = torch.frexp(x.float())
    torch.testing.assert_close(out[:, 0], x, rtol=0, atol=0)
    torch.testing.assert_close(out[:, 1], (x.float() - x.float().trunc()).half(), rtol=0, atol=0)
    torch.testing.assert_close(out[:, 2], x.float().trunc().half(), rtol=0, atol=0)
    torch.testing.assert_close(ints[:, 0], exps, rtol=0, atol=0)
    torch.testing.assert_close(ints[:, 1], exps - 1, rtol=0, atol=0)
    bf = b.float()
    torch.testing.assert_close(bout[:, 0], (bf - bf.trunc()).bfloat16(), rtol=0, atol=0)
    expected = (bf.trunc() + torch.frexp(bf)[1].float() - 1).bfloat16()
    torch.testing.assert_close(bout[:, 1], expected, rtol=0, atol=0)
