"""metalforge.sim on Metal written in the style of real kernel libraries (MLX): top-level C++
the signature parser must read, function constants, simdgroup_matrix with Metal's lane
ownership, the __metal_* intrinsics and shuffle rotations, each checked against an independent
Python reference."""
import pytest
import torch

from metalforge.msl.parse import parse
from metalforge.msl.tokens import ParseError
from metalforge.sim import compile_shader


# ------------------------------------------------------------------------- parser
def test_top_level_cpp_and_default_template_args_with_decltype_instantiation():
    src = r"""
#include <metal_stdlib>
using namespace metal;
struct pair_t { float a; float b; constexpr pair_t(float x, float y) : a(x), b(y) {} };
constexpr float sum_of(pair_t p) { return p.a + p.b; }
static_assert(sum_of(pair_t{1.0f, 2.0f}) == 3.0f, "brace initialisers inside parentheses");
static_assert((pair_t{1.0f, 2.0f}).b == 2.0f);
constant float table[] = {1.0f, 2.0f, 4.0f};
template <typename T> struct wrap { template <typename U> struct inner { U v; }; };

template <typename T, int N = 3>
[[kernel]] void scale(device const T* x, device T* y, uint i [[thread_position_in_grid]]) {
  typename wrap<T>::template inner<T> w{x[i]};
  y[i] = w.v * T(table[N - 1]);
}
#define instantiate_kernel(name, func, ...) \
  template [[host_name(name)]] [[kernel]] decltype(func<__VA_ARGS__>) func<__VA_ARGS__>;
instantiate_kernel("scale_float", scale, float)
instantiate_kernel("scale_half_2", scale, half, 2)
"""
    lib = compile_shader(src)
    x = torch.arange(8, dtype=torch.float32)
    y = torch.zeros(8)
    lib.scale_float(x, y)
    torch.testing.assert_close(y, x * 4)
    xh, yh = x.half(), torch.zeros(8, dtype=torch.half)
    lib.scale_half_2(xh, yh)
    torch.testing.assert_close(yh, xh * 2)


def test_parse_error_names_file_and_line():
    src = '# 1 "program_source"\nkernel void f(device float* x) {}\n\nstatic_assert((1 + 2;\n'
    with pytest.raises(ParseError, match=r"program_source:3: unbalanced '\('"):
        parse(src)


def test_implicit_buffer_indices_fill_gaps_in_declaration_order():
    src = ("kernel void f(device float* a, device float* b [[buffer(0)]], constant uint& n,\n"
           "              uint i [[thread_position_in_grid]]) {}\n")
    k = parse(src).kernels[0]
    assert [(p.name, p.buffer_index) for p in k.params if p.role == "buffer"] == \
        [("a", 1), ("b", 0), ("n", 2)]


# ------------------------------------------------------------------------- function constants
FC_SRC = r"""
#include <metal_stdlib>
using namespace metal;
constant bool has_w [[function_constant(20)]];
constant int reps [[function_constant(01)]];
constant bool reps_given = is_function_constant_defined(reps);
kernel void fc(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  float v = has_w ? 10.0f : 1.0f;
  y[i] = v * (reps_given ? float(reps) : -1.0f) + float(is_function_constant_defined(has_w));
}
"""


@pytest.mark.parametrize("values,expected", [
    (None, -1.0), ({20: True, 1: 3}, 31.0), ({1: 2}, 2.0), ({20: False}, -1.0 + 1.0)])
def test_function_constants(values, expected):
    lib = compile_shader(FC_SRC, function_constants=values)
    y = torch.zeros(4)
    lib.fc(y)
    assert y.tolist() == [expected] * 4


def test_function_constant_errors():
    with pytest.raises(TypeError, match="indices"):
        compile_shader(FC_SRC, function_constants={"has_w": True})
    with pytest.raises(SyntaxError, match=r"program_source:2: .*function constant"):
        compile_shader("#include <metal_stdlib>\nconstant bool b [[function_constant(0)]] = 1;\n")


# ------------------------------------------------------------------------- simdgroup_matrix
MM_SRC = r"""
#include <metal_stdlib>
#include <metal_simdgroup_matrix>
using namespace metal;
template <typename T>
kernel void mma8(device const T* a [[buffer(0)]], device const T* b [[buffer(1)]],
                 device const float* c [[buffer(2)]], device float* d [[buffer(3)]],
                 device float* owned [[buffer(4)]], device float* dt [[buffer(5)]],
                 uint lane [[thread_index_in_simdgroup]]) {
  simdgroup_matrix<T, 8, 8> A, B;
  simdgroup_float8x8 C, D;
  simdgroup_load(A, a);
  simdgroup_load(B, b + 8, 16, ulong2(0, 0), false);    // the right half of a 8x16 array
  simdgroup_load(C, c);
  simdgroup_multiply_accumulate(D, A, B, C);
  simdgroup_store(D, d);
  simdgroup_store(D, dt, 8, ulong2(0, 0), true);
  owned[2 * lane] = D.thread_elements()[0];
  owned[2 * lane + 1] = D.thread_elements()[1];
}
template [[host_name("mma8_float")]] kernel void mma8<float>(device const float*,
    device const float*, device const float*, device float*, device float*, device float*, uint);
template [[host_name("mma8_half")]] kernel void mma8<half>(device const half*,
    device const half*, device const float*, device float*, device float*, device float*, uint);
"""


def _lane_coords(lane: int) -> tuple[int, int]:
    q = lane // 4
    return (q & 4) + (lane // 2) % 4, (q & 2) * 2 + (lane % 2) * 2


@pytest.mark.parametrize("dtype,tname", [(torch.float32, "float"), (torch.float16, "half")])
def test_simdgroup_matrix_matches_matmul_and_lane_ownership(dtype, tname):
    lib = compile_shader(MM_SRC)
    g = torch.Generator().manual_seed(0)
    a = torch.randn(8, 8, generator=g).to(dtype)
    b = torch.randn(8, 16, generator=g).to(dtype)
    c = torch.randn(8, 8, generator=g)
    d, owned, dt = torch.zeros(8, 8), torch.zeros(64), torch.zeros(8, 8)
    getattr(lib, f"mma8_{tname}")(a, b, c, d, owned, dt, threads=32, group_size=32)
    ref = a.double() @ b[:, 8:].double() + c.double()
    torch.testing.assert_close(d.double(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dt, d.T)
    # lane l holds D[row][col], D[row][col + 1] of the documented mapping
    seen = set()
    for lane in range(32):
        r, col = _lane_coords(lane)
        assert owned[2 * lane].item() == d[r, col].item()
        assert owned[2 * lane + 1].item() == d[r, col + 1].item()
        seen |= {(r, col), (r, col + 1)}
    assert len(seen) == 64


GEMM_MSL = r"""
#include <metal_stdlib>
#include <metal_simdgroup_matrix>
using namespace metal;
// D[16][16] = A[16][K] B[K][16] + C, a simdgroup per 8x8 tile of D, K in steps of 8; B read
// from its stored [16][K] transpose when bt; each lane's two elements of the first tile too
template <typename T, typename U>
kernel void gemm(device const T* a [[buffer(0)]], device const T* b [[buffer(1)]],
                 device const float* c [[buffer(2)]], device U* d [[buffer(3)]],
                 device float* owned [[buffer(4)]], constant uint& k [[buffer(5)]],
                 constant uint& bt [[buffer(6)]],
                 uint sg [[simdgroup_index_in_threadgroup]],
                 uint lane [[thread_index_in_simdgroup]]) {
  const uint r0 = sg / 2 * 8, c0 = sg % 2 * 8;
  simdgroup_matrix<U, 8, 8> acc;
  simdgroup_load(acc, c, 16, ulong2(c0, r0));
  for (uint k0 = 0; k0 < k; k0 += 8) {
    simdgroup_matrix<T, 8, 8> x, y;
    simdgroup_load(x, a, k, ulong2(k0, r0));
    if (bt != 0) {
      simdgroup_load(y, b, k, ulong2(k0, c0), true);
    } else {
      simdgroup_load(y, b, 16, ulong2(c0, k0));
    }
    simdgroup_multiply_accumulate(acc, x, y, acc);
  }
  simdgroup_store(acc, d, 16, ulong2(c0, r0));
  if (sg == 0) {
    owned[2 * lane] = float(acc.thread_elements()[0]);
    owned[2 * lane + 1] = float(acc.thread_elements()[1]);
  }
}
"""
GEMM_TYPES = [("float", "float"), ("half", "float"), ("bfloat", "float"), ("half", "half")]
GEMM_MSL += "".join(
    f'template [[host_name("gemm_{t}_{u}")]] kernel void gemm<{t}, {u}>(device const {t}*,\n'
    f"    device const {t}*, device const float*, device {u}*, device float*, constant uint&,\n"
    f"    constant uint&, uint, uint);\n" for t, u in GEMM_TYPES)


@pytest.mark.parametrize("t,u", GEMM_TYPES)
@pytest.mark.parametrize("bt", [0, 1])
def test_simdgroup_matrix_chains_products_over_k(t, u, bt):
    """Loads at origins and strides (B also transposed), multiply-accumulates chained over K
    into a float or half accumulator, stores: against torch (the cuda backend runs the same
    source against this, tests/runtime/test_cuda.py)."""
    dt = {"float": torch.float32, "half": torch.float16, "bfloat": torch.bfloat16}
    g = torch.Generator().manual_seed(3)
    a = torch.randn(16, 40, generator=g).to(dt[t])
    b = torch.randn(40, 16, generator=g).to(dt[t])
    c = torch.randn(16, 16, generator=g)
    d, owned = torch.zeros(16, 16, dtype=dt[u]), torch.zeros(64)
    getattr(compile_shader(GEMM_MSL), f"gemm_{t}_{u}")(
        a, b.T.contiguous() if bt else b, c, d, owned, 40, bt, threads=128, group_size=128,
        arg_casts={5: "int32", 6: "int32"})
    tol = dict(rtol=1e-5, atol=1e-4) if u == "float" else dict(rtol=2e-3, atol=2e-2)
    want = a.double() @ b.double() + c.double()
    torch.testing.assert_close(d.double(), want.to(d.dtype).double(), **tol)
    for lane in range(32):
        r, col = _lane_coords(lane)
        assert owned[2 * lane] == d[r, col].float() and owned[2 * lane + 1] == d[r, col + 1].float()


# ------------------------------------------------------------------------- intrinsics, logging
INTR_SRC = r"""
#include <metal_stdlib>
#include <metal_logging>
using namespace metal;
typedef bfloat bfloat16_t;
namespace metal {
// code for Metal defines its own bfloat math (as MLX's bf16_math.h does), through intrinsics
METAL_FUNC bfloat16_t exp(bfloat16_t x) {
  return static_cast<bfloat16_t>(__metal_exp(static_cast<float>(x), __METAL_MAYBE_FAST_MATH__));
}
namespace fast {
METAL_FUNC bfloat16_t exp(bfloat16_t x) {
  return static_cast<bfloat16_t>(__metal_exp(static_cast<float>(x), __METAL_FAST_MATH__));
}
}
}
constant os_log logger("metalforge", "test");
kernel void intr(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                 uint lane [[thread_index_in_simdgroup]]) {
  logger.log_debug("lane %u", lane);
  float v = x[lane];
  y[5 * lane + 0] = float(metal::exp(bfloat16_t(v)));
  y[5 * lane + 1] = float(metal::fast::exp(bfloat16_t(v)));
  y[5 * lane + 2] = simd_shuffle_rotate_down(v, 3);
  y[5 * lane + 3] = simd_shuffle_rotate_up(v, 3);
  y[5 * lane + 4] = __metal_simd_sum(v);
}
"""


def test_intrinsics_bfloat_overloads_rotations_and_logging():
    lib = compile_shader(INTR_SRC)
    x = torch.linspace(-2, 2, 32)
    y = torch.zeros(32, 5)
    lib.intr(x, y, threads=32, group_size=32)
    e = torch.exp(x.bfloat16().float()).bfloat16().float()
    torch.testing.assert_close(y[:, 0], e)
    torch.testing.assert_close(y[:, 1], e)
    lanes = torch.arange(32)
    torch.testing.assert_close(y[:, 2], x[(lanes + 3) % 32])
    torch.testing.assert_close(y[:, 3], x[(lanes - 3) % 32])
    torch.testing.assert_close(y[:, 4], x.sum().expand(32), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------- big sources
def test_big_sources_compile_each_kernel_on_first_lookup():
    from metalforge.sim.library import LAZY_KERNELS
    insts = "\n".join(f'template [[host_name("add_{i}")]] [[kernel]] decltype(add<{i}>) add<{i}>;'
                      for i in range(LAZY_KERNELS + 1))
    src = r"""
#include <metal_stdlib>
template <int N>
[[kernel]] void add(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  static_assert(N != 7, "instantiating add<7> is an error");
  y[i] += float(N);
}
""" + insts
    lib = compile_shader(src)          # add<7> is never instantiated unless looked up
    assert len(dir(lib)) == LAZY_KERNELS + 1
    y = torch.zeros(3)
    lib.add_5(y)
    lib.add_64(y)
    assert y.tolist() == [69.0] * 3
    with pytest.raises(SyntaxError, match="instantiating add<7> is an error"):
        _ = lib.add_7


# ------------------------------------------------------------------------- Metal-only C++
MSL_STYLE_SRC = r"""
#include <metal_stdlib>
using namespace metal;
#define MY_CONST static constant constexpr const
MY_CONST int kTwo = 2;
constant bool use_bias [[function_constant(7)]];

struct cplx {
  float re, im;
  constexpr cplx(float r, float i) thread : re(r), im(i) {}
  constexpr cplx(float r, float i) device : re(r), im(i) {}
  float norm2() const thread { return re * re + im * im; }
  float norm2() const device { return re * re + im * im; }
  float norm2() const constant { return re * re + im * im; }
};
inline thread cplx& scale(thread cplx& c, float s) { c.re *= s; c.im *= s; return c; }
inline device cplx& scale(device cplx& c, float s) { c.re *= s; c.im *= s; return c; }
template <typename P> struct elem_of {};
template <typename T> struct elem_of<thread T*> { using type = T; };
template <typename T> struct elem_of<device T*> { using type = T; };

struct Op {
  template <typename T> T operator()(T x) { return x + T(1); }
  template <> float operator()(float x) { return x * 10.0f; }
};
template <typename T, metal::enable_if_t<sizeof(T) < 4, bool> = true>
T widen_or_keep(T x) { return x + T(100); }
template <typename T, metal::enable_if_t<sizeof(T) >= 4, bool> = true>
T widen_or_keep(T x) { return x; }

[[kernel]] void msl_style(device float* y [[buffer(0)]],
                          device const float* bias [[buffer(2), function_constant(use_bias)]],
                          uint i [[thread_position_in_grid]]) {
  cplx c(3.0f, 4.0f);
  scale(c, float(kTwo));
  typename elem_of<device float*>::type acc = c.norm2();        // 100
  half h = 1.5h;
  acc += h;                                                     // float += half
  acc += Op()(1.0f) + float(Op()(2));                           // 10 + 3
  acc += float(widen_or_keep(short(1))) + widen_or_keep(1.0f);  // 101 + 1
  y[i] = acc + (use_bias ? bias[i] : 0.0f);
}
"""


@pytest.mark.parametrize("with_bias", [False, True])
def test_metal_only_cpp_address_space_overloads_and_conditional_buffers(with_bias):
    lib = compile_shader(MSL_STYLE_SRC, function_constants={7: with_bias})
    y = torch.zeros(4)
    bias = torch.arange(4.0)
    # buffer(1) is used by no parameter and buffer(2) only with use_bias: both take None
    lib.msl_style(y, None, bias if with_bias else None)
    expected = 100 + 1.5 + 13 + 102 + (bias if with_bias else 0)
    torch.testing.assert_close(y, torch.full((4,), 0.0) + expected)
    with pytest.raises(TypeError, match="pass None exactly"):
        lib.msl_style(y, bias, bias if with_bias else None)
    if not with_bias:               # a buffer bound where use_bias is false is ignored (Metal)
        y.zero_()
        lib.msl_style(y, None, bias)
        torch.testing.assert_close(y, torch.full((4,), 0.0) + expected)
    else:
        with pytest.raises(TypeError, match="use_bias is true"):
            lib.msl_style(y, None, None)


# ------------------------------------------------------------------------- steel-style fragments
# MLX's steel attention (steel/attn/mma.h) names vectors through `typename metal::vec<U, N>` in
# alias templates and moves fragments between them and simdgroup_matrix::thread_elements().
FRAG_SRC = r"""
#include <metal_stdlib>
#include <metal_simdgroup_matrix>
using namespace metal;
template <typename T> struct Frag8 {
  static constexpr constant int kElemsPerFrag = 2;
  typedef metal::simdgroup_matrix<T, 8, 8> mat_type;
  typedef metal::vec<T, kElemsPerFrag> frag_type;
  typedef metal::vec<T, 1> row_frag_type;      // named only, never used (as in mma.h)
  template <typename U> using dtype_frag_t = typename metal::vec<U, kElemsPerFrag>;
  template <typename U> using dtype_mat_t = typename metal::simdgroup_matrix<U, 8, 8>;
  static short2 coord(ushort lane) {
    const short q = lane / 4;
    return short2{short((q & 2) * 2 + (lane % 2) * 2), short((q & 4) + (lane / 2) % 4)};
  }
};
static_assert(sizeof(float2) == 8 && sizeof(float3) == 16 && alignof(half4) == 8, "layout");

kernel void frag_mm(device const half* a [[buffer(0)]], device const half* b [[buffer(1)]],
                    device float* d [[buffer(2)]], ushort lane [[thread_index_in_simdgroup]]) {
  using F = Frag8<half>;
  const short2 c = F::coord(lane);                  // (col, row) of this lane's two elements
  F::frag_type fa = F::frag_type(a[c.y * 8 + c.x], a[c.y * 8 + c.x + 1]);
  F::frag_type fb = F::frag_type(b[c.y * 8 + c.x], b[c.y * 8 + c.x + 1]);
  F::mat_type A, B;
  A.thread_elements()[0] = fa.x;
  A.thread_elements()[1] = fa.y;
  reinterpret_cast<thread F::frag_type&>(B.thread_elements()) = fb;
  F::dtype_mat_t<float> D;
  simdgroup_multiply(D, A, B);
  F::dtype_frag_t<float> fd = F::dtype_frag_t<float>(D.thread_elements()[0],
                                                     D.thread_elements()[1]);
  d[c.y * 8 + c.x] = fd.x;
  d[c.y * 8 + c.x + 1] = float2(fd.yx).x;
}
"""


def test_steel_fragments_name_vectors_through_typename_metal_vec():
    lib = compile_shader(FRAG_SRC)
    g = torch.Generator().manual_seed(3)
    a = torch.randn(8, 8, generator=g).half()
    b = torch.randn(8, 8, generator=g).half()
    d = torch.zeros(8, 8)
    lib.frag_mm(a, b, d, threads=32, group_size=32)
    torch.testing.assert_close(d.double(), a.double() @ b.double(), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------- exited threads
# MLX's gemv (gemv.h) lets lanes 1-31 of each simdgroup return and meets a threadgroup_barrier
# with lane 0 of each: Apple GPUs run it; the simulator does with exited_leave_barriers.
LANE0_SRC = r"""
#include <metal_stdlib>
using namespace metal;
kernel void lane0_reduce(device const float* x [[buffer(0)]], device float* out [[buffer(1)]],
                         uint lid [[thread_position_in_threadgroup]],
                         uint sg [[simdgroup_index_in_threadgroup]],
                         uint lane [[thread_index_in_simdgroup]]) {
  threadgroup float part[4];
  float v = simd_sum(x[lid]);
  if (lane != 0) return;
  part[sg] = v;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (sg == 0) out[0] = part[0] + part[1] + part[2] + part[3];
}
kernel void split_sites(device float* out [[buffer(0)]], uint lid [[thread_index_in_threadgroup]]) {
  if (lid >= 40) return;
  if (lid < 16) {
    threadgroup_barrier(mem_flags::mem_none);
  } else {
    threadgroup_barrier(mem_flags::mem_none);
  }
  out[lid] = 1.0f;
}
kernel void simd_exit(device float* out [[buffer(0)]], uint lane [[thread_index_in_simdgroup]]) {
  if (lane >= 8) return;
  simdgroup_barrier(mem_flags::mem_none);
  out[lane] = 2.0f;
}
"""


def test_exited_threads_leave_barriers_only_when_asked():
    from metalforge.sim import KernelError
    x = torch.randn(128)
    out = torch.zeros(1)
    strict = compile_shader(LANE0_SRC)
    with pytest.raises(KernelError, match=r"threadgroup_barrier divergence.*have returned"):
        strict.lane0_reduce(x, out, threads=128, group_size=128)
    lib = compile_shader(LANE0_SRC, exited_leave_barriers=True)
    lib.lane0_reduce(x, out, threads=128, group_size=128)
    torch.testing.assert_close(out, x.sum().reshape(1), rtol=1e-5, atol=1e-5)
    y = torch.zeros(64)
    lib.simd_exit(y, threads=32, group_size=32)
    assert y[:8].eq(2).all() and y[8:].eq(0).all()
    # threads that have not returned must still meet at one barrier
    with pytest.raises(KernelError, match=r"threads 0-15 wait at threadgroup_barrier.*"
                                          r"threads 16-39 wait at threadgroup_barrier"):
        lib.split_sites(y, threads=64, group_size=64)
