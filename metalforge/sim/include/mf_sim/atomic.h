// metalforge.sim — Metal atomics: metal::atomic<T>, atomic_int/uint/float/bool and the
// atomic_*_explicit functions. Thread groups run on several OS threads, so these are real
// atomics (GCC/clang __atomic builtins); float add/sub and integer min/max use a CAS loop.
#ifndef MF_SIM_ATOMIC_H
#define MF_SIM_ATOMIC_H

#include "types.h"

namespace metal {

enum memory_order {
  memory_order_relaxed = __ATOMIC_RELAXED,
  memory_order_acquire = __ATOMIC_ACQUIRE,
  memory_order_release = __ATOMIC_RELEASE,
  memory_order_acq_rel = __ATOMIC_ACQ_REL,
  memory_order_seq_cst = __ATOMIC_SEQ_CST,
};

// An atomic object is a T in memory (buffers of int/uint/float are bound as atomic<T>*).
// It is not copyable, as in MSL: it is only used through pointers and references.
template <class T>
struct atomic {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "metal::atomic<T>: T must be 32- or 64-bit");
  T mf_v;
  atomic() = default;
  atomic(const atomic&) = delete;
  atomic& operator=(const atomic&) = delete;
};
// atomic_bool is 4 bytes in MSL (c10/metal/atomic.h relies on it); it holds 0 or 1.
template <>
struct atomic<bool> {
  uint mf_v;
  atomic() = default;
  atomic(const atomic&) = delete;
  atomic& operator=(const atomic&) = delete;
};

typedef atomic<int> atomic_int;
typedef atomic<uint> atomic_uint;
typedef atomic<float> atomic_float;
typedef atomic<bool> atomic_bool;
typedef atomic<ulong> atomic_ulong;
typedef atomic<long> atomic_long;

namespace detail {
template <class T> struct same { using type = T; };
template <class T> using nodeduce_t = typename same<T>::type;
template <class T> struct atomic_rep { using type = T; };
template <> struct atomic_rep<bool> { using type = uint; };

// Generic read-modify-write through compare-and-swap (bitwise, like the hardware).
template <class T, class F>
MF_INLINE T atomic_rmw(volatile T* p, F f) {
  T old;
  __atomic_load(p, &old, __ATOMIC_RELAXED);
  T desired;
  do {
    desired = f(old);
  } while (!__atomic_compare_exchange(p, &old, &desired, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
  return old;
}
}  // namespace detail

template <class T>
MF_INLINE void atomic_store_explicit(volatile atomic<T>* obj, detail::nodeduce_t<T> v,
                                     memory_order order) {
  typename detail::atomic_rep<T>::type r = v;
  __atomic_store(&obj->mf_v, &r, int(order));
}
template <class T>
MF_INLINE T atomic_load_explicit(const volatile atomic<T>* obj, memory_order order) {
  typename detail::atomic_rep<T>::type r;
  __atomic_load(&obj->mf_v, &r, int(order));
  return T(r);
}
template <class T>
MF_INLINE T atomic_exchange_explicit(volatile atomic<T>* obj, detail::nodeduce_t<T> v,
                                     memory_order order) {
  typename detail::atomic_rep<T>::type r = v, old;
  __atomic_exchange(&obj->mf_v, &r, &old, int(order));
  return T(old);
}
// On failure *expected receives the current value. Weak and strong behave the same here
// (a CPU CAS does not fail spuriously in a way kernels could observe differently).
template <class T>
MF_INLINE bool atomic_compare_exchange_weak_explicit(volatile atomic<T>* obj, T* expected,
                                                     detail::nodeduce_t<T> desired,
                                                     memory_order success,
                                                     memory_order failure) {
  typename detail::atomic_rep<T>::type e = *expected, d = desired;
  const bool ok = __atomic_compare_exchange(&obj->mf_v, &e, &d, false, int(success),
                                            int(failure) == __ATOMIC_RELEASE ? __ATOMIC_RELAXED
                                            : int(failure) == __ATOMIC_ACQ_REL ? __ATOMIC_ACQUIRE
                                                                               : int(failure));
  *expected = T(e);
  return ok;
}
template <class T>
MF_INLINE bool atomic_compare_exchange_strong_explicit(volatile atomic<T>* obj, T* expected,
                                                       detail::nodeduce_t<T> desired,
                                                       memory_order success,
                                                       memory_order failure) {
  return atomic_compare_exchange_weak_explicit(obj, expected, desired, success, failure);
}

// fetch_add / fetch_sub: integers wrap; floats (atomic_float) add through CAS.
template <class T>
MF_INLINE T atomic_fetch_add_explicit(volatile atomic<T>* obj, detail::nodeduce_t<T> v,
                                      memory_order order) {
  if constexpr (std::is_floating_point<T>::value)
    return detail::atomic_rmw(&obj->mf_v, [v](T a) { return a + v; });
  else
    return __atomic_fetch_add(&obj->mf_v, v, int(order));
}
template <class T>
MF_INLINE T atomic_fetch_sub_explicit(volatile atomic<T>* obj, detail::nodeduce_t<T> v,
                                      memory_order order) {
  if constexpr (std::is_floating_point<T>::value)
    return detail::atomic_rmw(&obj->mf_v, [v](T a) { return a - v; });
  else
    return __atomic_fetch_sub(&obj->mf_v, v, int(order));
}
#define MF_SIM_ATOMIC_BITOP(NAME, BUILTIN)                                                       \
  template <class T, std::enable_if_t<std::is_integral<T>::value, int> = 0>                      \
  MF_INLINE T NAME(volatile atomic<T>* obj, detail::nodeduce_t<T> v, memory_order order) {       \
    return BUILTIN(&obj->mf_v, v, int(order));                                                   \
  }
MF_SIM_ATOMIC_BITOP(atomic_fetch_and_explicit, __atomic_fetch_and)
MF_SIM_ATOMIC_BITOP(atomic_fetch_or_explicit, __atomic_fetch_or)
MF_SIM_ATOMIC_BITOP(atomic_fetch_xor_explicit, __atomic_fetch_xor)
#undef MF_SIM_ATOMIC_BITOP
template <class T, std::enable_if_t<std::is_integral<T>::value, int> = 0>
MF_INLINE T atomic_fetch_min_explicit(volatile atomic<T>* obj, detail::nodeduce_t<T> v,
                                      memory_order) {
  return detail::atomic_rmw(&obj->mf_v, [v](T a) { return v < a ? v : a; });
}
template <class T, std::enable_if_t<std::is_integral<T>::value, int> = 0>
MF_INLINE T atomic_fetch_max_explicit(volatile atomic<T>* obj, detail::nodeduce_t<T> v,
                                      memory_order) {
  return detail::atomic_rmw(&obj->mf_v, [v](T a) { return a < v ? v : a; });
}

}  // namespace metal

#endif  // MF_SIM_ATOMIC_H
