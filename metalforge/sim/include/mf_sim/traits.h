// metalforge.sim — metal:: type traits (<metal_type_traits>).
//
// As in MSL, the category traits look through vectors: is_floating_point_v<float4> and
// is_integral_v<uint2> are true, while is_scalar_v / is_vector_v tell scalars from vectors.
// half and bfloat are floating-point, signed, arithmetic scalars.
#ifndef MF_SIM_TRAITS_H
#define MF_SIM_TRAITS_H

#include "vec.h"

namespace metal {

// Plain C++ traits, under their MSL names.
using std::add_const;
using std::add_const_t;
using std::add_cv;
using std::add_lvalue_reference;
using std::add_pointer;
using std::add_rvalue_reference;
using std::add_volatile;
using std::bool_constant;
using std::conditional;
using std::conditional_t;
using std::decay;
using std::decay_t;
using std::declval;
using std::enable_if;
using std::enable_if_t;
using std::false_type;
using std::integral_constant;
using std::is_base_of;
using std::is_base_of_v;
using std::is_class;
using std::is_const;
using std::is_const_v;
using std::is_convertible;
using std::is_convertible_v;
using std::is_enum;
using std::is_pointer;
using std::is_pointer_v;
using std::is_reference;
using std::is_same;
using std::is_same_v;
using std::is_void;
using std::is_volatile;
using std::remove_all_extents;
using std::remove_const;
using std::remove_const_t;
using std::remove_cv;
using std::remove_cv_t;
using std::remove_extent;
using std::remove_pointer;
using std::remove_pointer_t;
using std::remove_reference;
using std::remove_reference_t;
using std::remove_volatile;
using std::remove_volatile_t;
using std::true_type;

namespace detail {
template <class T> struct scalar_of { using type = T; };
template <class T, int N> struct scalar_of<vec<T, N>> { using type = T; };
template <class T> using scalar_of_t = typename scalar_of<std::remove_cv_t<T>>::type;
template <class T>
constexpr bool is_float_scalar_v = std::is_floating_point<T>::value || is_f16<T>::value;
}  // namespace detail

template <class T> struct is_vector : false_type {};
template <class T, int N> struct is_vector<vec<T, N>> : true_type {};
template <class T> struct is_vector<const T> : is_vector<T> {};
template <class T> struct is_vector<volatile T> : is_vector<T> {};
template <class T> struct is_vector<const volatile T> : is_vector<T> {};

template <class T>
struct is_floating_point : bool_constant<detail::is_float_scalar_v<detail::scalar_of_t<T>>> {};
template <class T>
struct is_integral : bool_constant<std::is_integral<detail::scalar_of_t<T>>::value> {};
template <class T>
struct is_arithmetic
    : bool_constant<is_floating_point<T>::value || is_integral<T>::value> {};
template <class T>
struct is_signed : bool_constant<std::is_signed<detail::scalar_of_t<T>>::value ||
                                 detail::is_f16<detail::scalar_of_t<T>>::value> {};
template <class T>
struct is_unsigned : bool_constant<std::is_unsigned<detail::scalar_of_t<T>>::value> {};
// Scalar in MSL's sense: bool, the integer types, half, bfloat, float (not vectors).
template <class T>
struct is_scalar : bool_constant<detail::is_scalar_v<std::remove_cv_t<T>>> {};

// Number of elements: N for vec<T, N>, 1 for a scalar.
template <class T> struct vec_elements : integral_constant<int, 1> {};
template <class T, int N> struct vec_elements<vec<T, N>> : integral_constant<int, N> {};

// make_signed / make_unsigned, also for integer vectors (uint4 -> int4).
template <class T> struct make_unsigned : std::make_unsigned<T> {};
template <class T, int N> struct make_unsigned<vec<T, N>> {
  using type = vec<std::make_unsigned_t<T>, N>;
};
template <class T> struct make_signed : std::make_signed<T> {};
template <class T, int N> struct make_signed<vec<T, N>> {
  using type = vec<std::make_signed_t<T>, N>;
};
template <class T> using make_unsigned_t = typename make_unsigned<T>::type;
template <class T> using make_signed_t = typename make_signed<T>::type;

// The scalar type of a vector (T itself for a scalar).
template <class T> struct make_scalar { using type = detail::scalar_of_t<T>; };
template <class T> using make_scalar_t = typename make_scalar<T>::type;

template <class T> constexpr bool is_vector_v = is_vector<T>::value;
template <class T> constexpr bool is_floating_point_v = is_floating_point<T>::value;
template <class T> constexpr bool is_integral_v = is_integral<T>::value;
template <class T> constexpr bool is_arithmetic_v = is_arithmetic<T>::value;
template <class T> constexpr bool is_signed_v = is_signed<T>::value;
template <class T> constexpr bool is_unsigned_v = is_unsigned<T>::value;
template <class T> constexpr bool is_scalar_v = is_scalar<T>::value;
template <class T> constexpr int vec_elements_v = vec_elements<T>::value;

// Address spaces are one memory on the CPU: removing them changes nothing.
template <class T> struct remove_addrspace { using type = T; };
template <class T> using remove_addrspace_t = typename remove_addrspace<T>::type;

// Metal's internal trait helpers (visible under `#pragma METAL internals : enable`).
template <class... B> using _disjunction = std::disjunction<B...>;
template <class... B> using _conjunction = std::conjunction<B...>;

// uniform<T>: a value the same in every thread (a compiler hint on Metal); here the value.
template <class T>
struct uniform {
  T mf_v;
  uniform() = default;
  constexpr uniform(T v) : mf_v(v) {}
  constexpr operator T() const { return mf_v; }
};
template <class T> constexpr uniform<T> make_uniform(T v) { return uniform<T>(v); }

}  // namespace metal

#endif  // MF_SIM_TRAITS_H
