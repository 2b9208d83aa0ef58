"""The quantized family's constants: the simdgroup width as an IR literal and the tiled
kernel's (`qmm`) tile sizes, threads and staging layout, derived from the GPU facts of
schedule/hardware.py. The matvec kernels' levers are launch options (policy "quant")."""
from __future__ import annotations

from ... import ir
from ..hardware import FRAG, SIMD_WIDTH

SIMD = ir.Lit(SIMD_WIDTH, "uint")

# -- the tiled kernels: qmm, and qmm_wide (the matrix block's second tile, from
# qmm_wide_rows rows of x) ------------------------------------------------------------------
WIDE = "qmm_wide"
TILED = ("qmm", WIDE)
TILE_M, TILE_N, TILE_K = 32, 32, 64
THREADS = 256                                   # 8 simdgroups
SIMDGROUPS = THREADS // SIMD_WIDTH
RUN = 8                                         # consecutive values of K a thread stages of
RUNS = TILE_K // RUN                            # each tile row (one 4-bit word's); runs a row
W_STRIDE = TILE_N + 1                           # padded k-major weight rows: no bank conflicts
X_VECTORS = TILE_K // 4                         # float4s per staged row of x
BLOCKS = TILE_M * TILE_N // (FRAG * FRAG) // SIMDGROUPS   # 8x8 output blocks a simdgroup (2)
BLOCK_COLS = TILE_N // FRAG                     # 8x8 blocks across a tile row (4)
# register tiles (qmm_matrix off)
MICRO = 4                                       # a thread's outputs: MICRO rows x MICRO columns
TILE_THREADS = TILE_M * TILE_N // (MICRO * MICRO)         # threads covering the tile once (64)
K_SLICES = THREADS // TILE_THREADS              # slices of the step's k (4)
SLICE_K = TILE_K // K_SLICES                    # values of k a slice takes per step (16)
ROW_VECTORS = (TILE_N + MICRO) // 4             # float4s per staged k-major row of either
                                                # tile (TILE_M = TILE_N; 9: 36 floats), and
                                                # one more after every RUN rows (no conflicts)
TILE_VECTORS = TILE_K * ROW_VECTORS + RUNS      # float4s of one staged tile (584)
MICRO_COLS = TILE_N // MICRO                    # register tiles across a tile row (8)
assert THREADS == TILE_N * RUNS == TILE_M * RUNS and K_SLICES * THREADS <= 2 * TILE_VECTORS
