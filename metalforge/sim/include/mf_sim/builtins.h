// metalforge.sim — the compiler intrinsics behind Metal's library (`__metal_fabs(x, fast)`,
// `__metal_simd_sum(x)`, ...), for code that calls them directly, as MLX's bf16_math.h does to
// define its bfloat overloads.  Each forwards to the metal:: function of the same name; the
// trailing fast-math flag is accepted and ignored (the simulator has one precision).
#ifndef MF_SIM_BUILTINS_H
#define MF_SIM_BUILTINS_H

#include "math.h"
#include "simd.h"

#define __METAL_FAST_MATH__ 1
#define __METAL_PRECISE_MATH__ 0
#define __METAL_MAYBE_FAST_MATH__ __METAL_PRECISE_MATH__

#define MF_SIM_INTRINSIC(NAME)                                             \
  template <class... A>                                                    \
  MF_INLINE auto __metal_##NAME(A... a) {                                  \
    return mf_intrinsic_call(                                      \
        [](auto... x) -> decltype(::metal::NAME(x...)) { return ::metal::NAME(x...); }, a...); \
  }

template <class F, class Tup, size_t... I>
MF_INLINE auto mf_intrinsic_drop_last(F f, std::index_sequence<I...>, Tup t) {
  return f(std::get<I>(t)...);
}
// Drop the trailing fast-math flag (an int) when the function takes fewer arguments.
template <class F, class... A>
MF_INLINE auto mf_intrinsic_call(F f, A... a) {
  if constexpr (std::is_invocable<F, A...>::value) {
    return f(a...);
  } else {
    return mf_intrinsic_drop_last(f, std::make_index_sequence<sizeof...(A) - 1>{},
                                  std::forward_as_tuple(a...));
  }
}

MF_SIM_INTRINSIC(fabs) MF_SIM_INTRINSIC(acos) MF_SIM_INTRINSIC(acosh) MF_SIM_INTRINSIC(asin)
MF_SIM_INTRINSIC(asinh) MF_SIM_INTRINSIC(atan) MF_SIM_INTRINSIC(atan2) MF_SIM_INTRINSIC(atanh)
MF_SIM_INTRINSIC(ceil) MF_SIM_INTRINSIC(cos) MF_SIM_INTRINSIC(cosh) MF_SIM_INTRINSIC(cospi)
MF_SIM_INTRINSIC(divide) MF_SIM_INTRINSIC(exp) MF_SIM_INTRINSIC(exp10) MF_SIM_INTRINSIC(exp2)
MF_SIM_INTRINSIC(fdim) MF_SIM_INTRINSIC(floor) MF_SIM_INTRINSIC(fma) MF_SIM_INTRINSIC(fmax)
MF_SIM_INTRINSIC(fmax3) MF_SIM_INTRINSIC(fmedian3) MF_SIM_INTRINSIC(fmin) MF_SIM_INTRINSIC(fmin3)
MF_SIM_INTRINSIC(fmod) MF_SIM_INTRINSIC(fract) MF_SIM_INTRINSIC(log) MF_SIM_INTRINSIC(log10)
MF_SIM_INTRINSIC(log2) MF_SIM_INTRINSIC(nextafter) MF_SIM_INTRINSIC(pow) MF_SIM_INTRINSIC(powr)
MF_SIM_INTRINSIC(rint) MF_SIM_INTRINSIC(round) MF_SIM_INTRINSIC(rsqrt) MF_SIM_INTRINSIC(sin)
MF_SIM_INTRINSIC(sinh) MF_SIM_INTRINSIC(sinpi) MF_SIM_INTRINSIC(sqrt) MF_SIM_INTRINSIC(tan)
MF_SIM_INTRINSIC(tanh) MF_SIM_INTRINSIC(tanpi) MF_SIM_INTRINSIC(trunc)
MF_SIM_INTRINSIC(ldexp)
MF_SIM_INTRINSIC(simd_broadcast) MF_SIM_INTRINSIC(simd_shuffle)
MF_SIM_INTRINSIC(simd_shuffle_and_fill_down) MF_SIM_INTRINSIC(simd_shuffle_and_fill_up)
MF_SIM_INTRINSIC(simd_shuffle_down) MF_SIM_INTRINSIC(simd_shuffle_up)
MF_SIM_INTRINSIC(simd_shuffle_rotate_down) MF_SIM_INTRINSIC(simd_shuffle_rotate_up)
MF_SIM_INTRINSIC(simd_shuffle_xor) MF_SIM_INTRINSIC(simd_max) MF_SIM_INTRINSIC(simd_min)
MF_SIM_INTRINSIC(simd_prefix_exclusive_product) MF_SIM_INTRINSIC(simd_prefix_exclusive_sum)
MF_SIM_INTRINSIC(simd_prefix_inclusive_product) MF_SIM_INTRINSIC(simd_prefix_inclusive_sum)
MF_SIM_INTRINSIC(simd_product) MF_SIM_INTRINSIC(simd_sum)
#undef MF_SIM_INTRINSIC

// The bitwise reduction on any scalar: on the value's bits (MLX calls it with a float).
template <class T>
MF_INLINE T __metal_simd_xor(T x) {
  if constexpr (std::is_integral<T>::value) {
    return ::metal::simd_xor(x);
  } else {
    using U = std::conditional_t<sizeof(T) == 2, uint16_t,
                                 std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>;
    return __builtin_bit_cast(T, ::metal::simd_xor(__builtin_bit_cast(U, x)));
  }
}
template <class T>
MF_INLINE T __metal_frexp(T x, int* e) { return ::metal::frexp(x, *e); }
template <class T>
MF_INLINE T __metal_get_simdgroup_size(T) { return T(32); }
// The calling thread's lane and simdgroup (MLX's NAX fragments read the lane this way).
template <class T>
MF_INLINE T __metal_get_thread_index_in_simdgroup(T) {
  return T(mf_rt_position()->thread_index_in_simdgroup[0]);
}
template <class T>
MF_INLINE T __metal_get_simdgroup_index_in_threadgroup(T) {
  return T(mf_rt_position()->simdgroup_index_in_threadgroup[0]);
}

#endif  // MF_SIM_BUILTINS_H
