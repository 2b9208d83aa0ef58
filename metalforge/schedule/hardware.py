"""What the schedules know about the GPU, as frozen data in one place.

These are facts of Apple GPUs and of Metal, not tuning choices: the launch tables (`policy`)
and each family's tile sizes are built on them. Sources: Apple's Metal feature set tables
and the simdgroup_matrix section of the Metal Shading Language specification.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fragment:
    """A simdgroup_matrix: a rows x cols tile spread over the 32 lanes of a simdgroup, each lane
    holding `per_lane` elements (Apple's layout: row mf_mr, columns mf_mc and mf_mc + 1)."""
    rows: int
    cols: int
    per_lane: int
    types: tuple[str, ...]


@dataclass(frozen=True)
class Gpu:
    """Limits every kernel obeys on every Apple GPU metalforge targets."""
    simd_width: int                  # threads of a simdgroup (lanes)
    max_threads_per_group: int       # maxTotalThreadsPerThreadgroup
    threadgroup_bytes: int           # static threadgroup memory a kernel may declare
    fragment: Fragment               # the one simdgroup_matrix shape Metal has (8 x 8)


APPLE = Gpu(simd_width=32, max_threads_per_group=1024, threadgroup_bytes=32 * 1024,
            fragment=Fragment(rows=8, cols=8, per_lane=2, types=("float", "half", "bfloat")))

SIMD_WIDTH = APPLE.simd_width
MAX_THREADS_PER_GROUP = APPLE.max_threads_per_group
MAX_THREADGROUP_BYTES = APPLE.threadgroup_bytes
FRAG = APPLE.fragment.rows
