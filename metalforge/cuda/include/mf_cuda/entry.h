// metalforge.cuda: what the generated __global__ entry points use (metalforge/cuda/translate.py
// writes one per host-visible kernel): Metal thread positions for a dispatchThreads grid, and
// the types a kernel parameter is passed as.
#pragma once
#ifndef MF_ONE_D
#define MF_ONE_D 0
#endif
namespace mf_cuda {

struct U3 { unsigned x, y, z; };

// The Metal position of this CUDA thread. The grid is Metal's (threads per axis); CUDA's grid
// is rounded up to whole blocks. A partial edge threadgroup has act = the threads that exist
// there (Metal's threads_per_threadgroup); its threads are numbered 0..n-1 exactly as Metal
// linearises them (x fastest over the *actual* sizes), so CUDA warps are Metal simdgroups, and
// the block's threads numbered n and up are past the grid: init() returns false for them and
// the entry point returns before any user code.
struct Pos {
  U3 grid, act, local, group;
  unsigned index, n;
  // OneD: the module for 1-D dispatches (grid and threadgroup; every metalforge launch) is
  // compiled with the same numbering less its y and z terms and the partial edge block's
  // division and branch (library.py picks the module per launch). H100, 2026-11-27, against
  // one numbering for all: f16 silu 65536x128 10.6 -> 10.0 us, f32 silu 8192x128 3.5 ->
  // 3.0-3.3, f32 log_softmax 4096x8192 104.7 -> 97.3-98.4; a run-time test for 1-D in one
  // module instead kept little of it (10.3 us, 3.1-3.3, 109.2-109.7).
  template <bool OneD>
  __device__ __forceinline__ bool init(unsigned gx, unsigned gy, unsigned gz) {
    grid = U3{gx, gy, gz};
    if constexpr (OneD) {
      group = U3{blockIdx.x, 0u, 0u};
      const unsigned rx = gx - blockIdx.x * blockDim.x;
      act = U3{rx < blockDim.x ? rx : blockDim.x, 1u, 1u};
      n = act.x;
      index = threadIdx.x;
      local = U3{threadIdx.x, 0u, 0u};
      return index < n;
    }
    group = U3{blockIdx.x, blockIdx.y, blockIdx.z};
    const unsigned rx = gx - blockIdx.x * blockDim.x, ry = gy - blockIdx.y * blockDim.y,
                   rz = gz - blockIdx.z * blockDim.z;
    act = U3{rx < blockDim.x ? rx : blockDim.x, ry < blockDim.y ? ry : blockDim.y,
             rz < blockDim.z ? rz : blockDim.z};
    n = act.x * act.y * act.z;
    index = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    if (index >= n) return false;
    if (act.x == blockDim.x && act.y == blockDim.y) {
      local = U3{threadIdx.x, threadIdx.y, threadIdx.z};
    } else {
      local = U3{index % act.x, (index / act.x) % act.y, index / (act.x * act.y)};
    }
    return true;
  }
  __device__ __forceinline__ U3 thread_position_in_grid() const {
    return U3{group.x * blockDim.x + local.x, group.y * blockDim.y + local.y,
              group.z * blockDim.z + local.z};
  }
  __device__ __forceinline__ U3 thread_position_in_threadgroup() const { return local; }
  __device__ __forceinline__ U3 threadgroup_position_in_grid() const { return group; }
  __device__ __forceinline__ U3 threads_per_threadgroup() const { return act; }
  __device__ __forceinline__ U3 dispatch_threads_per_threadgroup() const {
    return U3{blockDim.x, blockDim.y, blockDim.z};
  }
  __device__ __forceinline__ U3 threadgroups_per_grid() const {
    return U3{gridDim.x, gridDim.y, gridDim.z};
  }
  __device__ __forceinline__ U3 threads_per_grid() const { return grid; }
  __device__ __forceinline__ U3 grid_origin() const { return U3{0u, 0u, 0u}; }
  __device__ __forceinline__ U3 thread_index_in_threadgroup() const { return U3{index, 0u, 0u}; }
  __device__ __forceinline__ U3 thread_index_in_simdgroup() const { return U3{index & 31u, 0u, 0u}; }
  __device__ __forceinline__ U3 simdgroup_index_in_threadgroup() const { return U3{index >> 5, 0u, 0u}; }
  __device__ __forceinline__ U3 threads_per_simdgroup() const { return U3{32u, 0u, 0u}; }
  __device__ __forceinline__ U3 thread_execution_width() const { return U3{32u, 0u, 0u}; }
  __device__ __forceinline__ U3 simdgroups_per_threadgroup() const { return U3{(n + 31u) / 32u, 0u, 0u}; }
  __device__ __forceinline__ U3 dispatch_simdgroups_per_threadgroup() const {
    return U3{(blockDim.x * blockDim.y * blockDim.z + 31u) / 32u, 0u, 0u};
  }
  __device__ __forceinline__ U3 thread_index_in_quadgroup() const { return U3{index & 3u, 0u, 0u}; }
  __device__ __forceinline__ U3 quadgroup_index_in_threadgroup() const { return U3{index >> 2, 0u, 0u}; }
  __device__ __forceinline__ U3 quadgroups_per_threadgroup() const { return U3{(n + 3u) / 4u, 0u, 0u}; }
  __device__ __forceinline__ U3 dispatch_quadgroups_per_threadgroup() const {
    return U3{(blockDim.x * blockDim.y * blockDim.z + 3u) / 4u, 0u, 0u};
  }
};

// a position converted to the declared type (uint, ushort, uint2, uint3, ...)
template <class T> struct PosCast {
  static __device__ __forceinline__ T f(U3 v) { return T(v.x); }
};
template <class S> struct PosCast<metal::vec<S, 2>> {
  static __device__ __forceinline__ metal::vec<S, 2> f(U3 v) { return metal::vec<S, 2>(S(v.x), S(v.y)); }
};
template <class S> struct PosCast<metal::vec<S, 3>> {
  static __device__ __forceinline__ metal::vec<S, 3> f(U3 v) {
    return metal::vec<S, 3>(S(v.x), S(v.y), S(v.z));
  }
};
template <class T> __device__ __forceinline__ T pos_cast(U3 v) {
  return PosCast<typename metal::remove_cv<typename metal::remove_reference<T>::type>::type>::f(v);
}

// the I-th parameter type of a function pointer type
template <int I, class... A> struct nth;
template <class A0, class... A> struct nth<0, A0, A...> { typedef A0 type; };
template <int I, class A0, class... A> struct nth<I, A0, A...> { typedef typename nth<I - 1, A...>::type type; };
template <class F, int I> struct param;
template <class R, class... A, int I> struct param<R (*)(A...), I> { typedef typename nth<I, A...>::type type; };
// how an entry point receives a parameter: by value (constant references, values) or as a
// pointer (pointers; references to device memory)
template <class F, int I> using value_t =
    typename metal::remove_cv<typename metal::remove_reference<typename param<F, I>::type>::type>::type;
template <class F, int I> using pointer_t =
    typename metal::remove_reference<typename param<F, I>::type>::type*;
template <class F, int I> using param_t = typename param<F, I>::type;

}  // namespace mf_cuda
