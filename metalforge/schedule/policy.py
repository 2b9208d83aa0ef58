"""Launch policy: one config table per schedule family, overridable, validated on the host.

Codegen reads every launch-shaped number (threads per group, elements per thread, vector width)
from a `LaunchPolicy`; nothing launch-related is a literal elsewhere. `resolve` merges a user's
`launch=` overrides into the family's defaults and checks them; `validate_for_kernel` checks the
result against the compiled pipeline's own limit before the first launch.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Mapping, Optional

from ..errors import LaunchError
from ..target import TARGETS
from .hardware import MAX_THREADGROUP_BYTES, MAX_THREADS_PER_GROUP, SIMD_WIDTH

MAX_VECTOR_BYTES = 16                 # widest access: Metal's 4-component vectors of 4-byte types
# Elements a row-reduction thread holds per input in registers (fp32 each). Bounded for Metal:
# Apple GPUs keep fewer registers per thread than NVIDIA before spilling, and on the H100 a
# 1024-thread group already has only 64 registers per thread (65536 / 1024): layer_norm f16 with
# 16 reads per thread exceeded that and could not launch 1024 threads (bench/README.md, levers).
MAX_READS_PER_THREAD = 16
# Bytes a thread of the wide column kernel loads a row (vector_width adjacent columns at most):
# H200, 2026-11-28, column_sum, us, 4 f32 columns (16 bytes) -> 2 (8 bytes): 4096x4096 25.1 ->
# 21.0, 2048x16384 41.1 -> 34.9; f16, 2 columns (4 bytes) -> 4 (8 bytes): 2048x16384 24.6 ->
# 23.9, 64x65536 5.0 -> 4.9 (bench/README.md)
COLUMN_LOAD_BYTES = 8
# Weight rows one quantized-matvec simdgroup holds at once: each keeps its packed words, scale,
# bias and accumulator in registers for the chunk.
MAX_QUANT_ROWS = 16
# how a call learns of a gather index out of range, where no proof drops the check
INDEX_CHECKS = ("checked", "deferred")


@dataclass(frozen=True)
class LaunchPolicy:
    family: str
    threads_per_group: int = 256
    vector_width: int = 4              # elements per vector load/store (1 = scalar only)
    vectors_per_thread: int = 1        # vector chunks each thread handles
    rows_per_group: int = 1            # row reductions: rows per threadgroup
    reads_per_thread: int = 4          # row reductions, group variant: elements per thread
    simd_reads_per_thread: int = 4     # row reductions, simd variant: elements per lane
    looped_reads_per_thread: int = 4   # row reductions, looped variant: elements per chunk
    looped_limit: int = 4096           # row reductions: longest row done in one pass
    stage_rows: Optional[bool] = False  # row reductions, group-variant rows of whole blocks:
                                       # the second half of each thread's block of the row's
                                       # first inputs kept in threadgroup memory, not registers
                                       # (the `staged` kernel); None: per call, where the backend
                                       # says twice the threadgroups then share a core (cuda)
    keep_narrow: bool = False          # row reductions: a reduction's argument computed by
                                       # plain arithmetic from 2-byte inputs (softmax(x / t)'s
                                       # x / t) kept in fp32 registers for the later phases;
                                       # False: recomputed there from the inputs' registers
    centered: Optional[bool] = None    # row reductions, streamed rows: a sum of squares around a
                                       # value of a sum (LayerNorm's variance) in the sum's pass
                                       # (schedule/centered.py); False: a pass of its own; None:
                                       # split rows centered, looped rows not (measured below)
    k_splits: int = 1                  # quantized matvec: simdgroups sharing one block of rows,
                                       # each taking a slice of K (merged in threadgroup memory)
    split_grid: int = 0                # quantized matvec: the k_splits kernel (qmv_split) runs
                                       # where qmv's grid has fewer than split_grid simdgroups
                                       # per stretch of K (32 chunks) each walks (0: qmv itself
                                       # splits, every call)
    small_grid: int = 0                # elementwise: grids of fewer elements take a second
                                       # kernel (`small`) at 4 elements a thread where
                                       # vector_width gives 8 (0: never)
    uses_simd: bool = False            # simd collectives in the kernel → groups of 32
    threadgroup_bytes: int = 0         # static threadgroup memory the kernel declares
    index64: Optional[bool] = None     # None: 64-bit indexing only where sizes need it
    key_splits: int = 0                # attention: key blocks per query row (0: per call)
    keys_per_step: int = 8             # attention: keys a simdgroup loads at once
    lane_scores: bool = False          # attention: each lane scores whole keys of its own (q in
                                       # threadgroup memory), no butterfly per key
    stage_kv: Optional[bool] = None    # attention: K/V tiles of 32 keys staged in threadgroup
                                       # memory by the whole group, one simdgroup per query row
                                       # (None: the schedule's choice, on where
                                       # threads_per_group = 32 x rows_per_group)
    matrix_rows: int = 32              # attention: query rows sharing keys from which a call
                                       # runs the simdgroup_matrix prefill kernel (0: never)
    qmm_min_rows: int = 64             # quantized: rows of x from which the tiled kernel runs
    qmm_matrix: bool = True            # quantized, tiled kernel: products as simdgroup
                                       # matrices (Apple's matrix hardware); False: FMAs on
                                       # per-thread register tiles
    qmm_tile_m: int = 64               # quantized, tiled kernel on the matrix block (half or
    qmm_tile_n: int = 64               # bfloat x): rows of x and weight rows of a tile (32,
                                       # 64 or 128 each; schedule/quant/blocked.py)
    qmm_tile_k: int = 32               # ... and values of K a step (32, 64 or 128)
    qmm_splits: int = 1                # quantized, tiled kernel on the matrix block: teams of
                                       # 4 simdgroups in a threadgroup splitting K (1, 2 or 4)
    qmm_prefetch: bool = True          # quantized, tiled kernel on the matrix block: the next
                                       # step's loads in registers while the products run
    qmm_fp32: bool = False             # quantized, tiled kernel: the fp32 kernel (qmm_matrix
                                       # picks its products) for half or bfloat x too
    qmm_wide_rows: int = 0             # quantized, tiled kernel on the matrix block: from
                                       # this many rows of x (and qmm_min_rows) the second
                                       # tiled kernel, qmm_wide, runs (0: never built)
    qmm_wide_tile_m: int = 128         # ... its rows of x and weight rows of a tile (32, 64
    qmm_wide_tile_n: int = 128         # or 128 each; its values of K a step: qmm_tile_k)
    qmm_wide_splits: int = 1           # ... and its teams splitting K (1, 2 or 4)
    qmm_wide_groups: int = 0           # ... taken only where its grid has at least this many
                                       # threadgroups (0: wherever qmm_wide_rows says)
    fill_groups: int = 0               # column reductions: threadgroups the split kernel's grid
                                       # aims at, splitting the reduced axis into chunks where
                                       # the column blocks alone are fewer (0: never chunks)
    chunk_rows: int = 64               # column reductions: fewest positions of the reduced
                                       # axis per chunk
    one_launch: bool = False           # column reductions of a chunked axis: the last
                                       # threadgroup of each column block to finish (an atomic
                                       # ticket in a zeroed counter the runtime keeps) merges the
                                       # chunks' partials in the same launch; False: a second
                                       # (combine) launch merges them (schedule/column_ticket.py)
    stage_prologue: bool = True        # quantized matvec of a computed x with exp / sigmoid /
                                       # tanh... (a fused activation): x computed once per
                                       # threadgroup into threadgroup memory (qmv_prologue);
                                       # False: once per simdgroup (qmv)
    x_rows: int = 2                    # quantized matvec: rows of x one simdgroup takes at once
                                       # (weights unpacked once for them) from x_rows rows on;
                                       # x_rows x rows_per_group sums at most MAX_QUANT_ROWS
    grad_fp32: bool = False            # attention backward: the fp32 8x8 simdgroup_matrix
                                       # kernels even for half / bfloat inputs (False: 16x16
                                       # blocks on the inputs' own type, schedule/attention_grad)
    grad_simdgroups: int = 2           # attention backward's 16x16 block kernels: simdgroups a
                                       # threadgroup: 2 (K, V or q, dO staged) or 4 (each
                                       # simdgroup's own rows in registers: attention_grad/wide,
                                       # tensor-op targets; elsewhere 2)
    grad_step_blocks: int = 1          # attention backward's wide kernels: 16-row (16-key)
                                       # blocks a step stages at once (1 or 2: fewer barriers
                                       # and load round trips a row; 4 would stage 34 KB)
    paired_rows: int = 0               # quantized matvec whose epilogue reads its own rows
                                       # (RoPE's partner: qmv_paired): rows_per_group of that
                                       # kernel, half of them partners (0: rows_per_group)
    index_check: str = "checked"       # gathers not proven in range: "checked" (each call
                                       # reads the kernel's report and raises) or "deferred"
                                       # (read at the next synchronisation point;
                                       # runtime/indexcheck.py). The MSL is the same.
    target: str = ""                   # contractions: the target the code is generated for
                                       # (metalforge/target.py: "apple9", "apple10", ...; ""
                                       # where the family reads none); set per call from the
                                       # current target unless a launch option names one
    tile: int = 64                     # contractions: output rows and columns of a
                                       # threadgroup's tile (32, 64 or 128)
    tile_simdgroups: int = 4           # contractions: simdgroups of a tile (4: 2 x 2 blocks,
                                       # 8: 2 x 4)
    k_step: int = 32                   # contractions: values of K a step (32 or 64)
    stage_pad: int = 0                 # contractions: values after each staged row of 16
                                       # (0 or 8: 48-byte rows, no bank conflicts in fragment
                                       # loads; 16-byte threadgroup stores); 2-byte operands
    prefetch: bool = False             # contractions, padded tiles: tensor operands' tiles
                                       # read into registers a step ahead of their products
    tile_groups: int = 0               # contractions: tiles walked column by column in bands
                                       # of this many rows of tiles (L2 reuse; 0: row-major)
    tf32: bool = False                 # contractions: f32 operands on the matrix hardware at
                                       # reduced precision (TF32: 10-bit mantissas) where the
                                       # target has tensor ops (matmul2d's relaxed_precision);
                                       # elsewhere exact fp32 still

    @property
    def elements_per_thread(self) -> int:
        return self.vector_width * self.vectors_per_thread

    def key(self) -> tuple[Any, ...]:
        return tuple(getattr(self, f.name) for f in fields(self))


def access_width(limit: int, itemsizes: set[int]) -> int:
    """Elements per vector access for tensors of these element sizes: at most `limit` and 16
    bytes of the widest; 8 only when every one is 2 bytes (the 16-byte `mf_pack8`: Metal's
    vectors stop at 4 components)."""
    w = min(limit, max(1, MAX_VECTOR_BYTES // max(itemsizes)))
    return w if w <= 4 or itemsizes == {2} else 4


# The table. Only the keys a family reads may be overridden for it.
POLICIES: dict[str, LaunchPolicy] = {
    # elementwise: vector_width is an upper bound, each access moves at most 16 bytes (8 f16,
    # 4 f32; `access_width`): on the H100 silu f16 went from 90 % of copy_ with 8-byte
    # accesses to 97-100 % with 16-byte ones (bench/README.md, 2026-11-23)
    # small_grid: untimed on Apple GPUs; the H100's 2^21 (BACKEND_POLICIES) scaled by core
    # count, an M-series Max's 40 against 132
    "elementwise": LaunchPolicy("elementwise", threads_per_group=256, vector_width=8,
                                vectors_per_thread=1, small_grid=1 << 19),
    # row reductions (schedule/rows/): rows up to 32*simd_reads_per_thread → the fewest lanes
    # of a simdgroup holding the row, rows_per_group simdgroups per group; up to looped_limit →
    # one group per row, reads_per_thread values per thread in registers (both counted for
    # 4-byte types: 2-byte types hold the same 32 bytes, 16 values, rows up to 2 x
    # looped_limit); longer → threads_per_group threads per row, looped.
    # vector_width is an upper bound: an access moves at most 16 bytes and a thread's reads.
    # Chosen on an H100 (2026-11-23, bench/README.md "after" table; levers from
    # bench/cuda_levers.py): reads_per_thread 4 for every variant was the main loss. Group
    # variant 8 per thread (f32) beat 4 and 16 (rms_norm f32 16384x4096 1.38→1.42x torch,
    # f32 at 4096x8192 with 16: rms_norm 1.35→1.19x); 16 for f16 beat 8 (layer_norm f16
    # 16384x4096 0.76→0.96x, softmax f16 4096x8192 1.04→1.50x, before the unchecked element
    # loops); looped variant 4 (8 at D=16384: softmax f16 0.56→0.48x, log_softmax f32
    # 0.91→0.66x); looped_limit 8192 is the longest row 1024 threads hold at 8 per thread.
    # With them: geomean 1.29x torch eager over 50 cases (was 1.03x). Simd variant 8 per lane
    # since short rows share simdgroups (2026-11-25: D=128 in 16 lanes, 16-byte f16 accesses;
    # log_softmax f16 8192x128 0.79→1.03x, softmax f16 0.97→1.24x; at 4 per lane and one
    # simdgroup per row, 8 per lane had left half the lanes idle: softmax f16 0.77→0.46x).
    # centered None: split rows fold LayerNorm's mean and variance in one centered pass, the
    # looped kernel in two (H200, 2026-11-29, layer_norm µs: f32 / f16 64x65536 split 18.1 /
    # 20.3, centered 17.1 / 17.6; f32 2048x16384 / 1024x16384 looped 124.0 / 64.1, centered
    # 129.4 / 67.0; its second read comes from L2, the centered arithmetic does not)
    "row": LaunchPolicy("row", threads_per_group=1024, vector_width=8, rows_per_group=8,
                        reads_per_thread=8, simd_reads_per_thread=8, looped_reads_per_thread=4,
                        looped_limit=8192, uses_simd=True),
    # quantized matvec (schedule/quant/): one simdgroup per rows_per_group weight rows, each
    # lane reading vector_width packed words (16 bytes) per chunk, every row's words loaded
    # before any is unpacked; k_splits simdgroups (of one threadgroup) may share a block of
    # rows, each taking every k_splits-th stretch of 32 chunks of K, their sums merged through
    # threadgroup memory. Chosen on an H100 (2026-11-24, `bench/quant.py --sweep`, f16, M = 1,
    # 4-bit, GS 64; time vs F.linear on the f16 weight, 4096x4096 / 11008x4096 / 4096x11008 /
    # 14336x4096): 2 rows, no split 1.52x / 2.38x / 2.38x / 2.31x (42-64% of copy_); 1 row
    # 1.27x / 1.94x / 2.04x / 1.95x; 4 rows 1.24x / 2.25x / 1.92x / 2.05x; k_splits 2 within
    # 0.05x of no split, 4 and 8 slower everywhere (bench/README.md). Re-swept 2026-11-26 with
    # values masked in place (rows 1 / 2 / 4 x k_splits 1 / 2 / 4 x 128 / 256 threads): 2 rows,
    # no split, 256 threads within 0.8 us of the best setting of every shape (49-70% of copy_)
    # 2026-11-27, with qmv's per-place sums (schedule/quant/affine.py), rows 2 / 4 x 64 / 128 / 256
    # threads, f16 (bf16 alike), us: 2 rows 7.1 / 13.4 / 13.3 / 15.9 at best, 4 rows and 128
    # threads 6.5 / 12.3 / 12.8 / 14.3 (46 / 73 / 70 / 83% of copy_, 1.69-2.95x F.linear), the
    # best or within 0.4 us of it everywhere; M = 2 / 8 (qmvx) 9.5 -> 8.3 / 29.3 -> 23.7 at
    # 4096^2. MLX's own qmv also gives a simdgroup 4 rows, with 16 values of x and 4 sums a
    # lane; ours holds 32 values of x, 16 sums (4 rows x 4 places), 16 words, 8 scales and
    # biases: about 80 registers, untimed on Apple GPUs, which spill earlier (rows_per_group
    # 2 halves the sums and words)
    # From qmm_min_rows rows of x the tiled kernel (schedule/quant/tiled.py) runs instead: H100,
    # 2026-11-24, f16, 4096x4096 / 11008x4096, us, matvec vs tiled: M = 8 35 / 89 vs 156 / 239;
    # 32 129 / 339 vs 159 / 251; 64 253 / 673 vs 203 / 485; 128 503 / 1353 vs 318 / 816; 512
    # 1992 / 5344 vs 1140 / 2935 (bench/README.md). Re-measured 2026-11-28 with the cuda
    # backend's register tiles (qmm_matrix=False) and tiles loaded a step ahead: M = 32 76 / 193
    # vs 75 / 194, 64 147 / 381 vs 118 / 350, 512 1129 / 2996 vs 919 / 2423; 64 stays
    # From x_rows rows of x the qmvx kernel takes x_rows of them per simdgroup (each packed value
    # unpacked once for all): H100, 2026-11-25, f16, 4096x4096 / 11008x4096, us, x_rows 1 / 2 /
    # 4 / 8: M = 2 10.8 / 9.4 / 12.4 / 24.5 (4096^2); M = 8 34.9 / 29.6 / 26.9 / 24.6 (4096^2),
    # 88.7 / 73.4 / 55.8 / 69.7; M = 32 129.6 / 107.7 / 81.1 / 90.6, 340.6 / 280.2 / 201.5 /
    # 238.0; vector_width 2 with x_rows 8 within 10% of x_rows 4 (bench/README.md). x_rows 2 is
    # the default: faster than one row of x at every M from 2, and a lane holds 64 values of x
    # (2 rows x 32, with 16-byte word loads) where x_rows 4 holds 128: Apple GPUs spill registers
    # long before NVIDIA's, and MLX's own qmv keeps 16 per lane; raise it where measured
    # Grids of few simdgroups for their chains of loads split K (qmv_split: k_splits
    # simdgroups a block of rows, sums merged through threadgroup memory): where qmv's grid has
    # fewer than split_grid simdgroups per stretch of K (1024 4-bit values) each would walk.
    # H100, 2026-11-27, f16, M = 1, rows 4, k_splits 1 / 2 / 4 / 8 (best of 128 and 256
    # threads), us, weights in L2 (bench/quant.py --sweep) and not (--cold), with qmv's
    # grid G and stretches: 1024x4096 (G 256, 4) 5.1 / 4.3 / 3.9 / 4.0 and 6.7 / 5.5 / 4.5 /
    # 4.5; 4096x4096 (1024, 4) 6.3 / 6.5 / 6.7 / 8.1 and 8.5 / 8.1 / 8.1 / 9.4; 4096x11008
    # (1024, 11) 12.6 / 12.4 / 12.1 / 13.7 and 19.0 / 15.8 / 15.1 / 16.7; 4096x14336 (1024, 14)
    # 15.7 / 14.7 / 14.4 / 16.0 and 22.5 / 18.8 / 17.9 / 19.2; 8192x8192 (2048, 8) 16.8 / 16.6 /
    # 17.3 / 19.8 and 20.2 / 19.2 / 20.1 / 21.8; 8192x28672 (2048, 28) 58.8 / 54.6 / 54.2 / 56.0
    # and 58.1 / 54.4 / 54.3 / 55.9; 28672x8192 (7168, 8) 52.4 / 54.4 / 55.2 / 64.6 and 52.7 /
    # 54.2 / 55.5 / 64.7; 1024x14336 (256, 14) 12.2 / 8.5 / 7.1 / 6.6 and 18.5 / 12.4 / 9.2 /
    # 7.8; cold 11008x4096 (2752, 4) 15.0 / 15.7 / 16.4, 14336x4096 (3584, 4) 17.1 / 18.3 / 20.0
    # (bench/README.md). 4 splits where G < 256 x stretches (BACKEND_POLICIES, cuda) is the best
    # or within 5% of it in each of these cases. The Metal table takes 64 (untimed on Apple
    # GPUs: the H100's 256 scaled by 38 cores of an M2 Max against its 132; MLX's qmv does not
    # split). qmvx_split (rows of x in blocks of x_rows, K split) where qmvx's grid has at
    # most split_grid simdgroups: H100, f16, us, qmvx -> split, M = 2: 1024x4096 (grid 256)
    # 6.4 -> 5.4, 1024x14336 (256) 15.0 -> 9.2, 4096x11008 (1024) 17.5 -> 22.1, 4096x14336
    # (1024) 23.1 -> 26.2; M = 4: 1024x4096 (512) 6.3 -> 8.6, 1024x14336 (512) 15.0 -> 16.8;
    # M = 8: 1024x14336 (1024) 20.7 -> 25.0 (bench/README.md)
    "quant": LaunchPolicy("quant", threads_per_group=128, vector_width=4, rows_per_group=4,
                          k_splits=4, split_grid=64, x_rows=2, uses_simd=True,
                          target="apple9"),
    # attention (schedule/attention/): a threadgroup per tile of rows_per_group query rows
    # that read the same keys (GQA's query heads of one kv head, prefill's query positions)
    # and block of keys; its threads_per_group / 32 simdgroups take turns over the block's
    # keys. lane_scores: each lane scores a key of its own over all of E (q in threadgroup
    # memory, 32 keys per simdgroup step), else a key's E elements are spread over the fewest
    # lanes holding reads_per_thread consecutive ones each and summed by shuffles; the values
    # are always taken that way (E up to 32 x 8 = 256), keys_per_step keys per lane stream at
    # a time; key_splits blocks per tile (0: chosen per call so that a few tiles still fill
    # the GPU), merged by a second kernel. Chosen on an H100 (2026-11-25, bench/attention.py,
    # decode B=1, 32/8 heads, E=128, f16, L = 4096 / 16384 / 65536, us): lane scores, 4 rows,
    # 128 threads 32.2 / 77.4 / 234; with 256 threads 34.3 / 93.3 / 253; without lane scores
    # (2 rows x 2 keys, 256 threads, the old default) 29.9 / 112.5 / 375; keys_per_step 1, 4
    # or 8 within 2%; key_splits=128 slower everywhere (bench/README.md)
    # stage_kv: K/V tiles of 32 keys in threadgroup memory (64 at E <= 64), a simdgroup per
    # query row (threads_per_group = 32 x rows_per_group), the simdgroups splitting each
    # tile's keys, about 1024 threadgroups; rows_per_group 8 (256 threads) measured slower
    # everywhere (decode 64K 131 -> 215 us, prefill 1024 E=128 860 -> 981). Unless set, on
    # wherever threads_per_group allows it: H100, 2026-11-25, us, unstaged -> staged: decode
    # GQA 32/8 E=128 f16 L = 4096 / 16384 / 65536: 31.0 / 71.5 / 227.4 -> 19.9 / 47.4 / 134.7;
    # bf16 16384 71.5 -> 48.2; f32 79.5 -> 72.1; E = 64 41.9 -> 34.4; MHA 32/32 206.5 ->
    # 108.5; prefill S = L = 1024, E = 64 / 128: 1568 / 2818 -> 1225 / 1600 (bench/README.md)
    # matrix_rows: from 32 query rows sharing keys, the simdgroup_matrix prefill kernel (Metal's
    # float 8x8 products, as MLX's steel attention). The H100 has no such product (the cuda
    # backend shuffles operands into place): there it is 2x slower than the scalar kernels
    # (S = L = 1024, E = 128: 1801 vs 872 us); Apple GPUs multiply them in hardware. Untimed on
    # a Mac, so the table follows the Metal design. With f16/bf16 operands the kernel is
    # schedule/attention/mma.py on the target's matrix hardware (Metal 4 tensor ops: the
    # cuda target's tensor cores); the fp32 one is left out on the cuda target
    # (attention/build.py; bench/README.md)
    # target: the prefill kernel's matrix hardware (schedule/attention/mma.py: Metal 4 tensor
    # ops where the target has them, else simdgroup_matrix; set per call from the current
    # target, as the contractions')
    "attention": LaunchPolicy("attention", threads_per_group=128, reads_per_thread=8,
                              rows_per_group=4, keys_per_step=2, lane_scores=True,
                              uses_simd=True, target="apple9"),
    # columns (schedule/column.py): one thread per column up to looped_limit positions of the
    # reduced axis; longer, groups of 32 columns x rows_per_group slices, each thread
    # reads_per_thread rows at once (loads in flight), up to vector_width adjacent columns (one
    # vector load of COLUMN_LOAD_BYTES a row: the wide kernel, where the graph and sizes
    # allow); where fewer than fill_groups column blocks, the reduced axis is also split into
    # chunks of at least chunk_rows positions
    # (fp32 partials through scratch, merged by a second launch). fill_groups: about one wave
    # of 256-thread groups on an H200 (132 SMs x 8 groups of 256 threads); the old kernel (a
    # group per block of 32 columns over the whole axis: 4 groups at D = 128) took a flat
    # ~100 us at 4096x128..4096x4096. chunk_rows 64 -> 128 (f16, wide, us): 4096x128 8.2 ->
    # 6.9, 4096x1024 10.8 -> 8.1 (fewer, longer chunks); reads_per_thread 8 within 5%
    # (bench/README.md, 2026-11-28). Back to 64 once the combine kernel merged the chunks in
    # parallel (2026-11-29, H200, column_sum f16 us, chunk_rows 128 -> 64: 4096x128 4.5 ->
    # 3.9, f32 4.2 -> 4.1, elsewhere within 0.2; fill_groups 256-2048 and reads_per_thread 2
    # within noise where fill_groups >= 1024, 512 slower at 2048x16384: 23.6 -> 29.8)
    "column": LaunchPolicy("column", threads_per_group=256, vector_width=4, rows_per_group=8,
                           reads_per_thread=4, looped_limit=16, fill_groups=1024,
                           chunk_rows=64),
    # scans (schedule/scan/): the row kernel's threadgroup holds a chunk of
    # threads_per_group x reads_per_thread elements of a row (fewer threads for shorter rows,
    # chosen per call); rows of one simdgroup's chunk (32 x reads_per_thread) one simdgroup
    # each, rows_per_group a threadgroup; vector_width an upper bound (16 bytes at most); rows
    # of several chunks split into segments (a totals launch first) where the rows alone make
    # fewer than fill_groups threadgroups (0: never). Untuned.
    # scan: 512 threads a row's threadgroup: the f16 row kernel's CUDA pipeline (H200) takes
    # at most 768, and its totals and row launches share one grid, so no launch may shrink
    "scan": LaunchPolicy("scan", threads_per_group=512, vector_width=8, reads_per_thread=8,
                         rows_per_group=8, uses_simd=True, fill_groups=256),
    # several axes reduced together (schedule/multiaxis): a threadgroup of threads_per_group
    # walks a row's flattened elements; where the rows are fewer than fill_groups, the row is
    # split into chunks of at least chunk_rows elements (partials merged by later launches)
    "multiaxis": LaunchPolicy("multiaxis", threads_per_group=512, vector_width=4,
                              fill_groups=512, chunk_rows=8192, uses_simd=True),
}
# Per backend, what differs from the table for a family. The table is the Metal design (mps,
# the simulator and mlx run it as it is); a backend's entry sits under the autotune cache and
# explicit launch options (tuning/launch.py). cuda: the simdgroup_matrix prefill kernel has no
# float 8x8 product in hardware there (the shim moves each product's operands by shuffles), so
# it never runs by default: H100, 2026-11-25, prefill S = L = 1024 / 4096, E = 64 / 128, ms,
# matrix kernel vs the scalar kernels 0.97 / 1.80 / 10.5 / 20.3 vs 0.47 / 0.87 / 6.2 / 12.1
# (bench/README.md)
# cuda, rows: the staged kernel (stage_rows) wherever the compiled kernels' registers and
# threadgroup memory let twice as many of its groups share a core as the register kernel's.
# H100, 2026-11-27, f16, us, group -> staged: layer_norm 2048x16384 74.3 -> 52.1 (64 -> 32
# registers: one group of 1024 a core -> two), 4096x8192 59.9 -> 48.7, rms_norm 2048x16384
# 60.2 -> 51.5; where it would not double them it is not faster: softmax 2048x16384 (two a
# core either way) 54.8 -> 58.7, add_rms_norm 4096x8192 (two groups of 512 -> three) 97.9 ->
# 103.4 (bench/README.md). The Metal table keeps it off: Metal says nothing of occupancy, and
# no Mac has timed it.
# cuda, rows: few long rows split over threadgroups (rows/split.py) where the looped kernel would
# run fewer than fill_groups of them (first 256: two groups of 1024 threads on each of an H100's
# or H200's 132 cores; now 128): 64 rows of 65536 ran in 64 threadgroups, f16 softmax 0.85x and
# log_softmax 0.63x torch eager (H200, 2026-11-28, bench/README.md); split (H200, 2026-11-29), us,
# f16 / f32: softmax 18.2 -> 16.0 / 19.0 -> 15.9, log_softmax 16.2 -> 15.1 / 17.3 -> 15.8,
# layer_norm 21.5 -> 21.2 / 21.9 -> 18.9 (fill_groups=0: as before). Then (H200, 2026-11-29, ninth
# session) fewer slices: fill_groups 128 (two slices of 64 rows, four of 32) against 256, us, f32
# layer_norm / softmax: 64x65536 17.2 / 16.1 -> 15.2 / 15.3, 32x65536 16.8 / 13.4 -> 12.1 / 10.7,
# 16x262144 25.7 / 21.0 -> 17.5 / 16.1, 128x32768 (no longer split) 16.3 / 15.7 -> 14.4 / 11.8,
# 8x65536 the same; 96 and 64 slower except at 8 rows, 192, 512 and 1024 slower everywhere
# (bench/README.md). The Metal table keeps it off (untimed on Apple GPUs).
# cuda, quant: K split 4 ways where qmv's grid has fewer than 256 simdgroups per stretch of
# K (measured with the table's, above); the tiled kernel sums in register tiles, not
# simdgroup_matrix products, whose operands the shim moves by shuffles: H100, 2026-11-28, f16,
# M = 64 / 512, 4096x4096, us: 332 / 2401 -> 118 / 919 (bench/README.md); a computed x
# (SwiGLU fused into the down projection) once per simdgroup, not staged: H200, 2026-11-29,
# 4096 x 14336 4-bit f16, 63.5 us staged (qmv_prologue) vs 37.0 before it (bench/decode.py)
# cuda, quant, the paired kernel (RoPE in a q/k projection's epilogue): 2 rows a simdgroup (a
# row and its partner), twice the simdgroups of 4: H200, 2026-11-29, the decode step's q_rope
# (4096 rows) / kv_rope (2 x 1024 rows, K split 4) at K = 4096, f16, us: 4 rows 11.0 / 8.4,
# 2 rows 10.1 / 6.8, 8 rows 12.1 / 12.6 (bench/README.md)
# The tiled kernel on the matrix block (half / bfloat x: schedule/quant/blocked.py, teams.py):
# tiles of 64 rows of x x 64 weight rows (each row of x read N / 64 times, each weight M / 64
# times, from L2), one team in the Metal table; the cuda backend splits K over 4 teams (M = 64:
# one tile of rows of x, 64 tiles at N = 4096 for 132 SMs: 16 simdgroups each instead of 4).
# cuda: 64 x 32 tiles, 4 teams. H200, 2026-11-29, f16 4-bit 4096x4096, us (bench/quant.py
# --matmul), M = 64 / 128 / 256: 64x32 1 team 126 / 156 / 247, 4 teams 83 / 134 / 262; 64x64
# 1 team 229 / 226 / 264, 4 teams 133 / 135 / 238; 128x128 1 team 1214 / 1267 / 1265; the
# fp32 kernel (qmm_fp32) 110 / 219 / 428; F.linear on the f16 weight 8.4 / 14.4 / 14.8
# cuda: from 128 rows of x the second tiled kernel (qmm_wide: 128 x 128 tiles, one team; a
# kernel of its own in the same library, picked per call by M, no recompile). H200,
# 2026-11-29, f16 4-bit, us (bench/quant.py --matmul; F.linear on the f16 weight in
# brackets): 14336x4096 M = 128 128x128 276.3 (34.6) against 64x32 / 4 teams 453.1, M = 256
# 367.3 (48.0), M = 512 734.6 (90.2); 4096x4096 M = 512 273.5 (24.9) against 474.7; at M = 64
# 64x32 / 4 teams stays best (82.6; 8.5). The Metal table never builds it (qmm_wide_rows 0:
# untimed on Apple GPUs). Only where its grid has 96 threadgroups or more (qmm_wide_groups):
# 4096x4096 (32 column tiles) M = 128 (32 groups) 272.2 against 133.4, M = 256 (64) 272.8
# against 261.3, M = 512 (128) 275.5 against 512.4; 14336x4096 M = 128 (112) 280.4 against
# 455.0 (same session, one run)
# cuda, elementwise: 4 elements a thread below 2^21 elements, 8 from there (measured at
# elementwise.SMALL_WIDTH).
# scatter (schedule/scatter/): one element a thread in every kernel (untimed on Apple GPUs)
POLICIES["scatter"] = LaunchPolicy("scatter", threads_per_group=256, vector_width=1)
# contractions (schedule/matmul/): a threadgroup per tile x tile outputs, 4 simdgroups of
# (tile / 2)^2 outputs each, 32 values of K a step (schedule/matrix/; untimed on Apple GPUs)
# cuda, matmul: 128 x 128 tiles (4 simdgroups of 64 x 64; the cuda library compiles the
# kernel without its 64-register cap, under which it spilled). H200, 2026-11-29, f16 4096^3,
# TFLOP/s (bench/matmul.py --configs), after whole 16-byte staging stores: tile 64 99.4, tile
# 128 125.9, tile 128 on 8 simdgroups 67.4, k_step 64 91.9, padded rows 70.0; linear + bias +
# GELU 44.6 at tile 64, 38.3 at 128 (its unrolled epilogue); before the stores: tile 64 61.4
POLICIES["matmul"] = LaunchPolicy("matmul", threads_per_group=128, vector_width=1,
                                  uses_simd=True, target="apple9", tile=64)

BACKEND_POLICIES: dict[str, dict[str, dict[str, Any]]] = {
    "cuda": {"row": {"stage_rows": None, "fill_groups": 128},
             "quant": {"split_grid": 256, "qmm_matrix": False, "stage_prologue": False,
                       "paired_rows": 2, "qmm_splits": 4, "qmm_tile_n": 32,
                       "qmm_wide_rows": 128,
                       "qmm_wide_groups": 96},
             "elementwise": {"small_grid": 1 << 21}, "matmul": {"tile": 128},
             "attention_grad": {"grad_simdgroups": 4, "grad_step_blocks": 2}},
}
TUNABLE: dict[str, tuple[str, ...]] = {
    "elementwise": ("threads_per_group", "vector_width", "vectors_per_thread", "small_grid",
                    "index64", "index_check"),
    "row": ("threads_per_group", "vector_width", "rows_per_group", "reads_per_thread",
            "simd_reads_per_thread", "looped_reads_per_thread", "looped_limit", "stage_rows",
            "index64", "index_check", "keep_narrow", "fill_groups", "centered"),
    "column": ("threads_per_group", "vector_width", "rows_per_group", "reads_per_thread",
               "looped_limit", "fill_groups", "chunk_rows", "index64", "index_check",
               "one_launch"),
    "quant": ("threads_per_group", "vector_width", "rows_per_group", "k_splits", "split_grid",
              "qmm_min_rows", "qmm_matrix", "stage_prologue", "x_rows", "paired_rows",
              "index64", "index_check", "target", "qmm_tile_m", "qmm_tile_n", "qmm_fp32",
              "qmm_splits", "qmm_tile_k", "qmm_prefetch", "qmm_wide_rows", "qmm_wide_tile_m",
              "qmm_wide_tile_n", "qmm_wide_splits", "qmm_wide_groups"),
    "scan": ("threads_per_group", "reads_per_thread", "fill_groups", "index64"),
    "multiaxis": ("threads_per_group", "vector_width", "fill_groups", "chunk_rows", "index64",
                  "index_check"),
    "attention": ("threads_per_group", "reads_per_thread", "rows_per_group", "key_splits",
                  "keys_per_step", "lane_scores", "stage_kv", "matrix_rows", "target",
                  "index64", "index_check"),
    "scatter": ("threads_per_group", "index64"),
    "matmul": ("target", "tile", "tile_simdgroups", "k_step", "stage_pad", "prefetch",
               "tile_groups", "index64", "tf32"),
}
# the attention backward (schedule/attention_grad): a simdgroup per row, 4 rows a group.
# cuda: the 4-simdgroup block kernels (grad_simdgroups 4). H200, 2026-11-29, f16 causal, 16
# heads, E = 128, ms (bench/attention_backward.py): S = 1024 2 simdgroups 0.90, 4 0.84 (SDPA
# 0.22); S = 4096 4.49 / 3.72 (SDPA 0.51); before the cuda library dropped the register caps
# that made these kernels spill, 1.98 / 13.01. 32 rows / keys a step (grad_step_blocks 2), H200
# 2026-11-29 (seventh session): S = 1024 0.37 -> 0.35, 4096 3.56 -> 3.24 (SDPA 0.15 / 0.44)
POLICIES["attention_grad"] = LaunchPolicy("attention_grad", threads_per_group=128,
                                          uses_simd=True)
TUNABLE["attention_grad"] = ("index64", "target", "grad_fp32", "grad_simdgroups",
                             "grad_step_blocks")
# options a family's kernels do not read but the kernels of its backward do, given on the
# forward's launch (`attention.with_launch(grad_fp32=True)`): `resolve` accepts and ignores
# them; runtime/autograd.py hands them to the backward kernels whose family takes them
FOR_BACKWARD: dict[str, tuple[str, ...]] = {"attention": tuple(
    o for o in TUNABLE["attention_grad"] if o not in TUNABLE["attention"])}


def backend_launch(backend: str, family: str) -> Optional[dict[str, Any]]:
    """The options a backend sets over the family's table (BACKEND_POLICIES), or None."""
    return BACKEND_POLICIES.get(backend, {}).get(family)


def resolve(family: str, launch: Optional[Mapping[str, Any]] = None) -> LaunchPolicy:
    """The family's policy with `launch` overrides applied, checked."""
    base = POLICIES[family]
    if launch:
        allowed = TUNABLE[family]
        bad = sorted(k for k in launch if k not in allowed and
                     k not in FOR_BACKWARD.get(family, ()))
        if bad:
            raise LaunchError(f"launch option(s) {', '.join(map(repr, bad))} do not apply to a "
                              f"{family} kernel; it takes: {', '.join(allowed)}")
        base = replace(base, **{k: v for k, v in launch.items() if k in allowed})
    validate(base)
    return base


_READS = ("reads_per_thread", "simd_reads_per_thread", "looped_reads_per_thread")
# options that are True or False, and what None means where it is allowed too (None: not)
_SWITCHES: tuple[tuple[str, Optional[str]], ...] = (
    ("index64", ""), ("lane_scores", None), ("qmm_matrix", None), ("one_launch", None),
    ("qmm_fp32", None), ("qmm_prefetch", None), ("keep_narrow", None), ("tf32", None),
    ("centered", " (split rows centered, looped rows not)"),
    ("stage_kv", " (the schedule's choice)"), ("stage_rows", " (the backend's choice)"))


def _need(p: LaunchPolicy, ok: bool, msg: str) -> None:
    if not ok:
        raise LaunchError(f"{p.family} launch policy: {msg}")


def _need_in(p: LaunchPolicy, name: str, choices: tuple[Any, ...]) -> None:
    """Option `name` is one of `choices` (numbers are listed "32, 64 or 128", names "one of
    'a', 'b'")."""
    v = getattr(p, name)
    listed = (", ".join(map(str, choices[:-1])) + f" or {choices[-1]}"
              if all(isinstance(c, int) for c in choices) else
              "one of " + ", ".join(map(repr, choices)))
    _need(p, v in choices, f"{name} must be {listed}, got {v!r}")


def _need_reads(p: LaunchPolicy, name: str) -> None:
    """Option `name` (values a thread reads at once) fits in registers and in whole vectors."""
    r = getattr(p, name)
    _need(p, r <= MAX_READS_PER_THREAD,
          f"{name}={r}: over {MAX_READS_PER_THREAD} values per thread in registers "
          f"spill on Apple GPUs")
    _need(p, r % p.vector_width == 0 if r >= p.vector_width else r & (r - 1) == 0,
          f"{name}={r} must be a multiple of vector_width={p.vector_width} (or a power "
          f"of two below it)")


def validate(p: LaunchPolicy) -> None:
    """Check a policy's values, in general and for its family (a LaunchError naming the
    option, its value and what would be right)."""
    _validate_common(p)
    check = _FAMILY_CHECKS.get(p.family)
    if check is not None:
        check(p)


def _validate_common(p: LaunchPolicy) -> None:
    for name in ("threads_per_group", "vector_width", "vectors_per_thread", "rows_per_group",
                 *_READS, "looped_limit", "keys_per_step", "k_splits", "qmm_min_rows",
                 "x_rows", "chunk_rows"):
        v = getattr(p, name)
        _need(p, isinstance(v, int) and not isinstance(v, bool) and v >= 1,
              f"{name} must be a positive int, got {v!r}")
    for name, zero in (("matrix_rows", "never the matrix prefill"),
                       ("key_splits", "chosen per call"),
                       ("split_grid", "every call splits K k_splits ways"),
                       ("small_grid", "never the small kernel"),
                       ("fill_groups", "never split the reduced axis into chunks"),
                       ("qmm_wide_rows", "never the wide tiled kernel"),
                       ("qmm_wide_groups", "at every grid")):
        v = getattr(p, name)
        _need(p, isinstance(v, int) and not isinstance(v, bool) and v >= 0,
              f"{name} must be an int >= 0 (0: {zero}), got {v!r}")
    _need(p, p.k_splits & (p.k_splits - 1) == 0
          and p.k_splits * SIMD_WIDTH <= MAX_THREADS_PER_GROUP,
          f"k_splits must be a power of two up to {MAX_THREADS_PER_GROUP // SIMD_WIDTH} (one "
          f"simdgroup per slice of K in a threadgroup), got {p.k_splits}")
    for name, none in _SWITCHES:
        v = getattr(p, name)
        allowed = "True or False" if none is None else f"None{none}, True or False"
        _need(p, isinstance(v, bool) or (none is not None and v is None),
              f"{name} must be {allowed}, got {v!r}")
    _need(p, p.threads_per_group <= MAX_THREADS_PER_GROUP,
          f"threads_per_group={p.threads_per_group} exceeds Metal's limit of "
          f"{MAX_THREADS_PER_GROUP}")
    _need(p, not p.uses_simd or p.threads_per_group % SIMD_WIDTH == 0,
          f"threads_per_group={p.threads_per_group} must be a multiple of {SIMD_WIDTH}: the "
          f"kernel uses simdgroup collectives")
    _need_in(p, "index_check", INDEX_CHECKS)
    _need_in(p, "vector_width", (1, 2, 4, 8))
    _need(p, p.threadgroup_bytes <= MAX_THREADGROUP_BYTES,
          f"the kernel needs {p.threadgroup_bytes} bytes of threadgroup memory, over the "
          f"{MAX_THREADGROUP_BYTES}-byte limit")
    _need_in(p, "grad_simdgroups", (2, 4))
    _need_in(p, "grad_step_blocks", (1, 2))


def _validate_matmul(p: LaunchPolicy) -> None:
    _need_in(p, "target", tuple(TARGETS))
    _need_in(p, "tile", (32, 64, 128))
    _need_in(p, "tile_simdgroups", (4, 8))
    _need(p, p.tile_simdgroups == 4 or p.tile >= 64,
          f"tile_simdgroups=8 needs tile 64 or 128 (blocks of at least 16 columns), got "
          f"tile={p.tile}")
    _need_in(p, "k_step", (32, 64))
    _need_in(p, "stage_pad", (0, 8))
    _need(p, not p.prefetch or p.stage_pad > 0,
          "prefetch=True reads padded tiles a step ahead: give stage_pad=8 with it")
    _need(p, p.tile_groups >= 0, f"tile_groups must be 0 or more, got {p.tile_groups!r}")


def _validate_row(p: LaunchPolicy) -> None:
    for name in _READS:
        _need_reads(p, name)
    _need(p, p.rows_per_group * SIMD_WIDTH <= MAX_THREADS_PER_GROUP,
          f"rows_per_group={p.rows_per_group}: that many simdgroups per group make "
          f"{p.rows_per_group * SIMD_WIDTH} threads per group, over {MAX_THREADS_PER_GROUP}")
    _need(p, p.looped_limit <= p.threads_per_group * p.reads_per_thread,
          f"looped_limit={p.looped_limit}: a row held in registers needs "
          f"looped_limit <= threads_per_group * reads_per_thread = "
          f"{p.threads_per_group * p.reads_per_thread}")


def _validate_attention(p: LaunchPolicy) -> None:
    _need_in(p, "target", tuple(TARGETS))
    _need(p, not p.stage_kv or p.threads_per_group == SIMD_WIDTH * p.rows_per_group,
          f"stage_kv: one simdgroup per query row of the tile, so threads_per_group="
          f"{p.threads_per_group} must be 32 x rows_per_group={p.rows_per_group} = "
          f"{SIMD_WIDTH * p.rows_per_group}")
    nsg = p.threads_per_group // SIMD_WIDTH        # each simdgroup's (m, d, acc[E]) shared
    tg = 4 * nsg * (2 + SIMD_WIDTH * p.reads_per_thread)
    _need(p, tg <= MAX_THREADGROUP_BYTES,
          f"threads_per_group={p.threads_per_group} with reads_per_thread="
          f"{p.reads_per_thread}: the merge of the simdgroups' states needs {tg} bytes of "
          f"threadgroup memory, over the {MAX_THREADGROUP_BYTES}-byte limit")
    _need(p, p.reads_per_thread & (p.reads_per_thread - 1) == 0
          and p.reads_per_thread <= MAX_READS_PER_THREAD,
          f"reads_per_thread={p.reads_per_thread}: a lane holds that many consecutive E "
          f"elements per key and per row in registers: a power of two up to "
          f"{MAX_READS_PER_THREAD}")
    for name in ("rows_per_group", "keys_per_step"):
        n = getattr(p, name)
        _need(p, n * p.reads_per_thread <= 8 * MAX_READS_PER_THREAD,
              f"{name}={n} with reads_per_thread={p.reads_per_thread}: each lane keeps "
              f"{name} x reads_per_thread = {n * p.reads_per_thread} values in registers "
              f"(q and the accumulators per row, k and v per key), at most "
              f"{8 * MAX_READS_PER_THREAD}")


def _validate_quant(p: LaunchPolicy) -> None:
    _need_in(p, "target", tuple(TARGETS))
    for name in ("qmm_tile_m", "qmm_tile_n", "qmm_tile_k", "qmm_wide_tile_m",
                 "qmm_wide_tile_n"):
        _need_in(p, name, (32, 64, 128))
    for name in ("qmm_splits", "qmm_wide_splits"):
        _need_in(p, name, (1, 2, 4))
    _need(p, p.vector_width <= 4, f"vector_width={p.vector_width}: a lane loads vector_width "
          "packed words at once, at most 4 (16 bytes)")
    _need(p, p.rows_per_group <= MAX_QUANT_ROWS,
          f"rows_per_group={p.rows_per_group}: a simdgroup keeps each row's words, scale, "
          f"bias and sum in registers, at most {MAX_QUANT_ROWS} rows")
    _need(p, p.x_rows <= MAX_QUANT_ROWS,
          f"x_rows={p.x_rows}: a lane keeps each row of x's values in registers, at most "
          f"{MAX_QUANT_ROWS} rows")
    _need(p, p.paired_rows % 2 == 0 and p.paired_rows <= MAX_QUANT_ROWS,
          f"paired_rows={p.paired_rows}: rows of the paired kernel's simdgroup, half of them "
          f"the others' partners: an even number up to {MAX_QUANT_ROWS} (0: rows_per_group)")
    _need(p, p.threads_per_group % (SIMD_WIDTH * p.k_splits) == 0,
          f"threads_per_group={p.threads_per_group} must be a multiple of 32 x k_splits="
          f"{p.k_splits} = {SIMD_WIDTH * p.k_splits}: the k_splits simdgroups of a block of "
          f"rows share one threadgroup")


def _validate_column(p: LaunchPolicy) -> None:
    _need(p, p.threads_per_group % SIMD_WIDTH == 0 and
          p.threads_per_group == SIMD_WIDTH * p.rows_per_group,
          f"threads_per_group={p.threads_per_group} must equal 32 columns x rows_per_group="
          f"{p.rows_per_group}")
    _need(p, p.vector_width <= 4,
          f"vector_width={p.vector_width}: adjacent columns a thread of the wide kernel takes "
          f"(one vector load of each row), at most 4")
    _need(p, p.reads_per_thread <= MAX_READS_PER_THREAD,
          f"reads_per_thread={p.reads_per_thread}: rows a thread loads at once, at most "
          f"{MAX_READS_PER_THREAD}")


def _validate_scan(p: LaunchPolicy) -> None:
    _need_reads(p, "reads_per_thread")


_FAMILY_CHECKS = {"row": _validate_row, "attention": _validate_attention,
                  "quant": _validate_quant, "column": _validate_column,
                  "matmul": _validate_matmul}
_FAMILY_CHECKS["scan"] = _validate_scan


def validate_for_kernel(p: LaunchPolicy, kernel_name: str, max_threads: int,
                        static_tg_bytes: int = 0) -> None:
    """Checks against the compiled pipeline (its max_threads_per_threadgroup), before launch."""
    if p.threads_per_group > max_threads:
        raise LaunchError(f"kernel {kernel_name}: threads_per_group={p.threads_per_group} exceeds "
                          f"this pipeline's max_threads_per_threadgroup={max_threads}")
    if static_tg_bytes > MAX_THREADGROUP_BYTES:
        raise LaunchError(f"kernel {kernel_name}: {static_tg_bytes} bytes of threadgroup memory, "
                          f"over the {MAX_THREADGROUP_BYTES}-byte limit")
