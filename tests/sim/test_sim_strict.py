"""The simulator rejects what Apple's Metal compiler rejects and C++ accepts (issue #50): each
rule has an invalid program, rejected with Metal's message at its line, and a corrected twin,
which compiles and runs (all twins share one library, so one build)."""
from pathlib import Path

import pytest
import torch

from metalforge.msl.parse import parse
from metalforge.sim import compile_shader, compiler, frontcheck

pytestmark = pytest.mark.skipif(not frontcheck.available(), reason="libclang is not installed")

HEAD = "#include <metal_stdlib>\nusing namespace metal;\n"

# name -> (invalid kernel text, message fragment, line of the error within the text)
BAD = {
    "tg_to_device": ("""
kernel void k(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  threadgroup float buf[4];
  device float* p = buf;
  out[i] = p[0];
}""", "cannot initialize a variable of type 'device float *' with an lvalue of type "
      "'threadgroup float[4]'", 4),
    "device_to_tg": ("""
kernel void k(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  threadgroup float* p = out;
  out[i] = p[0];
}""", "cannot initialize a variable of type 'threadgroup float *' with an lvalue of type "
      "'device float *'", 3),
    "device_to_constant": ("""
kernel void k(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  constant float* p = out;
  out[i] = p[0];
}""", "'constant float *' with an lvalue of type 'device float *'", 3),
    "constant_to_device_const": ("""
kernel void k(constant float* c [[buffer(0)]], device float* out [[buffer(1)]],
              uint i [[thread_position_in_grid]]) {
  device const float* p = c;
  out[i] = p[i];
}""", "'const device float *' with an lvalue of type 'constant float *'", 4),
    "device_to_thread_param": ("""
void twice(thread float* p) { p[0] *= 2.0f; }
kernel void k(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  twice(out + i);
}""", "cannot pass pointer to address space 'device' as a pointer to address space 'thread'", 4),
    "assign_tg_to_device": ("""
kernel void k(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  threadgroup float buf[4];
  device float* p = out;
  p = buf;
  out[i] = p[0];
}""", "assigning to 'device float *' from incompatible type 'threadgroup float[4]'", 5),
    "c_style_cast": ("""
kernel void k(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  threadgroup float buf[4];
  device float* p = (device float*)buf;
  out[i] = p[0];
}""", "C-style cast from 'threadgroup float *' to 'device float *' converts between "
      "mismatching address spaces", 4),
    "reinterpret_cast": ("""
kernel void k(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  threadgroup float buf[4];
  device int* p = reinterpret_cast<device int*>(buf);
  out[i] = p[0];
}""", "reinterpret_cast from 'threadgroup float *' to 'device int *' is not allowed", 4),
    "unqualified_kernel_param": ("""
kernel void k(float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  out[i] = 1.0f;
}""", "pointer parameter 'out' has no address space", 2),
    "unqualified_local": ("""
kernel void k(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  float x = 1.0f;
  float* p = &x;
  out[i] = *p;
}""", "pointer type must have explicit address space qualifier ('p'", 4),
    "unqualified_helper_ref": ("""
float twice(const float& x) { return 2.0f * x; }
kernel void k(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  out[i] = twice(out[i]);
}""", "reference type must have explicit address space qualifier ('x'", 2),
    "mutable_global": ("""
float scale = 2.0f;
kernel void k(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  out[i] = scale;
}""", "program scope variable must reside in constant address space", 2),
    "thread_global": ("""
thread float scale = 2.0f;
kernel void k(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  out[i] = scale;
}""", "program scope variable must reside in constant address space", 2),
    "threadgroup_global": ("""
threadgroup float shared_buf[32];
kernel void k(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  out[i] = shared_buf[0];
}""", "program scope variable must reside in constant address space", 2),
    "constexpr_table": ("""
constexpr float TABLE[4] = {1.0f, 2.0f, 3.0f, 4.0f};
kernel void k(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  out[i] = TABLE[i % 4];
}""", "program scope variable must reside in constant address space ('TABLE' is indexed", 4),
    "double": ("""
kernel void k(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  double x = out[i];
  out[i] = float(x * 2.0);
}""", "'double' is not supported in Metal", 3),
    "long_double_cast": ("""
kernel void k(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  out[i] = float((long double)out[i]);
}""", "'long double' is not supported in Metal", 3),
    "new": ("""
kernel void k(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  thread float* p = new float(1.0f);
  out[i] = *p;
}""", "'new' and 'delete' are not supported in Metal", 3),
    "throw": ("""
kernel void k(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  if (out[i] < 0.0f) throw 1;
}""", "Metal does not support exceptions", 3),
    "virtual": ("""
struct Op { virtual float apply(float x) const { return x; } };
kernel void k(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  Op op;
  out[i] = op.apply(out[i]);
}""", "virtual functions are not supported in Metal", 2),
    "goto": ("""
kernel void k(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  if (i % 2) goto done;
  out[i] = 0.0f;
done:
  return;
}""", "'goto' is not supported in Metal", 3),
    "thread_local": ("""
kernel void k(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  thread_local float t = 1.0f;
  out[i] = t;
}""", "thread_local storage is not supported in Metal", 3),
    "kernel_returns_value": ("""
kernel float k(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  out[i] = 1.0f;
  return 0.0f;
}""", "kernel function 'k' must return void", 2),
    "float_to_bfloat": ("""
kernel void k(device bfloat* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  out[i] = 0.5f * float(i);
}""", "implicit conversion from 'float' to 'bfloat' is not allowed in Metal", 3),
    "template_kernel": ("""
template <typename T>
kernel void k(device T* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  threadgroup T buf[4];
  device T* p = buf;
  out[i] = p[0];
}
template [[host_name("k_f")]] kernel void k<float>(device float*, uint);""",
        "'device float *' with an lvalue of type 'threadgroup float[4]'", 5),
    "position_on_float": ("""
kernel void k(device float* out [[buffer(0)]], float i [[thread_position_in_grid]]) {
  out[uint(i)] = 1.0f;
}""", "type 'float' is not valid for attribute 'thread_position_in_grid'", 2),
    "simd_lane_vector": ("""
kernel void k(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]],
              uint2 lane [[thread_index_in_simdgroup]]) {
  out[i] = float(lane.x);
}""", "type 'uint2' is not valid for attribute 'thread_index_in_simdgroup'", 2),
    "threadgroup_in_helper": ("""
float first(float x, ushort tid) {
  threadgroup float buf[4];
  if (tid == 0) buf[0] = x;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  return buf[0];
}
kernel void k(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]],
              ushort tid [[thread_position_in_threadgroup]]) {
  out[i] = first(out[i], tid);
}""", "non-kernel function variable cannot be declared in threadgroup address space ('buf' "
      "is declared in 'first'", 3),
    "static_local": ("""
kernel void k(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  static float calls = 0.0f;
  out[i] = calls;
}""", "static local variable must reside in constant address space ('calls' is not "
      "'constant')", 3),
    "static_table_indexed": ("""
kernel void k(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  static constexpr float HALVES[2] = {0.5f, 0.5f};
  out[i] = HALVES[i % 2];
}""", "static local variable must reside in constant address space ('HALVES' is indexed "
      "at run time", 4),
    "this_device": ("""
struct Acc { float v; float get() const { return v; } };
kernel void k(device float* out [[buffer(0)]], device Acc* acc [[buffer(1)]],
              uint i [[thread_position_in_grid]]) {
  out[i] = acc[i].get();
}""", "'this' argument to member function 'get' has type 'device Acc', but function is not "
      "marked device", 5),
    "this_constant": ("""
struct Acc { float v; float get() const { return v; } };
kernel void k(device float* out [[buffer(0)]], constant Acc& acc [[buffer(1)]],
              uint i [[thread_position_in_grid]]) {
  out[i] = acc.get();
}""", "'this' argument has type 'constant Acc', but the member function is not marked "
      "constant", 5),
    "this_thread": ("""
struct Acc { float v; float get() const device { return v; } };
kernel void k(device float* out [[buffer(0)]], device Acc* acc [[buffer(1)]],
              uint i [[thread_position_in_grid]]) {
  Acc a = acc[i];
  out[i] = a.get();
}""", "'this' argument has type 'thread Acc', but the member function is marked device", 6),
}


@pytest.mark.parametrize("name", list(BAD))
def test_invalid_metal_is_rejected(name):
    text, message, line = BAD[name]
    with pytest.raises(SyntaxError) as e:
        compile_shader(HEAD + text)
    assert message in str(e.value), str(e.value)
    assert e.value.lineno == line + 2, str(e.value)       # HEAD has two lines


# The corrected twins, in the order of BAD; each kernel writes out[i] = i + 1 (see `expected`).
GOOD = HEAD + r"""
void twice(thread float* p) { p[0] *= 2.0f; }
float twice_ref(const thread float& x) { return 2.0f * x; }
constant float scale = 2.0f;
constant float TABLE[4] = {1.0f, 2.0f, 3.0f, 4.0f};
constexpr constant int FOUR = 4;
struct Op { float apply(float x) const { return x; } };
float first(threadgroup float* buf) { return buf[0]; }  // threadgroup_in_helper: a pointer

kernel void spaces(device float* out [[buffer(0)]], constant float* c [[buffer(1)]],
                   uint i [[thread_position_in_grid]], uint lane [[thread_index_in_simdgroup]],
                   ushort tid [[thread_position_in_threadgroup]]) {
  threadgroup float buf[4];
  threadgroup float* t = buf;                          // tg_to_device, device_to_tg
  constant float* cp = c;                              // device_to_constant
  device const float* dp = out;                        // constant_to_device_const
  device float* p = out;
  p = out + i;                                         // assign_tg_to_device
  device float* q = (device float*)dp;                 // c_style_cast (same space)
  device int* r = reinterpret_cast<device int*>(q);    // reinterpret_cast (same space)
  if (tid == 0) { t[0] = 0.0f; }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  static constexpr constant float HALVES[2] = {0.5f, 0.5f};   // static_local, static_table
  float x = float(i) + 1.0f + first(t) + cp[0] - c[0] + HALVES[i % 2] - 0.5f;
  thread float* xp = &x;                               // unqualified_local
  twice(xp);                                           // device_to_thread_param
  float y = twice_ref(x) / 4.0f;                       // unqualified_helper_ref
  float z = y * scale / 2.0f * TABLE[i % FOUR] / TABLE[i % FOUR];   // globals, table
  float w = float(Op().apply(z));                      // no virtual
  if (i % 2) { w = w + 0.0f; }                         // no goto
  (void)r; (void)lane;
  bfloat b = bfloat(w);                                // float_to_bfloat: explicit
  p[0] = float(b) + (w - float(b));
}
"""


def test_corrected_twins_compile_and_run():
    lib = compile_shader(GOOD)
    out = torch.zeros(64)
    c = torch.tensor([0.5])
    lib.spaces(out, c)
    torch.testing.assert_close(out, torch.arange(64, dtype=torch.float32) + 1)


def test_the_message_uses_metal_spellings():
    src = HEAD + """
kernel void k(device half* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  threadgroup half buf[4];
  threadgroup half* t = buf;
  device half* p = t;
  out[i] = p[0];
}"""
    with pytest.raises(SyntaxError) as e:
        compile_shader(src)
    msg = str(e.value)
    assert "'device half *' with an lvalue of type 'threadgroup half *'" in msg, msg
    assert "__global" not in msg and "mf_half" not in msg


def test_valid_overloads_and_templates_pass_the_check():
    """Templates instantiated with [[host_name]], half/bfloat, vectors and simd functions."""
    src = HEAD + """
template <typename T>
kernel void scale(device T* x [[buffer(0)]], constant float& s [[buffer(1)]],
                  uint i [[thread_position_in_grid]]) {
  vec<T, 2> v = vec<T, 2>(x[i], T(1));
  x[i] = T(float(v.x) * s + simd_sum(0.0f));
}
template [[host_name("scale_h")]] kernel void scale<half>(device half*, constant float&, uint);
template [[host_name("scale_b")]] kernel void scale<bfloat>(device bfloat*, constant float&,
                                                            uint);
"""
    lib = compile_shader(src)
    x = torch.ones(8, dtype=torch.float16)
    lib.scale_h(x, 3.0)
    torch.testing.assert_close(x, torch.full((8,), 3.0, dtype=torch.float16))


def test_without_libclang_the_check_is_skipped_saying_what_to_install(monkeypatch):
    def missing():
        raise frontcheck.FrontCheckUnavailable("... Install it with `pip install 'libclang>=18'`.")
    monkeypatch.setattr(frontcheck, "_cindex", missing)
    frontcheck._warn_once.cache_clear()
    with pytest.warns(RuntimeWarning, match="pip install 'libclang>=18'"):
        assert not frontcheck.available()
    r = frontcheck.front_check("kernel void k() {}", None)
    assert r.errors == [] and r.pre == "kernel void k() {}"


OVERLOADS = HEAD + """
float get(device float* p) { return 1.0f; }
float get(threadgroup float* p) { return 2.0f; }
float get(thread float* p) { return 3.0f; }
float pick(constant float* p) { return 10.0f * p[0]; }
float pick(device const float* p) { return 100.0f * p[0]; }
namespace ns { float get(device float* p) { return 4.0f; } }
kernel void k(device float* out [[buffer(0)]], constant float* c [[buffer(1)]],
              uint i [[thread_position_in_grid]]) {
  threadgroup float buf[4];
  float x = 0.0f;
  device const float* d = out;
  out[i] = get(out) + 10.0f * get(buf) + 100.0f * get(&x) + 1000.0f * ns::get(out)
           + pick(c) + pick(d) * 0.0f;
}
"""


def test_overloads_on_address_spaces_run_the_overload_metal_picks():
    """get(device)/get(threadgroup)/get(thread) and pick(constant)/pick(device const) are one
    C++ function each in the build; the check renames them apart as clang resolves them."""
    lib = compile_shader(OVERLOADS)
    out = torch.zeros(4)
    lib.k(out, torch.tensor([2.0]))
    torch.testing.assert_close(out, torch.full((4,), 1.0 + 20.0 + 300.0 + 4000.0 + 20.0))


MEMBERS = HEAD + """
struct Acc {
  float v;
  float get() const thread { return v; }                 // this_device's twin: one per space
  float get() const device { return v + 1.0f; }
  float get() const constant { return v + 2.0f; }
  float get() const threadgroup { return v + 3.0f; }
  float scaled(device float* p) const thread { return v * p[0]; }
  float scaled(thread float* p) const thread { return 10.0f * v * p[0]; }
};
kernel void k(device float* out [[buffer(0)]], device Acc* acc [[buffer(1)]],
              constant Acc& c [[buffer(2)]], uint i [[thread_position_in_grid]],
              ushort tid [[thread_position_in_threadgroup]]) {
  threadgroup Acc t[1];
  Acc a = acc[i];
  if (tid == 0) t[0] = a;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float x = 1.0f;
  out[i] = acc[i].get() + 10.0f * a.get() + 100.0f * c.get() + 1000.0f * t[0].get()
           + a.scaled(out + i) + a.scaled(&x);
}
"""


def test_members_overloaded_on_address_spaces_run_the_overload_metal_picks():
    """Acc::get() marked thread/device/constant/threadgroup, and Acc::scaled on a device or
    thread pointer, are one C++ function each in the build; the check renames them apart."""
    lib = compile_shader(MEMBERS)
    out = torch.full((2,), 0.5)
    acc = torch.tensor([4.0, 4.0])                      # two Acc {v = 4}
    lib.k(out, acc, torch.tensor([7.0]), threads=2, group_size=2)
    # device 5, thread 4, constant 9, threadgroup 7, scaled: 4 * 0.5 and 10 * 4 * 1
    want = 5.0 + 10 * 4.0 + 100 * 9.0 + 1000 * 7.0 + 2.0 + 40.0
    torch.testing.assert_close(out, torch.full((2,), want))


def test_kernel_attribute_lists():
    """``[[kernel, max_total_threads_per_threadgroup(N)]]``: a kernel, with its thread limit."""
    src = HEAD + """
[[kernel, max_total_threads_per_threadgroup(64)]]
void fill(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  out[i] = float(i);
}
"""
    lib = compile_shader(src)
    assert lib.fill.max_threads_per_threadgroup == 64
    out = torch.zeros(100)
    lib.fill(out, group_size=64)
    torch.testing.assert_close(out, torch.arange(100, dtype=torch.float32))
    with pytest.raises(Exception, match="64"):
        lib.fill(out, group_size=128)


def test_template_kernel_thread_limit():
    """A template kernel's ``max_total_threads_per_threadgroup`` reaches its ``host_name``
    instantiations, in the list and the separate-attribute spellings (issue #50)."""
    lib = compile_shader(HEAD + """
template <typename T>
[[kernel, max_total_threads_per_threadgroup(128)]]
void a(device T* o [[buffer(0)]], uint i [[thread_position_in_grid]]) { o[i] = T(i); }
template [[host_name("a_f")]] [[kernel]] void a<float>(device float*, uint);
template <typename T>
[[max_total_threads_per_threadgroup(128)]] kernel
void b(device T* o [[buffer(0)]], uint i [[thread_position_in_grid]]) { o[i] = T(i); }
template [[host_name("b_f")]] kernel void b<float>(device float*, uint);
""")
    assert lib.a_f.max_threads_per_threadgroup == 128
    assert lib.b_f.max_threads_per_threadgroup == 128


GOLDEN = sorted((Path(__file__).resolve().parents[1] / "schedule" / "golden").glob("*.metal"))


def _preprocessed(source: str, tmp: Path, metal_version: int = 320) -> str:
    """`source` preprocessed as the simulator's build does (compiler.py, step 1)."""
    (tmp / compiler.SOURCE_NAME).write_text(source)
    r = compiler._run(compiler.cxx_cmd() + [
        "-E", "-x", "c++", "-std=c++17", "-D__METAL__=1", f"-D__METAL_VERSION__={metal_version}",
        "-I", str(compiler._stub_dir()), "-I", compiler.torch_include(), compiler.SOURCE_NAME],
        cwd=str(tmp))
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_every_golden_kernel_passes_the_check(tmp_path):
    """The kernels metalforge generates (tests/schedule/golden) are valid Metal: no error, and
    nothing renamed."""
    assert GOLDEN
    # Metal 4 sources (the contraction goldens at tensor-op targets) preprocess at Metal 4.0,
    # where the simulator has MetalPerformancePrimitives
    for path in GOLDEN:
        metal4 = "MetalPerformancePrimitives" in path.read_text()
        pre = _preprocessed(path.read_text(), tmp_path, 400 if metal4 else 320)
        result = frontcheck.front_check(pre, parse(pre))
        assert result.errors == [], (path.name, result.errors)
        assert result.pre == pre, path.name


def test_every_swizzle_without_repeats_reads_and_writes():
    src = HEAD + """
kernel void sw(device float4* v [[buffer(0)]], device float3* u [[buffer(1)]],
               uint i [[thread_position_in_grid]]) {
  float4 a = v[i];
  a.wx = float2(10.0f, 20.0f);              // w = 10, x = 20
  a.zyw = a.wzx;                            // (z, y, w) = (10, 3, 20)
  float3 b = u[i];
  b.bgr = b.rgb + float3(0.0f, 0.0f, 1.0f); // reversed, r + 1 into b
  v[i] = a.argb;                            // (w, x, y, z)
  u[i] = b;
}
"""
    lib = compile_shader(src)
    v = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    u = torch.tensor([[1.0, 2.0, 3.0, 0.0]])
    lib.sw(v, u, threads=1)
    # a = (20, 2, 3, 10) -> zyw = wzx = (10, 3, 20) -> a = (20, 3, 10, 20); argb = (20, 20, 3, 10)
    assert v.tolist() == [[20.0, 20.0, 3.0, 10.0]]
    assert u.tolist() == [[4.0, 2.0, 1.0, 0.0]]
