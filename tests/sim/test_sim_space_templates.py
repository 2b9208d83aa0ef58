"""Overloads that differ only in address space, called from templates (issue #50).

In the simulator's C++ build ``f(device float*)`` and ``f(threadgroup float*)`` are one
function; the front-end check renames them apart as clang resolves each call, and inside
templates per instantiation.  Before, a call whose arguments depend on a template parameter,
and member functions of class templates, ran whichever overload the parser kept (the program
below gave 200 too little for `ld(threadgroup)`, and `v` instead of `v + 1` for the device
`at()`).  What the build cannot keep apart is refused, never run through the wrong overload.
"""
import pytest
import torch

from metalforge.sim import compile_shader, frontcheck

from ..cuda_host import assert_host_syntax

pytestmark = pytest.mark.skipif(not frontcheck.available(), reason="libclang is not installed")

HEAD = "#include <metal_stdlib>\nusing namespace metal;\n"

TEMPLATES = HEAD + """
float get(device float* p) { return p[0]; }
float get(threadgroup float* p) { return 2.0f * p[0]; }
float get(thread float* p) { return 3.0f * p[0]; }
template <typename T> T ld(device T* p) { return p[0]; }
template <typename T> T ld(threadgroup T* p) { return T(200) + p[0]; }
template <> half ld<half>(threadgroup half* p) { return half(300) + p[0]; }
template <typename T> struct Acc {
  T v;
  T at() const thread;
  T at() const device { return v + T(1); }
  T sum(device T* p) const thread { return at() + p[0] + this->at(); }
  template <typename U> U as() const thread { return U(v); }
  template <typename U> U as() const device { return U(v) + U(2); }
};
template <typename T> T Acc<T>::at() const thread { return v; }
template <> half Acc<half>::at() const device { return v + half(5); }

template <typename F> float three(device F* a, threadgroup F* b, thread F* c) {
  return get(a) + 10.0f * get(b) + 100.0f * get(c);
}
template <typename T> float lds(device T* a, threadgroup T* b) {
  return float(ld(a)) + 1000.0f * float(ld<T>(b));
}
template <typename T>
kernel void k(device T* x [[buffer(0)]], device float* f [[buffer(1)]],
              device Acc<T>* acc [[buffer(2)]], device float* out [[buffer(3)]],
              uint i [[thread_position_in_grid]], uint l [[thread_position_in_threadgroup]]) {
  threadgroup T tb[64];
  threadgroup float fb[64];
  tb[l] = x[i] + T(1);
  fb[l] = f[i] + 1.0f;
  float c = f[i] + 2.0f;
  Acc<T> a = acc[i];
  out[i] = three(f + i, fb + l, &c) + lds(x + i, tb + l) + 1e4f * float(acc[i].at())
           + 1e5f * float(a.sum(x + i))
           + 1e6f * (acc[i].template as<float>() - a.template as<float>());
}
template [[host_name("k_f")]] kernel void k<float>(device float*, device float*,
    device Acc<float>*, device float*, uint, uint);
template [[host_name("k_h")]] kernel void k<half>(device half*, device float*,
    device Acc<half>*, device float*, uint, uint);
"""


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_overloads_called_from_templates_run_the_overload_metal_picks(dtype):
    """Free functions called with dependent arguments, function templates overloaded on
    spaces (with an explicit specialisation), class-template members overloaded on the
    space of `this` (defined in and out of the class, one explicitly specialised, called
    through an object, `this->` and implicitly) and member templates overloaded so: each
    call runs the overload Metal picks."""
    lib = compile_shader(TEMPLATES)
    n = 5
    x = torch.arange(n, dtype=dtype)                    # small integers: exact in half
    f = torch.arange(n, dtype=torch.float32) * 2.0
    v = torch.arange(n, dtype=dtype) + 1.0               # Acc<T> {v}
    out = torch.zeros(n)
    getattr(lib, "k_f" if dtype == torch.float32 else "k_h")(x, f, v, out, threads=n)
    xf, vf = x.double(), v.double()
    fd = f.double()
    three = fd + 10 * 2 * (fd + 1) + 100 * 3 * (fd + 2)
    tg_base, dev_bump = (200, 1) if dtype == torch.float32 else (300, 5)
    lds = xf + 1000 * (tg_base + xf + 1)
    want = three + lds + 1e4 * (vf + dev_bump) + 1e5 * (vf + xf + vf) + 1e6 * 2
    torch.testing.assert_close(out.double(), want, rtol=0, atol=0)


def test_a_call_that_picks_per_instantiation_is_refused():
    """`via<device float*>` and `via<thread float*>` are one function in the C++ build, so
    the call in it cannot pick both overloads: refused at its line, naming both."""
    src = HEAD + """
float get(device float* p) { return 1.0f; }
float get(thread float* p) { return 3.0f; }
template <typename P> float via(P p) { return get(p); }
kernel void k(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  float x = 0.0f;
  out[i] = via(out) + 10.0f * via(&x);
}
"""
    with pytest.raises(SyntaxError) as e:
        compile_shader(src)
    msg = str(e.value)
    assert e.value.lineno == 6
    assert "picks a different overload" in msg
    assert "get(device float *) in 'via<device float *>'" in msg
    assert "get(thread float *) in 'via<thread float *>'" in msg


CONSTRUCTORS = HEAD + """
struct Box {
  float v;
  Box() thread : v(1.0f) {}
  Box() threadgroup : v(2.0f) {}
};
kernel void k(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  Box b;
  out[i] = b.v;
}
"""


def test_constructors_overloaded_on_spaces_with_different_bodies_are_refused():
    """Constructors (and operators) cannot be renamed apart: refused rather than run through
    the one the build keeps.  (Identical bodies, as MLX's complex_t has, are kept as one.)"""
    with pytest.raises(SyntaxError) as e:
        compile_shader(CONSTRUCTORS)
    assert e.value.lineno == 7
    assert "differs from another definition only in address spaces" in str(e.value)
    assert "not operators, constructors" in str(e.value)


def test_without_the_check_differing_overloads_are_refused(monkeypatch):
    """With the front-end check off (or libclang missing), overloads the build would merge
    are refused, saying that the check is what keeps them apart."""
    monkeypatch.setenv("METALFORGE_SIM_FRONTCHECK", "0")
    src = HEAD + """
float get(device float* p) { return 1.0f; }
float get(threadgroup float* p) { return 2.0f; }
kernel void k(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  out[i] = get(out);
}
"""
    with pytest.raises(SyntaxError) as e:
        compile_shader(src)
    assert e.value.lineno == 5
    assert "libclang" in str(e.value)


def test_cuda_compiles_the_same_renames(tmp_path):
    """The cuda backend compiles the overloads renamed apart at the same calls (each call in
    the templates to its overload), and the unit passes the shim's host syntax check."""

    from metalforge.cuda import compile_shader as cuda_compile_shader

    body = cuda_compile_shader(TEMPLATES).text
    for call in ("get__mf_as0(a) + 10.0f * get__mf_as1(b) + 100.0f * get__mf_as2(c)",
                 "float(ld__mf_as0(a)) + 1000.0f * float(ld__mf_as1<T>(b))",
                 "half ld__mf_as1<half>(threadgroup half* p)",
                 "return at__mf_as0() + p[0] + this->at__mf_as0();",
                 "T Acc<T>::at__mf_as0() const thread", "half Acc<half>::at__mf_as1() const device",
                 "1e4f * float(acc[i].at__mf_as1())"):
        assert call in body, call
    assert_host_syntax(body, tmp_path)
