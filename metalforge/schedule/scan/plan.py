"""The scan schedule's host side: `ScanSchedule`, which sizes each call's launch (the row
kernel's threadgroup from the row's length, and the segments of few long rows; the column
kernel's threads from the columns) and checks the sizes its index types take."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from ... import ir
from ...errors import LaunchError
from ..base import Schedule, Step, Traffic
from ..hardware import SIMD_WIDTH
from .segments import SEGMENTS

AXIS_LIMIT = 2 ** 31                 # positions along the scan axis: uint, with headroom
# The column kernels split the axis where the columns are fewer threads than this (fill_groups
# > 0), into segments of at least MIN_SEGMENT positions. Untuned.
COLUMN_FILL = 1 << 16
MIN_SEGMENT = 256


@dataclass
class ScanSchedule(Schedule):
    axis: str = ""
    rows: tuple[str, ...] = ()          # the other axes: the row kernel's rows, the columns
    inner: bool = True                  # the row kernel (axis innermost), else the column one
    reads: int = 8                      # the row kernel's elements per thread and chunk
    variants: dict[str, ir.LoweredKernel] = field(default_factory=dict)
    scans: int = 1                      # fp32 totals per segment (a float2 scan's: two)
    passes: dict[str, dict[str, int]] = field(default_factory=dict)  # kernel → {input: reads}

    @property
    def kernels(self) -> tuple[ir.LoweredKernel, ...]:
        return tuple(self.variants.values()) or (self.kernel,)

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

    def lanes_per_row(self, d: int) -> int:
        """The simd kernel: the fewest lanes (a power of two, at most 32) holding a row of d
        elements at R each; the kernel computes the same from d."""
        n = max(1, -(-d // self.reads))
        return 1 << (n - 1).bit_length()

    @property
    def staged_rows(self) -> tuple[int, ...]:
        """No staged kernel (`check` asks schedules with `lanes_per_row` for its rows)."""
        return ()

    def segments(self, sizes: Mapping[str, int]) -> int:
        """Segments per row (column) (1: one threadgroup a row, one thread a column): where
        the split kernels are built and the rows make fewer than fill_groups threadgroups,
        enough segments to reach it, each at least one chunk; where the columns are fewer
        than COLUMN_FILL threads, enough to reach that, each at least MIN_SEGMENT
        positions."""
        first = "totals" if self.inner else "col_totals"
        if first not in self.variants or self.variant(sizes) == "simd":
            return 1
        d, rows = sizes[self.axis], self._rows(sizes)
        if not self.inner:
            if rows == 0 or rows >= COLUMN_FILL or d < 2 * MIN_SEGMENT:
                return 1
            return min(d // MIN_SEGMENT, -(-COLUMN_FILL // rows))
        chunks = -(-d // (self.group_threads(d) * self.reads))
        if chunks < 2 or rows == 0 or rows >= self.policy.fill_groups:
            return 1
        return min(chunks, -(-self.policy.fill_groups // rows))

    @property
    def thresholds(self) -> tuple[int, ...]:
        """Lengths where the kernels' behaviour changes (`check` tries t - 1, t, t + 1 there):
        the longest row one simdgroup's chunk holds (the simd kernel), one threadgroup's
        (more: several chunks, and a split of few rows); the shortest column axis a split
        takes."""
        if not self.inner:
            return (2 * MIN_SEGMENT,)              # the column kernel's shortest split
        return (SIMD_WIDTH * self.reads, self.policy.threads_per_group * self.reads)

    def host_name(self, sizes: Mapping[str, int]) -> str:
        d = sizes[self.axis]
        if d >= AXIS_LIMIT:
            raise LaunchError(f"kernel '{self.graph.name}': {d} elements along '{self.axis}' "
                              f"are over the 2^31 a scan indexes (its positions and chunk "
                              f"starts are 32-bit)")
        if not self.index64 and self.numel(sizes) >= 2 ** 31:
            raise LaunchError(f"kernel '{self.graph.name}': {self.numel(sizes)} elements need "
                              f"64-bit indexing; call it with launch={{'index64': True}}")
        return self.variants[self.variant(sizes)].host_name

    def variant(self, sizes: Mapping[str, int]) -> str:
        """The row kernels: ``simd`` for rows of one simdgroup's chunk (32 x R elements),
        ``row`` for longer ones; ``column`` for the column kernel."""
        if not self.inner:
            return "column"
        return "simd" if sizes[self.axis] <= SIMD_WIDTH * self.reads else "row"

    def launch(self, sizes: Mapping[str, int]) -> tuple[int, int]:
        rows = self._rows(sizes)
        if not self.inner:
            n = rows * self.segments(sizes)
            return n, max(1, min(self.policy.threads_per_group, n))
        if self.variant(sizes) == "simd":
            w = self.lanes_per_row(sizes[self.axis])
            group = min(self.policy.rows_per_group * SIMD_WIDTH, self.policy.threads_per_group)
            return rows * w, max(1, min(group, rows * w))
        t = self.group_threads(sizes[self.axis])
        return rows * self.segments(sizes) * t, t

    def steps(self, sizes: Mapping[str, int]) -> tuple[Step, ...]:
        """The row kernel; split calls launch the totals kernel first (same grid)."""
        last = Step(self.host_name(sizes), *self.launch(sizes))
        if self.segments(sizes) == 1:
            return (last,)
        first = self.variants["totals" if self.inner else "col_totals"]
        return (Step(first.host_name, last.threads, last.group), last)

    def scratch_floats(self, sizes: Mapping[str, int]) -> int:
        segs = self.segments(sizes)
        return 0 if segs == 1 else self.scans * self._rows(sizes) * segs

    def traffic(self, sizes: Mapping[str, int], variant: str = "") -> Traffic:
        """Bytes a call moves: each input read once, and once more by the totals launch of a
        split call (the inputs of the scans' arguments); each output written once (`variant`:
        the kernel the call launches first, as the bench scripts name it; the sizes say)."""
        reads = dict(self.passes.get("row", {}))
        if self.segments(sizes) > 1:
            for t, n in self.passes.get("totals", {}).items():
                reads[t] = reads.get(t, 0) + n
        return self.moved(sizes, reads, 0)

    def launch_value(self, name: str, sizes: Mapping[str, int]) -> int:
        if name == SEGMENTS:
            return self.segments(sizes)
        raise KeyError(name)
