// metalforge.sim — <metal_pack>: the pack/unpack functions of normalised integers (MSL spec,
// "Pack and Unpack Functions"), with the spec's conversion rules: unorm = clamp(f, 0, 1) * max
// and snorm = clamp(f, -1, 1) * max, rounded to nearest even (NaN packs to 0); unpack divides
// by max (snorm clamped to -1).  Component 0 is in the lowest bits.  Not provided: the sRGB and
// 565 forms.
#ifndef MF_SIM_PACK_H
#define MF_SIM_PACK_H

#include "vec.h"

namespace metal {
namespace detail {
MF_INLINE uint mf_pack_unorm(float f, float mx) {
  return uint(__builtin_rintf(__builtin_fminf(__builtin_fmaxf(f * mx, 0.0f), mx)));
}
MF_INLINE uint mf_pack_snorm(float f, float mx, uint mask) {
  if (f != f) return 0u;
  return uint(int(__builtin_rintf(__builtin_fminf(__builtin_fmaxf(f * mx, -mx), mx)))) & mask;
}
MF_INLINE float mf_unpack_snorm(uint bits, int width, float mx) {
  const int v = int(bits << (32 - width)) >> (32 - width);   // sign-extend
  return __builtin_fmaxf(float(v) / mx, -1.0f);
}
}  // namespace detail

MF_INLINE uint pack_float_to_unorm4x8(float4 v) {
  uint r = 0;
  for (int i = 0; i < 4; ++i) r |= detail::mf_pack_unorm(v[i], 255.0f) << (8 * i);
  return r;
}
MF_INLINE uint pack_float_to_snorm4x8(float4 v) {
  uint r = 0;
  for (int i = 0; i < 4; ++i) r |= detail::mf_pack_snorm(v[i], 127.0f, 0xffu) << (8 * i);
  return r;
}
MF_INLINE uint pack_float_to_unorm2x16(float2 v) {
  return detail::mf_pack_unorm(v[0], 65535.0f) | detail::mf_pack_unorm(v[1], 65535.0f) << 16;
}
MF_INLINE uint pack_float_to_snorm2x16(float2 v) {
  return detail::mf_pack_snorm(v[0], 32767.0f, 0xffffu) |
         detail::mf_pack_snorm(v[1], 32767.0f, 0xffffu) << 16;
}
MF_INLINE uint pack_float_to_unorm10a2(float4 v) {
  return detail::mf_pack_unorm(v[0], 1023.0f) | detail::mf_pack_unorm(v[1], 1023.0f) << 10 |
         detail::mf_pack_unorm(v[2], 1023.0f) << 20 | detail::mf_pack_unorm(v[3], 3.0f) << 30;
}
MF_INLINE float4 unpack_unorm4x8_to_float(uint x) {
  return float4(float(x & 0xffu), float(x >> 8 & 0xffu), float(x >> 16 & 0xffu),
                float(x >> 24)) / 255.0f;
}
MF_INLINE float4 unpack_snorm4x8_to_float(uint x) {
  return float4(detail::mf_unpack_snorm(x, 8, 127.0f), detail::mf_unpack_snorm(x >> 8, 8, 127.0f),
                detail::mf_unpack_snorm(x >> 16, 8, 127.0f),
                detail::mf_unpack_snorm(x >> 24, 8, 127.0f));
}
MF_INLINE float2 unpack_unorm2x16_to_float(uint x) {
  return float2(float(x & 0xffffu), float(x >> 16)) / 65535.0f;
}
MF_INLINE float2 unpack_snorm2x16_to_float(uint x) {
  return float2(detail::mf_unpack_snorm(x, 16, 32767.0f),
                detail::mf_unpack_snorm(x >> 16, 16, 32767.0f));
}
MF_INLINE float4 unpack_unorm10a2_to_float(uint x) {
  return float4(float(x & 0x3ffu) / 1023.0f, float(x >> 10 & 0x3ffu) / 1023.0f,
                float(x >> 20 & 0x3ffu) / 1023.0f, float(x >> 30) / 3.0f);
}
// The half forms: the same through float.
MF_INLINE uint pack_half_to_unorm4x8(half4 v) { return pack_float_to_unorm4x8(float4(v)); }
MF_INLINE uint pack_half_to_snorm4x8(half4 v) { return pack_float_to_snorm4x8(float4(v)); }
MF_INLINE uint pack_half_to_unorm2x16(half2 v) { return pack_float_to_unorm2x16(float2(v)); }
MF_INLINE uint pack_half_to_snorm2x16(half2 v) { return pack_float_to_snorm2x16(float2(v)); }
MF_INLINE uint pack_half_to_unorm10a2(half4 v) { return pack_float_to_unorm10a2(float4(v)); }
MF_INLINE half4 unpack_unorm4x8_to_half(uint x) { return half4(unpack_unorm4x8_to_float(x)); }
MF_INLINE half4 unpack_snorm4x8_to_half(uint x) { return half4(unpack_snorm4x8_to_float(x)); }
MF_INLINE half2 unpack_unorm2x16_to_half(uint x) { return half2(unpack_unorm2x16_to_float(x)); }
MF_INLINE half2 unpack_snorm2x16_to_half(uint x) { return half2(unpack_snorm2x16_to_float(x)); }
MF_INLINE half4 unpack_unorm10a2_to_half(uint x) { return half4(unpack_unorm10a2_to_float(x)); }
// sRGB (MSL spec, "Pack and Unpack Functions"): r, g, b go through the linear->sRGB curve after
// NaN -> 0 and a clamp to [0, 1], alpha stays linear; then round-to-nearest unorm8.
namespace detail {
MF_INLINE float mf_linear_to_srgb(float c) {
  if (c != c) c = 0.0f;
  if (c >= 1.0f) return 1.0f;
  if (c <= 0.0f) return 0.0f;
  if (c < 0.0031308f) return 12.92f * c;
  return 1.055f * __builtin_powf(c, 1.0f / 2.4f) - 0.055f;
}
MF_INLINE float mf_srgb_to_linear(float c) {
  return c <= 0.04045f ? c / 12.92f : __builtin_powf((c + 0.055f) / 1.055f, 2.4f);
}
}  // namespace detail
MF_INLINE uint pack_float_to_srgb_unorm4x8(float4 v) {
  return pack_float_to_unorm4x8(float4(detail::mf_linear_to_srgb(v[0]),
                                       detail::mf_linear_to_srgb(v[1]),
                                       detail::mf_linear_to_srgb(v[2]), v[3]));
}
MF_INLINE float4 unpack_unorm4x8_srgb_to_float(uint x) {
  const float4 c = unpack_unorm4x8_to_float(x);
  return float4(detail::mf_srgb_to_linear(c[0]), detail::mf_srgb_to_linear(c[1]),
                detail::mf_srgb_to_linear(c[2]), c[3]);
}
MF_INLINE uint pack_half_to_srgb_unorm4x8(half4 v) { return pack_float_to_srgb_unorm4x8(float4(v)); }
MF_INLINE half4 unpack_unorm4x8_srgb_to_half(uint x) {
  return half4(unpack_unorm4x8_srgb_to_float(x));
}
// 565: x in bits 0-4, y in bits 5-10, z in bits 11-15; round to nearest, clamped to [0, 1].
MF_INLINE ushort pack_float_to_unorm565(float3 v) {
  return ushort(detail::mf_pack_unorm(v[0], 31.0f) | detail::mf_pack_unorm(v[1], 63.0f) << 5 |
                detail::mf_pack_unorm(v[2], 31.0f) << 11);
}
MF_INLINE float3 unpack_unorm565_to_float(ushort x) {
  return float3(float(x & 0x1fu) / 31.0f, float(x >> 5 & 0x3fu) / 63.0f, float(x >> 11 & 0x1fu) / 31.0f);
}
MF_INLINE ushort pack_half_to_unorm565(half3 v) { return pack_float_to_unorm565(float3(v)); }
MF_INLINE half3 unpack_unorm565_to_half(ushort x) { return half3(unpack_unorm565_to_float(x)); }
}  // namespace metal

#endif  // MF_SIM_PACK_H
