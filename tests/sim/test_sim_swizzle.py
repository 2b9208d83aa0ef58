"""Swizzles with a repeated component (issue #50): values, not assignment targets, as in Metal."""
import pytest
import torch

from metalforge.sim import compile_shader

HEAD = """#include <metal_stdlib>
using namespace metal;
kernel void k(device float4* o [[buffer(0)]], device const float4* a [[buffer(1)]],
              uint i [[thread_position_in_grid]]) {
"""


def test_repeated_swizzle_reads():
    """.xxyy on names, a[i], parentheses, proxies and 2-vectors, xyzw and rgba, match torch."""
    lib = compile_shader(HEAD + """
  float4 v = a[i];
  float2 w = v.zw;
  o[i] = v.xxyy + a[i].wwzz * float4(w.yyx, 1.0f) + float4(v.rrg, (v).aaa.x)
       + float4(w.xx.yy, v.yy);
}
""")
    a = torch.randn(8, 4)
    o = torch.zeros(8, 4)
    lib.k(o, a, threads=8)
    w = a[:, 2:]
    ref = (a[:, [0, 0, 1, 1]]
           + a[:, [3, 3, 2, 2]] * torch.cat([w[:, [1, 1, 0]], torch.ones(8, 1)], 1)
           + torch.cat([a[:, [0, 0, 1]], a[:, 3:4]], 1)
           + torch.cat([w[:, [0, 0]], a[:, [1, 1]]], 1))
    torch.testing.assert_close(o, ref)


@pytest.mark.parametrize("stmt", ["v.xx = float2(1.0f);", "v.xx += 1.0f;", "v.rrg++;",
                                  "++v.zz;"])
def test_repeated_swizzle_write_rejected(stmt):
    """Metal: "a swizzle with a repeated component is not assignable"; reported at its line."""
    with pytest.raises(SyntaxError, match="repeated component is not assignable") as e:
        compile_shader(HEAD + "  float4 v = a[i];\n  " + stmt + "\n  o[i] = v;\n}\n")
    assert e.value.lineno == 6


def test_repeated_swizzle_write_through_parentheses_rejected():
    """A write the token check cannot see still fails: the value returned is const."""
    with pytest.raises(SyntaxError):
        compile_shader(HEAD + "  float4 v = a[i];\n  (v.yy) = float2(1.0f);\n  o[i] = v;\n}\n")


def test_struct_field_named_like_a_swizzle():
    """A struct field called ``xx`` stays a field (the rewrite skips names the source declares)."""
    lib = compile_shader(HEAD.replace("kernel void k", "struct P { float xx; float4 v; };\n"
                                      "kernel void k") + """
  P p;
  p.xx = 2.0f;
  p.v = a[i];
  o[i] = p.v.zzww * p.xx;
}
""")
    a = torch.randn(4, 4)
    o = torch.zeros(4, 4)
    lib.k(o, a, threads=4)
    torch.testing.assert_close(o, a[:, [2, 2, 3, 3]] * 2)


def test_repeated_swizzles_on_packed_vectors_read():
    """``p.xxyy`` on a packed vector reads as on a vector; a write is Metal's error."""
    src = """
#include <metal_stdlib>
using namespace metal;
kernel void k(device packed_float3* p [[buffer(0)]], device float4* out [[buffer(1)]],
              uint i [[thread_position_in_grid]]) {
  packed_float3 v = p[i];
  out[i] = v.zzyx + p[i].rrgg;
}
"""
    p = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    out = torch.zeros(2, 4)
    compile_shader(src).k(p, out, threads=2)
    want = torch.tensor([[3.0 + 1, 3 + 1, 2 + 2, 1 + 2], [6.0 + 4, 6 + 4, 5 + 5, 4 + 5]])
    assert torch.equal(out, want)
    with pytest.raises(SyntaxError, match=r"repeated component is not assignable \('xx'\)"):
        compile_shader(src.replace("packed_float3 v = p[i];", "packed_float3 v = p[i];\n"
                                   "  v.xx = float2(1.0f, 2.0f);"))
