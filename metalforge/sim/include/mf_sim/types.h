// metalforge.sim — the Metal type library: scalars (half, bfloat, uint, ...), vectors
// (float4, uint3, ...), packed vectors, metal::array, type traits, numeric_limits and the
// predefined constants, as_type.
#ifndef MF_SIM_TYPES_H
#define MF_SIM_TYPES_H

#include "scalar.h"
#include "vec.h"
#include "traits.h"
#include "packed.h"
#include "limits.h"

namespace metal {

// as_type<T>(x): reinterpret the bits of x as a T of the same size (float <-> uint,
// half2 <-> uint, long <-> int2, ...). A 3-vector counts with its padded size, as in MSL.
template <class T, class U>
MF_INLINE constexpr T as_type(const U& x) {
  static_assert(sizeof(T) == sizeof(U), "as_type: source and destination sizes differ");
  static_assert(std::is_trivially_copyable<T>::value && std::is_trivially_copyable<U>::value,
                "as_type: types must be trivially copyable");
  return __builtin_bit_cast(T, x);
}

}  // namespace metal

// MSL code inside other namespaces calls as_type<T>(x) unqualified (c10/metal/atomic.h does).
using metal::as_type;

#endif  // MF_SIM_TYPES_H
