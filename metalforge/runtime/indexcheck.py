"""The run-time index check of gathers whose index is not proven in range (`mf.take`).

A kernel with such a gather binds a 4-int report buffer; an index out of range makes it read
position 0 instead and set the report to (1, gather number, index low 32 bits, high 32 bits).
How the host learns of it is the kernel's `index_check` launch option:

    checked   (default) each call binds a zeroed report and reads it after the launch (a
              device-to-host copy: the call waits for the kernel) and raises GatherIndexError
    deferred  the call binds a persistent report of this kernel (one per kernel, gathered-axis
              sizes and device) and reads nothing: the report is read, and the error raised,
              at the next synchronisation point metalforge controls: `mf.check_deferred()`,
              `mf.synchronize()`, or the next checked call of any kernel (which waits anyway)

While a CUDA graph is being captured nothing can be read, so a checked call binds the
persistent report too (without a fill kernel in the graph): an index out of range in a replay
is reported at the next synchronisation point, as in deferred mode. That report must exist
before the capture: call the kernel once outside it first (as CUDA graph warm-ups do).

Gathers `schedule.ranges` proves in range have no check and no report at all: a kernel whose
gathers are all proven binds none, and its calls never wait.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Mapping, Optional

import torch

from ..dtypes import U64
from ..errors import GatherIndexError, LaunchError, at, kernel_at
from ..graph import Graph, Node, scatter_sites, take_sites
from ..once import OnceMap


def _capturing(device: Optional[torch.device]) -> bool:
    return device is not None and device.type == "cuda" and \
        torch.cuda.is_current_stream_capturing()


_sites: OnceMap[int, tuple[Graph, tuple[Node, ...], tuple[Node, ...]]] = OnceMap()


def _sites_of(graph: Graph) -> tuple[tuple[Node, ...], tuple[Node, ...]]:
    """(take_sites, scatter_sites) of `graph`, walked once per graph (explicit cache: each
    slow-path call of a gather kernel binds its report, and walking the graph twice was the
    largest single host cost of a differentiable call)."""
    got = _sites.get_or_build(id(graph), lambda: (graph, tuple(take_sites(graph)),
                                                  tuple(scatter_sites(graph))),
                              lambda v: v[0] is graph)
    return got[1], got[2]


@dataclass(frozen=True)
class IndexErrors:
    """A gather kernel's error report: argument `arg` is the 4-int buffer; `sites` says which
    gather each number is; `mode` is the kernel's `index_check`."""
    arg: int
    sites: tuple[str, ...]
    where: str                                  # the kernel, as messages name it
    mode: str = "checked"
    unsigned: tuple[bool, ...] = ()             # per site: a u64 index (its 64 bits unsigned)

    @staticmethod
    def of(graph: Graph, arg: Optional[int], sizes: Mapping[str, int],
           mode: str = "checked") -> Optional[IndexErrors]:
        if arg is None:
            return None
        takes, scatters = _sites_of(graph)
        sites = tuple(f"mf.take from '{n.attr[0]}' along '{n.attr[1]}' (size "
                      f"{sizes[n.attr[1]]}: valid indices 0 to {sizes[n.attr[1]] - 1})"
                      f"{at(n.loc)}" for n in takes)
        sites += tuple(f"mf.scatter_add along '{n.attr[0]}' (size {sizes[n.attr[0]]}: valid "
                       f"indices 0 to {sizes[n.attr[0]] - 1}){at(n.loc)}"
                       for n in scatters)
        unsigned = tuple(n.args[0].dtype is U64 for n in takes) + \
            tuple(n.args[1].dtype is U64 for n in scatters)
        return IndexErrors(arg, sites, kernel_at(graph.name, graph.loc), mode, unsigned)

    @property
    def deferred(self) -> bool:
        return self.mode == "deferred"

    def message(self, report: tuple[int, ...], when: str = "") -> str:
        _, site, lo, hi = report
        value = (hi << 32) | (lo & 0xFFFFFFFF)
        if value < 0 and site < len(self.unsigned) and self.unsigned[site]:
            value += 1 << 64
        verb = "wrote" if self.sites[site].startswith("mf.scatter") else "read"
        return (f"{self.where}: {self.sites[site]}: index {value} is out of range (the kernel "
                f"{verb} nothing there){when}")

    def buffer(self, device: Optional[torch.device]) -> torch.Tensor:
        """The report a call binds: a zeroed one of its own (checked: `CLEAN`), else the
        persistent one."""
        if self.deferred or _capturing(device):
            return DEFERRED.bind(self, device)
        if device is not None and device.type == "cuda" and not DEFERRED.has(self, device):
            DEFERRED.bind(self, device, arm=False)     # ready before any graph capture
        return CLEAN.take(device)

    def check(self, buffer: torch.Tensor) -> None:
        """After a checked launch: raise GatherIndexError if the kernel reported one, else
        give the report back still zeroed (`CLEAN`) and report any deferred error (the call
        waited for the GPU anyway). Deferred calls, and calls while a CUDA graph is being
        captured, read nothing."""
        if self.deferred or _capturing(buffer.device):
            return
        report = tuple(buffer.tolist())            # one copy to the host: waits for the kernel
        if report[0]:
            raise GatherIndexError(self.message(report))
        if not any(report):                        # else not zeroed: dropped
            CLEAN.give(buffer)
        DEFERRED.check()


class CleanReports:
    """Zeroed reports for checked calls, by device, so that a call does not zero one (a fill
    kernel) each time: a kernel writes its report only for an index out of range, so a report
    read back as zeros (after the kernel, `IndexErrors.check`) is still zeroed and goes back
    here; one that held an error is dropped. `list.pop` and `list.append` are atomic, so a
    report belongs to one call at a time; at most `keep` a device are kept."""

    def __init__(self, keep: int = 8) -> None:
        self.keep = keep
        self._free: dict[Optional[torch.device], list[torch.Tensor]] = {}

    def take(self, device: Optional[torch.device]) -> torch.Tensor:
        try:
            return self._free[device].pop()
        except (KeyError, IndexError):
            return torch.zeros(4, dtype=torch.int32, device=device)

    def give(self, buffer: torch.Tensor) -> None:
        free = self._free.get(buffer.device)
        if free is None:
            free = self._free.setdefault(buffer.device, [])
        if len(free) < self.keep:
            free.append(buffer)

    def clear(self) -> None:
        self._free.clear()


CLEAN = CleanReports()


class DeferredReports:
    """The persistent reports of deferred (and CUDA-graph-captured) gather calls, by (kernel
    errors, device); `armed`: those bound since they were last read (a captured one stays
    armed: every replay may write it). An explicit registry, shared by all kernels, guarded by
    a lock; a report is 16 bytes and there is one per kernel, gathered-axis sizes and device."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reports: dict[tuple[IndexErrors, str], torch.Tensor] = {}
        self._armed: dict[tuple[IndexErrors, str], bool] = {}     # True: captured in a graph

    def bind(self, errors: IndexErrors, device: Optional[torch.device],
             arm: bool = True) -> torch.Tensor:
        """The persistent report of `errors` on `device` (made zeroed on first use), armed."""
        key = (errors, str(device))
        with self._lock:
            buf = self._reports.get(key)
            capturing = _capturing(device)
            if buf is None:
                if capturing:
                    raise LaunchError(
                        f"{errors.where}: called for the first time while a CUDA graph is "
                        f"being captured; its index check needs a report buffer made outside "
                        f"the capture: call the kernel once before capturing (a warm-up)")
                buf = self._reports[key] = torch.zeros(4, dtype=torch.int32, device=device)
            if arm or capturing:
                self._armed[key] = self._armed.get(key, False) or capturing
        return buf

    def has(self, errors: IndexErrors, device: torch.device) -> bool:
        """Whether the persistent report of `errors` on `device` exists (read without the
        lock: reports are only added, or all dropped by `clear`)."""
        return (errors, str(device)) in self._reports

    def pending(self) -> int:
        """How many reports will be read at the next synchronisation point."""
        with self._lock:
            return len(self._armed)

    def check(self) -> None:
        """Read every armed report (waiting for the kernels that write it) and raise
        GatherIndexError for the first that holds an error; that report is zeroed and
        disarmed, the others stay armed for the next check."""
        with self._lock:
            armed = list(self._armed.items())
        for key, captured in armed:
            buf = self._reports[key]
            report = tuple(buf.tolist())
            with self._lock:
                if report[0]:
                    buf.zero_()
                if not captured:
                    self._armed.pop(key, None)
            if report[0]:
                raise GatherIndexError(key[0].message(
                    report, " (a deferred index check, reported at this synchronisation "
                    "point)"))

    def clear(self) -> None:
        """Forget every report (tests; `runtime.clear_caches`)."""
        with self._lock:
            self._reports.clear()
            self._armed.clear()
        CLEAN.clear()


DEFERRED = DeferredReports()


def check_deferred() -> None:
    """Report index errors of deferred gather checks: read every persistent report written
    since the last check (this waits for the kernels that write them) and raise
    `mf.GatherIndexError` for the first error found, naming the kernel, the tensor, the axis
    and its size, and the bad index. Calls of kernels with `index_check="deferred"` do not read
    their report; this does (and so does the next checked gather call, and `mf.synchronize`).

    Example::

        rope = my_rope.with_launch(index_check="deferred")
        for layer in layers:
            q = rope(q, pos)          # no wait for the GPU in the call
        mf.check_deferred()           # raises here if any call read an index out of range
    """
    DEFERRED.check()


def synchronize(device: Optional[torch.device | str] = None) -> None:
    """Wait for the GPU (torch.cuda / torch.mps synchronize, where there is one), then report
    deferred index errors (`check_deferred`). `device`: the torch device to wait for (default:
    the current CUDA device, else MPS).

    Example::

        out = paged_gather.with_launch(index_check="deferred")(cache, block_table)
        mf.synchronize()      # the GPU is done; an out-of-range block index raises here
    """
    dev = torch.device(device) if device is not None else None
    if (dev is None or dev.type == "cuda") and torch.cuda.is_available():
        torch.cuda.synchronize(dev)
    elif (dev is None or dev.type == "mps") and torch.backends.mps.is_available():
        torch.mps.synchronize()
    DEFERRED.check()
