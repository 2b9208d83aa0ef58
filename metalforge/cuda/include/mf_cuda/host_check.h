// metalforge.cuda: host stand-ins for the CUDA builtins the shim uses, so that a translated
// kernel can be syntax-checked with a host C++17 compiler (g++ -fsyntax-only
// -DMF_CUDA_HOST_CHECK) on machines without a GPU. Declarations only: nothing here runs.
#pragma once
#include <cmath>
#define __device__
#define __global__
#define __forceinline__ inline
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
struct mf_dim3 { unsigned x, y, z; };
extern const mf_dim3 threadIdx, blockIdx, blockDim, gridDim;
struct __half { unsigned short x; };
struct __nv_bfloat16 { unsigned short x; };
__half __float2half_rn(float);
float __half2float(__half);
__nv_bfloat16 __float2bfloat16_rn(float);
float __bfloat162float(__nv_bfloat16);
unsigned __shfl_sync(unsigned, unsigned, int);
unsigned long long __shfl_sync(unsigned, unsigned long long, int);
unsigned __shfl_xor_sync(unsigned, unsigned, int);
unsigned long long __shfl_xor_sync(unsigned, unsigned long long, int);
unsigned __activemask();
int __any_sync(unsigned, int);
int __all_sync(unsigned, int);
int __ffs(unsigned);
int __ffsll(long long);
int __clz(int);
int __clzll(long long);
int __popc(unsigned);
int __popcll(unsigned long long);
int __mulhi(int, int);
unsigned __umulhi(unsigned, unsigned);
long long __mul64hi(long long, long long);
unsigned long long __umul64hi(unsigned long long, unsigned long long);
void __syncthreads();
void __syncwarp(unsigned);
void __threadfence();
int atomicAdd(int*, int);
unsigned atomicAdd(unsigned*, unsigned);
float atomicAdd(float*, float);
int atomicExch(int*, int);
unsigned atomicExch(unsigned*, unsigned);
float atomicExch(float*, float);
unsigned atomicCAS(unsigned*, unsigned, unsigned);
float __int_as_float(int);
unsigned __float_as_uint(float);
float __expf(float);
float __exp10f(float);
float __logf(float);
float __log2f(float);
float __log10f(float);
float __fsqrt_rn(float);
float __sinf(float);
float __cosf(float);
float __tanf(float);
float __powf(float, float);
float __fdividef(float, float);
float rsqrtf(float);
float exp10f(float);
#define __launch_bounds__(...)
