"""The scan schedule: inclusive scans along one axis (mf.cumsum, cumprod, cummax, cummin,
logcumsumexp), with the elementwise work before and after them fused in.

Kernels: the graph's layout picks the row kernels or the column one (`context.is_inner`),
the row's length one of the row kernels (`ScanSchedule.variant`):

- ``row`` (the scan axis innermost, contiguous, in every tensor and output that has it): one
  threadgroup per row, of ceil(D / R) threads in whole simdgroups up to threads_per_group
  (set at launch from the row's length: `ScanSchedule.group_threads`). The row streams in
  chunks of threads x R elements; for each chunk: (1) each thread loads its R contiguous
  elements (vector loads where the row is a multiple of the vector width and the block lies
  wholly in the row; guarded scalar loads at the row's end: the rows schedule's `load_block`);
  (2) computes the scanned values and scans them serially in registers (mf_scan{i}, the
  thread's total mf_run{i}); (3) the simdgroup's exclusive prefix of the threads' totals
  (simd_prefix_exclusive_sum for sums; a shuffle-up ladder with the scan's combine for the
  others); (4) the threadgroup carry: each simdgroup's total through threadgroup memory, a
  barrier, each thread combining those before its simdgroup, and the chunk's total; (5) each
  element combined with the running carry of the earlier chunks and the prefixes before its
  thread, the outputs computed from it and stored. Work-efficient at any length: every element
  is read once, combined a constant number of times, written once.
- ``simd`` (rows of at most one simdgroup's chunk, 32 x R elements: 16384 x 128): the
  fewest lanes of a simdgroup that hold the row at R elements each (a power of two, W =
  16 lanes for 128 elements, so 32 / W rows share a simdgroup; the kernel computes W from
  the row's length as the host does), phases (1)-(3) as above with the ladder confined to
  the row's lanes for every kind, no threadgroup memory or barrier.
- ``column`` (the scan axis outer somewhere): one thread per column of the other axes (the
  contiguous one fastest, so neighbouring threads read neighbouring addresses), scanning
  serially along the axis, R positions' loads at a time, each element read and written once;
  where the columns are too few threads (`plan.COLUMN_FILL`) and the axis long, one thread
  per column and segment of the axis, after a ``col_totals`` launch (as below).

Few long rows (fewer than fill_groups threadgroups, rows of at least two chunks) split into
segments of whole chunks, one threadgroup each (`segments`): a first launch, the ``totals``
kernel, leaves each segment's total in the scratch buffer; the row kernel then starts each
segment's carry at the combine of the totals before it in its row. Never decoupled
look-back: Metal promises no forward progress between threadgroups, so no segment waits for
another. Every element is read twice then, once a row otherwise. Float scans only (the
totals are fp32); the MLX backend, one launch per call, keeps each row in one threadgroup.

f16/bf16 values scan in fp32 (`Scan.acc_type`), integers (cummax/cummin only) in int/uint.
Modules: `context` (the checks, the `Scan`s, the contexts), `blocks` (combines, identities,
the simdgroup prefix and the threadgroup carry), `segments` (the split: the thread's
segment, the carry in, the totals to scratch), `kernels` (the row, simd, totals,
column and col_totals kernels), `plan` (`ScanSchedule`, the host side), `build`.
"""
from __future__ import annotations

from .build import build
from .context import Scan, match, scans_of
from .plan import ScanSchedule

__all__ = ["Scan", "ScanSchedule", "build", "match", "scans_of"]
