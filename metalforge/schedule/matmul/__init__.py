"""The contraction family: `mf.sum(a * b, axis="K")` with a over (..., M, K) and b over
(..., N, K) (any storage order; batch axes broadcast), an elementwise prologue on each operand
and an elementwise epilogue after the sum (bias, activation, scale, residual), as one kernel on
the target's matrix hardware (`schedule/matrix`: Metal 4 tensor ops or simdgroup_matrix).

Modules: `form` (what the family recognises: `match`), `context` (the per-call context: tile,
parameters, element lowerings), `kernel` (the kernel's phases) and `schedule` (the host side,
`build`). Launch options: `target` (metalforge/target.py; set per call from the current target)
and `tile` (32, 64 or 128 outputs a side).
"""
from __future__ import annotations

from .form import Contraction, match
from .schedule import MatmulSchedule, build

__all__ = ["Contraction", "match", "build", "MatmulSchedule"]
