// metalforge.sim — packed vectors (packed_float4, packed_half3, ...) and metal::array.
#ifndef MF_SIM_PACKED_H
#define MF_SIM_PACKED_H

#include "vec.h"

namespace metal {

// packed_T<N>: N elements with the alignment of T and no padding (sizeof(packed_float3) == 12),
// for buffers of tightly packed vectors. Converts implicitly to and from vec<T, N> and works
// with the vector operators (the results are vec<T, N>); .x/.y/.z/.w and [] as for vec.
template <class T, int N> union packed_vec;

MF_SIM_ANONYMOUS_BEGIN  // vec.h
#define MF_SIM_PACKED_COMMON(N)                                                                  \
  using value_type = T;                                                                          \
  packed_vec() = default;                                                                        \
  MF_INLINE constexpr packed_vec(const vec<T, N>& v) : mf_e{} {                                  \
    for (int i = 0; i < N; ++i) mf_e[i] = v.mf_e[i];                                             \
  }                                                                                              \
  template <class A0_, class... A_,                                                              \
            std::enable_if_t<(detail::ncomp_sum<T, A0_, A_...> == N) &&                          \
                                 !std::is_same<A0_, vec<T, N>>::value, int> = 0>                 \
  MF_INLINE constexpr packed_vec(const A0_& a0, const A_&... a)                                  \
      : packed_vec(vec<T, N>(a0, a...)) {}                                                       \
  MF_INLINE constexpr operator vec<T, N>() const {                                               \
    vec<T, N> v{};                                                                               \
    for (int i = 0; i < N; ++i) v.mf_e[i] = mf_e[i];                                             \
    return v;                                                                                    \
  }                                                                                              \
  MF_INLINE constexpr T& operator[](int i) { return mf_e[MF_CHECKED(i, N)]; }                                \
  MF_INLINE constexpr const T& operator[](int i) const { return mf_e[MF_CHECKED(i, N)]; }                    \
  MF_INLINE constexpr T mf_get(int i) const { return mf_e[MF_CHECKED(i, N)]; }                               \
  /* p.xxyy, read only (the rewrite in swizzle.py calls this), as for vec */                     \
  template <int... J_> MF_INLINE constexpr const vec<T, int(sizeof...(J_))> mf_swz() const {      \
    return vec<T, N>(*this).template mf_swz<J_...>();                                            \
  }                                                                                              \
  template <class B_> MF_INLINE packed_vec& operator+=(const B_& b) { return *this = *this + b; } \
  template <class B_> MF_INLINE packed_vec& operator-=(const B_& b) { return *this = *this - b; } \
  template <class B_> MF_INLINE packed_vec& operator*=(const B_& b) { return *this = *this * b; } \
  template <class B_> MF_INLINE packed_vec& operator/=(const B_& b) { return *this = *this / b; }

template <class T> union packed_vec<T, 2> {
  T mf_e[2];
  struct { T x, y; };
  struct { T r, g; };
  MF_SIM_PACKED_COMMON(2)
};
template <class T> union packed_vec<T, 3> {
  T mf_e[3];
  struct { T x, y, z; };
  struct { T r, g, b; };
  MF_SIM_PACKED_COMMON(3)
};
template <class T> union packed_vec<T, 4> {
  T mf_e[4];
  struct { T x, y, z, w; };
  struct { T r, g, b, a; };
  MF_SIM_PACKED_COMMON(4)
};
#undef MF_SIM_PACKED_COMMON
MF_SIM_ANONYMOUS_END

namespace detail {
template <class T, int N> struct vinfo<packed_vec<T, N>> {
  static constexpr bool value = true;
  using elem = T;
  static constexpr int size = N;
};
}  // namespace detail

#define MF_SIM_PACKED_TYPEDEFS(T, NAME)                                                          \
  typedef packed_vec<T, 2> packed_##NAME##2;                                                     \
  typedef packed_vec<T, 3> packed_##NAME##3;                                                     \
  typedef packed_vec<T, 4> packed_##NAME##4;
MF_SIM_PACKED_TYPEDEFS(bool, bool)
MF_SIM_PACKED_TYPEDEFS(char, char)
MF_SIM_PACKED_TYPEDEFS(uchar, uchar)
MF_SIM_PACKED_TYPEDEFS(short, short)
MF_SIM_PACKED_TYPEDEFS(ushort, ushort)
MF_SIM_PACKED_TYPEDEFS(int, int)
MF_SIM_PACKED_TYPEDEFS(uint, uint)
MF_SIM_PACKED_TYPEDEFS(long, long)
MF_SIM_PACKED_TYPEDEFS(ulong, ulong)
MF_SIM_PACKED_TYPEDEFS(half, half)
MF_SIM_PACKED_TYPEDEFS(bfloat, bfloat)
MF_SIM_PACKED_TYPEDEFS(float, float)
#undef MF_SIM_PACKED_TYPEDEFS

// metal::array<T, N>: a fixed-size array with [], size(), begin()/end(); an aggregate, so
// `array<float, 2>{a, b}` works.
template <class T, size_t N>
struct array {
  T mf_e[N];
  using value_type = T;
  MF_INLINE constexpr T& operator[](size_t i) { return mf_e[MF_CHECKED(i, N)]; }
  MF_INLINE constexpr const T& operator[](size_t i) const { return mf_e[MF_CHECKED(i, N)]; }
  static constexpr size_t size() { return N; }
  static constexpr bool empty() { return N == 0; }
  MF_INLINE constexpr T* data() { return mf_e; }
  MF_INLINE constexpr const T* data() const { return mf_e; }
  MF_INLINE constexpr T* begin() { return mf_e; }
  MF_INLINE constexpr T* end() { return mf_e + N; }
  MF_INLINE constexpr const T* begin() const { return mf_e; }
  MF_INLINE constexpr const T* end() const { return mf_e + N; }
  MF_INLINE constexpr T& front() { return mf_e[0]; }
  MF_INLINE constexpr T& back() { return mf_e[N - 1]; }
};

}  // namespace metal

#define MF_SIM_PACKED_USING(NAME)                                                                \
  using metal::packed_##NAME##2;                                                                 \
  using metal::packed_##NAME##3;                                                                 \
  using metal::packed_##NAME##4;
MF_SIM_PACKED_USING(bool)
MF_SIM_PACKED_USING(char)
MF_SIM_PACKED_USING(uchar)
MF_SIM_PACKED_USING(short)
MF_SIM_PACKED_USING(ushort)
MF_SIM_PACKED_USING(int)
MF_SIM_PACKED_USING(uint)
MF_SIM_PACKED_USING(long)
MF_SIM_PACKED_USING(ulong)
MF_SIM_PACKED_USING(half)
MF_SIM_PACKED_USING(bfloat)
MF_SIM_PACKED_USING(float)
#undef MF_SIM_PACKED_USING

#endif  // MF_SIM_PACKED_H
