"""The pack/unpack functions of <metal_pack> (MSL spec, "Pack and Unpack Functions") in the
simulator, against the spec's conversion rules computed with numpy."""
import numpy as np
import torch

from metalforge.sim import compile_shader

SRC = r"""
#include <metal_stdlib>
using namespace metal;
kernel void pack(device const float4* v [[buffer(0)]], device uint* out [[buffer(1)]],
                 uint i [[thread_position_in_grid]]) {
  const float4 x = v[i];
  out[6 * i + 0] = pack_float_to_unorm4x8(x);
  out[6 * i + 1] = pack_float_to_snorm4x8(x);
  out[6 * i + 2] = pack_float_to_unorm2x16(x.xy);
  out[6 * i + 3] = pack_float_to_snorm2x16(x.zw);
  out[6 * i + 4] = pack_float_to_unorm10a2(x);
  out[6 * i + 5] = pack_half_to_unorm4x8(half4(x));
}
kernel void unpack(device const uint* w [[buffer(0)]], device float* out [[buffer(1)]],
                   uint i [[thread_position_in_grid]]) {
  const uint x = w[i];
  const float4 a = unpack_unorm4x8_to_float(x), b = unpack_snorm4x8_to_float(x);
  const float2 c = unpack_unorm2x16_to_float(x), d = unpack_snorm2x16_to_float(x);
  const float4 e = unpack_unorm10a2_to_float(x);
  const half4 h = unpack_unorm4x8_to_half(x);
  const float r[20] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w, c.x, c.y, d.x, d.y,
                       e.x, e.y, e.z, e.w, float(h.x), float(h.y), float(h.z), float(h.w)};
  for (int k = 0; k < 20; ++k) out[20 * i + k] = r[k];
}
"""


def _unorm(f, mx):
    return np.rint(np.clip(np.nan_to_num(f, nan=0.0) * mx, 0, mx)).astype(np.int64)


def _snorm(f, mx, bits):
    v = np.rint(np.clip(np.nan_to_num(f, nan=0.0) * mx, -mx, mx)).astype(np.int64)
    return v & ((1 << bits) - 1)


def _join(parts, bits):
    return sum(p << (bits * k) for k, p in enumerate(parts))


def test_pack_matches_the_spec_rules():
    v = torch.tensor([[0.0, 1.0, -1.0, 0.5], [0.2, -0.3, 2.0, -7.0],
                      [float("nan"), 0.998, 1e-3, 1 / 255],
                      [0.5 / 255, 1.5 / 255, -0.5 / 127, 0.75]], dtype=torch.float32)
    out = torch.zeros(6 * len(v), dtype=torch.int32)
    compile_shader(SRC).pack(v, out, threads=len(v))
    got = out.numpy().view(np.uint32).reshape(-1, 6).astype(np.int64)
    x = v.numpy().astype(np.float32)
    for i, row in enumerate(x):
        h = row.astype(np.float16).astype(np.float32)
        want = [_join([_unorm(c, 255) for c in row], 8), _join([_snorm(c, 127, 8) for c in row], 8),
                _join([_unorm(c, 65535) for c in row[:2]], 16),
                _join([_snorm(c, 32767, 16) for c in row[2:]], 16),
                _unorm(row[0], 1023) | _unorm(row[1], 1023) << 10 | _unorm(row[2], 1023) << 20
                | _unorm(row[3], 3) << 30,
                _join([_unorm(c, 255) for c in h], 8)]
        assert got[i].tolist() == [int(w) for w in want], (i, row)


def test_unpack_matches_the_spec_rules():
    w = np.array([0, 0xffffffff, 0x80818283, 0x7f01ff80, 0x12345678], dtype=np.uint32)
    out = torch.zeros(20 * len(w))
    compile_shader(SRC).unpack(torch.from_numpy(w.view(np.int32)), out, threads=len(w))
    got = out.numpy().reshape(-1, 20)
    for i, x in enumerate(w.astype(np.int64)):
        b8 = [(x >> (8 * k)) & 0xff for k in range(4)]
        b16 = [(x >> (16 * k)) & 0xffff for k in range(2)]
        s8 = [max((b - 256 if b > 127 else b) / 127, -1.0) for b in b8]
        s16 = [max((b - 65536 if b > 32767 else b) / 32767, -1.0) for b in b16]
        want = [b / 255 for b in b8] + s8 + [b / 65535 for b in b16] + s16 + \
            [(x & 0x3ff) / 1023, (x >> 10 & 0x3ff) / 1023, (x >> 20 & 0x3ff) / 1023,
             (x >> 30) / 3] + \
            [float(np.float16(b / 255)) for b in b8]
        np.testing.assert_allclose(got[i], np.array(want, dtype=np.float32), rtol=1e-6, atol=1e-7)


def _to_srgb(c):
    c = np.nan_to_num(c.astype(np.float32), nan=0.0)
    c = np.clip(c, 0.0, 1.0)
    return np.where(c < 0.0031308, 12.92 * c, 1.055 * np.power(c, 1 / 2.4) - 0.055)


def test_srgb_and_565_match_the_spec_rules():
    """sRGB (curve on r, g, b; alpha linear) and 5/6/5 packs and unpacks against numpy."""
    lib = compile_shader("""#include <metal_stdlib>
using namespace metal;
kernel void k(device const float4* a [[buffer(0)]], device uint* srgb [[buffer(1)]],
              device ushort* p565 [[buffer(2)]], device float4* us [[buffer(3)]],
              device float4* u5 [[buffer(4)]], uint i [[thread_position_in_grid]]) {
  srgb[i] = pack_float_to_srgb_unorm4x8(a[i]);
  p565[i] = pack_float_to_unorm565(a[i].xyz);
  us[i] = unpack_unorm4x8_srgb_to_float(srgb[i]);
  u5[i] = float4(unpack_unorm565_to_float(p565[i]), float(unpack_unorm565_to_half(p565[i]).y));
}
""")
    a = torch.rand(64, 4, generator=torch.Generator().manual_seed(3)) * 1.4 - 0.2
    a[0, 0] = 0.002
    srgb = torch.zeros(64, dtype=torch.int32)
    p565 = torch.zeros(64, dtype=torch.int16)
    us, u5 = torch.zeros(64, 4), torch.zeros(64, 4)
    lib.k(a, srgb, p565, us, u5, threads=64)
    x = a.numpy()
    rgb = np.concatenate([_to_srgb(x[:, :3]), x[:, 3:]], 1)
    want = _join([_unorm(rgb[:, j], 255.0) for j in range(4)], 8)
    # each channel within one step of numpy's (the curve's pow may round the other way at a
    # step's edge: Metal allows the sRGB conversion 0.6 ULP), alpha exactly
    got = srgb.numpy().astype(np.uint32).astype(np.int64)
    bytes_of = [(v[:, None] >> (8 * np.arange(4))) & 255 for v in (got, want.astype(np.int64))]
    assert np.abs(bytes_of[0] - bytes_of[1]).max() <= 1
    np.testing.assert_array_equal(bytes_of[0][:, 3], bytes_of[1][:, 3])
    w565 = (_unorm(x[:, 0], 31.0) | _unorm(x[:, 1], 63.0) << 5 | _unorm(x[:, 2], 31.0) << 11)
    np.testing.assert_array_equal(p565.numpy().astype(np.uint16), w565.astype(np.uint16))
    b = w565.astype(np.int64)
    fl = np.stack([(b & 31) / 31.0, (b >> 5 & 63) / 63.0, (b >> 11 & 31) / 31.0], 1)
    np.testing.assert_allclose(u5.numpy()[:, :3], fl, rtol=1e-6)
    c = np.stack([(got >> (8 * j)) & 255 for j in range(4)], 1) / 255.0
    lin = np.where(c <= 0.04045, c / 12.92, np.power((c + 0.055) / 1.055, 2.4))
    lin[:, 3] = c[:, 3]
    np.testing.assert_allclose(us.numpy(), lin, rtol=1e-5, atol=1e-7)
