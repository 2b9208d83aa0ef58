// metalforge.sim — the kernel-side half of the execution engine.
//
// Included (through <metal_stdlib>) by every simulated kernel.  Declares the
// per-thread position record the trampolines read, the collective "slot" the
// simd functions fill in, the entry points of the engine library
// (libmf_sim_engine.so, built from engine.cpp and loaded RTLD_GLOBAL before any
// kernel library), and Metal's barrier functions.
//
// Nothing here is target specific to the kernel text: a CUDA version of the shim
// provides the same names (threadgroup_barrier -> __syncthreads, ...).
#ifndef MF_SIM_RUNTIME_H
#define MF_SIM_RUNTIME_H

#include <stdint.h>
#include <string.h>
#include <tuple>
#include <type_traits>

namespace mf {

// Every thread-position value a kernel parameter can ask for.  3-component
// values are always stored as x, y, z; scalar parameters read component x.
struct Pos {
  uint32_t thread_position_in_grid[3];
  uint32_t thread_position_in_threadgroup[3];
  uint32_t threadgroup_position_in_grid[3];
  uint32_t threads_per_threadgroup[3];            // actual size (partial edge groups are smaller)
  uint32_t threadgroups_per_grid[3];
  uint32_t threads_per_grid[3];
  uint32_t dispatch_threads_per_threadgroup[3];   // the size asked for in the dispatch
  uint32_t grid_origin[3];
  uint32_t thread_index_in_threadgroup[3];
  uint32_t thread_index_in_simdgroup[3];
  uint32_t simdgroup_index_in_threadgroup[3];
  uint32_t threads_per_simdgroup[3];
  uint32_t simdgroups_per_threadgroup[3];
  uint32_t dispatch_simdgroups_per_threadgroup[3];
  uint32_t thread_execution_width[3];
  uint32_t thread_index_in_quadgroup[3];
  uint32_t quadgroup_index_in_threadgroup[3];
  uint32_t quadgroups_per_threadgroup[3];
  uint32_t dispatch_quadgroups_per_threadgroup[3];
};

// One lane's part in a simd/quad collective.  The lane blocks in
// mf_rt_collective(); once its simdgroup can make no other progress the engine
// calls `resolve` once per call site with the slots of the participating lanes
// (index = lane id, nullptr = inactive lane) and every participant's `out` is
// written.
struct CollSlot;
typedef void (*Resolver)(CollSlot* const* lanes, unsigned width);
struct CollSlot {
  const void* in;      // this lane's value
  void* out;           // where this lane's result goes
  const void* fill;    // simd_shuffle_and_fill_*: this lane's filling_data
  int64_t arg;         // lane / delta / mask argument
  int64_t modulo;      // simd_shuffle_and_fill_*: segment width (0 = simd width)
  Resolver resolve;
  int64_t stray;       // set by a shuffle's resolver: the source lane this lane named
                       // outside its simdgroup (quadgroup); kNoStray when it did not
};
constexpr int64_t kNoStray = INT64_MIN;

// Trampoline helpers: turn a bound buffer (void*) into the parameter's type.
template <class P>
inline P arg_cast(void* p) {
  if constexpr (std::is_pointer_v<P>) {
    return reinterpret_cast<P>(p);
  } else if constexpr (std::is_reference_v<P>) {
    return *reinterpret_cast<std::remove_reference_t<P>*>(p);
  } else {
    return *reinterpret_cast<std::remove_cv_t<P>*>(p);
  }
}

template <class F>
struct fn_traits;
template <class R, class... A>
struct fn_traits<R (*)(A...)> {
  template <unsigned I>
  using arg = std::tuple_element_t<I, std::tuple<A...>>;
};
template <class F, unsigned I>
using param_t = typename fn_traits<F>::template arg<I>;

}  // namespace mf

extern "C" {
// Block the calling thread at a barrier (simd = 0: threadgroup, 1: simdgroup).
void mf_rt_barrier(int simd, const char* file, unsigned line, unsigned col);
// Block the calling lane at a collective (see CollSlot).
void mf_rt_collective(mf::CollSlot* slot, int quad, const char* what, const char* file,
                      unsigned line, unsigned col);
// The calling thread's position record (what its kernel parameters were built from); all
// zeros outside a launch.  For headers that need the thread's lane without a parameter
// (__metal_get_thread_index_in_simdgroup, the cooperative tensors of MetalPerformancePrimitives).
const mf::Pos* mf_rt_position();
// Fail the launch: the calling lane's shuffle named source lane `lane` outside its `width`
// lanes (Metal leaves the value undefined; never resumed).
void mf_rt_stray_lane(const char* what, long long lane, unsigned width, const char* file,
                      unsigned line);
// Tell the race detector where the calling thread's copy of a threadgroup array is (race.h).
void mf_rt_tg_note(void* base, size_t bytes, unsigned granule, unsigned elem,
                   const unsigned* dims, unsigned ndims, const char* name, const char* file,
                   unsigned line);
}

// Call-site identification for barriers and collectives (default arguments are
// evaluated at the caller).  GCC before 13 has no __builtin_COLUMN.
#if defined(__has_builtin)
#if __has_builtin(__builtin_COLUMN)
#define MF_COLUMN() __builtin_COLUMN()
#endif
#endif
#ifndef MF_COLUMN
#define MF_COLUMN() 0u
#endif

namespace metal {

enum class mem_flags : unsigned {
  mem_none = 0,
  mem_device = 1,
  mem_threadgroup = 2,
  mem_texture = 4,
  mem_threadgroup_imageblock = 8,
  mem_object_data = 16,
};
constexpr mem_flags operator|(mem_flags a, mem_flags b) {
  return mem_flags(unsigned(a) | unsigned(b));
}
constexpr mem_flags operator&(mem_flags a, mem_flags b) {
  return mem_flags(unsigned(a) & unsigned(b));
}

// Resolves when every live thread of the threadgroup waits at this same call
// site; anything else (threads that returned, or wait elsewhere) is reported as
// barrier divergence.  The default arguments identify the call site.
inline void threadgroup_barrier(mem_flags = mem_flags::mem_none,
                                const char* file = __builtin_FILE(),
                                unsigned line = __builtin_LINE(),
                                unsigned col = MF_COLUMN()) {
  mf_rt_barrier(0, file, line, col);
}

// Same, for the threads of one simdgroup.
inline void simdgroup_barrier(mem_flags = mem_flags::mem_none,
                              const char* file = __builtin_FILE(),
                              unsigned line = __builtin_LINE(),
                              unsigned col = MF_COLUMN()) {
  mf_rt_barrier(1, file, line, col);
}

#ifdef MF_SIM_ATOMIC_H  // (kernels: <metal_stdlib> includes atomic.h first; not the engine)
// Metal 3.2's memory scopes and atomic_thread_fence.  Threadgroups run on OS threads of one
// process, so a fence is the C++ fence of the same order (the scope only narrows it on a GPU).
enum thread_scope {
  thread_scope_thread = 0,
  thread_scope_simdgroup = 1,
  thread_scope_threadgroup = 2,
  thread_scope_device = 3,
  thread_scope_system = 4,
};
inline void atomic_thread_fence(mem_flags, memory_order order,
                                thread_scope = thread_scope_device) {
  __atomic_thread_fence(int(order));
}
#endif

}  // namespace metal

#ifndef MF_SIM_ENGINE
namespace mf {

// Build a thread-position parameter (uint, ushort, uint2, ushort3, ...) from a
// stored x, y, z triple.
template <class T, class = void>
struct pos_conv {
  static T make(const uint32_t* v) { return T(v[0]); }
};
template <class E, auto N>
struct pos_conv<metal::vec<E, N>, void> {
  static metal::vec<E, N> make(const uint32_t* v) {
    if constexpr (N == 2) {
      return metal::vec<E, N>(E(v[0]), E(v[1]));
    } else if constexpr (N == 3) {
      return metal::vec<E, N>(E(v[0]), E(v[1]), E(v[2]));
    } else {
      return metal::vec<E, N>(E(v[0]), E(v[1]), E(v[2]), E(0));
    }
  }
};
template <class P>
inline P pos_cast(const uint32_t* v) {
  return pos_conv<std::remove_cv_t<std::remove_reference_t<P>>>::make(v);
}

// Bytes of one race-detector cell for an array of E: a scalar of E (two threads may write two
// components of one float4, or two fields of one struct, without racing).
template <class E>
struct tg_granule {
  static constexpr unsigned value = alignof(E) < 8 ? unsigned(alignof(E)) : 8u;
};
template <class T, int N>
struct tg_granule<metal::vec<T, N>> {
  static constexpr unsigned value = unsigned(sizeof(T));
};

// Registers a threadgroup array (or variable) `a` with the race detector; rewrite.py puts a
// call after every threadgroup declaration.  Each thread calls it when it passes the
// declaration; the engine keeps the first call per array.
template <class A>
inline void tg_note(A& a, const char* name, const char* file, unsigned line) {
  using E = std::remove_cv_t<std::remove_all_extents_t<A>>;
  constexpr unsigned ndims = unsigned(std::rank<A>::value);
  unsigned dims[ndims > 0 ? ndims : 1] = {0};
  if constexpr (ndims > 0) {
    dims[0] = unsigned(std::extent<A, 0>::value);
    if constexpr (ndims > 1) dims[1] = unsigned(std::extent<A, 1>::value);
    if constexpr (ndims > 2) dims[2] = unsigned(std::extent<A, 2>::value);
    if constexpr (ndims > 3) dims[3] = unsigned(std::extent<A, 3>::value);
  }
  mf_rt_tg_note((void*)&a, sizeof(A), tg_granule<E>::value, unsigned(sizeof(E)), dims, ndims,
                name, file, line);
}

}  // namespace mf
#endif  // MF_SIM_ENGINE

#endif  // MF_SIM_RUNTIME_H
