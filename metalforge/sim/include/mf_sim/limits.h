// metalforge.sim — metal::numeric_limits and MSL's predefined constants (FLT_MAX, HALF_MAX,
// M_PI_F, INFINITY, NAN, INT_MAX, ...).
#ifndef MF_SIM_LIMITS_H
#define MF_SIM_LIMITS_H

#include "scalar.h"

namespace metal {

template <class T> struct numeric_limits {
  static constexpr bool is_specialized = false;
};

namespace detail {
template <class T> struct int_limits {
  using U = std::make_unsigned_t<T>;
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = std::is_signed<T>::value;
  static constexpr bool is_integer = true;
  static constexpr bool is_exact = true;
  static constexpr bool has_infinity = false;
  static constexpr bool has_quiet_NaN = false;
  static constexpr bool has_signaling_NaN = false;
  static constexpr int radix = 2;
  static constexpr int digits = int(sizeof(T) * 8) - (is_signed ? 1 : 0);
  static constexpr int digits10 = digits * 301 / 1000;
  static constexpr T max() { return is_signed ? T(U(~U(0)) >> 1) : T(~U(0)); }
  static constexpr T min() { return is_signed ? T(-max() - 1) : T(0); }
  static constexpr T lowest() { return min(); }
  static constexpr T epsilon() { return T(0); }
  static constexpr T round_error() { return T(0); }
  static constexpr T infinity() { return T(0); }
  static constexpr T quiet_NaN() { return T(0); }
  static constexpr T signaling_NaN() { return T(0); }
  static constexpr T denorm_min() { return T(0); }
};

// Floating-point limits from bit patterns. mant = explicit mantissa bits.
template <class T, class Bits, int Mant, int Digits10, int MinExp, int MaxExp, Bits MaxB,
          Bits MinB, Bits EpsB, Bits InfB, Bits QnanB, Bits SnanB>
struct float_limits {
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = true;
  static constexpr bool is_integer = false;
  static constexpr bool is_exact = false;
  static constexpr bool has_infinity = true;
  static constexpr bool has_quiet_NaN = true;
  static constexpr bool has_signaling_NaN = true;
  static constexpr bool has_denorm = true;
  static constexpr int radix = 2;
  static constexpr int digits = Mant + 1;
  static constexpr int digits10 = Digits10;
  static constexpr int min_exponent = MinExp;
  static constexpr int max_exponent = MaxExp;
  static constexpr T from(Bits b) { return __builtin_bit_cast(T, b); }
  static constexpr T max() { return from(MaxB); }
  static constexpr T min() { return from(MinB); }
  static constexpr T lowest() { return from(Bits(MaxB | (Bits(1) << (sizeof(Bits) * 8 - 1)))); }
  static constexpr T epsilon() { return from(EpsB); }
  static constexpr T round_error() { return T(0.5f); }
  static constexpr T infinity() { return from(InfB); }
  static constexpr T quiet_NaN() { return from(QnanB); }
  static constexpr T signaling_NaN() { return from(SnanB); }
  static constexpr T denorm_min() { return from(Bits(1)); }
};
}  // namespace detail

template <> struct numeric_limits<bool> : detail::int_limits<unsigned char> {
  static constexpr int digits = 1;
  static constexpr bool max() { return true; }
  static constexpr bool min() { return false; }
  static constexpr bool lowest() { return false; }
};
template <> struct numeric_limits<char> : detail::int_limits<char> {};
template <> struct numeric_limits<signed char> : detail::int_limits<signed char> {};
template <> struct numeric_limits<uchar> : detail::int_limits<uchar> {};
template <> struct numeric_limits<short> : detail::int_limits<short> {};
template <> struct numeric_limits<ushort> : detail::int_limits<ushort> {};
template <> struct numeric_limits<int> : detail::int_limits<int> {};
template <> struct numeric_limits<uint> : detail::int_limits<uint> {};
template <> struct numeric_limits<long> : detail::int_limits<long> {};
template <> struct numeric_limits<ulong> : detail::int_limits<ulong> {};
template <> struct numeric_limits<long long> : detail::int_limits<long long> {};
template <> struct numeric_limits<unsigned long long> : detail::int_limits<unsigned long long> {};
template <>
struct numeric_limits<float>
    : detail::float_limits<float, uint32_t, 23, 6, -125, 128, 0x7f7fffffu, 0x00800000u,
                           0x34000000u, 0x7f800000u, 0x7fc00000u, 0x7fa00000u> {};
template <>
struct numeric_limits<half>
    : detail::float_limits<half, uint16_t, 10, 3, -13, 16, 0x7bff, 0x0400, 0x1400, 0x7c00,
                           0x7e00, 0x7d00> {};
template <>
struct numeric_limits<bfloat>
    : detail::float_limits<bfloat, uint16_t, 7, 2, -125, 128, 0x7f7f, 0x0080, 0x3c00, 0x7f80,
                           0x7fc0, 0x7fa0> {};
template <class T> struct numeric_limits<const T> : numeric_limits<T> {};

}  // namespace metal

// ---- MSL predefined constants ----------------------------------------------------------------
// Spelled exactly as glibc/GCC spell the ones they share, so a later <math.h>, <float.h> or
// <limits.h> redefines them identically.
#ifndef INFINITY
#define INFINITY (__builtin_inff ())
#endif
#ifndef NAN
#define NAN (__builtin_nanf (""))
#endif
#ifndef HUGE_VALF
#define HUGE_VALF (__builtin_huge_valf ())
#endif
#ifndef MAXFLOAT
#define MAXFLOAT 3.40282347e+38F
#endif
#ifndef FLT_MAX
#define FLT_MAX __FLT_MAX__
#endif
#ifndef FLT_MIN
#define FLT_MIN __FLT_MIN__
#endif
#ifndef FLT_EPSILON
#define FLT_EPSILON __FLT_EPSILON__
#endif
#ifndef FLT_DIG
#define FLT_DIG __FLT_DIG__
#endif
#ifndef FLT_MANT_DIG
#define FLT_MANT_DIG __FLT_MANT_DIG__
#endif
#ifndef CHAR_BIT
#define CHAR_BIT __CHAR_BIT__
#endif
#ifndef SCHAR_MAX
#define SCHAR_MAX __SCHAR_MAX__
#endif
#ifndef SCHAR_MIN
#define SCHAR_MIN (-SCHAR_MAX - 1)
#endif
#ifndef UCHAR_MAX
#define UCHAR_MAX (SCHAR_MAX * 2 + 1)
#endif
#ifndef CHAR_MAX
#define CHAR_MAX SCHAR_MAX
#endif
#ifndef CHAR_MIN
#define CHAR_MIN SCHAR_MIN
#endif
#ifndef SHRT_MAX
#define SHRT_MAX __SHRT_MAX__
#endif
#ifndef SHRT_MIN
#define SHRT_MIN (-SHRT_MAX - 1)
#endif
#ifndef USHRT_MAX
#define USHRT_MAX (SHRT_MAX * 2 + 1)
#endif
#ifndef INT_MAX
#define INT_MAX __INT_MAX__
#endif
#ifndef INT_MIN
#define INT_MIN (-INT_MAX - 1)
#endif
#ifndef UINT_MAX
#define UINT_MAX (INT_MAX * 2U + 1U)
#endif
#ifndef LONG_MAX
#define LONG_MAX __LONG_MAX__
#endif
#ifndef LONG_MIN
#define LONG_MIN (-LONG_MAX - 1L)
#endif
#ifndef ULONG_MAX
#define ULONG_MAX (LONG_MAX * 2UL + 1UL)
#endif
// Metal-only names.
#define HALF_MAX (::metal::numeric_limits<half>::max())
#define HALF_MIN (::metal::numeric_limits<half>::min())
#define HALF_EPSILON (::metal::numeric_limits<half>::epsilon())
#define MAXHALF HALF_MAX
#define BFLOAT_MAX (::metal::numeric_limits<bfloat>::max())
#define BFLOAT_MIN (::metal::numeric_limits<bfloat>::min())
#define BFLOAT_EPSILON (::metal::numeric_limits<bfloat>::epsilon())
#define M_E_F 2.71828182845904523536028747135266250f
#define M_LOG2E_F 1.44269504088896340735992468100189214f
#define M_LOG10E_F 0.434294481903251827651128918916605082f
#define M_LN2_F 0.693147180559945309417232121458176568f
#define M_LN10_F 2.30258509299404568401799145468436421f
#define M_PI_F 3.14159265358979323846264338327950288f
#define M_PI_2_F 1.57079632679489661923132169163975144f
#define M_PI_4_F 0.785398163397448309615660845819875721f
#define M_1_PI_F 0.318309886183790671537767526745028724f
#define M_2_PI_F 0.636619772367581343075535053490057448f
#define M_2_SQRTPI_F 1.12837916709551257389615890312154517f
#define M_SQRT2_F 1.41421356237309504880168872420969808f
#define M_SQRT1_2_F 0.707106781186547524400844362104849039f
#define M_E_H half(M_E_F)
#define M_LOG2E_H half(M_LOG2E_F)
#define M_LOG10E_H half(M_LOG10E_F)
#define M_LN2_H half(M_LN2_F)
#define M_LN10_H half(M_LN10_F)
#define M_PI_H half(M_PI_F)
#define M_PI_2_H half(M_PI_2_F)
#define M_PI_4_H half(M_PI_4_F)
#define M_1_PI_H half(M_1_PI_F)
#define M_2_PI_H half(M_2_PI_F)
#define M_2_SQRTPI_H half(M_2_SQRTPI_F)
#define M_SQRT2_H half(M_SQRT2_F)
#define M_SQRT1_2_H half(M_SQRT1_2_F)

#endif  // MF_SIM_LIMITS_H
