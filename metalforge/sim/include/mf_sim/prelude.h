// metalforge.sim — prelude: every C++ standard header the Metal shim needs, nothing Metal yet.
//
// The shim deliberately avoids <cmath>, <cstdlib>, <algorithm>, <atomic> and friends: they are
// slow to parse (every kernel library compiles these headers) and they put C library names such
// as ::abs(int) and ::fmax(double, double) into the global namespace, where they could compete
// with metal:: overloads in kernels that say `using namespace metal;`. Math goes through the
// compiler's __builtin_* functions (which call libm) and atomics through the __atomic builtins.
#ifndef MF_SIM_PRELUDE_H
#define MF_SIM_PRELUDE_H

#include <stddef.h>       // size_t, ptrdiff_t (global, as in MSL)
#include <stdint.h>       // int8_t ... uint64_t (global, as in MSL)
#include <type_traits>    // std:: traits behind metal:: traits and SFINAE
#include <utility>        // std::declval, std::integer_sequence

// What the Metal compiler predefines. The simulator also passes these on the command line, so
// headers included before <metal_stdlib> (e.g. c10/metal/common.h) see them too.
#ifndef __METAL__
#define __METAL__ 1
#endif
#ifndef __METAL_VERSION__
#define __METAL_VERSION__ 320
#endif

// Kernels are compiled with -O; forced inlining keeps the per-element helpers out of the profile.
#define MF_INLINE inline __attribute__((always_inline))
// A component or element index of a vector, packed vector or metal::array, checked like an
// array's (the compiler checks those: -fsanitize=bounds): out of range traps, and the engine
// reports an index out of bounds.
#define MF_CHECKED(i, n) ((unsigned long long)(i) < (unsigned long long)(n) ? (i) : (__builtin_trap(), (i)))

#endif  // MF_SIM_PRELUDE_H
