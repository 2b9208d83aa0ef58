// metalforge.sim — Metal scalar types: uint/ushort/uchar/ulong and the 16-bit floats half and
// bfloat (IEEE binary16 and bfloat16), stored as 16 bits and computed through float.
#ifndef MF_SIM_SCALAR_H
#define MF_SIM_SCALAR_H

#include "prelude.h"

// MSL names for the unsigned integer types (glibc may declare the same typedefs; identical
// redeclarations are fine). MSL's char is signed 8-bit, long/ulong 64-bit, as on LP64 Linux.
typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;

struct half;
struct bfloat;

namespace metal {
namespace detail {

MF_INLINE constexpr uint32_t f32_bits(float f) { return __builtin_bit_cast(uint32_t, f); }
MF_INLINE constexpr float f32_from_bits(uint32_t u) { return __builtin_bit_cast(float, u); }

// float -> binary16, round to nearest even. Overflow gives inf; NaN stays NaN with its sign and
// top payload bits, quietened (what x86 F16C does, hence what torch's .to(torch.float16) gives).
MF_INLINE constexpr uint16_t f32_to_f16(float f) {
  const uint32_t x = f32_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7fffffffu;
  if (a >= 0x7f800000u)  // inf or NaN
    return uint16_t(sign | 0x7c00u | (a > 0x7f800000u ? 0x0200u | ((a >> 13) & 0x3ffu) : 0u));
  if (a >= 0x477ff000u)  // >= 65520: rounds past HALF_MAX
    return uint16_t(sign | 0x7c00u);
  if (a < 0x38800000u) {  // below 2^-14: half subnormal (or zero)
    // Adding 0.5f puts the value's 2^-24 units in the low mantissa bits; the FPU rounds (RNE).
    return uint16_t(sign | (f32_bits(f32_from_bits(a) + 0.5f) - 0x3f000000u));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest even.
  const uint32_t odd = (a >> 13) & 1u;
  return uint16_t(sign | ((a + 0xc8000fffu + odd) >> 13));
}

// binary16 -> float (exact).
MF_INLINE constexpr float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7fffu;
  if (em >= 0x7c00u)  // inf or NaN
    return f32_from_bits(sign | 0x7f800000u | ((em & 0x3ffu) << 13));
  if (em >= 0x0400u)  // normal
    return f32_from_bits(sign | ((em << 13) + 0x38000000u));
  // Subnormal or zero: em units of 2^-24, exact in float.
  return f32_from_bits(sign | f32_bits(float(em) * 5.9604644775390625e-8f));
}

// float -> bfloat16, round to nearest even. NaN stays NaN (sign and top payload kept, quiet bit
// set); torch's own result for NaN depends on its code path (0x7fc0 scalar, 0xffff vectorised).
MF_INLINE constexpr uint16_t f32_to_bf16(float f) {
  const uint32_t x = f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x0040u);
  return uint16_t((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

MF_INLINE constexpr float bf16_to_f32(uint16_t b) { return f32_from_bits(uint32_t(b) << 16); }

template <class T> struct is_f16 : std::false_type {};
template <> struct is_f16<half> : std::true_type {};
template <> struct is_f16<bfloat> : std::true_type {};

template <class T>
constexpr bool is_plain_arith_v = std::is_arithmetic<T>::value;  // no half/bfloat

// MSL's type for `H op X` with H a 16-bit float and X a scalar: H itself for H and for integers
// (the integer is converted to H first), float for float (and for double: MSL has no double,
// an unsuffixed literal such as 0.5 is a float there). No entry: the operation does not exist.
template <class H, class X, class = void> struct f16_arith {};
template <class H> struct f16_arith<H, H> { using type = H; };
template <class H, class X>
struct f16_arith<H, X, std::enable_if_t<std::is_integral<X>::value>> { using type = H; };
template <class H> struct f16_arith<H, float> { using type = float; };
template <class H> struct f16_arith<H, double> { using type = float; };

}  // namespace detail
}  // namespace metal

// The two classes are the same apart from the conversion functions.
// Conversions: from any arithmetic type implicitly (MSL: `half h = x * 2.0f;`, `h = 0;`);
// to float implicitly; to every other arithmetic type only explicitly (`int(h)`,
// `static_cast<uint>(h)`, `if (h)`). Keeping the implicit path to float alone makes
// `cond ? h : 0` a half, as in MSL. Known limit: `cond ? h : 1.0f` is ambiguous in C++ (each
// side converts to the other); write `cond ? float(h) : 1.0f`.
// MSL converts float to bfloat only explicitly; the simulator's C++ build keeps the
// implicit constructor, and the simulator's front-end check (metalforge/sim/frontcheck.py)
// defines MF_SIM_BF16_FROM_FLOAT as `explicit` to find the implicit conversions.
#ifndef MF_SIM_BF16_FROM_FLOAT
#define MF_SIM_BF16_FROM_FLOAT
#endif
#define MF_SIM_FROM_FLOAT_half
#define MF_SIM_FROM_FLOAT_bfloat MF_SIM_BF16_FROM_FLOAT
#define MF_SIM_F16_CLASS(NAME, TO_BITS, FROM_BITS, OTHER)                                        \
  struct NAME {                                                                                  \
    uint16_t mf_bits;                                                                            \
    NAME() = default;                                                                            \
    constexpr MF_SIM_FROM_FLOAT_##NAME NAME(float f) : mf_bits(metal::detail::TO_BITS(f)) {}    \
    template <class T, std::enable_if_t<metal::detail::is_plain_arith_v<T> &&                    \
                                            !std::is_same<T, float>::value, int> = 0>            \
    constexpr NAME(T v) : mf_bits(metal::detail::TO_BITS(static_cast<float>(v))) {}            \
    explicit NAME(OTHER o);                                                                      \
    template <class T, std::enable_if_t<std::is_same<T, float>::value, int> = 0>                 \
    constexpr operator T() const { return metal::detail::FROM_BITS(mf_bits); }                  \
    template <class T, std::enable_if_t<metal::detail::is_plain_arith_v<T> &&                    \
                                            !std::is_same<T, float>::value, long> = 0>           \
    constexpr explicit operator T() const {                                                      \
      return static_cast<T>(metal::detail::FROM_BITS(mf_bits));                                  \
    }                                                                                            \
    constexpr NAME operator+() const { return *this; }                                           \
    constexpr NAME operator-() const { return from_bits(uint16_t(mf_bits ^ 0x8000u)); }          \
    static constexpr NAME from_bits(uint16_t b) {                                                \
      NAME r{};                                                                                  \
      r.mf_bits = b;                                                                             \
      return r;                                                                                  \
    }                                                                                            \
    template <class X> NAME& operator+=(X b) { return *this = NAME(*this + b); }                 \
    template <class X> NAME& operator-=(X b) { return *this = NAME(*this - b); }                 \
    template <class X> NAME& operator*=(X b) { return *this = NAME(*this * b); }                 \
    template <class X> NAME& operator/=(X b) { return *this = NAME(*this / b); }                 \
    NAME& operator++() { return *this = NAME(float(*this) + 1.0f); }                            \
    NAME& operator--() { return *this = NAME(float(*this) - 1.0f); }                            \
    NAME operator++(int) { NAME t = *this; ++*this; return t; }                                  \
    NAME operator--(int) { NAME t = *this; --*this; return t; }                                  \
  };

MF_SIM_F16_CLASS(half, f32_to_f16, f16_to_f32, bfloat)
MF_SIM_F16_CLASS(bfloat, f32_to_bf16, bf16_to_f32, half)
#undef MF_SIM_F16_CLASS

inline half::half(bfloat o) : half(float(o)) {}
inline bfloat::bfloat(half o) : bfloat(float(o)) {}

// MSL's literal suffixes: 1.0h / 2h (half), 1.0bf (bfloat).  Global, so every scope finds them.
constexpr half operator""h(long double v) { return half(float(v)); }
constexpr half operator""h(unsigned long long v) { return half(float(v)); }
constexpr half operator""H(long double v) { return half(float(v)); }
constexpr bfloat operator""bf(long double v) { return bfloat(float(v)); }
constexpr bfloat operator""bf(unsigned long long v) { return bfloat(float(v)); }

// Binary operators with MSL's result types (see f16_arith): both operands are converted to the
// result type, the operation is done in float and rounded once to the result type. (float has
// more than 2p+2 bits for p = 11 and p = 8, so this equals a correctly rounded 16-bit op.)
#define MF_SIM_F16_ARITH(OP)                                                                     \
  template <class H, class X, class R = typename metal::detail::f16_arith<H, X>::type,           \
            std::enable_if_t<metal::detail::is_f16<H>::value, int> = 0>                          \
  constexpr R operator OP(H a, X b) {                                                            \
    return R(float(R(a)) OP float(R(b)));                                                        \
  }                                                                                              \
  template <class X, class H, class R = typename metal::detail::f16_arith<H, X>::type,           \
            std::enable_if_t<metal::detail::is_f16<H>::value &&                                  \
                                 !metal::detail::is_f16<X>::value, int> = 0>                     \
  constexpr R operator OP(X a, H b) {                                                            \
    return R(float(R(a)) OP float(R(b)));                                                        \
  }
#define MF_SIM_F16_COMPARE(OP)                                                                   \
  template <class H, class X, class R = typename metal::detail::f16_arith<H, X>::type,           \
            std::enable_if_t<metal::detail::is_f16<H>::value, int> = 0>                          \
  constexpr bool operator OP(H a, X b) {                                                         \
    return float(R(a)) OP float(R(b));                                                           \
  }                                                                                              \
  template <class X, class H, class R = typename metal::detail::f16_arith<H, X>::type,           \
            std::enable_if_t<metal::detail::is_f16<H>::value &&                                  \
                                 !metal::detail::is_f16<X>::value, int> = 0>                     \
  constexpr bool operator OP(X a, H b) {                                                         \
    return float(R(a)) OP float(R(b));                                                           \
  }
MF_SIM_F16_ARITH(+)
MF_SIM_F16_ARITH(-)
MF_SIM_F16_ARITH(*)
MF_SIM_F16_ARITH(/)
MF_SIM_F16_COMPARE(==)
MF_SIM_F16_COMPARE(!=)
MF_SIM_F16_COMPARE(<)
MF_SIM_F16_COMPARE(>)
MF_SIM_F16_COMPARE(<=)
MF_SIM_F16_COMPARE(>=)
#undef MF_SIM_F16_ARITH
#undef MF_SIM_F16_COMPARE

// Compound assignment of a half/bfloat into a plain arithmetic variable (`float acc; acc += h;`):
// the conversion to float is a template, which C++'s built-in operators do not consider.
#define MF_SIM_F16_COMPOUND(OP)                                                                  \
  template <class A, class H,                                                                    \
            std::enable_if_t<metal::detail::is_plain_arith_v<A> && metal::detail::is_f16<H>::value, \
                             int> = 0>                                                           \
  constexpr A& operator OP##=(A& a, H b) { return a = static_cast<A>(a OP b); }
MF_SIM_F16_COMPOUND(+)
MF_SIM_F16_COMPOUND(-)
MF_SIM_F16_COMPOUND(*)
MF_SIM_F16_COMPOUND(/)
#undef MF_SIM_F16_COMPOUND

namespace metal {
using ::bfloat;
using ::half;
using ::uchar;
using ::uint;
using ::ulong;
using ::ushort;
}  // namespace metal

#endif  // MF_SIM_SCALAR_H
