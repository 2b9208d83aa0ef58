"""The attention family's tile sizes and thresholds, with the measurements behind them. Facts of
the GPU (simdgroup width, fragment shape, limits) come from `schedule/hardware.py`."""
from __future__ import annotations

from ..hardware import SIMD_WIDTH

# Key blocks per tile of query rows, when launch={'key_splits': n} does not pin them: enough
# threadgroups (tiles x blocks) to fill a GPU of many cores, each simdgroup of a block still
# taking at least MIN_KEYS keys (fewer and the merge costs more than the split saves).
# stage_kv's threadgroups are lighter (48 registers a thread, 21.5 KB of threadgroup memory:
# 10 fit an H100 core, against 4 of the unstaged schedule's), so it aims at twice as many:
# decode GQA 32/8, E = 128, f16, L = 16384 / 65536: 512 groups 83.6 / 285.5 us, 1024 groups
# 63.3 / 190.5, 2048 groups 68.0 / 190.8 (bench/README.md, 2026-11-25). A stage_kv block takes
# at least MIN_STAGED_KEYS keys (two tiles): each group's set-up and state then serve more
# than one tile; H100, 2026-11-26, the same decode at L = 4096: 128 blocks of one tile 17.7 us,
# 64 blocks 16.2 (at 16K / 64K the target binds first: 128 blocks, 41.0 / 108.7; 64 blocks
# 44.7 / 127.6).
TARGET_GROUPS = 512
TARGET_GROUPS_STAGED = 1024
# ... the prefill kernel with its scores in registers (flash.py): a tile's key blocks cost a
# merge and each block's rows re-read q, so it splits only grids of fewer groups than this.
# H200, 2026-11-29, f16, causal, 32 heads, us at S = L = 1024 E = 64 / 128 and 4096 E = 64 /
# 128: key_splits 1 193.5 / 252.4 / 1846.5 / 2518.1; 2 350.6 / 580.5 / 2399.4 / 3633.4; 4
# 366.8 / 601.4 / 2435.4 / 3664.9 (512 and 2048 tiles: the 1024 rule split S = 1024 in two)
TARGET_GROUPS_RESIDENT = 256
# ... and its narrow twin's E: rows of E up to this take a kernel whose registers and tiles
# hold that E (64 keys a tile, not 32), where the kernel of E up to 32 x run keeps them
NARROW_PREFILL_E = 64
MIN_KEYS = 32
MIN_STAGED_KEYS = 64
# The merge kernel: key blocks a stream of lanes loads before it adds any of them, and the
# simdgroups of a query row's threadgroup (each merges a share of the blocks, then the first
# merges their states: with one simdgroup per row, 32 rows of 128 blocks took 17-21 us on an
# H100, a serial chain of loads per row)
MERGE_STEP = 4
MERGE_SIMDGROUPS = 8
MERGE_MIN_SHARE = 2 * MERGE_STEP
# ... and the lanes of a block one merge threadgroup reads at most (MERGE_LANES x
# reads_per_thread elements of E): wider rows are split over several threadgroups, so that more
# cores read a row's states. H100, 2026-11-27, decode 32/8 heads, E = 128, f16, us at L = 4K /
# 16K / 64K, two runs: all 16 lanes (one threadgroup a row) 14.4 / 40.9-41.1 / 109.2-109.6;
# 8 lanes 13.8-13.9 / 39.4 / 107.1-107.2; 4 lanes 14.0-14.2 / 39.2-39.7 / 106.9-107.6; 2 lanes
# 14.4-14.8 / 39.6-40.1 / 107.6 (bench/README.md)
MERGE_LANES = 8
# stage_kv: keys per tile (the narrow kernel's: NARROW_TILE_KEYS, two a lane in its softmax:
# its keys are short, and more of them a tile spread the tile's four barriers), bytes of
# threadgroup memory per staged tensor (32 keys x 128 elements of 2 bytes or 64 x 64, rows
# padded by PAD_BYTES: 16-byte reads of 32 lanes at different rows then fall on different
# banks), and the consecutive E elements a lane holds for the values (E = 128: 4 per lane)
TILE_KEYS = 32
NARROW_TILE_KEYS = 64
PAD_BYTES = 16
TILE_BYTES = max(TILE_KEYS * (128 * 2 + PAD_BYTES), NARROW_TILE_KEYS * (64 * 2 + PAD_BYTES))
VALUE_RUN = 4
# A thread's copies of a full tile (fill_tiles) issued as one batch per K/V read (its loads,
# then its stores) when they number at most this: the decode kernel (E = 128, 32 keys, 128
# threads) and the narrow one (E = 64, 64 keys) make 4, the wide one 8 (left to the loop).
# H100, 2026-11-27, f16, us, the copy loop -> batched (no spill): decode B=1, 32/8 heads,
# L = 4K / 16K / 64K 12.0-12.3 / 35.1-35.4 / 102.8-103.5 -> 11.8-11.9 / 34.5-35.0 /
# 102.2-102.9; sliding-window decode (32 heads, window 4096) 33.2-34.0 -> 31.6-32.3; E = 64
# unchanged (bench/README.md)
BATCHED_COPIES = 4
# stage_kv: rows of E up to NARROW_LANES x run elements (64 at run 4) run the `decode_narrow`
# kernel: the values loop's lanes split into 32 / NARROW_LANES key streams (the lanes over E
# would otherwise leave half of them idle). H100, f16, E = 64, 32/8 heads, L = 16384: 34.4 ->
# 30.0 us; prefill S = L = 1024, E = 64: 1225 -> 986 us (bench/README.md); a separate kernel
# because the same loop with a per-call number of streams cost E = 128 2-8%.
NARROW_LANES = 16
# The simdgroup_matrix prefill kernel (prefill.py): query rows per threadgroup, 8 a
# simdgroup
MATRIX_ROWS = 32
MATRIX_GROUP = SIMD_WIDTH * MATRIX_ROWS // 8


def lanes_per_key(e: int, per_lane: int) -> int:
    """Lanes that share one key's E elements (a power of two): per_lane elements each."""
    w = 1
    while w * per_lane < e and w < SIMD_WIDTH:
        w *= 2
    return w

