"""metalforge.sim: every simd/quad collective, divergent participation, barriers, and torch's
c10/metal/reduction_utils.h, each checked against a Python model of Metal's semantics."""
import math

import pytest
import torch

from metalforge.sim import compile_shader

NF, NU = 23, 12
SENT = 12345.0

SRC = r"""
#include <metal_stdlib>
using namespace metal;

kernel void collectives(device const float* x [[buffer(0)]], device float* out [[buffer(1)]],
                        device uint* uout [[buffer(2)]], uint gid [[thread_position_in_grid]],
                        uint lane [[thread_index_in_simdgroup]]) {
  float v = x[gid];
  device float* o = out + gid * 23;
  device uint* u = uout + gid * 12;
  if ((lane % 5) != 4) {
    o[0] = simd_sum(v);
    o[1] = simd_product(v);
    o[2] = simd_max(v);
    o[3] = simd_min(v);
    o[4] = simd_prefix_inclusive_sum(v);
    o[5] = simd_prefix_exclusive_sum(v);
    o[6] = simd_prefix_inclusive_product(v);
    o[7] = simd_prefix_exclusive_product(v);
    o[8] = simd_broadcast(v, 3);
    o[9] = simd_broadcast_first(v);
    o[10] = simd_shuffle(v, ushort((lane * 7) % 32));
    o[11] = simd_shuffle_xor(v, 5);
    o[12] = simd_shuffle_up(v, 2);
    o[13] = simd_shuffle_down(v, 3);
    o[14] = simd_shuffle_and_fill_up(v, -v, 2);
    o[15] = simd_shuffle_and_fill_down(v, -v, 3);
    o[16] = simd_shuffle_and_fill_up(v, -v, 3, 8);
    o[17] = simd_shuffle_and_fill_down(v, -v, 2, 8);
    float2 v2 = simd_sum(float2(v, 2.0f * v));
    o[18] = v2.x;
    o[19] = v2.y;
    float4 s4 = simd_shuffle_down(float4(v, v + 1, v + 2, v + 3), 1);
    o[20] = s4.w;
    o[21] = quad_sum(v);
    o[22] = quad_broadcast(v, 1);
    uint iv = (gid * 2654435761u) >> 7;
    u[0] = simd_and(iv);
    u[1] = simd_or(iv);
    u[2] = simd_xor(iv);
    simd_vote b = simd_ballot(v > 1.0f);
    u[3] = uint(ulong(b) & 0xffffffffu);
    u[4] = simd_all(v > -100.0f);
    u[5] = simd_any(v > 1.08f);
    u[6] = simd_is_first();
    u[7] = simd_all(v > 1.0f);
    u[8] = b.all();
    u[9] = b.any();
    u[10] = as_type<uint>(simd_max(int(gid) - 50));
    u[11] = as_type<uint>(simd_min(int(gid) - 50));
  } else {
    for (int k = 0; k < 23; ++k) o[k] = 12345.0f;
    for (int k = 0; k < 12; ++k) u[k] = 12345u;
  }
}

// lanes in different branches take part in different collectives
kernel void branches(device const float* x, device float* out,
                     uint gid [[thread_position_in_grid]],
                     uint lane [[thread_index_in_simdgroup]]) {
  float v = x[gid];
  float r;
  if (lane < 10) {
    r = simd_sum(v);
  } else {
    r = simd_sum(v * 2.0f);
  }
  simdgroup_barrier(mem_flags::mem_none);
  out[gid * 2] = r;
  out[gid * 2 + 1] = simd_sum(v);      // everyone again
}

// a barrier inside a loop with a collective between
kernel void scan_blocks(device const float* x, device float* out,
                        uint tid [[thread_position_in_threadgroup]],
                        uint gid [[thread_position_in_grid]],
                        uint sg [[simdgroup_index_in_threadgroup]],
                        uint lane [[thread_index_in_simdgroup]],
                        uint nsg [[simdgroups_per_threadgroup]]) {
  threadgroup float totals[32];
  float p = simd_prefix_inclusive_sum(x[gid]);
  if (lane == 31) totals[sg] = p;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float offset = 0;
  for (uint k = 0; k < sg; ++k) offset += totals[k];
  out[gid] = p + offset;
}
"""

C10_SRC = r"""
#include <c10/metal/reduction_utils.h>
#include <metal_stdlib>
using namespace metal;

kernel void row_stats(constant float* x [[buffer(0)]], device float* out [[buffer(1)]],
                      constant uint& N [[buffer(2)]],
                      uint row [[threadgroup_position_in_grid]],
                      uint tid [[thread_position_in_threadgroup]],
                      uint tptg [[threads_per_threadgroup]]) {
  threadgroup float shared[32];
  threadgroup float shared_max[32];
  float acc = 0;
  float mx = -INFINITY;
  for (uint i = tid; i < N; i += tptg) {
    float v = x[row * N + i];
    acc += v * v;
    mx = metal::max(mx, v);
  }
  float tot = c10::metal::threadgroup_sum(shared, acc, tid, tptg);
  float m = c10::metal::threadgroup_max(shared_max, mx, tid, tptg);
  if (tid == 0) {
    out[row * 3] = tot;
    out[row * 3 + 1] = m;
    out[row * 3 + 2] = metal::precise::rsqrt(tot / N + 1e-6f);
  }
}

kernel void nan_max(constant float* x [[buffer(0)]], device float* out [[buffer(1)]],
                    uint gid [[thread_position_in_grid]]) {
  out[gid] = c10::metal::simd_max(x[gid]);
}
"""


@pytest.fixture(scope="module")
def lib():
    return compile_shader(SRC)


def _model(x: torch.Tensor, n: int, g: int):
    """Metal's collective semantics on the lanes of each simdgroup (float64 math)."""
    xs = x.double().tolist()
    out = [[SENT] * NF for _ in range(n)]
    uout = [[12345] * NU for _ in range(n)]
    for g0 in range(0, n, g):
        actual = min(g, n - g0)
        for s0 in range(0, actual, 32):
            lanes = [g0 + s0 + ln if s0 + ln < actual else None for ln in range(32)]
            act = [lanes[ln] is not None and ln % 5 != 4 for ln in range(32)]

            def val(ln):
                return xs[lanes[ln]] if 0 <= ln < 32 and act[ln] else 0.0

            alist = [ln for ln in range(32) if act[ln]]
            vals = [xs[lanes[ln]] for ln in alist]
            for ln in alist:
                gid = lanes[ln]
                v = xs[gid]
                o = out[gid]
                o[0] = sum(vals)
                o[1] = math.prod(vals)
                o[2] = max(vals)
                o[3] = min(vals)
                before = [xs[lanes[k]] for k in alist if k < ln]
                o[4] = sum(before) + v
                o[5] = sum(before)
                o[6] = math.prod(before) * v
                o[7] = math.prod(before)
                o[8] = val(3)
                o[9] = vals[0]
                o[10] = val((ln * 7) % 32)
                o[11] = val(ln ^ 5)
                o[12] = val(ln - 2) if ln >= 2 else v
                o[13] = val(ln + 3) if ln + 3 < 32 else v

                def fill(delta, m, down):
                    base, own = ln - ln % m, ln % m
                    s = own + delta if down else own - delta
                    if 0 <= s < m:
                        return val(base + s)
                    fs = s - m if down else s + m
                    return -val(base + fs)
                o[14] = fill(2, 32, False)
                o[15] = fill(3, 32, True)
                o[16] = fill(3, 8, False)
                o[17] = fill(2, 8, True)
                o[18] = sum(vals)
                o[19] = 2 * sum(vals)
                o[20] = (val(ln + 1) + 3 if act[ln + 1] else 0.0) if ln + 1 < 32 else v + 3
                q = [k for k in range(ln - ln % 4, ln - ln % 4 + 4) if act[k]]
                o[21] = sum(xs[lanes[k]] for k in q)
                o[22] = val(ln - ln % 4 + 1)
                ivs = [((lanes[k] * 2654435761) % 2**32) >> 7 for k in alist]
                u = uout[gid]
                u[0] = u[1] = u[2] = ivs[0]
                for iv in ivs[1:]:
                    u[0] &= iv
                    u[1] |= iv
                    u[2] ^= iv
                ballot = sum(1 << k for k in alist if xs[lanes[k]] > 1.0)
                u[3] = ballot & 0xFFFFFFFF
                u[4] = 1
                u[5] = int(any(w > 1.08 for w in vals))
                u[6] = int(ln == alist[0])
                u[7] = int(all(xs[lanes[k]] > 1.0 for k in alist))
                u[8] = u[7]
                u[9] = int(ballot != 0)
                u[10] = (max(lanes[k] for k in alist) - 50) % 2**32
                u[11] = (min(lanes[k] for k in alist) - 50) % 2**32
    return torch.tensor(out, dtype=torch.float64), torch.tensor(uout, dtype=torch.int64)


@pytest.mark.parametrize("n,g", [(80, 64), (96, 96)])
def test_every_collective_against_model(lib, n, g):
    torch.manual_seed(n)
    x = 1 + 0.05 * torch.randn(n)
    out = torch.zeros(n * NF)
    uout = torch.zeros(n * NU, dtype=torch.int32)
    lib.collectives(x, out, uout, threads=n, group_size=g)
    ref, uref = _model(x, n, g)
    got = out.view(n, NF).double()
    for k in range(NF):
        torch.testing.assert_close(got[:, k], ref[:, k], rtol=2e-5, atol=2e-5,
                                   msg=lambda m, k=k: f"float result {k}: {m}")
    gotu = uout.view(n, NU).long() % 2**32
    for k in range(NU):
        assert gotu[:, k].tolist() == uref[:, k].tolist(), f"uint result {k}"


def test_divergent_branches_are_separate_collectives(lib):
    x = torch.randn(64)
    out = torch.zeros(128)
    lib.branches(x, out, group_size=64)
    got = out.view(64, 2)
    for s in range(2):
        xs = x[s * 32:(s + 1) * 32]
        lo, hi = xs[:10].sum(), (2 * xs[10:]).sum()
        torch.testing.assert_close(got[s * 32:s * 32 + 10, 0], lo.expand(10), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got[s * 32 + 10:(s + 1) * 32, 0], hi.expand(22), rtol=1e-5,
                                   atol=1e-5)
        torch.testing.assert_close(got[s * 32:(s + 1) * 32, 1], xs.sum().expand(32), rtol=1e-5,
                                   atol=1e-5)


def test_block_scan_with_barrier(lib):
    x = torch.randn(1000)
    out = torch.zeros(1000)
    lib.scan_blocks(x, out, group_size=256)
    ref = torch.cat([c.cumsum(0) for c in x.split(256)])
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


def test_c10_reduction_utils():
    lib = compile_shader(C10_SRC)
    rows, n = 5, 1000
    x = torch.randn(rows, n)
    out = torch.zeros(rows * 3)
    lib.row_stats(x, out, n, threads=rows * 256, group_size=256, arg_casts={2: "int32"})
    got = out.view(rows, 3)
    ss = (x * x).sum(1)
    torch.testing.assert_close(got[:, 0], ss, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(got[:, 1], x.max(1).values)
    torch.testing.assert_close(got[:, 2], torch.rsqrt(ss / n + 1e-6), rtol=1e-4, atol=1e-6)
    # c10::metal::simd_max propagates NaN within its simdgroup only
    y = torch.randn(64)
    y[40] = float("nan")
    o = torch.zeros(64)
    lib.nan_max(y, o)
    torch.testing.assert_close(o[:32], y[:32].max().expand(32))
    assert torch.isnan(o[32:]).all()


STRAY = r"""
#include <metal_stdlib>
using namespace metal;

kernel void shuffle_from(device const float* x, device float* out, constant uint& off,
                         uint i [[thread_position_in_grid]],
                         uint lane [[thread_index_in_simdgroup]]) {
  out[i] = simd_shuffle(x[i], ushort(lane + off));
}

kernel void quad_from(device const float* x, device float* out, constant uint& src,
                      uint i [[thread_position_in_grid]]) {
  out[i] = quad_shuffle(x[i], ushort(src));
}
"""


def test_a_shuffle_from_a_lane_outside_the_simdgroup_fails():
    """Metal leaves a shuffle from a lane outside the simdgroup (quadgroup) undefined and CUDA
    wraps it to another lane: the simulator fails the launch, naming the call, the thread and
    the lane, rather than returning a value some GPU would not."""
    from metalforge.sim import KernelError
    lib = compile_shader(STRAY)
    x, out = torch.randn(64), torch.zeros(64)
    lib.shuffle_from(x, out, 0, group_size=64, arg_casts="int32")  # its own value
    assert torch.equal(out, x)
    out.fill_(7.0)
    lib.shuffle_from(x, out, 31, group_size=32, threads=1, arg_casts="int32")
    assert out[0] == 0.0               # lane 31 exists but is inactive: 0, as on Apple GPUs
    with pytest.raises(KernelError, match=r"simd_shuffle at .*:\d+: thread_position_in_grid "
                                          r"\(1,0,0\) named source lane 32, but a simdgroup has "
                                          r"lanes 0 to 31"):
        # one simdgroup: with two, lane 1 of either could be the first to report
        lib.shuffle_from(x, out, 31, group_size=32, threads=32, arg_casts="int32")
    lib.quad_from(x, out, 3, group_size=32, arg_casts="int32")
    assert torch.equal(out[:4], x[3].expand(4))
    with pytest.raises(KernelError, match=r"quad_shuffle .* named source lane 4, but a "
                                          r"quadgroup has lanes 0 to 3"):
        lib.quad_from(x, out, 4, group_size=32, arg_casts="int32")
