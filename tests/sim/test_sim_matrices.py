"""MSL's matrix types (floatCxR, halfCxR: C columns of R rows) in the simulator: construction,
column access, the products, transpose and determinant, against numpy."""
import numpy as np
import torch

from metalforge.sim import compile_shader

SRC = r"""
#include <metal_stdlib>
using namespace metal;
kernel void mats(device const float* a [[buffer(0)]], device float* out [[buffer(1)]],
                 uint i [[thread_position_in_grid]]) {
  if (i != 0) return;
  float3x3 m(float3(a[0], a[1], a[2]), float3(a[3], a[4], a[5]), float3(a[6], a[7], a[8]));
  float2x3 n(a[9], a[10], a[11], a[12], a[13], a[14]);      // 2 columns of 3
  const float3 v = float3(a[15], a[16], a[17]);
  const float3 mv = m * v;
  const float2 vn = v * n;
  const float3x2 nt = transpose(n);
  const float2x3 mn = m * n;
  const float4x4 d4 = float4x4(2.0f);
  const half2x2 h(half2(1.0h, 2.0h), half2(3.0h, 4.0h));
  int k = 0;
  for (int c = 0; c < 3; ++c) out[k++] = mv[c];
  for (int c = 0; c < 2; ++c) out[k++] = vn[c];
  for (int c = 0; c < 2; ++c) for (int r = 0; r < 3; ++r) out[k++] = nt[r][c];
  for (int c = 0; c < 2; ++c) for (int r = 0; r < 3; ++r) out[k++] = mn[c][r];
  out[k++] = determinant(m);
  out[k++] = determinant(d4);
  out[k++] = float(determinant(h));
  out[k++] = (m + m - m)[2][1] * 2.0f * 1.0f;
  out[k++] = float(sizeof(float3x3) + sizeof(half2x2) * 100);
}
"""


def test_matrix_types_match_numpy():
    a = np.random.default_rng(0).standard_normal(18).astype(np.float32)
    out = torch.zeros(32)
    compile_shader(SRC).mats(torch.from_numpy(a), out, threads=1)
    got = out.numpy()
    m = a[:9].reshape(3, 3).T            # columns -> a row-major numpy matrix
    n = a[9:15].reshape(2, 3).T          # 3 rows, 2 columns
    v = a[15:18]
    want = np.concatenate([m @ v, v @ n, n.reshape(-1, order="F"), (m @ n).reshape(-1, order="F"),
                           [np.linalg.det(m), 16.0, -2.0, 2 * m[1, 2], 48 + 8 * 100]])
    np.testing.assert_allclose(got[:len(want)], want, rtol=1e-5, atol=1e-5)
