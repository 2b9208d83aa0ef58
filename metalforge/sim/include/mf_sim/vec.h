// metalforge.sim — metal::vec<T, N> (N = 2, 3, 4) and the global typedefs float4, uint3, ...
//
// Layout follows MSL: a vector is aligned to its size, and a 3-vector is stored (and aligned)
// like a 4-vector (sizeof(float3) == 16). vec is a struct (so `typename metal::vec<T, N>` names
// it, as MLX's steel attention does) whose anonymous union makes .x/.y/.z/.w, .r/.g/.b/.a, the
// element array and the swizzle members (v.xy, v.zyx, ...) share storage; all of them are
// trivial, so every vector type is trivially copyable.
#ifndef MF_SIM_VEC_H
#define MF_SIM_VEC_H

#include "scalar.h"

namespace metal {

template <class T, int N> struct vec;
template <class T, int S, int... I> struct swizzle;

namespace detail {

// Scalars of MSL: arithmetic types plus half and bfloat.
template <class X>
constexpr bool is_scalar_v = std::is_arithmetic<X>::value || is_f16<X>::value;

// Vector-likes: vec<T, N> and swizzle proxies. elem / size describe the vector they stand for.
template <class X> struct vinfo { static constexpr bool value = false; };
template <class T, int N> struct vinfo<vec<T, N>> {
  static constexpr bool value = true;
  using elem = T;
  static constexpr int size = N;
};
template <class T, int S, int... I> struct vinfo<swizzle<T, S, I...>> {
  static constexpr bool value = true;
  using elem = T;
  static constexpr int size = sizeof...(I);
};
template <class X> constexpr bool is_veclike_v = vinfo<X>::value;

// Element i of a vector-like; a scalar is broadcast after conversion to the element type T
// (MSL converts the scalar operand to the vector's element type: half4 * 2.0f is a half4).
template <class T, class X>
MF_INLINE constexpr T el(const X& x, int i) {
  if constexpr (is_veclike_v<X>) return x.mf_get(i);
  else return T(x);
}

// Result shape of a binary operator: vector∘vector (same element type and length),
// vector∘scalar, scalar∘vector. No entry: the operands do not combine (compile error).
template <class A, class B, class = void> struct vbin {};
template <class A, class B>
struct vbin<A, B,
            std::enable_if_t<is_veclike_v<A> && is_veclike_v<B> &&
                             std::is_same<typename vinfo<A>::elem, typename vinfo<B>::elem>::value &&
                             vinfo<A>::size == vinfo<B>::size>> {
  using elem = typename vinfo<A>::elem;
  static constexpr int size = vinfo<A>::size;
};
template <class A, class B>
struct vbin<A, B, std::enable_if_t<is_veclike_v<A> && is_scalar_v<B>>> {
  using elem = typename vinfo<A>::elem;
  static constexpr int size = vinfo<A>::size;
};
template <class A, class B>
struct vbin<A, B, std::enable_if_t<is_scalar_v<A> && is_veclike_v<B>>> {
  using elem = typename vinfo<B>::elem;
  static constexpr int size = vinfo<B>::size;
};

// Number of elements an argument contributes to a component-wise constructor of vec<T, ...>:
// 1 for a scalar, N for a vector-like with element type T; anything else can't be used.
template <class T, class X, class = void> struct ncomp { static constexpr int value = -100; };
template <class T, class X>
struct ncomp<T, X, std::enable_if_t<is_scalar_v<X>>> { static constexpr int value = 1; };
template <class T, class X>
struct ncomp<T, X, std::enable_if_t<is_veclike_v<X> && std::is_same<typename vinfo<X>::elem, T>::value>> {
  static constexpr int value = vinfo<X>::size;
};
template <class T, class... A> constexpr int ncomp_sum = (ncomp<T, A>::value + ...);

template <class T, class X>
MF_INLINE constexpr void put(T* e, int& k, const X& x) {
  if constexpr (is_veclike_v<X>) {
    for (int i = 0; i < vinfo<X>::size; ++i) e[k++] = x.mf_get(i);
  } else {
    e[k++] = T(x);
  }
}

template <int... I> constexpr bool distinct() {
  constexpr int idx[] = {I...};
  for (unsigned i = 0; i < sizeof...(I); ++i)
    for (unsigned j = i + 1; j < sizeof...(I); ++j)
      if (idx[i] == idx[j]) return false;
  return true;
}

}  // namespace detail

// The proxy behind a swizzle member such as v.zyx: it overlays the vector's storage and reads
// (or, when no component repeats, writes) the selected components. It converts implicitly to
// vec<T, sizeof...(I)> and works with every vector operator. It cannot be copied on its own
// (`auto a = v.xy;` does not compile: write `float2 a = v.xy;`), which also rejects
// `v.xy = w.xy` between proxies of the same kind (write `v.xy = float2(w.xy);`).
template <class T, int S, int... I>
struct swizzle {
  T mf_e[S];
  using vec_type = vec<T, int(sizeof...(I))>;

  MF_INLINE constexpr T mf_get(int i) const {
    constexpr int idx[] = {I...};
    return mf_e[idx[i]];
  }
  MF_INLINE constexpr operator vec_type() const { return vec_type(mf_e[I]...); }
  template <int... J> MF_INLINE constexpr const vec<T, int(sizeof...(J))> mf_swz() const {
    static_assert(((J < int(sizeof...(I))) && ...), "swizzle component out of range");
    return vec_type(*this).template mf_swz<J...>();
  }

  template <class B>
  MF_INLINE swizzle& operator=(const B& b) {
    static_assert(detail::distinct<I...>(), "cannot assign to a swizzle with repeated components");
    const vec_type t = b;
    int k = 0;
    ((mf_e[I] = t.mf_e[k++]), ...);
    return *this;
  }
  template <class B> MF_INLINE swizzle& operator+=(const B& b) { return *this = vec_type(*this) + b; }
  template <class B> MF_INLINE swizzle& operator-=(const B& b) { return *this = vec_type(*this) - b; }
  template <class B> MF_INLINE swizzle& operator*=(const B& b) { return *this = vec_type(*this) * b; }
  template <class B> MF_INLINE swizzle& operator/=(const B& b) { return *this = vec_type(*this) / b; }

 private:
  template <class, int> friend struct vec;
  swizzle() = default;
  swizzle(const swizzle&) = default;
  swizzle& operator=(const swizzle&) = default;
};

// Members shared by vec<T, 2>, vec<T, 3> and vec<T, 4>.
#define MF_SIM_VEC_COMMON(N)                                                                     \
  using value_type = T;                                                                          \
  vec() = default;                                                                               \
  /* Broadcast a scalar (implicit, as MSL's `float4 v = 0.0f;`). */                             \
  template <class S_, std::enable_if_t<detail::is_scalar_v<S_>, int> = 0>                        \
  MF_INLINE constexpr vec(S_ s) : mf_e{} {                                                       \
    for (int i = 0; i < N; ++i) mf_e[i] = T(s);                                                  \
  }                                                                                              \
  /* Components from scalars and vectors of T adding up to N: float4(a.xy, 0, 1). */             \
  template <class A0_, class A1_, class... A_,                                                   \
            std::enable_if_t<detail::ncomp_sum<T, A0_, A1_, A_...> == N, int> = 0>               \
  MF_INLINE constexpr vec(const A0_& a0, const A1_& a1, const A_&... a) : mf_e{} {              \
    int k = 0;                                                                                   \
    detail::put(mf_e, k, a0);                                                                    \
    detail::put(mf_e, k, a1);                                                                    \
    (detail::put(mf_e, k, a), ...);                                                              \
  }                                                                                              \
  /* Element type conversion is explicit, as in MSL: float4(h4), ushort3(gid). */                \
  template <class U_, std::enable_if_t<!std::is_same<U_, T>::value, int> = 0>                    \
  MF_INLINE constexpr explicit vec(const vec<U_, N>& o) : mf_e{} {                               \
    for (int i = 0; i < N; ++i) mf_e[i] = T(o.mf_e[i]);                                          \
  }                                                                                              \
  template <class U_, int S_, int... I_,                                                         \
            std::enable_if_t<!std::is_same<U_, T>::value && sizeof...(I_) == N, int> = 0>        \
  MF_INLINE constexpr explicit vec(const swizzle<U_, S_, I_...>& o) : vec(vec<U_, N>(o)) {}      \
  MF_INLINE constexpr T& operator[](int i) { return mf_e[MF_CHECKED(i, N)]; }                                \
  MF_INLINE constexpr const T& operator[](int i) const { return mf_e[MF_CHECKED(i, N)]; }                    \
  MF_INLINE constexpr T mf_get(int i) const { return mf_e[MF_CHECKED(i, N)]; }                               \
  /* v.xxyy, read only: the rewrite in swizzle.py calls this (const: a write does not compile) */ \
  template <int... J_> MF_INLINE constexpr const vec<T, int(sizeof...(J_))> mf_swz() const {      \
    static_assert(((J_ < N) && ...), "swizzle component out of range for this vector");        \
    return vec<T, int(sizeof...(J_))>(mf_e[J_]...);                                              \
  }                                                                                              \
  template <class B_> MF_INLINE vec& operator+=(const B_& b) { return *this = *this + b; }       \
  template <class B_> MF_INLINE vec& operator-=(const B_& b) { return *this = *this - b; }       \
  template <class B_> MF_INLINE vec& operator*=(const B_& b) { return *this = *this * b; }       \
  template <class B_> MF_INLINE vec& operator/=(const B_& b) { return *this = *this / b; }       \
  template <class B_> MF_INLINE vec& operator%=(const B_& b) { return *this = *this % b; }       \
  template <class B_> MF_INLINE vec& operator&=(const B_& b) { return *this = *this & b; }       \
  template <class B_> MF_INLINE vec& operator|=(const B_& b) { return *this = *this | b; }       \
  template <class B_> MF_INLINE vec& operator^=(const B_& b) { return *this = *this ^ b; }       \
  template <class B_> MF_INLINE vec& operator<<=(const B_& b) { return *this = *this << b; }     \
  template <class B_> MF_INLINE vec& operator>>=(const B_& b) { return *this = *this >> b; }     \
  MF_INLINE vec& operator++() { return *this += T(1); }                                          \
  MF_INLINE vec& operator--() { return *this -= T(1); }                                          \
  MF_INLINE vec operator++(int) { vec t = *this; *this += T(1); return t; }                      \
  MF_INLINE vec operator--(int) { vec t = *this; *this -= T(1); return t; }

// Anonymous structs in unions are a GNU/clang extension, used here (and in packed.h) for
// .x/.y/.z/.w: MF_SIM_ANONYMOUS_BEGIN ... MF_SIM_ANONYMOUS_END around the types that use them.
#ifdef __clang__
#define MF_SIM_ANONYMOUS_BEGIN                                                      \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wpedantic\"") \
  _Pragma("clang diagnostic ignored \"-Wgnu-anonymous-struct\"")                   \
  _Pragma("clang diagnostic ignored \"-Wnested-anon-types\"")
#else
#define MF_SIM_ANONYMOUS_BEGIN \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wpedantic\"")
#endif
#define MF_SIM_ANONYMOUS_END _Pragma("GCC diagnostic pop")
MF_SIM_ANONYMOUS_BEGIN

// The swizzles of x, y, z without a repeated component (3P2 + 3P3), in both spellings, over
// 4 stored elements (vec<T, 3> is padded to 4): members of vec<T, 3> and vec<T, 4>.
#define MF_SIM_SWIZZLES_XYZ                                                                      \
  swizzle<T, 4, 0, 1> xy, rg;                                                                    \
  swizzle<T, 4, 0, 2> xz, rb;                                                                    \
  swizzle<T, 4, 1, 0> yx, gr;                                                                    \
  swizzle<T, 4, 1, 2> yz, gb;                                                                    \
  swizzle<T, 4, 2, 0> zx, br;                                                                    \
  swizzle<T, 4, 2, 1> zy, bg;                                                                    \
  swizzle<T, 4, 0, 1, 2> xyz, rgb;                                                               \
  swizzle<T, 4, 0, 2, 1> xzy, rbg;                                                               \
  swizzle<T, 4, 1, 0, 2> yxz, grb;                                                               \
  swizzle<T, 4, 1, 2, 0> yzx, gbr;                                                               \
  swizzle<T, 4, 2, 0, 1> zxy, brg;                                                               \
  swizzle<T, 4, 2, 1, 0> zyx, bgr;

template <class T>
struct alignas(2 * sizeof(T)) vec<T, 2> {
  union {
    T mf_e[2];
    struct { T x, y; };
    struct { T r, g; };
    swizzle<T, 2, 0, 1> xy, rg;
    swizzle<T, 2, 1, 0> yx, gr;
    swizzle<T, 2, 0, 0> xx, rr;
    swizzle<T, 2, 1, 1> yy, gg;
  };
  MF_SIM_VEC_COMMON(2)
};

template <class T>
struct alignas(4 * sizeof(T)) vec<T, 3> {
  union {
    T mf_e[4];  // the 4th element is padding, as in MSL
    struct { T x, y, z; };
    struct { T r, g, b; };
    MF_SIM_SWIZZLES_XYZ  // every swizzle without a repeated component (3P2 + 3P3)
  };
  MF_SIM_VEC_COMMON(3)
};

template <class T>
struct alignas(4 * sizeof(T)) vec<T, 4> {
  union {
    T mf_e[4];
    struct { T x, y, z, w; };
    struct { T r, g, b, a; };
    // every swizzle without a repeated component (4P2 + ... + 4P4): those of x, y, z, then
    // those with w
    MF_SIM_SWIZZLES_XYZ
    swizzle<T, 4, 0, 3> xw, ra;
    swizzle<T, 4, 1, 3> yw, ga;
    swizzle<T, 4, 2, 3> zw, ba;
    swizzle<T, 4, 3, 0> wx, ar;
    swizzle<T, 4, 3, 1> wy, ag;
    swizzle<T, 4, 3, 2> wz, ab;
    swizzle<T, 4, 0, 1, 3> xyw, rga;
    swizzle<T, 4, 0, 2, 3> xzw, rba;
    swizzle<T, 4, 0, 3, 1> xwy, rag;
    swizzle<T, 4, 0, 3, 2> xwz, rab;
    swizzle<T, 4, 1, 0, 3> yxw, gra;
    swizzle<T, 4, 1, 2, 3> yzw, gba;
    swizzle<T, 4, 1, 3, 0> ywx, gar;
    swizzle<T, 4, 1, 3, 2> ywz, gab;
    swizzle<T, 4, 2, 0, 3> zxw, bra;
    swizzle<T, 4, 2, 1, 3> zyw, bga;
    swizzle<T, 4, 2, 3, 0> zwx, bar;
    swizzle<T, 4, 2, 3, 1> zwy, bag;
    swizzle<T, 4, 3, 0, 1> wxy, arg;
    swizzle<T, 4, 3, 0, 2> wxz, arb;
    swizzle<T, 4, 3, 1, 0> wyx, agr;
    swizzle<T, 4, 3, 1, 2> wyz, agb;
    swizzle<T, 4, 3, 2, 0> wzx, abr;
    swizzle<T, 4, 3, 2, 1> wzy, abg;
    swizzle<T, 4, 0, 1, 2, 3> xyzw, rgba;
    swizzle<T, 4, 0, 1, 3, 2> xywz, rgab;
    swizzle<T, 4, 0, 2, 1, 3> xzyw, rbga;
    swizzle<T, 4, 0, 2, 3, 1> xzwy, rbag;
    swizzle<T, 4, 0, 3, 1, 2> xwyz, ragb;
    swizzle<T, 4, 0, 3, 2, 1> xwzy, rabg;
    swizzle<T, 4, 1, 0, 2, 3> yxzw, grba;
    swizzle<T, 4, 1, 0, 3, 2> yxwz, grab;
    swizzle<T, 4, 1, 2, 0, 3> yzxw, gbra;
    swizzle<T, 4, 1, 2, 3, 0> yzwx, gbar;
    swizzle<T, 4, 1, 3, 0, 2> ywxz, garb;
    swizzle<T, 4, 1, 3, 2, 0> ywzx, gabr;
    swizzle<T, 4, 2, 0, 1, 3> zxyw, brga;
    swizzle<T, 4, 2, 0, 3, 1> zxwy, brag;
    swizzle<T, 4, 2, 1, 0, 3> zyxw, bgra;
    swizzle<T, 4, 2, 1, 3, 0> zywx, bgar;
    swizzle<T, 4, 2, 3, 0, 1> zwxy, barg;
    swizzle<T, 4, 2, 3, 1, 0> zwyx, bagr;
    swizzle<T, 4, 3, 0, 1, 2> wxyz, argb;
    swizzle<T, 4, 3, 0, 2, 1> wxzy, arbg;
    swizzle<T, 4, 3, 1, 0, 2> wyxz, agrb;
    swizzle<T, 4, 3, 1, 2, 0> wyzx, agbr;
    swizzle<T, 4, 3, 2, 0, 1> wzxy, abrg;
    swizzle<T, 4, 3, 2, 1, 0> wzyx, abgr;
  };
  MF_SIM_VEC_COMMON(4)
};

// Longer vectors: Metal's vec<T, N> is clang's ext_vector_type, which takes other lengths too;
// MLX's NAX fragments (steel/gemm/nax.h) are vec<T, 8>.  Elements and operators only (no
// .x ... or swizzle members); aligned to their size, as ext_vector_type is.
template <class T>
struct alignas(8 * sizeof(T)) vec<T, 8> {
  T mf_e[8];
  MF_SIM_VEC_COMMON(8)
};
template <class T>
struct alignas(16 * sizeof(T)) vec<T, 16> {
  T mf_e[16];
  MF_SIM_VEC_COMMON(16)
};

MF_SIM_ANONYMOUS_END
#undef MF_SIM_VEC_COMMON
#undef MF_SIM_SWIZZLES_XYZ

// ---- operators (found by argument-dependent lookup on vec and swizzle) ----------------------

#define MF_SIM_VEC_BINOP(OP)                                                                     \
  template <class A, class B, class V = detail::vbin<A, B>>                                      \
  MF_INLINE constexpr vec<typename V::elem, V::size> operator OP(const A& a, const B& b) {       \
    using E = typename V::elem;                                                                  \
    vec<E, V::size> r{};                                                                         \
    for (int i = 0; i < V::size; ++i) r.mf_e[i] = E(detail::el<E>(a, i) OP detail::el<E>(b, i)); \
    return r;                                                                                    \
  }
#define MF_SIM_VEC_CMPOP(OP)                                                                     \
  template <class A, class B, class V = detail::vbin<A, B>>                                      \
  MF_INLINE constexpr vec<bool, V::size> operator OP(const A& a, const B& b) {                   \
    using E = typename V::elem;                                                                  \
    vec<bool, V::size> r{};                                                                      \
    for (int i = 0; i < V::size; ++i) r.mf_e[i] = detail::el<E>(a, i) OP detail::el<E>(b, i);   \
    return r;                                                                                    \
  }
MF_SIM_VEC_BINOP(+)
MF_SIM_VEC_BINOP(-)
MF_SIM_VEC_BINOP(*)
MF_SIM_VEC_BINOP(/)
MF_SIM_VEC_BINOP(%)
MF_SIM_VEC_BINOP(&)
MF_SIM_VEC_BINOP(|)
MF_SIM_VEC_BINOP(^)
MF_SIM_VEC_BINOP(<<)
MF_SIM_VEC_BINOP(>>)
MF_SIM_VEC_CMPOP(==)
MF_SIM_VEC_CMPOP(!=)
MF_SIM_VEC_CMPOP(<)
MF_SIM_VEC_CMPOP(>)
MF_SIM_VEC_CMPOP(<=)
MF_SIM_VEC_CMPOP(>=)
MF_SIM_VEC_CMPOP(&&)  // element-wise, both sides evaluated (as for vectors in MSL)
MF_SIM_VEC_CMPOP(||)
#undef MF_SIM_VEC_BINOP
#undef MF_SIM_VEC_CMPOP

#define MF_SIM_VEC_UNOP(OP, BOOL_RESULT)                                                         \
  template <class A, std::enable_if_t<detail::is_veclike_v<A>, int> = 0,                         \
            class R = std::conditional_t<BOOL_RESULT, bool, typename detail::vinfo<A>::elem>>    \
  MF_INLINE constexpr vec<R, detail::vinfo<A>::size> operator OP(const A& a) {                   \
    vec<R, detail::vinfo<A>::size> r{};                                                          \
    for (int i = 0; i < detail::vinfo<A>::size; ++i) r.mf_e[i] = R(OP a.mf_get(i));              \
    return r;                                                                                    \
  }
MF_SIM_VEC_UNOP(-, false)
MF_SIM_VEC_UNOP(+, false)
MF_SIM_VEC_UNOP(~, false)
MF_SIM_VEC_UNOP(!, true)
#undef MF_SIM_VEC_UNOP

// ---- typedefs: float4, half2, uint3, ... (global, and in namespace metal) -------------------

#define MF_SIM_VEC_TYPEDEFS(T, NAME)                                                             \
  typedef vec<T, 2> NAME##2;                                                                     \
  typedef vec<T, 3> NAME##3;                                                                     \
  typedef vec<T, 4> NAME##4;
MF_SIM_VEC_TYPEDEFS(bool, bool)
MF_SIM_VEC_TYPEDEFS(char, char)
MF_SIM_VEC_TYPEDEFS(uchar, uchar)
MF_SIM_VEC_TYPEDEFS(short, short)
MF_SIM_VEC_TYPEDEFS(ushort, ushort)
MF_SIM_VEC_TYPEDEFS(int, int)
MF_SIM_VEC_TYPEDEFS(uint, uint)
MF_SIM_VEC_TYPEDEFS(long, long)
MF_SIM_VEC_TYPEDEFS(ulong, ulong)
MF_SIM_VEC_TYPEDEFS(half, half)
MF_SIM_VEC_TYPEDEFS(bfloat, bfloat)
MF_SIM_VEC_TYPEDEFS(float, float)
#undef MF_SIM_VEC_TYPEDEFS

}  // namespace metal

#define MF_SIM_VEC_USING(NAME) using metal::NAME##2; using metal::NAME##3; using metal::NAME##4;
MF_SIM_VEC_USING(bool)
MF_SIM_VEC_USING(char)
MF_SIM_VEC_USING(uchar)
MF_SIM_VEC_USING(short)
MF_SIM_VEC_USING(ushort)
MF_SIM_VEC_USING(int)
MF_SIM_VEC_USING(uint)
MF_SIM_VEC_USING(long)
MF_SIM_VEC_USING(ulong)
MF_SIM_VEC_USING(half)
MF_SIM_VEC_USING(bfloat)
MF_SIM_VEC_USING(float)
#undef MF_SIM_VEC_USING

#endif  // MF_SIM_VEC_H
