"""The cuda backend runs the simulator's Metal front-end check on every source it compiles
(issue #50): each invalid program of test_sim_strict.py fails `metalforge.cuda.compile_shader`
with the simulator's message at the same line, the corrected twins pass, and a source checked
once is not checked again (a marker in the cache). No GPU needed: a CudaLibrary compiles with
NVRTC only on first use on a device."""
import pytest

from metalforge.cuda import compile_shader as cuda_compile_shader
from metalforge.sim import frontcheck, metalcheck

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

    def fail(source):
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
