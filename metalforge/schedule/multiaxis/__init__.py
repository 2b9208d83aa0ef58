"""The multiaxis schedule: reductions over several axes together in one kernel
(`mf.sum(x, axis=("C", "H", "W"))`, group norm, instance norm, a full reduction; also a full
reduction of one axis, `mf.sum(x, axis="N")` of x: "T[N]", which it splits across threadgroups).

The frontend writes a reduction over several axes as a chain of one-axis reductions; `form`
finds the chains (every chain of the kernel over one set of axes), orders the reduced axes for
flattening (storage order, the innermost last) and collapses each chain into one reduction node,
so the shared reduction blocks (`reduce`: phases, accumulators, online (max, sum) pairs,
compensated sums; `rows.combine`: simd -> threadgroup -> simd) take it as one reduction over
one flattened axis. A row is one element of the outer axes; its elements are the flattened
index mf_f over the reduced axes, read at base + mf_f where a tensor holds them as one
contiguous run and through each axis's digit of mf_f elsewhere (`context`).

Kernels (`kernels`): ``group``, one threadgroup per row; where the rows are fewer than
fill_groups, the row split into chunks, a threadgroup per (row, chunk), partials to scratch and
merged in chunk order by one thread per row between the phases (``part<p>``, ``merge<p>``,
``out``): deterministic, the same bits every run. `plan`: the host side (`MultiSchedule`) and
`build`.
"""
from __future__ import annotations

from .form import AxesForm, collapse, match
from .plan import MultiSchedule, build

__all__ = ["AxesForm", "MultiSchedule", "build", "collapse", "match"]
