"""The simulator's Metal type and math library (metalforge/sim/include), checked against torch.

One C++ probe program is compiled against <metal_stdlib> (with the system compiler, as the
simulator does) and run in several modes: float -> half/bfloat rounding of many bit patterns,
16-bit -> float, the math library at f32/f16/bf16, and a set of vector / as_type /
numeric_limits / integer / atomic checks that print name=value lines.
"""

import math
import os
import shutil
import struct
import subprocess

import numpy as np
import pytest
import torch

INCLUDE = os.path.join(os.path.dirname(__file__), "..", "..", "metalforge", "sim", "include")

PROBE = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>
#include <thread>
typedef std::thread host_thread;  // `thread` is an address-space keyword below
#include <metal_stdlib>
using namespace metal;

static std::vector<char> slurp(const char* path) {
  FILE* f = fopen(path, "rb");
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  std::vector<char> b(n);
  if (n && fread(b.data(), 1, n, f) != size_t(n)) abort();
  fclose(f);
  return b;
}
static void dump(FILE* f, const void* p, size_t n) { fwrite(p, 1, n, f); }

// ---- mode cvt: float32 bits -> half bits, bfloat bits ----
static void cvt(const char* in, const char* out) {
  auto b = slurp(in);
  size_t n = b.size() / 4;
  const float* x = reinterpret_cast<const float*>(b.data());
  std::vector<uint16_t> h(n), bf(n);
  for (size_t i = 0; i < n; ++i) {
    half hv = x[i];            // implicit float -> half
    bfloat bv = bfloat(x[i]);  // explicit float -> bfloat
    h[i] = as_type<ushort>(hv);
    bf[i] = as_type<ushort>(bv);
  }
  FILE* f = fopen(out, "wb");
  dump(f, h.data(), 2 * n);
  dump(f, bf.data(), 2 * n);
  fclose(f);
}

// ---- mode h2f: every 16-bit pattern -> float, as half and as bfloat ----
static void h2f(const char* out) {
  std::vector<float> a(65536), b(65536);
  for (uint i = 0; i < 65536; ++i) {
    a[i] = float(as_type<half>(ushort(i)));
    b[i] = as_type<bfloat>(ushort(i));
  }
  FILE* f = fopen(out, "wb");
  dump(f, a.data(), 4 * 65536);
  dump(f, b.data(), 4 * 65536);
  fclose(f);
}

// ---- mode math: unary and binary functions at float, half, bfloat ----
#define UNARY(M) M(abs) M(fabs) M(exp) M(exp2) M(exp10) M(log) M(log2) M(log10) M(sqrt) \
  M(rsqrt) M(sin) M(cos) M(tan) M(asin) M(acos) M(atan) M(sinh) M(cosh) M(tanh) M(asinh) \
  M(acosh) M(atanh) M(floor) M(ceil) M(round) M(rint) M(trunc) M(fract) M(sign) M(saturate) \
  M(sinpi) M(cospi) M(precise::exp) M(fast::exp) M(precise::sqrt) M(precise::rsqrt)
#define BINARY(M) M(pow) M(powr) M(atan2) M(fmod) M(fmin) M(fmax) M(min) M(max) M(copysign) \
  M(step)
template <class T> static void run_math(const float* x, const float* y, size_t n, FILE* f) {
  std::vector<float> r(n);
#define U(fn) for (size_t i = 0; i < n; ++i) r[i] = float(fn(T(x[i]))); dump(f, r.data(), 4 * n);
#define B(fn) for (size_t i = 0; i < n; ++i) r[i] = float(fn(T(x[i]), T(y[i]))); \
              dump(f, r.data(), 4 * n);
  UNARY(U)
  BINARY(B)
  // ternary: fma, clamp, mix; vectors: the float4 forms must equal the scalar ones
  for (size_t i = 0; i < n; ++i) r[i] = float(fma(T(x[i]), T(y[i]), T(x[i])));
  dump(f, r.data(), 4 * n);
  for (size_t i = 0; i < n; ++i) r[i] = float(clamp(T(x[i]), T(-1.0f), T(1.0f)));
  dump(f, r.data(), 4 * n);
  for (size_t i = 0; i < n; ++i) r[i] = float(mix(T(x[i]), T(y[i]), T(0.25f)));
  dump(f, r.data(), 4 * n);
  for (size_t i = 0; i + 4 <= n; i += 4) {
    vec<T, 4> v{T(x[i]), T(x[i + 1]), T(x[i + 2]), T(x[i + 3])};
    vec<T, 4> e = exp(v), s = sqrt(fabs(v)), m = fmax(v, T(0.5f));
    auto same = [](T a, T b) { return float(a) == float(b) || (isnan(a) && isnan(b)); };
    for (int k = 0; k < 4; ++k)
      r[i + k] = same(e[k], exp(v[k])) && same(s[k], sqrt(fabs(v[k]))) &&
                 same(m[k], fmax(v[k], T(0.5f))) ? 1.0f : 0.0f;
  }
  for (size_t i = n / 4 * 4; i < n; ++i) r[i] = 1.0f;
  dump(f, r.data(), 4 * n);
  // arithmetic in T: x + y, x * y, x / y, x - y (half and bfloat round once)
  for (size_t i = 0; i < n; ++i) r[i] = float(T(x[i]) + T(y[i]));
  dump(f, r.data(), 4 * n);
  for (size_t i = 0; i < n; ++i) r[i] = float(T(x[i]) * T(y[i]));
  dump(f, r.data(), 4 * n);
  for (size_t i = 0; i < n; ++i) r[i] = float(T(x[i]) / T(y[i]));
  dump(f, r.data(), 4 * n);
  for (size_t i = 0; i < n; ++i) r[i] = float(T(x[i]) - T(y[i]));
  dump(f, r.data(), 4 * n);
#undef U
#undef B
}
static void math(const char* in, const char* out) {
  auto b = slurp(in);
  size_t n = b.size() / 8;
  const float* x = reinterpret_cast<const float*>(b.data());
  FILE* f = fopen(out, "wb");
  run_math<float>(x, x + n, n, f);
  run_math<half>(x, x + n, n, f);
  run_math<bfloat>(x, x + n, n, f);
  fclose(f);
}

// ---- mode misc: name=value checks ----
#define P(name, fmt, ...) printf("%s=" fmt "\n", name, __VA_ARGS__)
static void misc() {
  // vectors: construction, members, swizzles, operators
  uint3 gid(1, 2, 3);
  float4 a = float4(1.0f);
  float4 b(float2(1, 2), float2(3, 4));
  float4 c = 2.0f * (b + a) - 1;
  P("c", "%g,%g,%g,%g", c.x, c.y, c.z, c.w);
  b.zw = float2(9, 10);
  b.x = 7;
  b.xy += 1;
  P("b", "%g,%g,%g,%g", b[0], b[1], b[2], b[3]);
  float2 yx = b.yx;
  float3 zyx = b.zyx;
  P("swz", "%g,%g,%g,%g,%g", yx.x, yx.y, zyx.x, zyx.y, zyx.z);
  P("swz_expr", "%g", (b.xy + b.zw).y);
  P("rgba", "%g,%g", b.r, b.a);
  bool4 lt = a < b;
  P("cmp", "%d,%d,%d,%d,%d", lt.x, lt.y, lt.z, lt.w, int(all(b > 0.0f)) + 2 * int(any(b < 0.0f)));
  ushort3 us = ushort3(gid);
  P("ushort3", "%u,%u,%u", us.x, us.y, us.z);
  half4 h4 = half4(float4(1.0f, 2.5f, 65504.0f, 1e6f));
  float4 back = float4(h4);
  P("half4", "%g,%g,%g,%g", back.x, back.y, back.z, back.w);
  int4 i4 = (int4(1, 2, 3, 4) << 2) ^ 5;
  i4 = -(~i4 & 0xff);
  P("int4", "%d,%d,%d,%d", i4.x, i4.y, i4.z, i4.w);
  uint4 u4 = uint4(7, 8, 9, 10) % 4u;
  P("uint4mod", "%u,%u,%u,%u", u4.x, u4.y, u4.z, u4.w);
  char2 c2 = char2(char(100), char(-100)) + char2(char(100), char(-100));  // wraps like 8-bit
  P("char2", "%d,%d", int(c2.x), int(c2.y));
  float3 f3(1, 2, 3), g3(4, 5, 6);
  float3 cr = cross(f3, g3);
  P("cross", "%g,%g,%g", cr.x, cr.y, cr.z);
  P("dot", "%g", dot(f3, g3));
  P("length", "%.9g", length(float2(3, 4)));
  float2 nrm = normalize(float2(3, 4));
  P("normalize", "%.9g,%.9g", nrm.x, nrm.y);
  P("distance", "%.9g", distance(float2(1, 1), float2(4, 5)));
  float4 sel = select(float4(1, 2, 3, 4), float4(5, 6, 7, 8), bool4(true, false, true, false));
  P("select", "%g,%g,%g,%g", sel.x, sel.y, sel.z, sel.w);
  P("select_s", "%g", select(1.0f, 2.0f, true));
  P("sizes", "%d,%d,%d,%d,%d,%d,%d", int(sizeof(float3)), int(alignof(float3)), int(sizeof(half3)),
    int(sizeof(packed_float3)), int(alignof(packed_float4)), int(sizeof(bool4)),
    int(sizeof(long3)));
  packed_half4 ph = packed_half4(half4(1.0f, 2.0f, 3.0f, 4.0f));
  half4 hv = ph;
  hv = hv + ph;
  P("packed", "%g,%g", float(hv.x), float(hv.w));
  array<float, 3> arr{1.0f, 2.0f, 3.0f};
  float acc = 0;
  for (float v : arr) acc += v;
  P("array", "%g,%d", acc, int(arr.size()));
  // half arithmetic result types and rounding
  half h = 0.1f;
  auto hh = h + h;
  auto hf = h + 1.0f;
  auto hi = h * 3;
  P("types", "%d,%d,%d", int(is_same_v<decltype(hh), half>), int(is_same_v<decltype(hf), float>),
    int(is_same_v<decltype(hi), half>));
  half t = true ? h : 0;
  P("ternary", "%d", int(is_same_v<decltype(true ? h : 0), half>) + 2 * int(float(t) == float(h)));
  half acc_h = 0;
  for (int i = 0; i < 4096; ++i) acc_h += half(1.0f);  // stalls at 2048 in half
  P("half_acc", "%g", float(acc_h));
  // as_type
  P("as_type", "%08x,%08x,%d", as_type<uint>(1.0f), as_type<uint>(half2(1.0f, -2.0f)),
    as_type<int2>(-3L).y);
  P("as_type_f", "%.9g", as_type<float>(0x40490fdbu));
  // traits
  P("traits", "%d%d%d%d%d%d%d%d%d%d", int(is_floating_point_v<half>),
    int(is_floating_point_v<bfloat4>),
    int(is_integral_v<uint3>), int(is_signed_v<half>), int(is_unsigned_v<ushort>),
    int(is_scalar_v<float>), int(is_scalar_v<float2>), int(is_vector_v<int4>),
    int(is_same_v<make_unsigned_t<int>, uint>), int(vec_elements<float3>::value));
  P("traits2", "%d%d%d", int(is_same_v<make_signed_t<uint4>, int4>),
    int(is_same_v<conditional_t<true, half, float>, half>),
    int(is_same_v<remove_cv_t<const volatile int>, int>));
  // integer functions
  P("clz", "%d,%d,%d,%d", int(clz(uint(1))), int(clz(uchar(1))), int(clz(0u)), int(clz(ulong(1))));
  P("ctz", "%d,%d,%d", int(ctz(uint(8))), int(ctz(ushort(0))),
    int(ctz(static_cast<ulong>(1ul << 40))));
  P("popcount", "%d,%d", int(popcount(0xffu)), int(popcount(-1)));
  P("reverse_bits", "%08x,%02x", reverse_bits(1u), uint(reverse_bits(uchar(1))));
  P("sat", "%d,%d,%u,%u", int(addsat(char(100), char(100))), int(subsat(char(-100), char(100))),
    addsat(0xfffffff0u, 0x100u), subsat(3u, 5u));
  P("mulhi", "%u,%d", mulhi(0x80000000u, 4u), mulhi(-2, 0x40000000));
  P("rotate", "%08x", rotate(0x80000001u, 1u));
  P("extract", "%d,%u", extract_bits(int(0xf0), 4u, 4u), extract_bits(uint(0xf0), 4u, 4u));
  P("insert", "%08x", insert_bits(0xffffffffu, 0u, 8u, 8u));
  P("minmax_i", "%d,%u,%d", max(-3, 2), min(7u, 9u), clamp(15, 0, 10));
  P("abs_i", "%d,%d", abs(-7), abs(int4(-1, 2, -3, 4)).z);
  P("absdiff", "%u", absdiff(3u, 10u));
  int4 mx = max(int4(1, 5, -2, 0), 2);
  P("max_iv", "%d,%d,%d,%d", mx.x, mx.y, mx.z, mx.w);
  // relational
  P("isnan", "%d%d%d%d", int(isnan(NAN)), int(isnan(half(NAN))), int(isinf(-INFINITY)),
    int(isfinite(1.0f)));
  P("signbit", "%d%d", int(signbit(-0.0f)), int(signbit(1.0f)));
  P("nanprop", "%g,%g,%d", fmax(NAN, 1.0f), min(2.0f, NAN), int(isnan(fmax(NAN, NAN))));
  float sc, sn = sincos(0.5f, sc);
  P("sincos", "%.9g,%.9g", sn, sc);
  P("smoothstep", "%.9g", smoothstep(0.0f, 2.0f, 0.5f));
  P("sign", "%g,%g,%g,%g", sign(-3.0f), sign(2.0f), sign(-0.0f), sign(NAN));
  P("fract", "%.9g,%.9g", fract(-0.25f), fract(-1e-10f));
  // numeric_limits (compared to torch.finfo / iinfo)
  P("lim_f", "%.9g,%.9g,%.9g,%.9g,%.9g", numeric_limits<float>::max(), numeric_limits<float>::min(),
    numeric_limits<float>::lowest(), numeric_limits<float>::epsilon(),
    numeric_limits<float>::denorm_min());
  P("lim_h", "%.9g,%.9g,%.9g,%.9g,%.9g", float(numeric_limits<half>::max()),
    float(numeric_limits<half>::min()), float(numeric_limits<half>::lowest()),
    float(numeric_limits<half>::epsilon()), float(numeric_limits<half>::denorm_min()));
  P("lim_bf", "%.9g,%.9g,%.9g,%.9g,%.9g", float(numeric_limits<bfloat>::max()),
    float(numeric_limits<bfloat>::min()), float(numeric_limits<bfloat>::lowest()),
    float(numeric_limits<bfloat>::epsilon()), float(numeric_limits<bfloat>::denorm_min()));
  P("lim_special", "%d%d%d", int(isinf(numeric_limits<half>::infinity())),
    int(isnan(numeric_limits<bfloat>::quiet_NaN())),
    int(isnan(numeric_limits<float>::quiet_NaN())));
  P("lim_i", "%d,%d,%u,%ld,%ld,%lu,%d,%d,%u", numeric_limits<char>::min(),
    numeric_limits<short>::max(),
    uint(numeric_limits<ushort>::max()), numeric_limits<long>::min(), numeric_limits<long>::max(),
    numeric_limits<ulong>::max(), numeric_limits<int>::lowest(), numeric_limits<int>::max(),
    numeric_limits<uint>::max());
  P("consts", "%.9g,%.9g,%g,%.9g", M_PI_F, M_SQRT2_F, float(HALF_MAX), FLT_MAX);
  // atomics from two OS threads
  static uint ucnt = 0;
  static float fsum = 0;
  static int imax = -1;
  auto* au = reinterpret_cast<device atomic_uint*>(&ucnt);
  auto* af = reinterpret_cast<device atomic_float*>(&fsum);
  auto* ai = reinterpret_cast<device atomic<int>*>(&imax);
  auto work = [&] {
    for (int i = 0; i < 20000; ++i) {
      atomic_fetch_add_explicit(au, 1u, memory_order_relaxed);
      atomic_fetch_add_explicit(af, 0.5f, memory_order_relaxed);
      atomic_fetch_max_explicit(ai, i, memory_order_relaxed);
    }
  };
  host_thread t1(work), t2(work);
  t1.join();
  t2.join();
  uint expected = 1;
  bool swapped = atomic_compare_exchange_weak_explicit(au, &expected, 5u, memory_order_relaxed,
                                                       memory_order_relaxed);
  P("atomics", "%u,%g,%d,%d,%u", atomic_load_explicit(au, memory_order_relaxed),
    atomic_load_explicit(af, memory_order_relaxed), imax, int(swapped), expected);
  atomic_store_explicit(au, 3u, memory_order_relaxed);
  uint prev = atomic_exchange_explicit(au, 9u, memory_order_relaxed);
  atomic_fetch_or_explicit(au, 0x10u, memory_order_relaxed);
  atomic_fetch_and_explicit(au, 0x18u, memory_order_relaxed);
  atomic_fetch_xor_explicit(au, 0x1u, memory_order_relaxed);
  atomic_fetch_sub_explicit(au, 2u, memory_order_relaxed);
  atomic_fetch_min_explicit(ai, 7, memory_order_relaxed);
  P("atomics2", "%u,%u,%d,%d", prev, ucnt, imax, int(sizeof(atomic_bool)));
}

int main(int argc, char** argv) {
  if (!strcmp(argv[1], "cvt")) cvt(argv[2], argv[3]);
  else if (!strcmp(argv[1], "h2f")) h2f(argv[2]);
  else if (!strcmp(argv[1], "math")) math(argv[2], argv[3]);
  else misc();
  return 0;
}
"""

UNARY = ["abs", "fabs", "exp", "exp2", "exp10", "log", "log2", "log10", "sqrt", "rsqrt", "sin",
         "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh",
         "floor", "ceil", "round", "rint", "trunc", "fract", "sign", "saturate", "sinpi", "cospi",
         "precise::exp", "fast::exp", "precise::sqrt", "precise::rsqrt"]
BINARY = ["pow", "powr", "atan2", "fmod", "fmin", "fmax", "min", "max", "copysign", "step"]
EXTRA = ["fma", "clamp", "mix", "vector_forms", "add", "mul", "div", "sub"]


def _torch_ref(name, x, y):
    """Reference in float64 from torch (then rounded by the caller)."""
    pi = math.pi
    unary = {
        "abs": torch.abs, "fabs": torch.abs, "exp": torch.exp, "exp2": torch.exp2,
        "exp10": lambda v: torch.pow(10.0, v), "log": torch.log, "log2": torch.log2,
        "log10": torch.log10, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "sin": torch.sin,
        "cos": torch.cos, "tan": torch.tan, "asin": torch.asin, "acos": torch.acos,
        "atan": torch.atan, "sinh": torch.sinh, "cosh": torch.cosh, "tanh": torch.tanh,
        "asinh": torch.asinh, "acosh": torch.acosh, "atanh": torch.atanh,
        "floor": torch.floor, "ceil": torch.ceil,
        "round": lambda v: torch.sign(v) * torch.floor(torch.abs(v) + 0.5),
        "rint": torch.round, "trunc": torch.trunc,
        "fract": lambda v: torch.where(
            torch.isinf(v), torch.zeros_like(v),
            torch.clamp(v - torch.floor(v), max=float.fromhex("0x1.fffffep-1"))),
        "sign": lambda v: torch.where(torch.isnan(v), torch.zeros_like(v), torch.sign(v)),
        # MSL clamp/saturate are fmin(fmax(x, lo), hi): NaN -> lo
        "saturate": lambda v: torch.clamp(torch.nan_to_num(v, nan=0.0), 0.0, 1.0),
        "sinpi": lambda v: torch.sin(pi * v), "cospi": lambda v: torch.cos(pi * v),
        "precise::exp": torch.exp, "fast::exp": torch.exp, "precise::sqrt": torch.sqrt,
        "precise::rsqrt": torch.rsqrt,
    }
    if name in unary:
        return unary[name](x)
    binary = {
        "pow": torch.pow, "powr": torch.pow, "atan2": torch.atan2, "fmod": torch.fmod,
        "fmin": torch.fmin, "fmax": torch.fmax, "min": torch.fmin, "max": torch.fmax,
        "copysign": torch.copysign,
        "step": lambda e, v: torch.where(v < e, torch.zeros_like(v), torch.ones_like(v)),
        "fma": lambda a, b: a * b + a,
        "clamp": lambda a, b: torch.clamp(torch.nan_to_num(a, nan=-1.0), -1.0, 1.0),
        "mix": lambda a, b: a + (b - a) * 0.25,
        "add": torch.add, "mul": torch.mul, "div": torch.div, "sub": torch.sub,
    }
    return binary[name](x, y)


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    cxx = os.environ.get("CXX") or shutil.which("c++") or "g++"
    d = tmp_path_factory.mktemp("sim_types")
    src = d / "probe.cpp"
    src.write_text(PROBE)
    exe = d / "probe"
    cmd = [cxx, "-std=c++17", "-O1", "-pthread", "-I", INCLUDE, str(src), "-o", str(exe)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-4000:]

    def run(*args):
        out = subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        return out.stdout

    run.dir = d
    return run


def _bits_to_f32(bits):
    return torch.from_numpy(np.asarray(bits, dtype=np.uint32).view(np.float32).copy())


def test_float_to_half_and_bfloat_rounding_matches_torch(probe):
    rng = np.random.default_rng(0)
    # Every sign/exponent/top-mantissa pattern with several low halves (ties, just above and
    # below ties, zero, all ones), plus random patterns: covers subnormals, overflow to inf,
    # NaNs with payloads, and the rounding boundaries of both formats.
    hi = np.arange(1 << 16, dtype=np.uint32) << 16
    lows = np.array([0, 1, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x2000, 0x7fff, 0x8000, 0x8001,
                     0xffff], dtype=np.uint32)
    bits = np.concatenate([(hi[:, None] | lows[None, :]).ravel(),
                           rng.integers(0, 1 << 32, 200_000, dtype=np.uint64).astype(np.uint32)])
    x = _bits_to_f32(bits)
    inp = probe.dir / "cvt.in"
    out = probe.dir / "cvt.out"
    x.numpy().tofile(inp)
    probe("cvt", inp, out)
    res = np.fromfile(out, dtype=np.uint16)
    n = len(bits)
    got_h, got_bf = res[:n], res[n:]
    want_h = x.to(torch.float16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(got_h, want_h)  # bit-exact, NaNs included
    want_bf = x.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    is_nan = np.isnan(x.numpy())
    np.testing.assert_array_equal(got_bf[~is_nan], want_bf[~is_nan])
    # torch's own NaN result depends on its code path; ours must be a NaN of the same sign.
    nan_bf = got_bf[is_nan]
    assert np.all((nan_bf & 0x7f80) == 0x7f80) and np.all((nan_bf & 0x7f) != 0)
    assert np.array_equal(nan_bf >> 15, (bits[is_nan] >> 31).astype(np.uint16))


def test_half_and_bfloat_to_float_is_exact(probe):
    out = probe.dir / "h2f.out"
    probe("h2f", out)
    res = np.fromfile(out, dtype=np.float32)
    pat = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16)
    want_h = pat.view(torch.float16).float().numpy()
    want_bf = pat.view(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(res[: 1 << 16].view(np.uint32)[~np.isnan(want_h)],
                                  want_h.view(np.uint32)[~np.isnan(want_h)])
    assert np.all(np.isnan(res[: 1 << 16][np.isnan(want_h)]))
    np.testing.assert_array_equal(res[1 << 16:].view(np.uint32), want_bf.view(np.uint32))


def test_math_functions_match_torch_at_f32_f16_bf16(probe):
    rng = np.random.default_rng(1)
    specials = np.array([0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, 2.5, -2.5, 3.0, 1e-3, 0.999,
                         np.inf, -np.inf, np.nan, 100.0, -100.0, 1e-40, 7.25, -7.75],
                        dtype=np.float32)
    xs = np.concatenate([specials, rng.uniform(-4, 4, 1500).astype(np.float32),
                         rng.standard_normal(500).astype(np.float32) * 30]).astype(np.float32)
    ys = np.roll(xs, 7)[::-1].copy()
    ys[ys == 0] = 0.75
    inp = probe.dir / "math.in"
    out = probe.dir / "math.out"
    np.concatenate([xs, ys]).tofile(inp)
    probe("math", inp, out)
    n = len(xs)
    names = UNARY + BINARY + EXTRA
    res = np.fromfile(out, dtype=np.float32).reshape(3, len(names), n)
    failures = []
    for ti, dt in enumerate([torch.float32, torch.float16, torch.bfloat16]):
        # Inputs as the kernel sees them: rounded to the dtype.
        x = torch.from_numpy(xs).to(dt).double()
        y = torch.from_numpy(ys).to(dt).double()
        for fi, name in enumerate(names):
            got = torch.from_numpy(res[ti, fi]).double()
            if name == "vector_forms":
                if not torch.all(got == 1.0):
                    failures.append(f"{dt} vector forms differ from scalar forms")
                continue
            with np.errstate(all="ignore"):
                want = _torch_ref(name, x, y).to(dt).double()
            # Results are rounded to the dtype: allow 2 ulp of the dtype (f32: libm vs
            # float64 reference rounding; f16/bf16: one rounding of the float result, and
            # the sensitivity of sin/tan/... near large arguments is excluded below).
            eps = {torch.float32: 2.0**-23, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}[dt]
            tol = 2 * eps * want.abs() + (1e-37 if dt != torch.float16 else 2.0**-24)
            exact = name in ("abs", "fabs", "floor", "ceil", "round", "rint", "trunc", "sign",
                             "saturate", "fmin", "fmax", "min", "max", "copysign", "step",
                             "clamp", "add", "mul", "div", "sub", "fmod")
            if exact:
                tol = torch.zeros_like(want)
            ok = (got == want) | ((got - want).abs() <= tol) | (got.isnan() & want.isnan())
            if name in ("sin", "cos", "tan", "sinpi", "cospi", "tan", "pow", "powr", "exp10",
                        "sinh", "cosh", "exp", "exp2", "precise::exp", "fast::exp", "fma", "mix"):
                # large arguments amplify the input rounding; compare where well conditioned
                ok |= x.abs() > 50
            if name in ("mix", "fma"):  # cancellation: error relative to the operands
                ok |= (got - want).abs() <= 4 * eps * (x.abs() + y.abs() + x.abs() * y.abs())
            if name == "copysign":  # the sign of a NaN is unspecified
                ok |= y.isnan()
            if name in ("pow", "powr"):
                ok |= (y.abs() > 8) | (x.abs() > 8)
            bad = (~ok).nonzero().flatten()
            if len(bad):
                i = int(bad[0])
                failures.append(f"{dt} {name}({float(x[i])!r}, {float(y[i])!r}) = "
                                f"{float(got[i])!r}, "
                                f"torch {float(want[i])!r} ({len(bad)} mismatches)")
    assert not failures, "\n".join(failures)


def _misc(probe):
    out = {}
    for line in probe("misc").splitlines():
        k, v = line.split("=", 1)
        out[k] = v
    return out


def test_vectors_packed_array_and_half_semantics(probe):
    m = _misc(probe)
    assert m["c"] == "3,5,7,9"
    assert m["b"] == "8,3,9,10"
    assert m["swz"] == "3,8,9,3,8"
    assert m["swz_expr"] == "13"
    assert m["rgba"] == "8,10"
    assert m["cmp"] == "1,1,1,1,1"
    assert m["ushort3"] == "1,2,3"
    assert m["half4"] == "1,2.5,65504,inf"
    i4 = [-(~((v << 2) ^ 5) & 0xFF) for v in (1, 2, 3, 4)]
    assert m["int4"] == ",".join(map(str, i4))
    assert m["uint4mod"] == "3,0,1,2"
    assert m["char2"] == "-56,56"
    assert m["cross"] == "-3,6,-3"
    assert m["dot"] == "32"
    assert float(m["length"]) == 5.0
    assert m["normalize"] == "0.600000024,0.800000012"
    assert float(m["distance"]) == 5.0
    assert m["select"] == "5,2,7,4" and m["select_s"] == "2"
    assert m["sizes"] == "16,16,8,12,4,4,32"
    assert m["packed"] == "2,8"
    assert m["array"] == "6,3"
    assert m["types"] == "1,1,1"
    assert m["ternary"] == "3"
    want_acc = torch.zeros((), dtype=torch.float16)
    for _ in range(4096):
        want_acc = want_acc + torch.tensor(1.0, dtype=torch.float16)
    assert float(m["half_acc"]) == float(want_acc) == 2048.0


def test_as_type_traits_limits_and_constants(probe):
    m = _misc(probe)
    h2 = torch.tensor([1.0, -2.0], dtype=torch.float16).view(torch.int32).item() & 0xFFFFFFFF
    assert m["as_type"] == f"3f800000,{h2:08x},-1"
    assert np.float32(m["as_type_f"]) == struct.unpack("<f", struct.pack("<I", 0x40490FDB))[0]
    assert m["traits"] == "1111110113"
    assert m["traits2"] == "111"
    for key, dt in (("lim_f", torch.float32), ("lim_h", torch.float16), ("lim_bf", torch.bfloat16)):
        fi = torch.finfo(dt)
        want = [fi.max, fi.tiny, fi.min, fi.eps, fi.smallest_normal * fi.eps]
        assert [float(v) for v in m[key].split(",")] == pytest.approx(want, rel=1e-6), key
    assert m["lim_special"] == "111"
    ii = torch.iinfo
    want_i = [ii(torch.int8).min, ii(torch.int16).max, 65535, ii(torch.int64).min,
              ii(torch.int64).max, 2**64 - 1, ii(torch.int32).min, ii(torch.int32).max, 2**32 - 1]
    assert [int(v) for v in m["lim_i"].split(",")] == want_i
    c = [np.float32(v) for v in m["consts"].split(",")]
    assert c == [np.float32(math.pi), np.float32(math.sqrt(2)), 65504.0,
                 np.float32(torch.finfo(torch.float32).max)]


def test_integer_relational_and_common_functions(probe):
    m = _misc(probe)
    assert m["clz"] == "31,7,32,63"
    assert m["ctz"] == "3,16,40"
    assert m["popcount"] == "8,32"
    assert m["reverse_bits"] == "80000000,80"
    assert m["sat"] == f"127,-128,{0xFFFFFFFF},0"
    assert m["mulhi"] == f"2,{(-2 * 0x40000000) >> 32}"
    assert m["rotate"] == "00000003"
    assert m["extract"] == "-1,15"
    assert m["insert"] == "ffff00ff"
    assert m["minmax_i"] == "2,7,10"
    assert m["abs_i"] == "7,3"
    assert m["absdiff"] == "7"
    assert m["max_iv"] == "2,5,2,2"
    assert m["isnan"] == "1111"
    assert m["signbit"] == "10"
    assert m["nanprop"] == "1,2,1"  # fmax/min return the non-NaN operand, as IEEE maxNum
    sn, cs = (np.float32(v) for v in m["sincos"].split(","))
    assert sn == np.float32(torch.sin(torch.tensor(0.5)))
    assert cs == np.float32(torch.cos(torch.tensor(0.5)))
    assert float(m["smoothstep"]) == pytest.approx(0.15625)
    assert m["sign"] == "-1,1,-0,0"
    fr = [np.float32(v) for v in m["fract"].split(",")]
    assert fr == [0.75, np.float32(float.fromhex("0x1.fffffep-1"))]


def test_atomics_across_threads(probe):
    m = _misc(probe)
    # 2 threads x 20000: counter, float sum of 0.5s, running max; CAS with a stale
    # expected value fails and reports the current value.
    assert m["atomics"] == "40000,20000,19999,0,40000"
    # store 3; exchange -> 9 (prev 3); |0x10 -> 0x19; &0x18 -> 0x18; ^1 -> 0x19; -2 -> 0x17
    assert m["atomics2"] == f"3,{0x17},7,4"
