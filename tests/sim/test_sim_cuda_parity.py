"""The cuda backend runs the simulator's Metal front-end check on every source it compiles
(issue #50): each invalid program of test_sim_strict.py fails `metalforge.cuda.compile_shader`
with the simulator's message at the same line, the corrected twins pass, and a source checked
once is not checked again (a marker in the cache). No GPU needed: a CudaLibrary compiles with
NVRTC only on first use on a device."""
import pytest

from metalforge.cuda import compile_shader as cuda_compile_shader
from metalforge.sim import frontcheck, metalcheck

from ..cuda_host import assert_host_syntax
from .test_sim_strict import BAD, GOOD, HEAD

pytestmark = pytest.mark.skipif(not frontcheck.available(), reason="libclang is not installed")


@pytest.mark.parametrize("name", list(BAD))
def test_cuda_rejects_what_the_simulator_rejects(name):
    text, message, line = BAD[name]
    with pytest.raises(SyntaxError) as e:
        cuda_compile_shader(HEAD + text)
    msg = str(e.value)
    assert msg.startswith("failed to compile Metal source for CUDA (Metal front-end check)"), msg
    assert message in msg, msg
    assert e.value.lineno == line + 2, msg


def test_cuda_accepts_the_twins_and_checks_a_source_once(monkeypatch):
    lib = cuda_compile_shader(GOOD)
    assert dir(lib) == ["spaces"]

    def fail(source, *version):
        raise AssertionError("checked again")
    monkeypatch.setattr(metalcheck, "_check", fail)
    cuda_compile_shader(GOOD)                       # the marker: no second check
    with pytest.raises(AssertionError, match="checked again"):
        cuda_compile_shader(GOOD + "\n// another source\n")


def test_cuda_rejects_a_repeated_swizzle_write():
    src = HEAD + """
kernel void k(device float4* v [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  float4 a = v[i];
  a.xx = float2(1.0f, 2.0f);
  v[i] = a;
}"""
    with pytest.raises(SyntaxError) as e:
        cuda_compile_shader(src)
    assert "a swizzle with a repeated component is not assignable ('xx')" in str(e.value)
    assert e.value.lineno == 6


# ------------------------------------------------------------------ swizzles
# Every kind of swizzle Metal accepts: reads of 2-4 components with repeats, in both
# spellings, through a pointer and on a const vector; writes without repeats (plain and
# compound); lone .r/.g/.b/.a; a struct field named like a swizzle (`rg`) stays a field.
SWIZZLES = HEAD + """
struct P { float val; float rg; };
kernel void sw(device float4* v [[buffer(0)]], device float3* u [[buffer(1)]],
               device P* ps [[buffer(2)]], uint i [[thread_position_in_grid]]) {
  float4 a = v[i];
  a.wx = float2(10.0f, 20.0f);
  a.zyw = a.wzx;
  a.zy += float2(1.0f, 2.0f);
  a.xw *= 2.0f;
  float3 b = u[i];
  b.bgr = b.rgb + float3(0.0f, 0.0f, 1.0f);
  b.r = b.g + a.a;
  float4 c = a.xxyy + a.zzzw + float4(b.rrr, a.a) + (v + i)->wwxy;
  ps[i].val = ps[i].rg + c.x;
  ps[i].rg = c.g;
  const float4 k = v[i];
  float2 kz = k.zw + k.ar;
  v[i] = a.argb + c;
  v[i].yz = kz;
  u[i] = b;
}
"""
_SWIZZLE_MAIN = r"""
#include <cstdio>
int main() {
  float4 v[1] = {float4(1.0f, 2.0f, 3.0f, 4.0f)};
  float3 u[1] = {float3(5.0f, 6.0f, 7.0f)};
  P ps[1] = {{0.0f, 0.5f}};
  sw(v, u, ps, 0u);
  std::printf("%g %g %g %g %g %g %g %g %g\n", v[0].x, v[0].y, v[0].z, v[0].w, u[0].x, u[0].y,
              u[0].z, ps[0].val, ps[0].rg);
}
"""


def test_cuda_shim_swizzles_match_the_simulator(tmp_path):
    """The CUDA translation of SWIZZLES, compiled for the host against the CUDA shim (its
    host stand-ins) and run, gives what the simulator gives."""
    import shutil
    import subprocess

    import torch

    from metalforge.cuda import translate
    from metalforge.cuda.library import INCLUDE_DIR
    from metalforge.sim import compile_shader

    v = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    u = torch.tensor([[5.0, 6.0, 7.0, 0.0]])
    ps = torch.tensor([[0.0, 0.5]])
    compile_shader(SWIZZLES).sw(v, u, ps, threads=1)
    want = v[0].tolist() + u[0, :3].tolist() + ps[0].tolist()
    # by hand: a = (40, 5, 11, 40), b = (46, 6, 5), c = (101, 101, 63, 87), kz = (7, 5)
    assert want == [141.0, 7.0, 5.0, 98.0, 46.0, 6.0, 5.0, 101.5, 101.0]

    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    body = translate(SWIZZLES).text.split('#line 1 "metalforge_cuda_entries"')[0]
    assert "mf_swzc_w<0x130>()" in body and "mf_swzc<0x10011>()" in body and "ps[i].rg" in body
    (tmp_path / "sw.cpp").write_text(body + '#line 1 "main"\n' + _SWIZZLE_MAIN)
    r = subprocess.run([cxx, "-std=c++17", "-w", "-DMF_CUDA_HOST_CHECK", f"-I{INCLUDE_DIR}",
                        "-x", "c++", "sw.cpp", "-o", "sw"], capture_output=True, text=True,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr[:4000]
    got = [float(x) for x in subprocess.run([str(tmp_path / "sw")], capture_output=True,
                                            text=True, check=True).stdout.split()]
    assert got == want


def test_cuda_rejects_a_repeated_swizzle_write_without_the_check():
    from metalforge.cuda import translate
    src = HEAD + """
kernel void k(device half4* v [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  half4 a = v[i];
  a.gg -= half2(1.0h, 2.0h);
  v[i] = a;
}"""
    with pytest.raises(SyntaxError, match=r"repeated component is not assignable \('gg'\)") as e:
        translate(src)
    assert e.value.lineno == 6


def test_cuda_rewrites_swizzles_in_define_bodies(tmp_path):
    """Swizzles in macro bodies (continuation lines included) and in a macro's argument
    (where a comma would split it) are rewritten: the translation passes the host syntax
    check."""

    from metalforge.cuda import translate
    src = HEAD + """
#define REV(v) ((v).zyx + v.rrr)
#define SET(v, c) v.wx = c; \\
  v.bg = c
kernel void k(device float4* v [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  float4 a = v[i];
  SET(a, REV(a).xy);
  v[i] = a;
}"""
    body = translate(src).text
    assert "#define REV(v) ((v).template mf_swzc<0x1210>() + v.template mf_swzc<0x1000>())" \
        in body
    assert "v.template mf_swzc_w<0x130>() = c;" in body
    assert "v.template mf_swzc_w<0x121>() = c" in body and "SET(a, REV(a).template" in body
    assert_host_syntax(body, tmp_path)


def test_cuda_renames_address_space_overloads_as_the_simulator(tmp_path):
    """get(device)/get(threadgroup)/get(thread) and pick(constant)/pick(device const) would
    be one CUDA function each (redefinitions); the cuda backend compiles them renamed apart
    as clang resolved each call, and the unit passes the shim's host syntax check."""


    from .test_sim_strict import OVERLOADS
    lib = cuda_compile_shader(OVERLOADS)
    body = lib.text.split('#line 1 "metalforge_cuda_entries"')[0]
    for name in ("get__mf_as0(device", "get__mf_as1(threadgroup", "get__mf_as2(thread",
                 "pick__mf_as0(constant", "pick__mf_as1(device const",
                 "get__mf_as0(out) + 10.0f * get__mf_as1(buf) + 100.0f * get__mf_as2(&x)",
                 "ns::get(out)", "pick__mf_as0(c) + pick__mf_as1(d)"):
        assert name in body, (name, body)
    assert body.count("\n") == OVERLOADS.count("\n") + 2          # lines kept
    assert_host_syntax(lib.text, tmp_path)


def test_cuda_rewrites_a_vector_swizzle_named_like_a_struct_field(tmp_path):
    """`P` has fields `a` and `rg`: `p.a`/`p.rg` stay fields, while `c.a`/`c.rg` on a float4
    (told apart by the front-end check's types) become the vector's swizzles; the unit
    passes the host syntax check."""

    from metalforge.cuda import compile_shader as cuda_compile
    src = HEAD + """
struct P { float a; float2 rg; };
kernel void k(device float4* v [[buffer(0)]], device P* ps [[buffer(1)]],
              uint i [[thread_position_in_grid]]) {
  float4 c = v[i];
  ps[i].a = c.a + ps[i].rg.x;
  ps[i].rg = c.rg;
}"""
    body = cuda_compile(src).text
    assert "ps[i].a = c.w + ps[i].rg.x;" in body, body
    assert "ps[i].rg = c.template mf_swzc<0x101>();" in body, body
    assert_host_syntax(body, tmp_path)
