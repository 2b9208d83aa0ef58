"""The scan schedule's host side: `ScanSchedule`, which sizes each call's launch (the row
kernel's threadgroup from the row's length; the column kernel's threads from the columns) and
checks the sizes its index types take."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from ...errors import LaunchError
from ..base import Schedule
from ..hardware import SIMD_WIDTH

UINT_LIMIT = 2 ** 32


@dataclass
class ScanSchedule(Schedule):
    axis: str = ""
    rows: tuple[str, ...] = ()          # the other axes: the row kernel's rows, the columns
    inner: bool = True                  # the row kernel (axis innermost), else the column one
    reads: int = 8                      # the row kernel's elements per thread and chunk

    def _rows(self, sizes: Mapping[str, int]) -> int:
        n = 1
        for a in self.rows:
            n *= sizes[a]
        return n

    def group_threads(self, d: int) -> int:
        """The row kernel's threads for rows of d elements: one per R elements, in whole
        simdgroups, at most threads_per_group (longer rows loop over chunks)."""
        t = -(-max(d, 1) // self.reads)
        return min(self.policy.threads_per_group, -(-t // SIMD_WIDTH) * SIMD_WIDTH)

    @property
    def thresholds(self) -> tuple[int, ...]:
        """Row lengths where the row kernel's behaviour changes: the longest row one chunk
        holds (`check` tries t - 1, t, t + 1 there)."""
        return (self.policy.threads_per_group * self.reads,) if self.inner else ()

    def host_name(self, sizes: Mapping[str, int]) -> str:
        d = sizes[self.axis]
        if d >= UINT_LIMIT:
            raise LaunchError(f"kernel '{self.graph.name}': {d} elements along '{self.axis}' "
                              f"are over the 2^32 a scan indexes")
        if not self.index64 and self.numel(sizes) >= 2 ** 31:
            raise LaunchError(f"kernel '{self.graph.name}': {self.numel(sizes)} elements need "
                              f"64-bit indexing; call it with launch={{'index64': True}}")
        return self.kernel.host_name

    def launch(self, sizes: Mapping[str, int]) -> tuple[int, int]:
        rows = self._rows(sizes)
        if self.inner:
            t = self.group_threads(sizes[self.axis])
            return rows * t, t
        return rows, max(1, min(self.policy.threads_per_group, rows))
