"""metalforge.sim: a launch writes back only the bytes its kernel changed.

The simulator stages each bound storage (from the lowest bound offset to the storage's end) into
a guarded copy. Writing the whole copy back after the launch would undo what another thread
wrote elsewhere in that storage while the kernel ran; these tests write there during a launch
(ctypes releases the GIL while the kernel runs) and check that the write survives.
"""
import threading
import time

import torch

import metalforge as mf
from metalforge.sim import compile_shader

# `slow` spins long enough (about 0.5 s on the simulator) for another thread to write
# while it runs; it reads `x` (bound read-only or writable) and writes out[0] only.
SRC = r"""
#include <metal_stdlib>
using namespace metal;

kernel void slow_const(device const float* x [[buffer(0)]], device float* out [[buffer(1)]],
                       constant uint& n [[buffer(2)]], uint i [[thread_position_in_grid]]) {
  float acc = x[0];
  for (uint k = 0; k < n; ++k) acc = fma(acc, 0.999999f, 1e-7f * float(k & 7));
  if (i == 0) out[0] = acc;
}

kernel void slow_inplace(device float* x [[buffer(0)]], constant uint& n [[buffer(1)]],
                         uint i [[thread_position_in_grid]]) {
  float acc = x[0];
  for (uint k = 0; k < n; ++k) acc = fma(acc, 0.999999f, 1e-7f * float(k & 7));
  if (i == 0) x[0] = acc + 1.0f;
}

kernel void const_pointer(device float* const x [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  x[i] = x[i] * 2.0f;
}
"""

SPIN = 200_000_000


def _write_during(launch, buf: torch.Tensor, index: int, value: float) -> None:
    """Run `launch` in a thread and set buf[index] = value while it runs."""
    t = threading.Thread(target=launch)
    t.start()
    time.sleep(0.02)
    assert t.is_alive(), "the launch ended before the concurrent write: raise SPIN"
    buf[index] = value
    t.join()


def test_read_only_input_is_not_written_back():
    lib = compile_shader(SRC)
    buf = torch.zeros(4096)
    out = torch.zeros(1)
    _write_during(lambda: lib.slow_const(buf, out, SPIN, arg_casts="int32", threads=1),
                  buf, 1000, 7.0)
    assert buf[1000].item() == 7.0


def test_written_storage_keeps_other_threads_writes():
    lib = compile_shader(SRC)
    buf = torch.zeros(4096)
    _write_during(lambda: lib.slow_inplace(buf, SPIN, arg_casts="int32", threads=1),
                  buf, 1000, 7.0)
    assert buf[1000].item() == 7.0
    assert buf[0].item() > 1.0                       # the kernel's own write came back


def test_view_binding_keeps_writes_past_the_view():
    lib = compile_shader(SRC)
    buf = torch.zeros(2, 2048)
    _write_during(lambda: lib.slow_inplace(buf[0], SPIN, arg_casts="int32", threads=1),
                  buf, (1, 5), 3.0)
    assert buf[1, 5].item() == 3.0
    assert buf[0, 0].item() > 1.0


def test_writes_through_a_const_pointer_come_back():
    lib = compile_shader(SRC)
    x = torch.arange(8, dtype=torch.float32)
    lib.const_pointer(x)
    torch.testing.assert_close(x, torch.arange(8, dtype=torch.float32) * 2)


@mf.kernel
def silu_row_view(x: "T[N]"):
    return x * mf.sigmoid(x)


def test_kernel_on_a_row_keeps_concurrent_writes_to_other_rows():
    """The issue's reproduction: silu(buf[0]) in a loop while another thread writes buf[1]."""
    buf = torch.zeros(2, 4096)
    buf[0] = torch.linspace(-4, 4, 4096)
    expect = silu_row_view.reference(buf[0].clone())
    stop = threading.Event()
    results: list[torch.Tensor] = []

    def calls():
        while not stop.is_set():
            results.append(silu_row_view(buf[0]))

    t = threading.Thread(target=calls)
    t.start()
    try:
        for j in range(4096):
            buf[1, j] = j + 1.0
    finally:
        stop.set()
        t.join()
    torch.testing.assert_close(buf[1], torch.arange(1, 4097, dtype=torch.float32))
    assert results
    for r in results:
        torch.testing.assert_close(r, expect)
