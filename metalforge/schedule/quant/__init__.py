"""The quantized family: a sum over K of values computed from packed words.

Recognised when a reduction's argument unpacks words (`mf.unpack`), as in

    y[m, n] = sum_k (unpack(wq)[n, k] * scales[n, k // GS] + biases[n, k // GS]) * x[m, k]

The matvec kernels `qmv` (one row of x) and `qmv_split` (the same with K split, for grids of
few rows: `QuantSchedule.variant`; `qmvx` and `qmvx_split` take a few rows of x). The output's
innermost axis (N, the weight rows) is split into blocks of R = `rows_per_group` rows; S
simdgroups (of one threadgroup; 1 in qmv, `k_splits` in the _split kernels) own one block at
one position of the other output axes (M), simdgroup s of them taking slice s of K. The 32
lanes of slice s walk K in chunks of C = vector_width words × values per word (16 bytes of
words: 32 4-bit values), lane l taking chunks 32 s + l, then every 32 S-th (S = 1: l, l + 32,
...):

- every load of a chunk is issued before any of its values is used: each row's chunk of
  packed words (one vector load per row) and, in the affine form below, the row's per-group
  scale and bias (GS a multiple of C: one each per chunk), into per-row register arrays, then
  the values the block's rows share (tensors without N, such as x) with 16-byte vector loads,
  so a lane has R + 1 streams of loads in flight;
- then each row unpacks every value from a register with a literal shift
  (`lower.unpack_value`) and adds the element value (the user's expression) to its fp32
  accumulator; in the affine form below each value is instead masked where it sits in its half
  word (`(word >> half) & (mask << at)`: one shift per half word, not per value), which is the
  value times 2^at. qmv keeps one sum per place at (4 for 4-bit values) for every row and
  scales each by 2^-at once per chunk (`mf_place_weight`); qmvx, whose every value serves
  several rows of x, multiplies by an x pre-scaled by 2^-at instead, as MLX's qdot does;
- a chunk that runs past K is done element by element, every load guarded; where K's derived
  dims make it a multiple of the chunk (K/GS, GS 64 > 32 values) no chunk does, and the
  kernels that do not split K have no such path (`only_whole`).

Rows past N in the last block (N not a multiple of R) repeat row N - 1 (in bounds, no branch
in the chunk loop) and are never stored. Then each row's accumulator is reduced across the
simdgroup (`simd_sum`); with S > 1 the S partials of a row meet in threadgroup memory
(`reduce.through_threadgroup`, the row schedule's simd → threadgroup → simd combine) and the
block's first simdgroup stores. Lane 0 computes and stores the outputs (the epilogue may use
the sum like any row value). Weight bytes are read once per position of the other output axes:
at M = 1 the kernel streams the packed weights once, which is what decode needs. Larger M
re-reads them (from cache) once per row of x.

Several sums over K in one kernel, each of its own unpacked weights and all of one x (SwiGLU's
gate and up projections), keep one set of accumulators (and affine registers) per sum; x's
chunk and its sum are read and taken once for all; the tiled kernel is built for one sum only.

Sums over K of the shared values alone (`xsums`: an RMSNorm's mean of x * x beside the
projection of x) are taken from the chunk's registers by each simdgroup (qmv only). Gathers of
the kernel's own results in the epilogue (RoPE's partner row, `gathers`) run in `qmv_paired`
(rows i and i + Q in one simdgroup, where the index is i, i + Q or i - Q: `pairing`) or
`qmv_staged` (a threadgroup per position of the other output axes, every row's sums in
threadgroup memory: `staged`). An x that applies a transcendental function (SwiGLU fused into
the down projection) is computed once per threadgroup into threadgroup memory (`qmv_prologue`:
`prologue`).

Launch levers (policy "quant", all tunable): rows_per_group (x and its sum shared by more rows,
fewer simdgroups), k_splits (qmv_split's simdgroups per block: more loads in flight when rows
are few, one barrier and S partials per row more), split_grid (where the _split kernels run
instead), vector_width (words per load), threads_per_group (a multiple of 32 S; only groups
simdgroups). The kernels for several rows of x (`qmvx`, `qmm`) are described where they are
built (`affine`, `tiled`, `blocked`); on the matrix block the library may hold a second tiled
kernel, `qmm_wide` (its own tile and teams: the qmm_wide_* options), which the host launches
from qmm_wide_rows rows of x (`build.tiled_names`, `QuantSchedule.variant`).

Modules: `form` (what the family recognises: `match`, the affine form, the tiled kernel's
factors), `params` (tile sizes and constants), `context` (the frozen per-call context and the
per-kernel state), `positions` and `blocks` (positions, offsets, registers, loads, loops and
the epilogue the kernels share), `affine` (scales and biases: the affine form's arithmetic),
`matvec` (qmv, qmvx and their _split kernels, qmv_paired, qmv_prologue), `tiled` (qmm),
`xsums` (sums of x alone), `gathers`, `pairing` and `staged` (the epilogue's gathers),
`prologue` (a staged x), `build` (the kernels of a graph) and `schedule` (`QuantSchedule`: the
host side).
"""
from __future__ import annotations

from .build import build, kernel_names
from .context import QuantContext, QuantState, context
from .form import Affine, affine, factors, is_quant, match
from .schedule import QuantSchedule
from .transposed import transposed

__all__ = ["match", "is_quant", "build", "kernel_names", "QuantSchedule", "QuantContext",
           "QuantState", "context", "Affine", "affine", "factors", "transposed"]
