"""Address spaces in the simulator: `constant` memory is read-only as on Metal, and functions
overloaded on `constant` vs `device` pointers (torch's c10/metal/indexing.h) stay distinct."""
import pytest
import torch

from metalforge.sim import compile_shader

STRIDED_COPY = r"""
#include <c10/metal/indexing.h>
#include <metal_stdlib>
using namespace metal;

// out (contiguous) = x viewed with the given sizes/strides (in elements, innermost first).
kernel void strided_copy(constant float* x [[buffer(0)]],
                         device float* out [[buffer(1)]],
                         constant long* sizes [[buffer(2)]],
                         constant long* strides [[buffer(3)]],
                         constant uint& ndim [[buffer(4)]],
                         uint gid [[thread_position_in_grid]]) {
  const long offs = c10::metal::offset_from_thread_index(long(gid), sizes, strides, ndim);
  // the constant-pointer overload of val_at_offs (the device one must not be picked)
  out[gid] = c10::metal::val_at_offs<float>(x, offs * long(sizeof(float)));
}

// the device-pointer overload, on a read-write buffer
kernel void bump(device float* x [[buffer(0)]], uint gid [[thread_position_in_grid]]) {
  c10::metal::ref_at_offs<float>(x, long(gid) * long(sizeof(float))) += 1.0f;
}
"""


def test_c10_indexing_overloads_on_address_space():
    lib = compile_shader(STRIDED_COPY)
    base = torch.randn(5, 7)
    view = base.t()                                    # [7, 5], non-contiguous
    out = torch.empty(view.numel())
    sizes = list(reversed(view.shape))                 # innermost first
    strides = list(reversed(view.stride()))
    lib.strided_copy(base, out, sizes, strides, len(sizes), threads=out.numel(),
                     arg_casts={4: "int32"})
    torch.testing.assert_close(out.view(7, 5), view.contiguous(), rtol=0, atol=0)

    y = torch.zeros(9)
    lib.bump(y)
    torch.testing.assert_close(y, torch.ones(9), rtol=0, atol=0)


def test_writing_constant_memory_is_a_compile_error():
    src = """
#include <metal_stdlib>
kernel void bad(constant float* x [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  x[i] = 1.0f;
}
"""
    with pytest.raises(SyntaxError) as e:
        compile_shader(src)
    assert e.value.lineno == 4


def test_const_constant_spellings_compile():
    src = """
#include <metal_stdlib>
constant constexpr float kScale = 2.0f;
kernel void scale(const constant float* x [[buffer(0)]], device float* y [[buffer(1)]],
                  constant const float& s [[buffer(2)]], uint i [[thread_position_in_grid]]) {
  y[i] = x[i] * s * kScale;
}
"""
    x = torch.arange(6, dtype=torch.float32)
    y = torch.empty(6)
    compile_shader(src).scale(x, y, 0.5)
    torch.testing.assert_close(y, x, rtol=0, atol=0)


CAST_KERNEL = """
#include <metal_stdlib>
using namespace metal;
kernel void k(constant float* c [[buffer(0)]], device float* out [[buffer(1)]],
              uint i [[thread_position_in_grid]]) {
  device const float* d = out;
  {CAST}
  out[i] = q[i];
}
"""


@pytest.mark.parametrize("cast", [
    "device float* q = (device float*)c;",
    "device const float* q = (device const float*)c;",
    "device float* q = const_cast<device float*>(c);",
    "constant float* q = (constant float*)out;",
    "const constant float* q = (const constant float*)d;",
])
def test_explicit_casts_between_address_spaces_are_compile_errors(cast):
    # Metal rejects these; in C++ `constant` is `const`, so they were accepted before
    with pytest.raises(SyntaxError, match="Metal does not convert pointers between address "
                                          "spaces") as e:
        compile_shader(CAST_KERNEL.replace("{CAST}", cast))
    assert e.value.lineno == 7


@pytest.mark.parametrize("stmt", [
    "device float* p = c;",                       # implicit: drops const, C++ rejects it too
])
def test_implicit_constant_to_device_pointer_is_a_compile_error(stmt):
    with pytest.raises(SyntaxError) as e:
        compile_shader(CAST_KERNEL.replace("{CAST}", stmt + " constant float* q = c;"))
    assert e.value.lineno == 7


def test_casts_within_an_address_space_still_compile():
    src = CAST_KERNEL.replace("{CAST}", "device float* w = (device float*)d; "
                              "constant uint* cu = (constant uint*)c; "
                              "device float* q = const_cast<device float*>(d); (void)w; (void)cu;")
    out = torch.arange(4.0)
    compile_shader(src).k(torch.zeros(4), out)
    torch.testing.assert_close(out, torch.arange(4.0))
