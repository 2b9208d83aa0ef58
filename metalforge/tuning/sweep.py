"""The default autotune candidates: a small grid over a family's tunable launch options."""
from __future__ import annotations

import itertools
from typing import Any, Mapping

from ..schedule.policy import TUNABLE, LaunchError, resolve
from .launch import NOT_TUNED

# Values tried per option. Threads per group only changes the dispatch (no recompile); the
# others change the generated code, so the grid compiles one kernel per combination of them.
SWEEP: dict[str, tuple[int, ...]] = {
    "threads_per_group": (128, 256, 512, 1024),
    "vector_width": (2, 4, 8),
    "vectors_per_thread": (1, 2, 4),
    "rows_per_group": (1, 2, 4, 8),
    "reads_per_thread": (2, 4, 8),
    "k_splits": (1, 2, 4, 8),
    # attention: the simdgroup_matrix prefill kernel or not (Apple GPUs multiply float 8x8
    # matrices in hardware, the cuda backend emulates them: 2x slower there, bench/README.md)
    "matrix_rows": (0, 32),
    # quantized tiled kernel: simdgroup_matrix products or register tiles (the cuda backend's:
    # 2.6-3x faster there, bench/README.md); untimed on Apple GPUs
    "qmm_matrix": (True, False),
}


def swept_keys(family: str, pinned: Mapping[str, Any] = ()) -> tuple[str, ...]:
    return tuple(k for k in TUNABLE[family] if k in SWEEP and k not in NOT_TUNED
                 and k not in pinned)


def grid(family: str, pinned: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every combination of SWEEP values for the family's tunable keys that are not pinned by
    an explicit override, each merged with the pinned ones; combinations the family's policy
    rejects (e.g. rows per group that do not fit the group) are left out."""
    pinned = dict(pinned or {})
    keys = swept_keys(family, pinned)
    out = []
    for values in itertools.product(*(SWEEP[k] for k in keys)):
        cand = {**dict(zip(keys, values)), **pinned}
        try:
            resolve(family, cand)
        except LaunchError:
            continue
        out.append(cand)
    return out
