"""The simulator's threadgroup-memory race detector (include/mf_sim/race.h).

Each kernel here either misses an ordering (a barrier, or a collective the two lanes meet at)
and must fail with a KernelError naming the hazard, the array, the element and both threads,
or is ordered and must run and give the values a reference computes, in both thread orders.
"""
import pytest
import torch

from metalforge.sim import KernelError, compile_shader, race_detection, thread_order

HEAD = """#include <metal_stdlib>
using namespace metal;
"""

# Each thread writes its element, then reads its right neighbour's (wrapping).
NEIGHBOUR = HEAD + """
kernel void neighbour(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                      uint t [[thread_position_in_threadgroup]],
                      uint n [[threads_per_threadgroup]]) {
  threadgroup float buf[128];
  buf[t] = x[t];
  %s
  y[t] = buf[(t + 1) %% n];
}
"""
BARRIER = "threadgroup_barrier(mem_flags::mem_threadgroup);"


def neighbour_reference(x: torch.Tensor) -> torch.Tensor:
    return torch.roll(x, -1)


@pytest.mark.parametrize("order", ["forward", "reverse"])
def test_a_missing_barrier_is_a_race_in_either_order(order):
    k = compile_shader(NEIGHBOUR % "").neighbour
    with thread_order(order), pytest.raises(KernelError) as e:
        k(torch.arange(64.0), torch.empty(64), threads=64, group_size=64)
    msg = str(e.value)
    assert "kernel 'neighbour'" in msg and "threadgroup memory race" in msg
    assert "threadgroup array 'buf' declared at program_source:" in msg
    # forward: thread 0 reads buf[1] before thread 1 writes it; reverse: thread 63 wrote buf[63]
    # before thread 62 reads it
    if order == "forward":
        assert "(write after read) on buf[1]," in msg, msg
        assert "thread 1 (simdgroup 0, lane 1) writes it after thread 0 (simdgroup 0, lane 0) " \
               "read it" in msg, msg
    else:
        assert "(read after write) on buf[63]," in msg, msg
        assert "thread 62 (simdgroup 1, lane 30) reads it after thread 63 (simdgroup 1, " \
               "lane 31) wrote it" in msg, msg


@pytest.mark.parametrize("order", ["forward", "reverse"])
def test_with_the_barrier_it_runs(order):
    k = compile_shader(NEIGHBOUR % BARRIER).neighbour
    x, y = torch.randn(96), torch.empty(96)
    with thread_order(order):
        k(x, y, threads=96, group_size=96)
    assert torch.equal(y, neighbour_reference(x))


def test_race_detection_can_be_turned_off():
    k = compile_shader(NEIGHBOUR % "").neighbour
    with race_detection(False):
        k(torch.arange(64.0), torch.empty(64), threads=64, group_size=64)


# A tree reduction in threadgroup memory: every level reads what other threads wrote at the
# level before, and is separated from it by a barrier.
TREE = HEAD + """
kernel void tree(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                 uint t [[thread_position_in_threadgroup]], uint g [[threadgroup_position_in_grid]],
                 uint n [[threads_per_threadgroup]]) {
  threadgroup float s[256];
  s[t] = x[g * n + t];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (uint w = n / 2; w > 0; w /= 2) {
    if (t < w) s[t] += s[t + w];
    %s
  }
  if (t == 0) y[g] = s[0];
}
"""


def test_a_tree_reduction_with_barriers_runs():
    k = compile_shader(TREE % BARRIER).tree
    x, y = torch.randn(4 * 256), torch.empty(4)
    k(x, y, threads=4 * 256, group_size=256)
    torch.testing.assert_close(y, x.view(4, 256).sum(1), rtol=1e-5, atol=1e-5)


def test_a_tree_reduction_without_the_loop_barrier_races():
    k = compile_shader(TREE % "").tree
    # thread 0 reads s[1] (level w = 1 of a 2-thread group) before thread 1 writes it
    with pytest.raises(KernelError, match=r"race \(write after read\) on s\[1\].*thread 1 "
                                          r"\(simdgroup 0, lane 1\) writes it after thread 0 "):
        k(torch.randn(256), torch.empty(1), threads=256, group_size=256)


# Two threads write one element in one epoch.
BOTH_WRITE = HEAD + """
kernel void both(device float* y [[buffer(0)]], uint t [[thread_position_in_threadgroup]]) {
  threadgroup float flag[1];
  if (t == 3 || t == 40) flag[0] = float(t);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  y[t] = flag[0];
}
"""


def test_two_writers_race():
    k = compile_shader(BOTH_WRITE).both
    with pytest.raises(KernelError, match=r"race \(write after write\) on flag\[0\].*thread 40 "
                                          r"\(simdgroup 1, lane 8\) writes it after thread 3 "):
        k(torch.empty(64), threads=64, group_size=64)


# Lanes of one simdgroup exchange values through threadgroup memory, ordered by a collective
# (simd_sum) or a simdgroup_barrier, never a threadgroup_barrier.  Reading the partner lane's
# value is ordered; reading a lane of the other simdgroup is not.
SIMD_EXCHANGE = HEAD + """
kernel void exchange(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                     uint t [[thread_index_in_threadgroup]]) {
  threadgroup float buf[64];
  buf[t] = x[t];
  %s
  y[t] = buf[%s];
}
"""


@pytest.mark.parametrize("sync", ["simd_sum", "simdgroup_barrier"])
@pytest.mark.parametrize("order", ["forward", "reverse"])
def test_lanes_of_a_simdgroup_are_ordered_by_collectives(sync, order):
    line = ("float s = simd_sum(1.0f); (void)s;" if sync == "simd_sum"
            else "simdgroup_barrier(mem_flags::mem_threadgroup);")
    k = compile_shader(SIMD_EXCHANGE % (line, "t ^ 1")).exchange
    x, y = torch.randn(64), torch.empty(64)
    with thread_order(order):
        k(x, y, threads=64, group_size=64)
    assert torch.equal(y, x.view(32, 2).flip(1).reshape(64))


def test_a_collective_does_not_order_other_simdgroups():
    k = compile_shader(SIMD_EXCHANGE % ("float s = simd_sum(1.0f); (void)s;", "t ^ 32")).exchange
    # last first: simdgroup 1 passes its sum first, and thread 63 reads what thread 31 wrote
    with pytest.raises(KernelError, match=r"race \(read after write\) on buf\[31\].*thread 63 "
                                          r"\(simdgroup 1, lane 31\) reads it after thread 31 "):
        with thread_order("reverse"):
            k(torch.randn(64), torch.empty(64), threads=64, group_size=64)


# Lanes 0-15 meet at a shuffle, lanes 16-31 at a sum (two call sites, two collectives): the
# shuffle orders what lanes 0-15 wrote for each other, not what lanes 16-31 wrote.
DIVERGENT = HEAD + """
kernel void divergent(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                      uint t [[thread_index_in_threadgroup]]) {
  threadgroup float buf[32];
  buf[t] = x[t];
  if (t < 16) {
    float s = simd_shuffle_xor(x[t], 1);
    y[t] = s + buf[%s];
  } else {
    y[t] = simd_sum(x[t]);
  }
}
"""


def test_a_collective_orders_only_the_lanes_at_it():
    x, y = torch.randn(32), torch.empty(32)
    compile_shader(DIVERGENT % "t ^ 2").divergent(x, y, threads=32, group_size=32)
    lane = torch.arange(16)
    want = torch.cat([x[lane ^ 1] + x[lane ^ 2], x[16:].sum().expand(16)])
    torch.testing.assert_close(y, want)
    for order in ("forward", "reverse"):
        with pytest.raises(KernelError,
                           match=r"race \(read after write\) on buf\[(1[6-9]|2\d|3[01])\]"
                                 r".* reads it after thread (1[6-9]|2\d|3[01]) "):
            with thread_order(order):
                compile_shader(DIVERGENT % "t + 16").divergent(x, y, threads=32, group_size=32)


# A pointer into the array (MLX's `threadgroup T* p = buf + ...` style) and a helper taking
# `threadgroup float*`: the detector sees addresses, so both are checked.
POINTER = HEAD + """
static void put(threadgroup float* p, uint i, float v) { p[i] = v; }
kernel void pointer(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                    uint t [[thread_index_in_threadgroup]]) {
  threadgroup float buf[2][64];
  threadgroup float* row = &buf[1][0];
  put(row, t, x[t]);
  %s
  y[t] = row[63 - t];
}
"""


def test_pointers_into_threadgroup_memory_are_checked():
    # thread 31 reads row[32] = buf[1][32] before thread 32 writes it
    with pytest.raises(KernelError, match=r"race \(write after read\) on buf\[1\]\[32\]"):
        compile_shader(POINTER % "").pointer(torch.randn(64), torch.empty(64), threads=64,
                                             group_size=64)
    x, y = torch.randn(64), torch.empty(64)
    compile_shader(POINTER % BARRIER).pointer(x, y, threads=64, group_size=64)
    assert torch.equal(y, x.flip(0))


# Atomics on threadgroup memory never race; a plain read of the counter after a barrier is
# ordered after them.
ATOMIC = HEAD + """
kernel void count(device const float* x [[buffer(0)]], device uint* y [[buffer(1)]],
                  uint t [[thread_index_in_threadgroup]]) {
  threadgroup atomic_uint n;
  if (t == 0) atomic_store_explicit(&n, 0u, memory_order_relaxed);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (x[t] > 0.0f) atomic_fetch_add_explicit(&n, 1u, memory_order_relaxed);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (t == 0) y[0] = atomic_load_explicit(&n, memory_order_relaxed);
}
"""


def test_atomics_do_not_race():
    x, y = torch.randn(128), torch.zeros(1, dtype=torch.int32)
    compile_shader(ATOMIC).count(x, y, threads=128, group_size=128)
    assert int(y[0]) == int((x > 0).sum())


# Neighbouring elements of a half array, and two components of one float4, are written by
# different threads: distinct memory, no race.
NARROW = HEAD + """
kernel void narrow(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                   uint t [[thread_index_in_threadgroup]]) {
  threadgroup half h[64];
  threadgroup float4 v[16];
  h[t] = half(x[t]);
  v[t / 4][t % 4] = x[t];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  y[t] = float(h[63 - t]) + v[(63 - t) / 4][(63 - t) % 4];
}
"""


def test_neighbouring_halves_and_components_are_distinct():
    x, y = torch.randn(64), torch.empty(64)
    compile_shader(NARROW).narrow(x, y, threads=64, group_size=64)
    xf = x.flip(0)
    torch.testing.assert_close(y, xf.half().float() + xf)


# Group g writes element (t + g) % n: group 1's thread t writes the element group 0's thread
# t + 1 wrote last.  Different groups: no race, even when one worker runs both.
SHIFTED = HEAD + """
kernel void shifted(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                    uint t [[thread_index_in_threadgroup]], uint g [[threadgroup_position_in_grid]],
                    uint n [[threads_per_threadgroup]]) {
  threadgroup float buf[64];
  buf[(t + g) % n] = x[g * n + t];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  y[g * n + t] = buf[(t + g) % n];
}
"""


def test_each_group_starts_afresh(monkeypatch):
    monkeypatch.setenv("METALFORGE_SIM_WORKERS", "1")
    x, y = torch.randn(128), torch.empty(128)
    compile_shader(SHIFTED).shifted(x, y, threads=128, group_size=32)
    assert torch.equal(y, x)
