"""Scatter outputs (`mf.scatter_add`): a zeroed output added to at computed positions.

Two modes, one family:

- atomic (`atomic`): a zeroing launch, then one thread per source element adding its value at
  its index with a relaxed atomic add (Metal's atomic_float / atomic_int / atomic_uint; f16
  and bf16 outputs through an f32 accumulator and a finishing cast);
- deterministic (`segmented`): the call sorts the index on the device first; one thread per
  output element sums its run of the sorted index in order, no atomics, bit-identical runs.

`form` recognises the graph (the scatter is the kernel's only output), `context` holds what
the kernels share (names, positions, the values' lowering, the index check, the parameter
list), `schedule` the launches of a call.
"""
from __future__ import annotations

from .form import ScatterForm, match
from .schedule import ScatterSchedule, build

__all__ = ["ScatterForm", "ScatterSchedule", "build", "match"]
