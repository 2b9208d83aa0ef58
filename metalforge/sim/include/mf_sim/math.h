// metalforge.sim — the Metal math library: math, common, integer, relational and geometric
// functions in namespace metal, with metal::precise:: and metal::fast:: views.
//
// Every function exists for the scalars it has in MSL (non-template overloads, so mixed calls
// such as max(uint, int) are as ambiguous as in Metal) and element-wise for vectors, swizzles
// and packed vectors (templates; a scalar argument next to a vector is broadcast).
// half and bfloat are computed in float and rounded once to the 16-bit type; a 16-bit float
// mixed with integers (max(h, 0)) is that 16-bit type, as in MSL (detail::f16_int_mix_t).
// Float functions call libm through the compiler builtins: precise:: results equal the C
// library's float functions; fast:: is the same code (allowed: fast only bounds the error).
//
// Not in MSL, hence not here: erf, erfc, lgamma, tgamma, expm1, log1p, cbrt, hypot
// (c10/metal/special_math.h and utils.h implement some of them on top of this library).
#ifndef MF_SIM_MATH_H
#define MF_SIM_MATH_H

#include "types.h"

namespace metal {
namespace detail {

// Result type of an element-wise call whose arguments are scalars and vector-likes: the
// vec<E, N> of the (first) vector-like argument, provided every vector-like argument has the
// same element type E and length N, at least one is present, and E passes Cat.
enum { cat_any, cat_float, cat_int };
template <int Cat, class E>
constexpr bool in_cat = Cat == cat_any || (Cat == cat_float ? is_float_scalar_v<E>
                                                           : std::is_integral<E>::value);
template <class... A> struct first_vec { static constexpr bool value = false; };
template <class A, class... R>
struct first_vec<A, R...> : std::conditional_t<is_veclike_v<A>, vinfo<A>, first_vec<R...>> {};
template <class E, int N, class X>
constexpr bool fits() {
  if constexpr (is_veclike_v<X>)
    return std::is_same<typename vinfo<X>::elem, E>::value && vinfo<X>::size == N;
  else
    return is_scalar_v<X>;
}
template <bool Ok, class F> struct vres_if {};
template <class F> struct vres_if<true, F> {
  using elem = typename F::elem;
  static constexpr int size = F::size;
  using type = vec<elem, size>;
};
template <int Cat, class... A> struct vres_check {
  using F = first_vec<A...>;
  static constexpr bool ok() {
    if constexpr (F::value)
      return in_cat<Cat, typename F::elem> && (fits<typename F::elem, F::size, A>() && ...);
    else
      return false;
  }
};
template <int Cat, class... A>
struct vres : vres_if<vres_check<Cat, A...>::ok(), first_vec<A...>> {};

// A scalar call that mixes one 16-bit float type H with integers (max(h, 0), clamp(h, 0, 1),
// pow(h, 2)): on Metal the integers convert to H as readily as to float and the H argument
// matches exactly, so the H overload is chosen and the result is an H. In C++ H is a class and
// the H and float overloads would each need one user-defined conversion (ambiguous), hence
// templates that take the integers as they are. `type` is H; absent unless every argument is H
// or an integer, at least one is H and at least one is not (all-H calls use the plain overloads;
// H mixed with float stays ambiguous, as on Metal).
template <class... A> struct first_f16 {};
template <class A, class... R>
struct first_f16<A, R...> : std::conditional_t<is_f16<A>::value, std::enable_if<true, A>,
                                               first_f16<R...>> {};
template <class H, class... A>
constexpr bool f16_int_mix_ok = ((std::is_same<A, H>::value || std::is_integral<A>::value) && ...) &&
                                !(std::is_same<A, H>::value && ...);
template <class Enable, class... A> struct f16_int_mix_impl {};
template <class... A>
struct f16_int_mix_impl<std::enable_if_t<f16_int_mix_ok<typename first_f16<A...>::type, A...>>,
                        A...> {
  using type = typename first_f16<A...>::type;
};
template <class... A> using f16_int_mix_t = typename f16_int_mix_impl<void, A...>::type;

}  // namespace detail

// ---- definition helpers ------------------------------------------------------------------
// The bfloat overloads are templates restricted to bfloat: Metal's own library has no bfloat
// math, and code written for it (MLX's bf16_math.h) defines plain `bfloat f(bfloat)` overloads
// of its own in metal::, metal::fast:: and metal::precise::. A template never clashes with
// those, and overload resolution prefers them where both exist.
#define MF_SIM_BF_FN(B) \
  template <class B, std::enable_if_t<std::is_same<B, bfloat>::value, int> = 0> MF_INLINE B
// Scalar float definition, plus half/bfloat through float, plus the element-wise vector form.
#define MF_SIM_F16_VIA_FLOAT1(NAME)                                                              \
  MF_INLINE half NAME(half x) { return half(NAME(float(x))); }                                   \
  MF_SIM_BF_FN(B) NAME(B x) { return B(NAME(float(x))); }
#define MF_SIM_F16_VIA_FLOAT2(NAME)                                                              \
  MF_INLINE half NAME(half x, half y) { return half(NAME(float(x), float(y))); }                 \
  MF_SIM_BF_FN(B) NAME(B x, B y) { return B(NAME(float(x), float(y))); }                         \
  template <class X, class Y, class H = detail::f16_int_mix_t<X, Y>>                             \
  MF_INLINE H NAME(X x, Y y) { return NAME(H(x), H(y)); }
#define MF_SIM_F16_VIA_FLOAT3(NAME)                                                              \
  MF_INLINE half NAME(half x, half y, half z) {                                                  \
    return half(NAME(float(x), float(y), float(z)));                                             \
  }                                                                                              \
  MF_SIM_BF_FN(B) NAME(B x, B y, B z) {                                                          \
    return B(NAME(float(x), float(y), float(z)));                                                \
  }                                                                                              \
  template <class X, class Y, class Z, class H = detail::f16_int_mix_t<X, Y, Z>>                 \
  MF_INLINE H NAME(X x, Y y, Z z) { return NAME(H(x), H(y), H(z)); }
#define MF_SIM_VMAP1(NAME, CAT)                                                                  \
  template <class A, class F = detail::vres<detail::CAT, A>>                                     \
  MF_INLINE typename F::type NAME(const A& a) {                                                  \
    typename F::type r{};                                                                        \
    for (int i = 0; i < F::size; ++i) r.mf_e[i] = NAME(a.mf_get(i));                            \
    return r;                                                                                    \
  }
#define MF_SIM_VMAP2(NAME, CAT)                                                                  \
  template <class A, class B, class F = detail::vres<detail::CAT, A, B>>                         \
  MF_INLINE typename F::type NAME(const A& a, const B& b) {                                      \
    using E = typename F::elem;                                                                  \
    typename F::type r{};                                                                        \
    for (int i = 0; i < F::size; ++i) r.mf_e[i] = NAME(detail::el<E>(a, i), detail::el<E>(b, i)); \
    return r;                                                                                    \
  }
#define MF_SIM_VMAP3(NAME, CAT)                                                                  \
  template <class A, class B, class C, class F = detail::vres<detail::CAT, A, B, C>>             \
  MF_INLINE typename F::type NAME(const A& a, const B& b, const C& c) {                          \
    using E = typename F::elem;                                                                  \
    typename F::type r{};                                                                        \
    for (int i = 0; i < F::size; ++i)                                                            \
      r.mf_e[i] = NAME(detail::el<E>(a, i), detail::el<E>(b, i), detail::el<E>(c, i));           \
    return r;                                                                                    \
  }
#define MF_SIM_FLOAT1(NAME, EXPR)                                                                \
  MF_INLINE float NAME(float x) { return EXPR; }                                                 \
  MF_SIM_F16_VIA_FLOAT1(NAME)                                                                    \
  MF_SIM_VMAP1(NAME, cat_float)
#define MF_SIM_FLOAT2(NAME, EXPR)                                                                \
  MF_INLINE float NAME(float x, float y) { return EXPR; }                                        \
  MF_SIM_F16_VIA_FLOAT2(NAME)                                                                    \
  MF_SIM_VMAP2(NAME, cat_float)
#define MF_SIM_FLOAT3(NAME, EXPR)                                                                \
  MF_INLINE float NAME(float x, float y, float z) { return EXPR; }                               \
  MF_SIM_F16_VIA_FLOAT3(NAME)                                                                    \
  MF_SIM_VMAP3(NAME, cat_float)
#define MF_SIM_FOR_INTS(M) M(char) M(uchar) M(short) M(ushort) M(int) M(uint) M(long) M(ulong)

// ---- math functions ------------------------------------------------------------------------
MF_SIM_FLOAT1(fabs, __builtin_fabsf(x))
MF_SIM_FLOAT1(exp, __builtin_expf(x))
MF_SIM_FLOAT1(exp2, __builtin_exp2f(x))
MF_SIM_FLOAT1(exp10, __builtin_powf(10.0f, x))
MF_SIM_FLOAT1(log, __builtin_logf(x))
MF_SIM_FLOAT1(log2, __builtin_log2f(x))
MF_SIM_FLOAT1(log10, __builtin_log10f(x))
MF_SIM_FLOAT1(sqrt, __builtin_sqrtf(x))
MF_SIM_FLOAT1(rsqrt, 1.0f / __builtin_sqrtf(x))
MF_SIM_FLOAT1(sin, __builtin_sinf(x))
MF_SIM_FLOAT1(cos, __builtin_cosf(x))
MF_SIM_FLOAT1(tan, __builtin_tanf(x))
MF_SIM_FLOAT1(asin, __builtin_asinf(x))
MF_SIM_FLOAT1(acos, __builtin_acosf(x))
MF_SIM_FLOAT1(atan, __builtin_atanf(x))
MF_SIM_FLOAT1(sinh, __builtin_sinhf(x))
MF_SIM_FLOAT1(cosh, __builtin_coshf(x))
MF_SIM_FLOAT1(tanh, __builtin_tanhf(x))
MF_SIM_FLOAT1(asinh, __builtin_asinhf(x))
MF_SIM_FLOAT1(acosh, __builtin_acoshf(x))
MF_SIM_FLOAT1(atanh, __builtin_atanhf(x))
// sinpi(x) = sin(pi x), computed in double so that pi x is accurate.
MF_SIM_FLOAT1(sinpi, float(__builtin_sin(3.14159265358979323846 * double(x))))
MF_SIM_FLOAT1(cospi, float(__builtin_cos(3.14159265358979323846 * double(x))))
MF_SIM_FLOAT1(tanpi, float(__builtin_tan(3.14159265358979323846 * double(x))))
MF_SIM_FLOAT1(floor, __builtin_floorf(x))
MF_SIM_FLOAT1(ceil, __builtin_ceilf(x))
MF_SIM_FLOAT1(round, __builtin_roundf(x))  // halfway cases away from zero
MF_SIM_FLOAT1(rint, __builtin_rintf(x))    // halfway cases to even
MF_SIM_FLOAT1(trunc, __builtin_truncf(x))
// fract: x - floor(x), kept below 1 (MSL clamps to 0x1.fffffep-1f); +-0 for +-inf, NaN for NaN.
MF_SIM_FLOAT1(fract, __builtin_fabsf(x) == __builtin_inff() ? __builtin_copysignf(0.0f, x)
                     : x != x ? x : __builtin_fminf(x - __builtin_floorf(x), 0x1.fffffep-1f))
MF_SIM_FLOAT1(logb, __builtin_logbf(x))
MF_SIM_FLOAT2(pow, __builtin_powf(x, y))
MF_SIM_FLOAT2(powr, __builtin_powf(x, y))  // MSL: defined for x >= 0
MF_SIM_FLOAT2(atan2, __builtin_atan2f(x, y))
MF_SIM_FLOAT2(fmod, __builtin_fmodf(x, y))
MF_SIM_FLOAT2(fdim, __builtin_fdimf(x, y))
MF_SIM_FLOAT2(copysign, __builtin_copysignf(x, y))
MF_SIM_FLOAT2(nextafter, __builtin_nextafterf(x, y))
MF_SIM_FLOAT2(divide, x / y)
// fmin/fmax (and min/max on floats): IEEE minNum/maxNum as in MSL, a NaN operand yields the
// other operand; NaN only when both are NaN.
MF_SIM_FLOAT2(fmin, __builtin_fminf(x, y))
MF_SIM_FLOAT2(fmax, __builtin_fmaxf(x, y))
MF_SIM_FLOAT3(fma, __builtin_fmaf(x, y, z))
MF_SIM_FLOAT3(mad, x * y + z)  // not fused (GPU mad may be; difference is within fma rounding)
MF_SIM_FLOAT3(fmin3, __builtin_fminf(__builtin_fminf(x, y), z))
MF_SIM_FLOAT3(fmax3, __builtin_fmaxf(__builtin_fmaxf(x, y), z))
MF_SIM_FLOAT3(fmedian3, __builtin_fmaxf(__builtin_fminf(x, y), __builtin_fminf(__builtin_fmaxf(x, y), z)))

// abs: floats and integers (integers: |x| in the same type, abs(INT_MIN) == INT_MIN).
// One template for all scalars, so that a C library ::abs(int) or std::abs(float) made visible
// by some other header wins ties with identical results instead of making calls ambiguous.
template <class T, std::enable_if_t<detail::is_scalar_v<T>, int> = 0>
MF_INLINE constexpr T abs(T x) {
  if constexpr (detail::is_float_scalar_v<T>)
    return T(__builtin_fabsf(float(x)));
  else if constexpr (std::is_signed<T>::value)
    return x < 0 ? T(0 - std::make_unsigned_t<T>(x)) : x;
  else
    return x;
}
MF_SIM_VMAP1(abs, cat_any)

// sincos returns sin(x) and stores cos(x).
MF_INLINE float sincos(float x, float& cosval) {
  cosval = __builtin_cosf(x);
  return __builtin_sinf(x);
}
MF_INLINE half sincos(half x, half& cosval) {
  cosval = half(__builtin_cosf(float(x)));
  return half(__builtin_sinf(float(x)));
}
MF_SIM_BF_FN(B) sincos(B x, B& cosval) {
  cosval = B(__builtin_cosf(float(x)));
  return B(__builtin_sinf(float(x)));
}
template <class T, int N>
MF_INLINE vec<T, N> sincos(const vec<T, N>& x, vec<T, N>& cosval) {
  vec<T, N> r{};
  for (int i = 0; i < N; ++i) r.mf_e[i] = sincos(x.mf_e[i], cosval.mf_e[i]);
  return r;
}

MF_INLINE float ldexp(float x, int k) { return __builtin_ldexpf(x, k); }
MF_INLINE half ldexp(half x, int k) { return half(__builtin_ldexpf(float(x), k)); }
MF_SIM_BF_FN(B) ldexp(B x, int k) { return B(__builtin_ldexpf(float(x), k)); }
MF_INLINE float frexp(float x, int& e) { return __builtin_frexpf(x, &e); }
MF_INLINE half frexp(half x, int& e) { return half(__builtin_frexpf(float(x), &e)); }
MF_SIM_BF_FN(B) frexp(B x, int& e) { return B(__builtin_frexpf(float(x), &e)); }
MF_INLINE float modf(float x, float& i) { return __builtin_modff(x, &i); }
MF_INLINE half modf(half x, half& i) {
  float fi;
  const float f = __builtin_modff(float(x), &fi);
  i = half(fi);
  return half(f);
}
MF_SIM_BF_FN(B) modf(B x, B& i) {
  float fi;
  const float f = __builtin_modff(float(x), &fi);
  i = B(fi);
  return B(f);
}
MF_INLINE int ilogb(float x) { return __builtin_ilogbf(x); }
MF_INLINE int ilogb(half x) { return __builtin_ilogbf(float(x)); }
template <class B, std::enable_if_t<std::is_same<B, bfloat>::value, int> = 0>
MF_INLINE int ilogb(B x) { return __builtin_ilogbf(float(x)); }
// Vector forms (MSL: T ldexp(T, Ti), T frexp(T, thread Ti&), T modf(T, thread T&), Ti ilogb(T)
// with Ti the int vector of T's length).
template <class T, int N, std::enable_if_t<detail::is_float_scalar_v<T>, int> = 0>
MF_INLINE vec<T, N> ldexp(const vec<T, N>& x, const vec<int, N>& k) {
  vec<T, N> r{};
  for (int i = 0; i < N; ++i) r.mf_e[i] = ldexp(x.mf_e[i], k.mf_e[i]);
  return r;
}
template <class T, int N, std::enable_if_t<detail::is_float_scalar_v<T>, int> = 0>
MF_INLINE vec<T, N> frexp(const vec<T, N>& x, vec<int, N>& e) {
  vec<T, N> r{};
  for (int i = 0; i < N; ++i) r.mf_e[i] = frexp(x.mf_e[i], e.mf_e[i]);
  return r;
}
template <class T, int N, std::enable_if_t<detail::is_float_scalar_v<T>, int> = 0>
MF_INLINE vec<T, N> modf(const vec<T, N>& x, vec<T, N>& ip) {
  vec<T, N> r{};
  for (int i = 0; i < N; ++i) r.mf_e[i] = modf(x.mf_e[i], ip.mf_e[i]);
  return r;
}
template <class T, int N, std::enable_if_t<detail::is_float_scalar_v<T>, int> = 0>
MF_INLINE vec<int, N> ilogb(const vec<T, N>& x) {
  vec<int, N> r{};
  for (int i = 0; i < N; ++i) r.mf_e[i] = ilogb(x.mf_e[i]);
  return r;
}

// ---- common functions ----------------------------------------------------------------------
// clamp(x, lo, hi) = fmin(fmax(x, lo), hi), as MSL defines it: a NaN x gives lo (saturate(NaN)
// is 0). The vector form (floats and integers) is below.
MF_INLINE float clamp(float x, float lo, float hi) { return __builtin_fminf(__builtin_fmaxf(x, lo), hi); }
MF_SIM_F16_VIA_FLOAT3(clamp)
MF_SIM_FLOAT1(saturate, __builtin_fminf(__builtin_fmaxf(x, 0.0f), 1.0f))
MF_SIM_FLOAT3(mix, x + (y - x) * z)
MF_SIM_FLOAT2(step, y < x ? 0.0f : 1.0f)  // step(edge, x)
MF_INLINE float smoothstep(float e0, float e1, float x) {
  const float t = __builtin_fminf(__builtin_fmaxf((x - e0) / (e1 - e0), 0.0f), 1.0f);
  return t * t * (3.0f - 2.0f * t);
}
MF_SIM_F16_VIA_FLOAT3(smoothstep)
MF_SIM_VMAP3(smoothstep, cat_float)
// sign: 1 for x > 0, -1 for x < 0, x itself for +-0, 0 for NaN.
MF_SIM_FLOAT1(sign, x > 0.0f ? 1.0f : x < 0.0f ? -1.0f : x == 0.0f ? x : 0.0f)

// min/max/clamp on floats follow fmin/fmax (see above); on integers the plain comparisons.
MF_INLINE float min(float x, float y) { return __builtin_fminf(x, y); }
MF_INLINE float max(float x, float y) { return __builtin_fmaxf(x, y); }
MF_SIM_F16_VIA_FLOAT2(min)
MF_SIM_F16_VIA_FLOAT2(max)
MF_INLINE float min3(float x, float y, float z) { return fmin3(x, y, z); }
MF_INLINE float max3(float x, float y, float z) { return fmax3(x, y, z); }
MF_INLINE float median3(float x, float y, float z) { return fmedian3(x, y, z); }
MF_SIM_F16_VIA_FLOAT3(min3)
MF_SIM_F16_VIA_FLOAT3(max3)
MF_SIM_F16_VIA_FLOAT3(median3)

// ---- integer functions ---------------------------------------------------------------------
namespace detail {
template <class T> using uns_t = std::make_unsigned_t<T>;
template <class T> constexpr int bits_v = int(sizeof(T) * 8);
template <class T> MF_INLINE constexpr T clz_of(T x) {
  const uint64_t u = uint64_t(uns_t<T>(x));
  return T(u == 0 ? bits_v<T> : __builtin_clzll(u) - (64 - bits_v<T>));
}
template <class T> MF_INLINE constexpr T ctz_of(T x) {
  const uint64_t u = uint64_t(uns_t<T>(x));
  return T(u == 0 ? bits_v<T> : __builtin_ctzll(u));
}
template <class T> MF_INLINE constexpr T reverse_bits_of(T x) {
  uint64_t u = uint64_t(uns_t<T>(x)), r = 0;
  for (int i = 0; i < bits_v<T>; ++i) r |= ((u >> i) & 1u) << (bits_v<T> - 1 - i);
  return T(uns_t<T>(r));
}
template <class T> MF_INLINE constexpr T addsat_of(T x, T y) {
  T r;
  if (!__builtin_add_overflow(x, y, &r)) return r;
  return (std::is_signed<T>::value && x < 0) ? numeric_limits<T>::min() : numeric_limits<T>::max();
}
template <class T> MF_INLINE constexpr T subsat_of(T x, T y) {
  T r;
  if (!__builtin_sub_overflow(x, y, &r)) return r;
  return (std::is_signed<T>::value && x >= 0) || (!std::is_signed<T>::value)
             ? (std::is_signed<T>::value ? numeric_limits<T>::max() : T(0))
             : numeric_limits<T>::min();
}
template <class T> MF_INLINE constexpr T mulhi_of(T x, T y) {
  if constexpr (sizeof(T) < 8) {
    // in a 64-bit type of T's signedness: uint x uint fills all 64 bits (int64_t would overflow)
    using W = typename std::conditional<std::is_signed<T>::value, int64_t, uint64_t>::type;
    return T((W(x) * W(y)) >> bits_v<T>);
  } else if constexpr (std::is_signed<T>::value) {
    return T((__int128(x) * __int128(y)) >> 64);
  } else {
    return T((unsigned __int128)(x) * (unsigned __int128)(y) >> 64);
  }
}
template <class T> MF_INLINE constexpr T rotate_of(T v, T i) {
  const int n = int(uns_t<T>(i) % uns_t<T>(bits_v<T>));
  const uns_t<T> u = uns_t<T>(v);
  return n == 0 ? v : T(uns_t<T>((u << n) | (u >> (bits_v<T> - n))));
}
template <class T> MF_INLINE constexpr T extract_bits_of(T x, uint offset, uint bits) {
  if (bits == 0) return T(0);
  const uns_t<T> u = uns_t<T>(uns_t<T>(x) << (bits_v<T> - offset - bits));
  // Signed types sign-extend the extracted field, unsigned types zero-extend it.
  return std::is_signed<T>::value ? T(T(u) >> (bits_v<T> - bits)) : T(u >> (bits_v<T> - bits));
}
template <class T> MF_INLINE constexpr T insert_bits_of(T base, T ins, uint offset, uint bits) {
  if (bits == 0) return base;
  const uns_t<T> mask = uns_t<T>((~uns_t<T>(0) >> (bits_v<T> - bits)) << offset);
  return T((uns_t<T>(base) & ~mask) | ((uns_t<T>(uns_t<T>(ins) << offset)) & mask));
}
}  // namespace detail

#define MF_SIM_INT_FUNCS(T)                                                                      \
  MF_INLINE T min(T x, T y) { return y < x ? y : x; }                                            \
  MF_INLINE T max(T x, T y) { return x < y ? y : x; }                                            \
  MF_INLINE T clamp(T x, T lo, T hi) { return min(max(x, lo), hi); }                             \
  MF_INLINE T min3(T x, T y, T z) { return min(min(x, y), z); }                                  \
  MF_INLINE T max3(T x, T y, T z) { return max(max(x, y), z); }                                  \
  MF_INLINE T median3(T x, T y, T z) { return max(min(x, y), min(max(x, y), z)); }               \
  MF_INLINE T absdiff(T x, T y) { return x > y ? T(x - y) : T(y - x); }                           \
  MF_INLINE T addsat(T x, T y) { return detail::addsat_of(x, y); }                               \
  MF_INLINE T subsat(T x, T y) { return detail::subsat_of(x, y); }                               \
  MF_INLINE T hadd(T x, T y) { return T((x >> 1) + (y >> 1) + (x & y & 1)); }                    \
  MF_INLINE T rhadd(T x, T y) { return T((x >> 1) + (y >> 1) + ((x | y) & 1)); }                 \
  MF_INLINE T mulhi(T x, T y) { return detail::mulhi_of(x, y); }                                 \
  MF_INLINE T madhi(T x, T y, T z) { return T(detail::mulhi_of(x, y) + z); }                     \
  MF_INLINE T madsat(T x, T y, T z) {                                                            \
    T p;                                                                                         \
    if (__builtin_mul_overflow(x, y, &p))                                                        \
      return (std::is_signed<T>::value && ((x < 0) != (y < 0))) ? numeric_limits<T>::min()        \
                                                                : numeric_limits<T>::max();      \
    return detail::addsat_of(p, z);                                                              \
  }                                                                                              \
  MF_INLINE T rotate(T v, T i) { return detail::rotate_of(v, i); }                               \
  MF_INLINE T clz(T x) { return detail::clz_of(x); }                                             \
  MF_INLINE T ctz(T x) { return detail::ctz_of(x); }                                             \
  MF_INLINE T popcount(T x) { return T(__builtin_popcountll(uint64_t(detail::uns_t<T>(x)))); }   \
  MF_INLINE T reverse_bits(T x) { return detail::reverse_bits_of(x); }                           \
  MF_INLINE T extract_bits(T x, uint offset, uint bits) {                                        \
    return detail::extract_bits_of(x, offset, bits);                                             \
  }                                                                                              \
  MF_INLINE T insert_bits(T base, T ins, uint offset, uint bits) {                               \
    return detail::insert_bits_of(base, ins, offset, bits);                                      \
  }
MF_SIM_FOR_INTS(MF_SIM_INT_FUNCS)
#undef MF_SIM_INT_FUNCS
MF_INLINE int mul24(int x, int y) { return int(int64_t(x << 8 >> 8) * int64_t(y << 8 >> 8)); }
MF_INLINE uint mul24(uint x, uint y) { return (x & 0xffffffu) * (y & 0xffffffu); }
MF_INLINE int mad24(int x, int y, int z) { return int(uint(mul24(x, y)) + uint(z)); }
MF_INLINE uint mad24(uint x, uint y, uint z) { return mul24(x, y) + z; }

// Vector forms: min/max/clamp/... work for float and integer vectors alike.
MF_SIM_VMAP2(min, cat_any)
MF_SIM_VMAP2(max, cat_any)
MF_SIM_VMAP3(min3, cat_any)
MF_SIM_VMAP3(max3, cat_any)
MF_SIM_VMAP3(median3, cat_any)
MF_SIM_VMAP3(clamp, cat_any)
MF_SIM_VMAP2(absdiff, cat_int)
MF_SIM_VMAP2(addsat, cat_int)
MF_SIM_VMAP2(subsat, cat_int)
MF_SIM_VMAP2(hadd, cat_int)
MF_SIM_VMAP2(rhadd, cat_int)
MF_SIM_VMAP2(mulhi, cat_int)
MF_SIM_VMAP2(rotate, cat_int)
MF_SIM_VMAP1(clz, cat_int)
MF_SIM_VMAP1(ctz, cat_int)
MF_SIM_VMAP1(popcount, cat_int)
MF_SIM_VMAP1(reverse_bits, cat_int)

// ---- relational functions ------------------------------------------------------------------
namespace detail {
template <class X> MF_INLINE constexpr float as_f(X x) { return float(x); }
}  // namespace detail
#define MF_SIM_PRED1(NAME, EXPR)                                                                 \
  MF_INLINE bool NAME(float x) { return EXPR; }                                                  \
  MF_INLINE bool NAME(half h) { return NAME(float(h)); }                                         \
  MF_INLINE bool NAME(bfloat h) { return NAME(float(h)); }                                       \
  template <class A, class F = detail::vres<detail::cat_float, A>>                               \
  MF_INLINE vec<bool, F::size> NAME(const A& a) {                                                \
    vec<bool, F::size> r{};                                                                      \
    for (int i = 0; i < F::size; ++i) r.mf_e[i] = NAME(a.mf_get(i));                             \
    return r;                                                                                    \
  }
#define MF_SIM_PRED2(NAME, EXPR)                                                                 \
  MF_INLINE bool NAME(float x, float y) { return EXPR; }                                         \
  MF_INLINE bool NAME(half x, half y) { return NAME(float(x), float(y)); }                       \
  MF_INLINE bool NAME(bfloat x, bfloat y) { return NAME(float(x), float(y)); }                   \
  template <class A, class B, class F = detail::vres<detail::cat_float, A, B>>                   \
  MF_INLINE vec<bool, F::size> NAME(const A& a, const B& b) {                                    \
    using E = typename F::elem;                                                                  \
    vec<bool, F::size> r{};                                                                      \
    for (int i = 0; i < F::size; ++i) r.mf_e[i] = NAME(detail::el<E>(a, i), detail::el<E>(b, i)); \
    return r;                                                                                    \
  }
MF_SIM_PRED1(isnan, x != x)
MF_SIM_PRED1(isinf, __builtin_fabsf(x) == __builtin_inff())
MF_SIM_PRED1(isfinite, __builtin_fabsf(x) < __builtin_inff())
MF_SIM_PRED1(isnormal, __builtin_isnormal(x))
MF_SIM_PRED1(signbit, __builtin_signbit(x) != 0)
MF_SIM_PRED2(isunordered, x != x || y != y)
MF_SIM_PRED2(isordered, x == x && y == y)
#undef MF_SIM_PRED1
#undef MF_SIM_PRED2

MF_INLINE constexpr bool all(bool b) { return b; }
MF_INLINE constexpr bool any(bool b) { return b; }
template <class A, class F = detail::vres<detail::cat_any, A>>
MF_INLINE constexpr bool all(const A& a) {
  for (int i = 0; i < F::size; ++i)
    if (!a.mf_get(i)) return false;
  return true;
}
template <class A, class F = detail::vres<detail::cat_any, A>>
MF_INLINE constexpr bool any(const A& a) {
  for (int i = 0; i < F::size; ++i)
    if (a.mf_get(i)) return true;
  return false;
}

// select(a, b, c): c ? b : a, element-wise for vectors (c a bool vector or one bool).
template <class T, std::enable_if_t<detail::is_scalar_v<T>, int> = 0>
MF_INLINE constexpr T select(T a, T b, bool c) { return c ? b : a; }
template <class A, class B, class C, class F = detail::vres<detail::cat_any, A, B>,
          std::enable_if_t<std::is_same<C, bool>::value ||
                               std::is_same<C, vec<bool, F::size>>::value, int> = 0>
MF_INLINE typename F::type select(const A& a, const B& b, const C& c) {
  using E = typename F::elem;
  typename F::type r{};
  for (int i = 0; i < F::size; ++i)
    r.mf_e[i] = detail::el<bool>(c, i) ? detail::el<E>(b, i) : detail::el<E>(a, i);
  return r;
}

// ---- geometric functions (float, half, bfloat vectors) -------------------------------------
// Sums are accumulated in float and rounded once for half/bfloat.
template <class A, class B, class F = detail::vres<detail::cat_float, A, B>,
          std::enable_if_t<detail::is_veclike_v<A> && detail::is_veclike_v<B>, int> = 0>
MF_INLINE typename F::elem dot(const A& a, const B& b) {
  float s = 0.0f;
  for (int i = 0; i < F::size; ++i) s = s + float(a.mf_get(i)) * float(b.mf_get(i));
  return typename F::elem(s);
}
template <class A, class F = detail::vres<detail::cat_float, A>>
MF_INLINE typename F::elem length_squared(const A& a) { return dot(a, a); }
template <class A, class F = detail::vres<detail::cat_float, A>>
MF_INLINE typename F::elem length(const A& a) {
  float s = 0.0f;
  for (int i = 0; i < F::size; ++i) s = s + float(a.mf_get(i)) * float(a.mf_get(i));
  return typename F::elem(__builtin_sqrtf(s));
}
template <class A, class B, class F = detail::vres<detail::cat_float, A, B>>
MF_INLINE typename F::elem distance(const A& a, const B& b) {
  return length(typename F::type(a) - typename F::type(b));
}
template <class A, class B, class F = detail::vres<detail::cat_float, A, B>>
MF_INLINE typename F::elem distance_squared(const A& a, const B& b) {
  return length_squared(typename F::type(a) - typename F::type(b));
}
template <class A, class F = detail::vres<detail::cat_float, A>>
MF_INLINE typename F::type normalize(const A& a) {
  float s = 0.0f;
  for (int i = 0; i < F::size; ++i) s = s + float(a.mf_get(i)) * float(a.mf_get(i));
  const float inv = 1.0f / __builtin_sqrtf(s);
  typename F::type r{};
  for (int i = 0; i < F::size; ++i) r.mf_e[i] = typename F::elem(float(a.mf_get(i)) * inv);
  return r;
}
template <class A, class B, class F = detail::vres<detail::cat_float, A, B>,
          std::enable_if_t<F::size == 3, int> = 0>
MF_INLINE typename F::type cross(const A& a_, const B& b_) {
  const typename F::type a = a_, b = b_;
  return typename F::type(a.y * b.z - a.z * b.y, a.z * b.x - a.x * b.z, a.x * b.y - a.y * b.x);
}
template <class A, class B, class F = detail::vres<detail::cat_float, A, B>>
MF_INLINE typename F::type reflect(const A& i, const B& n) {
  const typename F::type I = i, N = n;
  return I - typename F::elem(2) * dot(N, I) * N;
}
template <class A, class B, class C, class F = detail::vres<detail::cat_float, A, B, C>>
MF_INLINE typename F::type faceforward(const A& n, const B& i, const C& nref) {
  const typename F::type N = n, I = i, R = nref;
  return dot(R, I) < typename F::elem(0) ? N : typename F::type(-N);
}

#undef MF_SIM_BF_FN
#undef MF_SIM_F16_VIA_FLOAT1
#undef MF_SIM_F16_VIA_FLOAT2
#undef MF_SIM_F16_VIA_FLOAT3
#undef MF_SIM_VMAP1
#undef MF_SIM_VMAP2
#undef MF_SIM_VMAP3
#undef MF_SIM_FLOAT1
#undef MF_SIM_FLOAT2
#undef MF_SIM_FLOAT3
#undef MF_SIM_FOR_INTS

// ---- precise:: and fast:: ------------------------------------------------------------------
#define MF_SIM_MATH_NAMES                                                                        \
  using metal::abs; using metal::acos; using metal::acosh; using metal::asin;                   \
  using metal::asinh; using metal::atan; using metal::atan2; using metal::atanh;                \
  using metal::ceil; using metal::copysign; using metal::cos; using metal::cosh;                \
  using metal::cospi; using metal::divide; using metal::exp; using metal::exp10;                \
  using metal::exp2; using metal::fabs; using metal::fdim; using metal::floor;                  \
  using metal::fma; using metal::fmax; using metal::fmax3; using metal::fmedian3;               \
  using metal::fmin; using metal::fmin3; using metal::fmod; using metal::fract;                 \
  using metal::frexp; using metal::ilogb; using metal::ldexp; using metal::log;                 \
  using metal::log10; using metal::log2; using metal::logb; using metal::modf;                  \
  using metal::nextafter; using metal::pow; using metal::powr; using metal::rint;               \
  using metal::round; using metal::rsqrt; using metal::sin; using metal::sincos;                \
  using metal::sinh; using metal::sinpi; using metal::sqrt; using metal::tan;                   \
  using metal::tanh; using metal::tanpi; using metal::trunc; using metal::clamp;                \
  using metal::saturate; using metal::mix; using metal::step; using metal::smoothstep;          \
  using metal::sign; using metal::min; using metal::max; using metal::dot;                      \
  using metal::length; using metal::length_squared; using metal::normalize;                     \
  using metal::distance; using metal::distance_squared; using metal::cross;
namespace precise { MF_SIM_MATH_NAMES }
namespace fast { MF_SIM_MATH_NAMES }
#undef MF_SIM_MATH_NAMES

}  // namespace metal

#endif  // MF_SIM_MATH_H
