"""The attention schedule: softmax over an axis L of scores that contract an axis E, followed by
a contraction with values over L, computed in one pass over the keys with an online softmax.

Recognised when an output is (elementwise work on) `sum(P * V, axis=L)` where P is a softmax
over L (`exp(s - max(s, L)) / sum(exp(s - max(s, L)), L)`, the form `mf.softmax` builds) of
scores `s` that are elementwise work (scale, masks from `mf.index`/`mf.size`, tensor masks and
biases, soft caps) on contractions `sum(..., axis=E)`:

    s = mf.sum(q * k, axis="E") * scale
    s = mf.where(mf.index("L") <= mf.index("S"), s, -mf.inf)
    out = mf.sum(mf.softmax(s, axis="L") * v, axis="L")

Kernels: `decode` (with stage_kv also `decode_narrow` and `decode_wide`, by E), `prefill`
(`prefill`: simdgroup_matrix products, for calls where at least `matrix_rows` query
rows share their keys), and `merge` when a call splits the keys into blocks.

- A threadgroup takes a *tile* of `rows_per_group` query rows that read the same keys (the
  query-row axes no key tensor has: GQA's R, the query positions S) and a block of keys.
- With stage_kv=False (staging, below, is the default), scores with `lane_scores` (on
  unless set off): a simdgroup takes 32 keys per step, each lane one, and contracts all of
  its key's E elements with every row of the tile (q staged in threadgroup memory); the
  step's max comes from the simdgroup (`mf_simd_max`), so m is the same in every lane, and
  each lane keeps its own key's weight p and a lane-partial d.
  Without: a key's E elements are spread over lanes as for the values below, each lane's part
  of the contraction summed by an xor butterfly over the key's lanes.
- Values: a key's E elements are spread over mf_w lanes (the fewest holding
  `reads_per_thread` consecutive ones each, chosen per call from E); the simdgroup's 32 / mf_w
  key streams take different keys, `keys_per_step` at a time (with lane scores, each key's p
  shuffled from the lane that scored it), the simdgroups of the group take turns.
- Per step: the keys' k and v chunks are loaded once (vector loads; through a gather, the
  key's row is found and checked first) and shared by the tile's rows; per (key, row) the
  contraction, the score's elementwise work; per row one online-softmax update of (running
  max m, running sum d, the rescaled fp32 accumulator of the lane's E outputs):

      m' = max(m, s);  c = exp(m - m');  p = exp(s - m');  d = d c + p;  acc = acc c + p v

  (with c = 1, p = 0 while m' is still -inf, so masked keys before the first visible one add
  nothing).
- Then the streams merge by shuffles, the simdgroups through threadgroup memory (row by row),
  and the tile's rows are written as acc / d, or, with several key blocks, each block's state
  goes to a scratch buffer that `merge` combines (a threadgroup of 8 simdgroups per row, each
  over a share of the blocks, its lanes in parallel). All keys masked gives 0 / 0 = NaN, as
  softmax of all -inf does in torch; a NaN score makes the row NaN, as in softmax. The scores
  never touch memory.
- With `stage_kv` (the default): a simdgroup per query row of the tile, the keys a tile of
  mf_kt (32) at a time: the whole group copies the tile's K and V rows into threadgroup memory
  (16-byte copies, rows padded by 16 bytes, `fill_tiles`), a barrier; the simdgroups split the
  tile's keys, each scoring its mf_ks keys against every row of the tile (`tile_scores`: a
  key's row read and converted once for all rows, q as float4 broadcasts from threadgroup
  memory, several lanes per key), a barrier; simdgroup t updates row t's online softmax over
  the tile (`tile_softmax`: a lane per key; the weights and the rows' rescale factors to
  threadgroup memory), a barrier; each simdgroup adds p v of its keys to its accumulators of
  every row (`tile_values`: each lane's 4 consecutive values of a key as one vec<T, 4> read,
  for all rows), a barrier before the next tile. Then the rows' accumulators are summed
  across the simdgroups (`sum_rows`) and simdgroup t writes row t. Where E is not a multiple
  of the vector width the tiles are read element by element (guarded). Rows that would not
  fit a tile's bytes (E > 128 in f16) make tiles of fewer keys. Three kernels by E (narrow,
  decode, wide: `staged.kernel`), each with accumulators for its E only. The block's state
  goes out as above.

The package: `match` (recognition), `params` (tile sizes, thresholds), `context` (the frozen
call context, the per-kernel state), the blocks (`loops`, `head`, `staging`, `tiles`, `scores`,
`softmax`, `values`, `combine`, `write`), one module per kernel (`decode`, `staged`: the
stage_kv decode kernels, `prefill`, `merge`), `build` and the host side `schedule`.
"""
from __future__ import annotations

from .build import build
from .match import Form, is_attention, match
from .schedule import AttentionSchedule

__all__ = ["AttentionSchedule", "Form", "build", "is_attention", "match"]
