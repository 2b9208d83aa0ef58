"""The ticket counters of single-launch column reductions (`one_launch`, column_ticket.py).

A kernel with a ``("counter",)`` argument takes a ticket on one uint word per column block
(an atomic add) and the block's last group puts the word back to 0. So a word is zero whenever
no launch is using it, and every launch needs only that:

- the buffer is made zeroed (``torch.zeros``) once, outside any CUDA graph capture, and kept
  (one per device and stream, grown, again zeroed, where a call needs more words): no zeroing
  launch per call;
- calls on one stream (MPS: its one queue; the simulator: one calling thread) run one after
  another, and each leaves its words at 0 for the next, so
  every kernel and every call on that stream can share the one buffer; calls on another stream
  (which may run at the same time) get a buffer of their own;
- a CUDA graph keeps the pointer it captured, and each replay leaves the words at 0 as an eager
  call does. Captured calls bind the device's graph buffer (made zeroed, outside any capture,
  together with every eager buffer of the device, at the same size): the warm-up call that
  CUDA graphs need anyway (on any stream) makes it; a buffer made inside a capture would be
  zeroed only by replays, so a capture that needs more words than exist raises. All graphs of
  a device share that buffer: replay graphs holding one-launch kernels on one stream at a time
  (eager calls, on any stream, never touch it);
- a launch that aborts (a device fault) can leave a word nonzero: on CUDA the context is lost
  with it (every later call fails); elsewhere `clear` (``mf.runtime.clear_caches``) drops the
  buffers so the next call makes zeroed ones.
"""
from __future__ import annotations

import threading
from typing import Optional

import torch

from ..errors import LaunchError

GRAPHS = -1                      # the stream key of captured calls


def _capturing(device: Optional[torch.device]) -> bool:
    return device is not None and device.type == "cuda" and \
        torch.cuda.is_current_stream_capturing()


def _stream_key(device: Optional[torch.device]) -> tuple[str, int]:
    """Launches with one key run one after another: a CUDA stream's; MPS's one queue; on the
    simulator (CPU tensors) the calling thread's, whose calls return when the kernel is done."""
    if device is not None and device.type == "cuda":
        if _capturing(device):
            return str(device), GRAPHS
        return str(device), torch.cuda.current_stream(device).stream_id
    if device is None or device.type == "cpu":
        return str(device), threading.get_ident()
    return str(device), 0


class TicketCounters:
    """The counter buffers, by (device, stream): an explicit registry guarded by a lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buffers: dict[tuple[str, int], torch.Tensor] = {}
        # graph buffers replaced (grown, or dropped by `clear`): captured graphs still hold
        # their pointers, so they stay allocated (a few KB each)
        self._retired: list[torch.Tensor] = []

    def words(self, device: Optional[torch.device], n: int, where: str = "") -> torch.Tensor:
        """A buffer of at least `n` int32 words, all zero between launches, for calls on the
        current stream of `device`."""
        key = _stream_key(device)
        with self._lock:
            buf = self._buffers.get(key)
            if buf is None or buf.numel() < n:
                if _capturing(device):
                    raise LaunchError(
                        f"{where or 'a one-launch column reduction'}: its ticket counters "
                        f"({n} words) must be made outside a CUDA graph capture; call the "
                        f"kernel once with these sizes on the capture stream before capturing "
                        f"(a warm-up), or use launch={{'one_launch': False}}")
                size = max(n, 2 * buf.numel() if buf is not None else 256)
                buf = self._buffers[key] = torch.zeros(size, dtype=torch.int32, device=device)
                graphs = self._buffers.get((key[0], GRAPHS))
                if device is not None and device.type == "cuda" and \
                        (graphs is None or graphs.numel() < size):
                    if graphs is not None:
                        self._retired.append(graphs)
                    self._buffers[key[0], GRAPHS] = torch.zeros(size, dtype=torch.int32,
                                                                device=device)
        return buf

    def clear(self) -> None:
        """Forget every buffer (after an aborted launch; tests; `runtime.clear_caches`): the
        next calls make zeroed ones (graph buffers stay allocated for the graphs holding them)."""
        with self._lock:
            self._retired += [b for k, b in self._buffers.items() if k[1] == GRAPHS]
            self._buffers.clear()


COUNTERS = TicketCounters()
