"""The row-reduction schedule: reductions over the innermost, contiguous axis ("D").

One library holds four kernels (five with `staged`); the host picks one per call from the
row length D (`RowSchedule.variant`), so sizes never recompile:

- ``simd``   (D <= 32 * simd_reads_per_thread): W lanes per row, the fewest (a power of two
  up to 32) holding it at R elements each (`lanes_per_row`; the kernel computes the same W from
  D), so 32 / W short rows share a simdgroup; `rows_per_group` simdgroups per threadgroup; the
  row's lane l holds elements [l*R, l*R + R) in registers; the row's lanes combine by an xor
  butterfly (shuffles only, no threadgroup memory).
- ``simd_exact`` (the simd rows its lanes cover exactly, D = W * R: 64, 128, 256 at R = 8):
  the simd kernel without a check of the row's end (every load a whole vector), and, where a
  lane holds several vector chunks and the row has no gathers (their register and shuffle paths
  need contiguous blocks), chunk c of the row's lane l at (c * W + l) * V (V the vector width):
  each vector access of the row's lanes one contiguous span (`slot_pos`). On the H100 at
  8192x128 (bench/README.md) f32 log_softmax went from 0.93-0.96x torch eager to parity
  (0.97-1.02x over four runs; as text edits, neither change alone gained), f16 from 1.03x
  to 1.14-1.18x, rms_norm and layer_norm 10-25% faster.
- ``group``  (D <= `group_limit`: looped_limit, counted in 4-byte elements like R, so 2-byte
  rows up to twice as long): one threadgroup per row of ceil(D/R) threads rounded up to 32;
  thread t holds elements [t*R, t*R + R) in registers, read once from global memory with
  vector loads when D is a multiple of the width; partials go simd → threadgroup
  scratch (one 32-slot array per reduction) → a second simd reduction in every simdgroup.
- ``staged`` (group-variant rows of whole blocks, D a multiple of 32 * R, where
  `stage_rows` asks for it; `RowSchedule.stages`): the group kernel, except that the second
  half of each thread's block of the inputs phase 1 loads (whole vector chunks, at most half
  of the threadgroup memory) is also stored to threadgroup memory, and the later phases read
  it from there instead of keeping it in registers: chunk c >= S / W of the thread's block at
  chunk `(c - S / W) * tpg + t` (W-wide, the group's threads side by side), written and read
  back by the same thread, so no barrier. Every load a whole vector, no element checks (a
  per-element tail path cost the H100 its register saving). Fewer registers a thread, so more
  groups may share a core: with stage_rows=None the launcher takes it where the backend says
  at least twice as many do (`RowSchedule.alternatives`).
- ``looped`` (longer rows, or rows needing more threads than the group kernel's pipeline
  allows: `RowSchedule.within`): one threadgroup of `threads_per_group` threads per row; every phase
  streams the row in chunks of threads_per_group * R elements (vector loads), so the row is read
  once per phase; a max followed by sum(exp(a - max)) is fused into one online pass, and,
  with the launch option `centered=True` (split rows: unless it is False), a sum followed by
  the sum of squares around a value of it (LayerNorm's mean and variance) into one centered
  pass (`schedule.centered`: sums shifted
  by the thread's first element, moments about one shift summed across threads), a thread's
  chunk folded at once where it lies wholly in the row (`mf_online_add_chunk`,
  `mf_centered_add_chunk`).

- ``split`` / ``split_2`` / ``split_3`` and ``finish`` (few long rows, where fill_groups asks:
  `RowSchedule.slices`, module `split`): the looped kernel's rows cut into slices of whole
  chunks, one threadgroup each, a launch per phase writing each slice's partial results to
  scratch (after merging the earlier phases'), then one merging them all, in slice order, in
  every threadgroup of the row and storing its slice's outputs.

R is the variant's reads per thread (`reads_for`: the group variant's `reads_per_thread` counts
4-byte elements, narrower types hold as many bytes, so f16 rows get twice as many elements per
thread, up to MAX_READS_PER_THREAD); a vector access moves up to
`vector_width` elements, at most 16 bytes and at most R (`vector_width_for`): 8 f16 elements
as one `mf_pack8`, 4 f32 elements as one `vec<float, 4>`.

Each phase (see `reduce`) loads the inputs it needs, computes its element values, folds them
into fp32 accumulators, and combines them across the row; the epilogue computes the outputs
(elements of the row, vector stores; or one value per row, stored by the row's first thread).
Register variants re-read nothing: the epilogue recomputes element values from the loaded
registers, except those kept in registers from the phase that computes them (`kept_values`):
a reduction's computed argument that a later phase or output uses again (softmax's
exp(x - max)), and a value held in place of the inputs it is computed from where that holds
fewer register blocks (add_rms_norm's h = x + r, `carried`; the staged kernel then stages
only inputs read again, so none for add_rms_norm). Outputs that need no reduction
(add_rms_norm's h) are stored by the first phase. A thread whose R elements all lie in the
row runs its element loops without a per-element bounds check; one wholly past the row's end
skips the row-end paths (`holding`). Rows that are not a multiple of the vector width move
element by element, and there (in the simd, group and looped kernels, unless the row is
gathered from) slot k of thread t sits at t + k * threads instead of t * R + k, so that each
access of a simdgroup is one contiguous span (`placement`, `slot_pos`).

Modules: `plan` (variants, sizes, thresholds; `RowSchedule`, the host side), `context` (the
frozen per-call `RowContext`: what is kept in registers, stored early, staged; a fresh
`RowKernel` per variant, a `Section` per pass), `loads` (register blocks, wide loads and stores
with guarded tails, threadgroup staging), `gathers` (mf.take in rows: own slots, shuffles,
loads), `combine` (across the row's lanes or simdgroups), `phases` (a pass over the row, the
epilogue), `place` (where a kernel's thread is), `split` (the split rows' kernels) and
`kernels` (one function per variant, `build`).
"""
from __future__ import annotations

from .kernels import KERNELS, build
from .plan import (
                   HELD,
                   LANES,
                   READS,
                   UINT_LIMIT,
                   VARIANTS,
                   WHOLE,
                   RowSchedule,
                   group_limit,
                   group_threads,
                   is_row,
                   reads_for,
                   vector_width_for,
)

__all__ = ["HELD", "KERNELS", "LANES", "READS", "UINT_LIMIT", "VARIANTS", "WHOLE", "RowSchedule",
           "build", "group_limit", "group_threads", "is_row", "reads_for", "vector_width_for"]
