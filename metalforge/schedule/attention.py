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
(attention_matrix.py: simdgroup_matrix products, for calls where at least `matrix_rows` query
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
  decode, wide: `stage_kv_kernel`), each with accumulators for its E only. The block's state
  goes out as above.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Optional, Sequence

import torch

from .. import ir
from ..errors import LaunchError, ShapeError, UnsupportedConstruct, at
from ..graph import Graph, Node, Op, TensorParam, strip_casts, topo_order
from ..reference import evaluate_expressions
from . import online, reduce
from .attention_matrix import prefill_kernel
from .base import IDX, Schedule, Step, Traffic, make_kernel
from .elementwise import kernel_params, msl_names, used_params
from .lower import ElementLowering, compute_type, ident
from .names import template_vars
from .online import NEG_INF
from .hardware import SIMD_WIDTH
from .policy import LaunchPolicy, access_width, validate

SIMD = ir.Lit(SIMD_WIDTH, "uint")
MACC = ir.Lane(ir.Var("mf_macc"), ir.Var("mf_j"))     # a merged accumulator at the lane's slot


@dataclass(frozen=True)
class Form:
    """The pieces of an attention graph."""
    out: Node                  # sum(P * V, axis=L)
    values: Node               # V: the factor of P (over L and E)
    scores: Node               # s: what the softmax is over
    max: Node                  # max(s, L)
    denom: Node                # sum(exp(s - max), L)
    contractions: tuple[Node, ...]   # the sums over E inside the scores
    key: str                   # L: the softmax / key axis
    e: str                     # E: the contracted / output axis


def _reductions_in(n: Node) -> list[Node]:
    return [m for m in topo_order([n]) if m.op == Op.REDUCE]


def match(graph: Graph) -> Optional[Form]:
    """The attention form of `graph`, or None when it is not one."""
    outs = [r for o in graph.outputs for r in _reductions_in(o.node)
            if r.attr[0] == "sum" and strip_casts(r.args[0]).op == Op.BINARY
            and strip_casts(r.args[0]).attr == "mul"]
    for out in outs:
        l_axis = out.attr[1]
        prod = strip_casts(out.args[0])
        for p, v in (prod.args, prod.args[::-1]):
            form = _softmax(strip_casts(p), l_axis)
            if form is None or _reductions_in(v):
                continue
            scores, mx, denom = form
            contractions = tuple(r for r in _reductions_in(scores))
            axes = {r.attr[1] for r in contractions}
            if not contractions or len(axes) != 1 or l_axis in axes or any(
                    r.attr[0] != "sum" or _reductions_in(r.args[0]) for r in contractions):
                continue
            e_axis = axes.pop()
            if e_axis not in out.axes:
                continue
            return Form(out, v, scores, mx, denom, contractions, l_axis, e_axis)
    return None


def _normalised(p: Node) -> Optional[tuple[Node, Node]]:
    """(e, d) when p is e / d or e * (1 / d), in either order (mf.softmax's own form)."""
    if p.op == Op.BINARY and p.attr == "div":
        return strip_casts(p.args[0]), strip_casts(p.args[1])
    if p.op != Op.BINARY or p.attr != "mul":
        return None
    for e, r in (p.args, p.args[::-1]):
        r = strip_casts(r)
        if r.op == Op.BINARY and r.attr == "div":
            one = strip_casts(r.args[0])
            if one.op == Op.CONST and one.attr == 1:
                return strip_casts(e), strip_casts(r.args[1])
    return None


def _softmax(p: Node, axis: str) -> Optional[tuple[Node, Node, Node]]:
    """(s, max(s), sum(exp(s - max))) when p is exp(s - max(s, axis)) / sum(..., axis) (or
    times 1 / sum)."""
    pair = _normalised(p)
    if pair is None:
        return None
    e, denom = pair
    if denom.op != Op.REDUCE or denom.attr != ("sum", axis) or strip_casts(denom.args[0]) is not e:
        return None
    if e.op != Op.UNARY or e.attr != "exp":
        return None
    diff = strip_casts(e.args[0])
    if diff.op != Op.BINARY or diff.attr != "sub":
        return None
    s, mx = (strip_casts(a) for a in diff.args)
    if mx.op != Op.REDUCE or mx.attr != ("max", axis) or strip_casts(mx.args[0]) is not s:
        return None
    return s, mx, denom


def is_attention(graph: Graph) -> bool:
    return match(graph) is not None


def build(graph: Graph, policy: LaunchPolicy, index64: bool,
          form: Optional[Form] = None) -> "AttentionSchedule":
    return _Builder(graph, policy, index64, form).build()


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
# The simdgroup_matrix prefill kernel (attention_matrix.py): query rows per threadgroup, 8 a
# simdgroup
MATRIX_ROWS = 32
MATRIX_GROUP = SIMD_WIDTH * MATRIX_ROWS // 8


def lanes_per_key(e: int, per_lane: int) -> int:
    """Lanes that share one key's E elements (a power of two): per_lane elements each."""
    w = 1
    while w * per_lane < e and w < SIMD_WIDTH:
        w *= 2
    return w


@dataclass
class AttentionSchedule(Schedule):
    l_axis: str = "L"
    e_axis: str = "E"
    rows: tuple[str, ...] = ()
    max_e: int = 256
    merge: Optional[ir.LoweredKernel] = None
    narrow: Optional[ir.LoweredKernel] = None   # stage_kv: the decode kernel for E <= narrow_e
    narrow_e: int = 0
    wide: Optional[ir.LoweredKernel] = None     # ... for mid_e < E <= max_e (`kernel` up to mid_e)
    mid_e: int = 0
    prefill: Optional[ir.LoweredKernel] = None  # simdgroup_matrix kernel for many query rows
    prefill_e: int = 0                          # ... E up to this
    own_axes: tuple[str, ...] = ()     # query-row axes the keys depend on (B, G)
    tile_axes: tuple[str, ...] = ()    # query-row axes sharing keys (R, S): tiled
    qt: int = 1                        # query rows per tile
    tile_items: tuple[int, ...] = ()   # stage_kv: element sizes of the staged K/V tensors
    tile_vw: int = 1                   # ... and the elements of a chunk of their rows
    bounds: tuple[tuple[str, Node, int], ...] = ()   # the mask's bounds on the keys (key_bounds)
    kv_reads: tuple[Node, ...] = ()    # the reads along keys and E (k, v), loads or gathers

    @property
    def axis(self) -> str:
        """The key axis: the size testing draws boundaries of (1, 31, 32, 33, ...)."""
        return self.l_axis

    @property
    def thresholds(self) -> tuple[int, ...]:
        """Key counts from which one tile of query rows splits its keys into blocks."""
        return (2 * self._per_block(),)

    @property
    def kernels(self) -> tuple[ir.LoweredKernel, ...]:
        return tuple(k for k in (self.kernel, self.narrow, self.wide, self.prefill, self.merge)
                     if k is not None)

    def _rows(self, sizes: Mapping[str, int]) -> int:
        return math.prod(sizes[a] for a in self.rows)

    def _prefill(self, sizes: Mapping[str, int]) -> bool:
        """Whether a call with these sizes runs the simdgroup_matrix prefill kernel: at least
        matrix_rows query rows share their keys and E fits it."""
        rows = self.policy.matrix_rows
        return self.prefill is not None and rows > 0 and sizes[self.e_axis] <= self.prefill_e \
            and math.prod(sizes[a] for a in self.tile_axes) >= rows

    def _tile_rows(self, sizes: Mapping[str, int]) -> int:
        return MATRIX_ROWS if self._prefill(sizes) else self.qt

    def _tiles(self, sizes: Mapping[str, int]) -> int:
        """Threadgroups per key block: own rows x tiles of rows sharing keys."""
        tiled = math.prod(sizes[a] for a in self.tile_axes)
        return math.prod(sizes[a] for a in self.own_axes) * -(-tiled // self._tile_rows(sizes))

    def _per_block(self) -> int:
        if self.policy.stage_kv:                # the simdgroups share every key
            return MIN_STAGED_KEYS
        return self.policy.threads_per_group // SIMD_WIDTH * MIN_KEYS

    def _group(self, sizes: Optional[Mapping[str, int]] = None) -> int:
        """Threads per group of the decode kernel (stage_kv: a simdgroup per row of the tile;
        the prefill kernel: one per 8 rows)."""
        if sizes is not None and self._prefill(sizes):
            return MATRIX_GROUP
        return SIMD_WIDTH * self.qt if self.policy.stage_kv else self.policy.threads_per_group

    def _narrow(self, sizes: Mapping[str, int]) -> bool:
        """Whether a call with these sizes runs the narrow decode kernel (and its tiles)."""
        return self.narrow is not None and sizes[self.e_axis] <= self.narrow_e

    def keys_per_tile(self, sizes: Mapping[str, int]) -> int:
        """stage_kv: keys per staged tile, TILE_KEYS (the narrow kernel's calls:
        NARROW_TILE_KEYS) unless a tile's rows (E rounded up to whole chunks, padded by
        PAD_BYTES) would not fit its TILE_BYTES: then the largest power of two that does; 0 if
        none fits."""
        e = -(-sizes[self.e_axis] // self.tile_vw) * self.tile_vw      # whole chunks
        kt = NARROW_TILE_KEYS if self._narrow(sizes) else TILE_KEYS
        while kt and any(kt * (e + PAD_BYTES // b) > TILE_BYTES // b for b in self.tile_items):
            kt //= 2
        return kt

    def lanes(self, sizes: Mapping[str, int]) -> int:
        return lanes_per_key(sizes[self.e_axis], self.policy.reads_per_thread)

    def splits(self, sizes: Mapping[str, int]) -> int:
        """Key blocks per tile for a call with these sizes."""
        length = sizes[self.l_axis]
        if self.policy.key_splits:
            return max(1, min(self.policy.key_splits, length))
        target = TARGET_GROUPS_STAGED if self.policy.stage_kv else TARGET_GROUPS
        want = -(-target // max(1, self._tiles(sizes)))
        return max(1, min(want, length // self._per_block()))

    def traffic(self, sizes: Mapping[str, int], scalars: Mapping[str, Any] = {}) -> Traffic:
        """Each input element read once, each output written once, except that K and V count
        only the keys the mask's bounds let some threadgroup read: per own query-row head,
        the union over its tiles of the key range each tile reads (the hull of its rows'
        bounds). A bound on a runtime scalar counts only when `scalars` gives its value (else
        every key counts)."""
        whole = super().traffic(sizes)
        known = self._known_bounds(scalars)
        if not known:
            return whole
        length, qt = sizes[self.l_axis], self.qt
        axes = self.own_axes + self.tile_axes
        shape = [sizes[a] for a in axes]
        lo = torch.zeros(shape, dtype=torch.int64)
        hi = torch.full(shape, length, dtype=torch.int64)
        for kind, v in self._bound_values(known, sizes, scalars, axes):
            lo, hi = (torch.maximum(lo, v), hi) if kind == "lo" else (lo, torch.minimum(hi, v))
        owns, tiled = math.prod(shape[:len(self.own_axes)]), math.prod(shape[len(self.own_axes):])
        pad = -tiled % qt                      # rows past the last tile see nothing
        seen = lo < hi
        lo = torch.nn.functional.pad(torch.where(seen, lo, length).reshape(owns, tiled),
                                     (0, pad), value=length).reshape(owns, -1, qt).amin(-1)
        hi = torch.nn.functional.pad(torch.where(seen, hi, 0).reshape(owns, tiled),
                                     (0, pad), value=0).reshape(owns, -1, qt).amax(-1)
        keys = 0
        for tlo, thi in zip(lo.tolist(), hi.tolist()):
            end = 0                            # the union of the own's tile ranges
            for a, b in sorted(zip(tlo, thi)):
                if a < b and b > end:
                    keys += b - max(a, end)
                    end = b
        kv = 0
        for n in dict.fromkeys(self.kv_reads):
            t = self.graph.tensor(n.attr[0] if n.op == Op.TAKE else n.attr)
            kv += math.prod(sizes[a] for a in (n.axes if n.op == Op.TAKE else t.axes)) \
                * t.dtype.itemsize
        return Traffic(whole.read - kv + kv * keys // (owns * length), whole.written)

    def _known_bounds(self, scalars: Mapping[str, Any]) -> list[tuple[str, Node, int]]:
        """The mask's key bounds whose runtime scalars `scalars` gives."""
        return [b for b in self.bounds if all(n.attr in scalars for n in topo_order([b[1]])
                                              if n.op == Op.SCALAR)]

    def _bound_values(self, bounds: list[tuple[str, Node, int]], sizes: Mapping[str, int],
                      scalars: Mapping[str, Any], axes: tuple[str, ...]
                      ) -> list[tuple[str, torch.Tensor]]:
        """Each bound as ('lo' or 'hi', its first or end key per query row), broadcastable
        over `axes`."""
        values = evaluate_expressions(self.graph, [n for _, n, _ in bounds], sizes, scalars, axes)
        return [(kind, v + add) for (kind, _, add), v in zip(bounds, values)]

    def visible_keys(self, sizes: Mapping[str, int], scalars: Mapping[str, Any],
                     axes: tuple[str, ...]) -> Optional[torch.Tensor]:
        """Where a query row's mask bounds let it see a key (the keys the kernels read for
        it), as booleans broadcastable over `axes` (which hold the key axis); None when the
        mask bounds no key or a bound's scalar is not in `scalars`."""
        known = self._known_bounds(scalars)
        if not known or len(known) < len(self.bounds):
            return None
        key = torch.arange(sizes[self.l_axis]).reshape(
            [-1 if a == self.l_axis else 1 for a in axes])
        seen = torch.ones((), dtype=torch.bool)
        for kind, v in self._bound_values(known, sizes, scalars, axes):
            seen = seen & ((key >= v) if kind == "lo" else (key < v))
        return seen

    def launch(self, sizes: Mapping[str, int]) -> tuple[int, int]:
        tpg = self._group(sizes)
        return max(1, self._tiles(sizes)) * self.splits(sizes) * tpg, tpg

    def steps(self, sizes: Mapping[str, int]) -> tuple[Step, ...]:
        first = (Step(self.host_name(sizes), *self.launch(sizes)),)
        if self.splits(sizes) == 1 or self.merge is None:
            return first
        group = SIMD_WIDTH * MERGE_SIMDGROUPS
        parts = self.merge_parts(sizes)
        return first + (Step(self.merge.host_name, self._rows(sizes) * parts * group, group),)

    def merge_parts(self, sizes: Mapping[str, int]) -> int:
        """Threadgroups of the merge kernel per query row: each takes MERGE_LANES lanes' E
        elements of every block (the kernel computes the same from mf_w)."""
        w = self.lanes(sizes)
        return w // min(w, MERGE_LANES)

    def scratch_floats(self, sizes: Mapping[str, int]) -> int:
        splits = self.splits(sizes)
        return 0 if splits == 1 else self._rows(sizes) * splits * (self.max_e + 2)

    def launch_value(self, name: str, sizes: Mapping[str, int]) -> int:
        if name == "key_splits":
            return self.splits(sizes)
        if name == "lanes_per_key":
            return self.lanes(sizes)
        if name == "keys_per_tile":
            return self.keys_per_tile(sizes)
        raise KeyError(name)

    def host_name(self, sizes: Mapping[str, int]) -> str:
        where = f"kernel '{self.graph.name}'"
        if sizes[self.e_axis] > self.max_e:
            raise LaunchError(f"{where}: '{self.e_axis}' = {sizes[self.e_axis]}, over the "
                              f"{self.max_e} the attention schedule holds per row (32 lanes x "
                              f"reads_per_thread={self.max_e // SIMD_WIDTH}); raise "
                              f"launch={{'reads_per_thread': ...}} up to 16")
        if self.policy.stage_kv and not self.keys_per_tile(sizes):
            raise LaunchError(f"{where}: stage_kv: one key's row of '{self.e_axis}' = "
                              f"{sizes[self.e_axis]} elements does not fit the "
                              f"{TILE_BYTES}-byte tile; call it without stage_kv")
        if sizes[self.l_axis] == 0:
            raise ShapeError(f"{where}: softmax over an empty axis ({self.l_axis} = 0) has no "
                             "value (torch raises too)")
        n = max([self._rows(sizes) * sizes[self.e_axis], self.scratch_floats(sizes)] + [
            math.prod(sizes[a] for a in t.axes) for t in self.graph.tensors])
        if not self.index64 and n >= 2 ** 31:
            raise LaunchError(f"{where}: {n} elements need 64-bit indexing; call it with "
                              "launch={'index64': True}")
        # a safety net: the policies validate() admits keep a tile's keys >= its rows (16 rows
        # already need more threadgroup memory than Metal has)
        if self.policy.stage_kv and self.keys_per_tile(sizes) < self.qt:
            raise LaunchError(f"{where}: stage_kv: a tile of {self.keys_per_tile(sizes)} keys "
                              f"('{self.e_axis}' = {sizes[self.e_axis]}) cannot give each of the "
                              f"rows_per_group={self.qt} simdgroups a key; lower rows_per_group "
                              f"or call it without stage_kv")
        if self.prefill is not None and self._prefill(sizes):
            return self.prefill.host_name
        if self.narrow is not None and self._narrow(sizes):
            return self.narrow.host_name
        if self.wide is not None and sizes[self.e_axis] > self.mid_e:
            return self.wide.host_name
        return self.kernel.host_name

    def selecting(self, host_name: str) -> list[dict[str, int]]:
        """Sizes that make a call launch kernel `host_name` (testing's coverage). The decode
        kernels (stage_kv): E = narrow_e for the narrow kernel and E just past the E of the
        kernel below for the others (narrow_e + 1, mid_e + 1); the prefill kernel: E = 33 (four
        whole 8-element blocks and one of a single element) with MATRIX_ROWS + 1 positions along
        the innermost tile axis a tensor names. Each kernel gets two examples (`_two_ways`)."""
        if self.prefill is not None and host_name == self.prefill.host_name:
            axis = self._innermost(self.tile_axes)
            if axis is None:
                return []
            return self._two_ways({axis: MATRIX_ROWS + 1}, 33, NARROW_TILE_KEYS)
        if self.narrow is None:
            return []
        pick = {self.narrow.host_name: self.narrow_e, self.kernel.host_name: self.narrow_e + 1}
        if self.wide is not None:
            pick[self.wide.host_name] = self.mid_e + 1
        if host_name not in pick:
            return []
        tile = self._innermost(self.tile_axes)
        rows = {} if tile is None else {tile: self.qt + 1}      # a tile and a partial one
        narrow = host_name == self.narrow.host_name
        return self._two_ways(rows, pick[host_name], NARROW_TILE_KEYS if narrow else TILE_KEYS)

    def _two_ways(self, rows: dict[str, int], e: int, kt: int) -> list[dict[str, int]]:
        """Two examples, both with two heads (the innermost own axis a tensor names at 2): E of
        the other alignment than `e` (whole 8-element vectors or not: the vector copy path and
        the element path) over keys of one block and at least two tiles of `kt`; and E = `e`
        with `rows` over exactly two key blocks. So the kernel's tile loop, barriers, both copy
        paths, outputs and partial states all run, with groups that differ in head, tile and
        block: with one head a wrong head offset reads and writes the right place; with one
        tile, or tiles and blocks in step, a wrong map from group to (head, tile, block) can
        still cover every triple. (Exactly two blocks: the fewest keys that split.)"""
        own = self._innermost(self.own_axes)
        heads = {} if own is None else {own: 2}
        other = e - 1 if e % 8 == 0 else -(-e // 8) * 8
        block = self._per_block()
        return [{**heads, self.e_axis: other, self.l_axis: min(2 * kt + 1, 2 * block - 1)},
                {**rows, **heads, self.e_axis: e, self.l_axis: 2 * block}]

    def _innermost(self, axes: tuple[str, ...]) -> Optional[str]:
        """The innermost of `axes` that a tensor names (a grouped dim's R, S, a head axis)."""
        named = {d.name for t in self.graph.tensors for d in t.dims}
        return next((a for a in reversed(axes) if a in named), None)

    def max_group_size(self, host_name: str) -> int:
        if self.merge is not None and host_name == self.merge.host_name:
            return SIMD_WIDTH * MERGE_SIMDGROUPS
        if self.prefill is not None and host_name == self.prefill.host_name:
            return MATRIX_GROUP
        return self._group()


class _Builder(reduce.Builder):
    def __init__(self, graph: Graph, policy: LaunchPolicy, index64: bool,
                 form: Optional[Form] = None):
        form = match(graph) if form is None else form
        if form is None:
            raise UnsupportedConstruct(f"kernel '{graph.name}': not an attention graph")
        self.form = form
        self.graph, self.policy, self.index64 = graph, policy, index64
        self.axis = form.key
        nodes = list(graph.nodes())
        self.nodes = nodes
        widest = max(graph.outputs, key=lambda o: len(o.axes)).axes
        if form.e not in widest:
            raise UnsupportedConstruct(f"kernel '{graph.name}': the attention output must keep "
                                       f"'{form.e}'")
        self.rows = tuple(a for a in widest if a != form.e)
        for o in graph.outputs:
            if tuple(a for a in o.axes if a != form.e) != self.rows or form.e not in o.axes:
                raise UnsupportedConstruct(
                    f"kernel '{graph.name}': every output of an attention kernel is over the "
                    f"query rows {list(self.rows)} and '{form.e}'")
        for r in graph.reductions():
            if r not in (form.out, form.max, form.denom, *form.contractions):
                raise UnsupportedConstruct(
                    f"kernel '{graph.name}': mf.{r.attr[0]}(..., axis={r.attr[1]!r}){at(r.loc)}"
                    " is a reduction the attention schedule does not fuse (it takes the score "
                    "contractions, one softmax and the contraction with the values)")
        self.inputs, self.scalars = used_params(graph, nodes)
        self.tvars = template_vars(graph.dtype_vars)
        self.names, self.out_names = msl_names(graph)
        self.sizes_used: list[str] = [form.key, form.e, *self.rows]
        for t in self.inputs:                    # gathered (N) and derived (L/BS) dims too
            self.sizes_used += [a for a in t.axes if a not in self.sizes_used]
        self.helpers: set[str] = set()
        # rows that read the same keys share a threadgroup: the query-row axes no tensor
        # with keys along L has (GQA's R, the query positions S)
        roots = [o.node for o in graph.outputs]
        keyed = {a for n in topo_order(roots) if n.op in (Op.LOAD, Op.TAKE)
                 and form.key in n.axes for a in n.axes}
        self.tile_axes = tuple(a for a in self.rows if a not in keyed)
        self.own_axes = tuple(a for a in self.rows if a in keyed)
        self.qt = policy.rows_per_group if self.tile_axes else 1
        self.epl = policy.reads_per_thread             # E elements per lane
        self.kps = policy.keys_per_step                # keys a lane's key stream takes at once
        self.kv = self._key_tensors()
        sizes = {self.tensor_of(n).dtype.itemsize for n in self.kv}
        if policy.stage_kv is None:              # the schedule's choice (policy.py)
            self.policy = policy = replace(policy, stage_kv=(
                policy.threads_per_group == SIMD_WIDTH * policy.rows_per_group))
        self.vw = access_width(self.epl, sizes or {4})
        self.tiled = False
        self.pre: list[ir.Stmt] = []
        self.q_stores: list[ir.Stmt] = []              # stage_kv: q into threadgroup memory
        self.pre_names: set[str] = set()
        self.params: tuple[ir.Argument, ...] = ()
        self.staged: dict[Node, ir.Expr] = {}
        self.staged_tg: dict[Node, str] = {}           # ... their threadgroup arrays (mf_tgq<i>)
        self.streamed: set[Node] = set(self.kv)        # what load_keys loads
        self.tg_decls: list[ir.Stmt] = []
        self.tg_bytes = 0
        self.over_e = False                            # slots spread over the value lanes
        self.vlanes = SIMD_WIDTH                       # ... that many (stage_kv: 32, narrow 16)
        # threads of a decode group (stage_kv: one simdgroup per row of the tile)
        self.group = SIMD_WIDTH * self.qt if policy.stage_kv else policy.threads_per_group
        self.run = min(VALUE_RUN, self.epl)            # ... run consecutive elements each
        self.scratch_e = SIMD_WIDTH * self.epl         # E slots of a block's state in scratch
        self.kt_max = TILE_KEYS                        # stage_kv: the kernel's largest tile
        # the tile's row as a run-time value (not an unrolled loop's): positions computed
        # from it, not read from the tile's arrays (indexing those by a run-time value would put
        # them in memory for the whole kernel)
        self.row_of: Optional[ir.Expr] = None

    def _key_tensors(self) -> dict[Node, str]:
        """Reads along the keys and E (k, v; loads or gathers through a block table) that no
        tile axis changes: each key's E elements are loaded once per lane into registers
        (`mf_kv<i>`) and shared by the tile's query rows."""
        f = self.form
        roots = [r.args[0] for r in f.contractions] + [f.values]
        out: dict[Node, str] = {}
        for n in topo_order(roots):
            if n.op == Op.LOAD or (n.op == Op.TAKE and n.attr[1] != f.e):
                axes = n.axes if n.op == Op.TAKE else self.graph.tensor(n.attr).axes
                if f.key in axes and f.e in axes and not set(axes) & set(self.tile_axes):
                    out[n] = f"mf_kv{len(out)}"
        return out

    def tensor_of(self, n: Node) -> TensorParam:
        return self.graph.tensor(n.attr[0] if n.op == Op.TAKE else n.attr)

    # -- positions and loads ------------------------------------------------------------
    def flat_position(self, axis: str, axes: tuple[str, ...], var: str) -> ir.Expr:
        """`axis`'s position in the flat index `var` over `axes` (declared once, up front)."""
        return self.position_in(var, axes, axis, f"mf_pos_{ident(axis)}", self)

    def at(self, axis: str) -> ir.Expr:
        if axis == self.form.key:
            return ir.Var("mf_l")
        if axis == self.form.e:
            return ir.Cast(IDX, ir.Var("mf_e"))
        if axis in self.tile_axes and self.tiled:
            if self.row_of is not None:        # row mf_t picked at run time: computed
                return self.tile_position(axis, self.row_of)
            return ir.Lane(ir.Var(f"mf_tpos_{ident(axis)}"), ir.Var("mf_t"))
        if axis in self.own_axes and self.tiled:
            return self.flat_position(axis, self.own_axes, "mf_own")
        if axis in self.rows:
            return self.flat_position(axis, self.rows, "mf_row")
        spec = self.graph.axis_spec(axis)
        if spec.base == self.form.key and spec.mul == 1 and spec.add == 0:
            return ir.Var("mf_l") / ir.Lit(spec.div, IDX)      # L/BS: key l reads l / BS
        raise UnsupportedConstruct(f"kernel '{self.graph.name}': axis '{axis}' is neither a "
                                   f"query-row axis, '{self.form.key}' nor '{self.form.e}'")

    def offset(self, axes: Sequence[str], moved: Mapping[str, ir.Expr] = {}) -> ir.Expr:
        """The element's index in a tensor over `axes` (at the positions in `moved` along
        those axes: a gather's row)."""
        e: ir.Expr = ir.Lit(0, IDX)
        for i, a in enumerate(axes):
            p = moved[a] if a in moved else self.at(a)
            e = p if i == 0 else e * self.size(a) + p
        return e

    def load(self, n: Node) -> ir.Expr:
        t = self.graph.tensor(n.attr)
        return ir.Cast(compute_type(t.dtype), ir.Load(self.names[t.name], self.offset(t.axes)))

    def take(self, n: Node, pos: ir.Expr) -> ir.Expr:
        """A gather (the index already checked): the tensor's element at `pos` along the
        gathered axis, at this element's positions along the others."""
        t = self.tensor_of(n)
        return ir.Cast(compute_type(t.dtype), ir.Load(self.names[t.name], self.offset(
            t.axes, {n.attr[1]: pos})))

    def lowering(self, prefix: str) -> ElementLowering:
        return ElementLowering(self.graph, self.load, self.at, self.size,
                               lambda s: self.names[s], prefix=prefix, take=self.take)

    # -- loops: a lane's E slots, a tile's rows, a step's keys ---------------------------
    def slots(self, body: list[ir.Stmt]) -> ir.Stmt:
        """`body` for each of the lane's E slots mf_j < reads_per_thread (unrolled)."""
        return ir.For("mf_j", "uint", ir.Lit(0, "uint"), ir.Lit(self.epl, "uint"), body,
                      unroll=True)

    def slot_e(self) -> ir.Expr:
        """The E element of the lane's slot mf_j: mf_sub * reads_per_thread + j (a lane holds
        reads_per_thread consecutive elements of a key spread over mf_w lanes); in the
        stage_kv kernel, all 32 lanes over E (the narrow kernel: 16 per key stream), `run`
        consecutive elements each per stretch of 32 x run (E = 128: 4 each; narrow: 16 x
        run)."""
        j = ir.Var("mf_j")
        if self.over_e:
            run = ir.Lit(self.run, "uint")
            return (j / run * ir.Lit(self.vlanes * self.run, "uint") + self.vlane() * run
                    + j % run)
        return ir.Var("mf_sub") * ir.Lit(self.epl, "uint") + j

    def vlane(self) -> ir.Expr:
        """The lane's place among the value lanes of its key stream (stage_kv)."""
        lane = ir.Var("mf_lane")
        return lane if self.vlanes == SIMD_WIDTH else lane % ir.Lit(self.vlanes, "uint")

    def lanes(self, body: list[ir.Stmt]) -> ir.Stmt:
        """`body` for each of the lane's E elements mf_e = slot_e() inside E."""
        e = self.slot_e()
        return self.slots([
            ir.Decl("mf_e", "uint", e),
            ir.If(ir.Cast(IDX, ir.Var("mf_e")) < self.size(self.form.e), body)])

    def each_row(self, body: list[ir.Stmt]) -> ir.Stmt:
        """`body` for each row mf_t < rows_per_group of the tile that exists (unrolled; the
        rows that exist are the first mf_nlive, the same in every thread of the group)."""
        t = ir.Var("mf_t")
        return self.every_row([ir.If(t < ir.Var("mf_nlive"), body)])

    def every_row(self, body: list[ir.Stmt]) -> ir.Stmt:
        """`body` for every row mf_t < rows_per_group of the tile, those past its end too:
        straight-line code for work whose results the rows past the end never use and that
        reads nothing they lack (registers, the staged tiles and rows)."""
        return ir.For("mf_t", "uint", ir.Lit(0, "uint"), ir.Lit(self.qt, "uint"), body,
                      unroll=True)

    def rows_reading(self, roots: Sequence[Node],
                     known: set[Node]) -> Callable[[list[ir.Stmt]], ir.Stmt]:
        """The row loop for work computing `roots`: every_row when it reads no tensor but
        those in `known` (already in registers or threadgroup memory), so that a row past the
        tile's end may compute it; else each_row."""
        if all(n in known for n in topo_order(list(roots)) if n.op in (Op.LOAD, Op.TAKE)):
            return self.every_row
        return self.each_row

    def each_key(self, body: list[ir.Stmt]) -> ir.Stmt:
        """`body` for each key mf_u < keys_per_step of the lane's key stream (unrolled)."""
        return ir.For("mf_u", "uint", ir.Lit(0, "uint"), ir.Lit(self.kps, "uint"), body,
                      unroll=True)

    def keys(self, body: list[ir.Stmt], past: Sequence[ir.Stmt] = ()) -> ir.Stmt:
        """`body` for each key mf_l = mf_base + u * kp + grp of the step inside the block's
        keys (the simdgroup's kp key streams interleave; with lane scores, inside the 32 keys
        the simdgroup scored, mf_lend); `past` for keys past the end."""
        key = ir.Var("mf_base") + ir.Cast(IDX, ir.Var("mf_u") * ir.Var("mf_kp")
                                          + ir.Var("mf_grp"))
        end = ir.Var("mf_lend" if self.policy.lane_scores else "mf_l1")
        return self.each_key([
            ir.Decl("mf_l", IDX, key),
            ir.If(ir.Var("mf_l") < end, body, list(past))])

    # -- the decode kernel's parts --------------------------------------------------------
    def tile(self) -> list[ir.Stmt]:
        """Which rows of the tile exist (the first mf_nlive: the rows past the tile axes' end
        do not) and their positions along the tile axes."""
        first = ir.Cast(IDX, ir.Var("mf_tile") * ir.Lit(self.qt, "uint"))
        out: list[ir.Stmt] = [
            ir.Comment("the rows of the tile that exist: the first mf_nlive"),
            ir.Decl("mf_nlive", "uint", ir.Cast("uint", ir.Call("min", (
                ir.Cast(IDX, ir.Lit(self.qt, "uint")), self.span(self.tile_axes) - first))))]
        if not self.tile_axes:
            return out
        body: list[ir.Stmt] = []
        for a in self.tile_axes:
            name = f"mf_tpos_{ident(a)}"
            out.append(ir.ArrayDecl(name, IDX, self.qt))
            body.append(ir.Assign(ir.Lane(ir.Var(name), ir.Var("mf_t")),
                                  self.tile_position(a, ir.Var("mf_t"))))
        return out + [ir.For("mf_t", "uint", ir.Lit(0, "uint"), ir.Lit(self.qt, "uint"), body,
                             unroll=True)]

    def stage(self) -> list[ir.Stmt]:
        """Register staging of what the score contractions read that does not change with the
        key (each query row's q): each lane loads its E elements of every row once, before
        the key loop, into `mf_staged<i>[t][j]` (0 past E)."""
        f = self.form
        self.staged = {}
        self.staged_tg = {}
        nodes: list[Node] = []
        for r in f.contractions:
            cone = topo_order([r.args[0]])
            fixed = {n for n in cone if f.key not in n.axes and f.e in n.axes}
            nodes += [n for n in cone if n in fixed and n not in nodes and not any(
                n in u.args for u in cone if u in fixed)]
        if self.policy.lane_scores or self.policy.stage_kv:
            return self.stage_shared(nodes)
        out: list[ir.Stmt] = []
        for i, n in enumerate(nodes):
            low = self.lowering(f"mf_st{i}_")
            body = low.lower([n])
            self.helpers |= low.helpers
            name = f"mf_staged{i}"
            slot = ir.Lane(ir.Var(name), ir.Var("mf_t") * ir.Lit(self.epl, "uint")
                           + ir.Var("mf_j"))
            zero = ir.Lit(0.0, "float") if compute_type(n.dtype) == "float" else ir.Lit(
                0, compute_type(n.dtype))
            out += [ir.ArrayDecl(name, compute_type(n.dtype), self.qt * self.epl),
                    self.each_row([self.slots([ir.Assign(slot, zero)]),
                                   self.lanes(body + [ir.Assign(slot, low.value(n))])])]
            self.staged[n] = slot
        if out:
            out.insert(0, ir.Comment("each query row's values every key multiplies, in "
                                     "registers (0 past E)"))
        return out

    def stage_shared(self, nodes: list[Node]) -> list[ir.Stmt]:
        """Threadgroup staging of the same values for lane scores: every lane reads all of a
        row's E values, so the group's threads fill `mf_tgq<i>[t * Emax + e]` together (0 past
        E and for dead rows), then wait at a barrier."""
        emax = SIMD_WIDTH * self.epl
        tpg = self.group
        self.q_stores = []
        out: list[ir.Stmt] = [ir.Comment(
            "each query row's values every key multiplies, in threadgroup memory: every lane "
            "reads all of them" + ("; loaded here, stored with the first tile's copies"
                                   if self.policy.stage_kv else ""))]
        t, e = ir.Var("mf_t"), ir.Var("mf_e")
        for i, n in enumerate(nodes):
            low = self.lowering(f"mf_st{i}_")
            self.row_of = t
            body = low.lower([n])
            value = _float(low.value(n), n)
            self.row_of = None
            self.helpers |= low.helpers
            name = f"mf_tgq{i}"
            slot = ir.Lane(ir.Var(name), t * ir.Lit(emax, "uint") + e)
            zero = ir.Lit(0.0, "float")
            self.tg_bytes += 4 * self.qt * emax
            if self.policy.stage_kv:
                # declared as float4 (16-byte aligned): tile_scores reads it a float4 at a time
                self.tg_decls.append(ir.ArrayDecl(f"{name}_v", "float4", self.qt * emax // 4,
                                                  "threadgroup"))
                out.append(ir.Decl(name, "threadgroup float*", ir.Call(
                    "reinterpret_cast<threadgroup float*>", (ir.Var(f"{name}_v"),)),
                    const=False))
            else:
                self.tg_decls.append(ir.ArrayDecl(name, "float", self.qt * emax, "threadgroup"))
            self.staged_tg[n] = name
            # the row (mf_t) a run-time value: its positions computed, not read from the
            # tile's arrays
            live = t < ir.Var("mf_nlive")
            where = [ir.Decl("mf_t", "uint", ir.Var("mf_qi") / ir.Lit(emax, "uint")),
                     ir.Decl("mf_e", "uint", ir.Var("mf_qi") % ir.Lit(emax, "uint"))]
            valid = live.and_(ir.Cast(IDX, e) < self.size(self.form.e))
            self.staged[n] = ir.Lane(ir.Var(name), t * ir.Lit(emax, "uint") + e)
            if not self.policy.stage_kv:
                out.append(ir.For("mf_qi", "uint", ir.Var("mf_sg") * SIMD + ir.Var("mf_lane"),
                                  ir.Lit(self.qt * emax, "uint"), [
                    *where, ir.Assign(slot, zero), ir.If(valid, body + [ir.Assign(slot, value)])],
                    step=ir.Lit(tpg, "uint")))
                continue
            # stage_kv: the thread's qt x Emax / tpg values loaded into registers here and
            # stored once the first tile's copies are issued (`q_stores`), so that their
            # loads and the tile's wait in one round
            reg = ir.Lane(ir.Var(f"mf_qr{i}"), ir.Var("mf_n"))
            qi = ir.Decl("mf_qi", "uint", ir.Var("mf_sg") * SIMD + ir.Var("mf_lane")
                         + ir.Var("mf_n") * ir.Lit(tpg, "uint"))
            per = ir.Lit(self.qt * emax // tpg, "uint")
            out += [ir.ArrayDecl(f"mf_qr{i}", "float", self.qt * emax // tpg),
                    ir.For("mf_n", "uint", ir.Lit(0, "uint"), per, [
                        qi, *where, ir.Assign(reg, zero),
                        ir.If(valid, body + [ir.Assign(reg, value)])], unroll=True)]
            self.q_stores.append(ir.For("mf_n", "uint", ir.Lit(0, "uint"), per, [
                qi, ir.Assign(ir.Lane(ir.Var(name), ir.Var("mf_qi")), reg)], unroll=True))
        if not out[1:]:
            return []
        # stage_kv: the first tile's barrier orders the stores before any read of them
        return out if self.policy.stage_kv else out + [ir.Barrier()]

    def load_keys(self) -> list[ir.Stmt]:
        """Each key's E elements of k and v for this lane: `vw`-wide vector loads when E is a
        multiple of the width, else guarded scalar loads; 0 past E and past the keys. A gather
        (a paged cache) finds the key's row once, then loads it the same way."""
        out: list[ir.Stmt] = [ir.Comment("this lane's E elements of the step's keys and values, "
                                         "loaded once for all the tile's rows")]
        for n, arr in self.kv.items():
            if n not in self.streamed:
                continue
            t = self.tensor_of(n)
            ct = compute_type(t.dtype)
            zero = ir.Lit(0.0, ct) if ct == "float" else ir.Lit(0, ct)
            slot = ir.Var("mf_u") * ir.Lit(self.epl, "uint") + ir.Var("mf_j")
            find: list[ir.Stmt] = []
            moved: dict[str, ir.Expr] = {}
            if n.op == Op.TAKE:
                low = self.lowering(f"{arr}_")
                find, pos = low.gather_position(n)
                self.helpers |= low.helpers
                find.append(ir.Decl(f"mf_{arr}_row", IDX, pos))
                moved[n.attr[1]] = ir.Var(f"mf_{arr}_row")
            offset = self.offset(t.axes, moved)
            scalar = ir.If(ir.Cast(IDX, ir.Var("mf_e")) < self.size(self.form.e),
                           [ir.Assign(ir.Lane(ir.Var(arr), slot), ir.Cast(ct, ir.Load(
                               self.names[t.name], offset)))],
                           [ir.Assign(ir.Lane(ir.Var(arr), slot), zero)])
            guarded: list[ir.Stmt] = [self.slots([
                ir.Decl("mf_e", "uint", ir.Var("mf_sub") * ir.Lit(self.epl, "uint")
                        + ir.Var("mf_j")), scalar])]
            body = guarded
            if self.vw > 1 and t.axes[-1] == self.form.e:
                body = [ir.If(ir.Var("mf_vec_ok"), self.vector_load(t, offset, arr), guarded)]
            out += [ir.ArrayDecl(arr, ct, self.kps * self.epl),
                    self.keys(find + body, [self.slots([ir.Assign(ir.Lane(ir.Var(arr), slot),
                                                                  zero)])])]
        return out

    def vector_load(self, t: TensorParam, offset: ir.Expr, arr: str) -> list[ir.Stmt]:
        """The lane's reads_per_thread elements of one key as reads_per_thread / vw vector
        loads (the lane's chunk is inside E or wholly past it: E is a multiple of vw)."""
        ct, st, vw = compute_type(t.dtype), self.in_stype(t), self.vw
        c = ir.Var("mf_c")
        e0 = ir.Var("mf_sub") * ir.Lit(self.epl, "uint") + c * ir.Lit(vw, "uint")
        slot = ir.Var("mf_u") * ir.Lit(self.epl, "uint") + c * ir.Lit(vw, "uint") + ir.Var(
            "mf_x")
        elem = ir.Call("mf_lane8", (ir.Var("mf_vec"), ir.Var("mf_x"))) if vw == 8 else ir.Lane(
            ir.Var("mf_vec"), ir.Var("mf_x"))
        zero = ir.Lit(0.0, ct) if ct == "float" else ir.Lit(0, ct)
        if vw == 8:
            self.helpers.add("mf_pack8_of")
        return [ir.For("mf_c", "uint", ir.Lit(0, "uint"), ir.Lit(self.epl // vw, "uint"), [
            ir.Decl("mf_e", "uint", e0),
            ir.If(ir.Cast(IDX, ir.Var("mf_e")) < self.size(self.form.e), [
                ir.Decl("mf_vec", ir.vector_type(st, vw),
                        ir.Load(self.names[t.name], offset, vw, st)),
                ir.For("mf_x", "uint", ir.Lit(0, "uint"), ir.Lit(vw, "uint"), [
                    ir.Assign(ir.Lane(ir.Var(arr), slot), ir.Cast(ct, elem))], unroll=True)],
                [ir.For("mf_x", "uint", ir.Lit(0, "uint"), ir.Lit(vw, "uint"), [
                    ir.Assign(ir.Lane(ir.Var(arr), slot), zero)], unroll=True)])],
            unroll=True)]

    def key_value(self, low: ElementLowering) -> None:
        """Let `low` read the staged q and k/v registers instead of loading them."""
        low.values.update(self.staged)
        slot = ir.Var("mf_u") * ir.Lit(self.epl, "uint") + ir.Var("mf_j")
        low.values.update({n: ir.Lane(ir.Var(arr), slot) for n, arr in self.kv.items()})

    def elements(self, n: Node, body: list[ir.Stmt]) -> ir.Stmt:
        """`body` over the lane's E slots: all of them when `n` reads nothing along E but the
        staged registers (slots past E compute values nobody stores), else only those inside
        E (guarded loads)."""
        own = [m for m in topo_order([n]) if m.op in (Op.LOAD, Op.INDEX, Op.TAKE)
               and self.form.e in m.axes and m not in self.staged and m not in self.kv]
        return self.lanes(body) if own else self.slots(body)

    def zero_padded(self, n: Node) -> bool:
        """Whether `n` is 0 past E without a guard: a product of staged registers."""
        if n in self.staged or n in self.kv:
            return True
        if n.op == Op.CAST:
            return self.zero_padded(n.args[0])
        return n.op == Op.BINARY and n.attr == "mul" and all(self.zero_padded(a)
                                                             for a in n.args)

    def dots(self) -> list[ir.Stmt]:
        """The step's score contractions: each lane's part over its E elements for every
        (key, row), then summed over the key's mf_w lanes (xor butterfly)."""
        f = self.form
        out: list[ir.Stmt] = [ir.Comment("scores: each lane's part of every contraction, then "
                                         "summed across the key's lanes")]
        dot_at = ir.Var("mf_u") * ir.Lit(self.qt, "uint") + ir.Var("mf_t")
        self.dot_of: dict[Node, ir.Expr] = {}
        for i, r in enumerate(f.contractions):
            part = self.lowering(f"mf_c{i}_")
            self.key_value(part)
            body = part.lower([r.args[0]])
            dot = ir.Lane(ir.Var(f"mf_dot{i}"), dot_at)
            add = body + [ir.Assign(dot, dot + _float(part.value(r.args[0]), r.args[0]))]
            each = self.elements(r.args[0], add) if self.zero_padded(r.args[0]) else \
                self.lanes(add)
            self.helpers |= part.helpers
            rows = ir.For("mf_t", "uint", ir.Lit(0, "uint"), ir.Lit(self.qt, "uint"),
                          [ir.Assign(dot, ir.Lit(0.0, "float"))], unroll=True)
            off = ir.Var("mf_off")
            out += [ir.ArrayDecl(f"mf_dot{i}", "float", self.kps * self.qt),
                    self.each_key([rows]), self.keys([self.each_row([each])]),
                    ir.For("mf_off", "uint", ir.Lit(1, "uint"), ir.Var("mf_w"), [
                        self.each_key([self.each_row([ir.Assign(dot, dot + ir.Call(
                            "simd_shuffle_xor", (dot, off)))])])], step=off)]
            self.dot_of[r] = dot
        return out

    def own_key_chunks(self, nodes: Sequence[Node]) -> tuple[list[ir.Stmt], list[ir.Stmt]]:
        """For lane scores: (once per key, per chunk) statements putting chunk mf_c (vw
        consecutive E elements from mf_c * vw) of the lane's own key mf_l of each of `nodes`
        into `mf_kc<i>[x]`: a vector load when E is a multiple of vw, else guarded scalar
        loads (0 past E). A gather finds the key's row once."""
        vw = self.vw
        find: list[ir.Stmt] = []
        chunk: list[ir.Stmt] = []
        c, x = ir.Var("mf_c"), ir.Var("mf_x")
        e0 = c * ir.Lit(vw, "uint")
        for n in nodes:
            arr = self.kv[n]
            t = self.tensor_of(n)
            ct, st = compute_type(t.dtype), self.in_stype(t)
            zero = ir.Lit(0.0, ct) if ct == "float" else ir.Lit(0, ct)
            moved: dict[str, ir.Expr] = {}
            if n.op == Op.TAKE:
                low = self.lowering(f"{arr}_")
                found, pos = low.gather_position(n)
                self.helpers |= low.helpers
                find += found + [ir.Decl(f"mf_{arr}_row", IDX, pos)]
                moved[n.attr[1]] = ir.Var(f"mf_{arr}_row")
            reg = ir.Lane(ir.Var(f"{arr}c"), x)
            scalar = ir.For("mf_x", "uint", ir.Lit(0, "uint"), ir.Lit(vw, "uint"), [
                ir.Decl("mf_e", "uint", e0 + x),
                ir.If(ir.Cast(IDX, ir.Var("mf_e")) < self.size(self.form.e),
                      [ir.Assign(reg, ir.Cast(ct, ir.Load(self.names[t.name],
                                                          self.offset(t.axes, moved))))],
                      [ir.Assign(reg, zero)])], unroll=True)
            body: list[ir.Stmt] = [scalar]
            if vw > 1 and t.axes[-1] == self.form.e:
                elem = ir.Call("mf_lane8", (ir.Var("mf_vec"), x)) if vw == 8 else ir.Lane(
                    ir.Var("mf_vec"), x)
                if vw == 8:
                    self.helpers.add("mf_pack8_of")
                body = [ir.If(ir.Var("mf_vec_ok"), [
                    ir.Decl("mf_e", "uint", e0),
                    ir.Decl("mf_vec", ir.vector_type(st, vw),
                            ir.Load(self.names[t.name], self.offset(t.axes, moved), vw, st)),
                    ir.For("mf_x", "uint", ir.Lit(0, "uint"), ir.Lit(vw, "uint"), [
                        ir.Assign(reg, ir.Cast(ct, elem))], unroll=True)], [scalar])]
            chunk += [ir.ArrayDecl(f"{arr}c", ct, vw)] + body
        return find, chunk

    def lane_dots(self) -> list[ir.Stmt]:
        """Lane scores: each lane's own key mf_l = mf_step + lane, its whole contraction with
        every row of the tile (q from threadgroup memory), chunk by chunk of vw elements."""
        f = self.form
        vw = self.vw
        out: list[ir.Stmt] = [ir.Comment("scores: each lane takes a key of its own and "
                                         "contracts all of E with every row of the tile")]
        self.dot_of = {}
        nodes = [n for n in self.kv if any(n in topo_order([r.args[0]])
                                           for r in f.contractions)]
        find, chunk = self.own_key_chunks(nodes)
        adds: list[ir.Stmt] = []
        t = ir.Var("mf_t")
        for i, r in enumerate(f.contractions):
            part = self.lowering(f"mf_c{i}_")
            part.values.update(self.staged)
            part.values.update({n: ir.Lane(ir.Var(f"{self.kv[n]}c"), ir.Var("mf_x"))
                                for n in nodes})
            body = part.lower([r.args[0]])
            self.helpers |= part.helpers
            dot = ir.Lane(ir.Var(f"mf_dot{i}"), t)
            adds.append(self.each_row(body + [ir.Assign(dot, dot + _float(
                part.value(r.args[0]), r.args[0]))]))
            out += [ir.ArrayDecl(f"mf_dot{i}", "float", self.qt),
                    ir.For("mf_t", "uint", ir.Lit(0, "uint"), ir.Lit(self.qt, "uint"),
                           [ir.Assign(dot, ir.Lit(0.0, "float"))], unroll=True)]
            self.dot_of[r] = dot
        chunks = (self.size(f.e) + ir.Lit(vw - 1, IDX)) / ir.Lit(vw, IDX)
        each = ir.For("mf_x", "uint", ir.Lit(0, "uint"), ir.Lit(vw, "uint"), [
            ir.Decl("mf_e", "uint", ir.Var("mf_c") * ir.Lit(vw, "uint") + ir.Var("mf_x")),
            ir.If(ir.Cast(IDX, ir.Var("mf_e")) < self.size(f.e), adds)], unroll=True)
        out.append(ir.If(ir.Var("mf_l") < ir.Var("mf_l1"), find + [
            ir.For("mf_c", "uint", ir.Lit(0, "uint"), ir.Cast("uint", chunks),
                   chunk + [each])]))
        return out

    def score(self) -> tuple[list[ir.Stmt], ir.Expr]:
        """The scores' elementwise work (scale, masks, caps) on the contractions `dot_of`: its
        statements and the score as a float."""
        f = self.form
        low = self.lowering("mf_s")
        for r, dot in self.dot_of.items():
            low.values[r] = dot if compute_type(r.dtype) == "float" else ir.Cast(
                compute_type(r.dtype), dot)
        body = low.lower([f.scores])
        self.helpers |= low.helpers | {"mf_maximum"}
        return body, _float(low.value(f.scores), f.scores)

    def lane_softmax(self) -> list[ir.Stmt]:
        """Lane scores: the scores' elementwise work for the lane's key, then per row one
        online-softmax update for the simdgroup's 32 keys: their max over the simdgroup (the
        same m in every lane), the lane's own weight p (kept in mf_ps for the values), its
        running sum d (lane-partial, summed at the end) and acc rescaled."""
        t = ir.Var("mf_t")
        sc, ps = ir.Lane(ir.Var("mf_sc"), t), ir.Lane(ir.Var("mf_ps"), t)
        body, value = self.score()
        self.helpers.add("mf_simd_max")
        m, d = ir.Lane(ir.Var("mf_m"), t), ir.Lane(ir.Var("mf_d"), t)
        m_new, corr = ir.Var("mf_m_new"), ir.Var("mf_corr")
        acc = ir.Lane(ir.Var("mf_acc"), t * ir.Lit(self.epl, "uint") + ir.Var("mf_j"))
        dead = ir.For("mf_t", "uint", ir.Lit(0, "uint"), ir.Lit(self.qt, "uint"),
                      [ir.Assign(sc, NEG_INF)], unroll=True)
        return [
            ir.ArrayDecl("mf_sc", "float", self.qt),
            ir.If(ir.Var("mf_l") < ir.Var("mf_l1"), [self.each_row(
                body + [ir.Assign(sc, value)])], [dead]),
            ir.Comment("online softmax, per row: the max of the simdgroup's keys, the old sums "
                       "rescaled, this lane's weight p"),
            ir.ArrayDecl("mf_ps", "float", self.qt),
            self.each_row([
                ir.Decl("mf_m_new", "float", ir.Call("mf_maximum", (m, ir.Call(
                    "mf_simd_max", (sc,))))),
                ir.Decl("mf_corr", "float", online.rescale(m, m_new)),
                ir.Assign(ps, online.weight(sc, m_new)),
                ir.Assign(d, d * corr + ps),
                ir.Assign(m, m_new),
                self.slots([ir.Assign(acc, acc * corr)])])]

    def lane_values(self) -> list[ir.Stmt]:
        """Lane scores: the step's 32 keys' values, kp * keys_per_step at a time in the usual
        layout (a key's E elements over mf_w lanes, kp key streams), each key's weight p
        fetched from the lane that scored it."""
        t, u = ir.Var("mf_t"), ir.Var("mf_u")
        p = ir.Lane(ir.Var("mf_p"), u * ir.Lit(self.qt, "uint") + t)
        # the lane that scored key mf_i + u * kp + grp (past the step's 32 keys: unused, but a
        # shuffle must still name a lane of the simdgroup)
        src = (ir.Var("mf_i") + u * ir.Var("mf_kp") + ir.Var("mf_grp")) % SIMD
        per = ir.Var("mf_kp") * ir.Lit(self.kps, "uint")
        return [ir.Decl("mf_lend", IDX, ir.Call("min", (ir.Var("mf_l1"), ir.Var("mf_step")
                                                        + ir.Lit(SIMD_WIDTH, IDX)))),
                ir.For("mf_i", "uint", ir.Lit(0, "uint"), SIMD, [
            ir.Decl("mf_base", IDX, ir.Var("mf_step") + ir.Cast(IDX, ir.Var("mf_i"))),
            *self.load_keys(),
            ir.ArrayDecl("mf_p", "float", self.kps * self.qt),
            self.each_key([self.each_row([ir.Assign(p, ir.Call(
                "simd_shuffle", (ir.Lane(ir.Var("mf_ps"), t), src)))])]),
            *self.accumulate()], step=per)]

    def merge_lanes(self) -> list[ir.Stmt]:
        """Lane scores: the simdgroup's state. m is the same in every lane; d is summed over
        the lanes, acc over the key streams (lanes mf_w apart hold the same E elements)."""
        t, off = ir.Var("mf_t"), ir.Var("mf_off")
        d = ir.Lane(ir.Var("mf_d"), t)
        acc = ir.Lane(ir.Var("mf_acc"), t * ir.Lit(self.epl, "uint") + ir.Var("mf_j"))
        return [
            ir.Comment("the simdgroup's state: d summed over its lanes, acc over its key "
                       "streams"),
            self.each_row([
                ir.Assign(d, ir.Call("simd_sum", (d,))),
                ir.For("mf_off", "uint", ir.Var("mf_w"), SIMD, [self.slots([ir.Assign(
                    acc, acc + ir.Call("simd_shuffle_xor", (acc, off)))])], step=off)])]

    def softmax_step(self) -> list[ir.Stmt]:
        """The scores' elementwise work, then per row one online-softmax update for the step:
        its max, what was summed under the old max rescaled, the step's weights p added."""
        sc_at = ir.Var("mf_u") * ir.Lit(self.qt, "uint") + ir.Var("mf_t")
        sc, p = ir.Lane(ir.Var("mf_sc"), sc_at), ir.Lane(ir.Var("mf_p"), sc_at)
        body, value = self.score()
        t = ir.Var("mf_t")
        m, d = ir.Lane(ir.Var("mf_m"), t), ir.Lane(ir.Var("mf_d"), t)
        m_new, corr = ir.Var("mf_m_new"), ir.Var("mf_corr")
        acc = ir.Lane(ir.Var("mf_acc"), t * ir.Lit(self.epl, "uint") + ir.Var("mf_j"))
        dead = ir.For("mf_t", "uint", ir.Lit(0, "uint"), ir.Lit(self.qt, "uint"),
                      [ir.Assign(sc, NEG_INF)], unroll=True)
        return [
            ir.ArrayDecl("mf_sc", "float", self.kps * self.qt),
            self.keys([self.each_row(body + [ir.Assign(sc, value)])], [dead]),
            ir.Comment("online softmax, per row: the step's max, the old sums rescaled, the "
                       "step's weights p added"),
            ir.ArrayDecl("mf_p", "float", self.kps * self.qt),
            self.each_row([
                ir.Decl("mf_m_new", "float", m, const=False),
                self.each_key([ir.Assign(m_new, ir.Call("mf_maximum", (m_new, sc)))]),
                ir.Decl("mf_corr", "float", online.rescale(m, m_new)),
                ir.Assign(d, d * corr),
                self.each_key([ir.Assign(p, online.weight(sc, m_new)), ir.Assign(d, d + p)]),
                ir.Assign(m, m_new),
                self.slots([ir.Assign(acc, acc * corr)])])]

    def accumulate(self) -> list[ir.Stmt]:
        """acc += p v for every (row, key) of the step."""
        f = self.form
        vals = self.lowering("mf_w")
        self.key_value(vals)
        body = vals.lower([f.values])
        self.helpers |= vals.helpers
        t = ir.Var("mf_t")
        acc = ir.Lane(ir.Var("mf_acc"), t * ir.Lit(self.epl, "uint") + ir.Var("mf_j"))
        p = ir.Lane(ir.Var("mf_p"), ir.Var("mf_u") * ir.Lit(self.qt, "uint") + t)
        return [ir.Comment("the values: acc += p v"),
                self.keys([self.each_row([self.elements(f.values, body + [
                    ir.Assign(acc, acc + p * _float(vals.value(f.values), f.values))])])])]

    def epilogue(self, acc: ir.Expr = MACC,
                 each: Optional[Callable[[list[ir.Stmt]], ir.Stmt]] = None) -> ir.Stmt:
        """The outputs at the lane's E elements (`each`: the loop over them declaring mf_e;
        lanes() unless given): the merged acc / d through the work after the sum."""
        f = self.form
        low = self.lowering("mf_o")
        low.values[f.out] = ir.Cast(compute_type(f.out.dtype), acc / ir.Var("mf_md"))
        body = low.lower([o.node for o in self.graph.outputs])
        self.helpers |= low.helpers
        for k, o in enumerate(self.graph.outputs):
            body.append(ir.Store(self.out_names[k], self.offset(o.axes), self.out_value(k, low)))
        return (each or self.lanes)(body)

    # -- online-softmax states: per key stream, merged -----------------------------------
    def state(self) -> list[ir.Stmt]:
        """Empty online-softmax states for the tile's rows: m = -inf, d = 0, acc = 0."""
        t = ir.Var("mf_t")
        return [ir.ArrayDecl("mf_m", "float", self.qt), ir.ArrayDecl("mf_d", "float", self.qt),
                ir.ArrayDecl("mf_acc", "float", self.qt * self.epl),
                ir.For("mf_t", "uint", ir.Lit(0, "uint"), ir.Lit(self.qt, "uint"), [
                    ir.Assign(ir.Lane(ir.Var("mf_m"), t), NEG_INF),
                    ir.Assign(ir.Lane(ir.Var("mf_d"), t), ir.Lit(0.0, "float")),
                    self.slots([ir.Assign(ir.Lane(ir.Var("mf_acc"), t * ir.Lit(self.epl, "uint")
                                                  + ir.Var("mf_j")), ir.Lit(0.0, "float"))])],
                       unroll=True)]

    def merge_streams(self) -> list[ir.Stmt]:
        """Merge the simdgroup's kp key streams (lanes mf_w apart hold the same E elements of
        different keys) by an xor butterfly; afterwards every stream holds the merge."""
        t, off = ir.Var("mf_t"), ir.Var("mf_off")
        m, d = ir.Lane(ir.Var("mf_m"), t), ir.Lane(ir.Var("mf_d"), t)
        acc = ir.Lane(ir.Var("mf_acc"), t * ir.Lit(self.epl, "uint") + ir.Var("mf_j"))
        mo, mx = ir.Var("mf_mo"), ir.Var("mf_mx")

        def weight(ms: ir.Expr) -> ir.Expr:
            return online.share(ms, mx)
        return [
            ir.Comment("merge the simdgroup's key streams"),
            ir.For("mf_off", "uint", ir.Var("mf_w"), SIMD, [self.each_row([
                ir.Decl("mf_mo", "float", ir.Call("simd_shuffle_xor", (m, off))),
                ir.Decl("mf_do", "float", ir.Call("simd_shuffle_xor", (d, off))),
                ir.Decl("mf_mx", "float", ir.Call("mf_maximum", (m, mo))),
                ir.Decl("mf_c1", "float", weight(m)),
                ir.Decl("mf_c2", "float", weight(mo)),
                ir.Assign(d, d * ir.Var("mf_c1") + ir.Var("mf_do") * ir.Var("mf_c2")),
                self.slots([ir.Assign(acc, acc * ir.Var("mf_c1") + ir.Call(
                    "simd_shuffle_xor", (acc, off)) * ir.Var("mf_c2"))]),
                ir.Assign(m, mx)])], step=off)]

    def merge_states(self, count: ir.Expr, m_of: Callable[[ir.Expr], ir.Expr],
                     d_of: Callable[[ir.Expr], ir.Expr],
                     acc_of: Callable[[ir.Expr, ir.Expr], ir.Expr]) -> list[ir.Stmt]:
        """(mf_mm, mf_md, mf_macc) = the merge of `count` states s (m_of(s), d_of(s),
        acc_of(s, e)): the largest max M, then d = sum d_s c_s and acc = sum acc_s c_s with
        c_s = exp(m_s - M) (0 for an empty state, m_s = -inf; NaN in any state makes the
        result NaN)."""
        s, c = ir.Var("mf_s"), ir.Var("mf_c")
        acc = ir.Lane(ir.Var("mf_macc"), ir.Var("mf_j"))
        e = ir.Var("mf_e")
        return [
            ir.Decl("mf_mm", "float", NEG_INF, const=False),
            ir.Decl("mf_md", "float", ir.Lit(0.0, "float"), const=False),
            ir.ArrayDecl("mf_macc", "float", self.epl),
            self.slots([ir.Assign(acc, ir.Lit(0.0, "float"))]),
            ir.For("mf_s", "uint", ir.Lit(0, "uint"), count, [
                ir.Assign(ir.Var("mf_mm"), ir.Call("mf_maximum", (ir.Var("mf_mm"), m_of(s))))]),
            ir.For("mf_s", "uint", ir.Lit(0, "uint"), count, [
                ir.Decl("mf_ms", "float", m_of(s)),
                ir.Decl("mf_c", "float", online.share(ir.Var("mf_ms"), ir.Var("mf_mm"))),
                ir.Assign(ir.Var("mf_md"), ir.Var("mf_md") + d_of(s) * c),
                self.lanes([ir.Assign(acc, acc + acc_of(s, e) * c)])])]

    @staticmethod
    def shared_states(nsg: int, emax: int) -> list[ir.Stmt]:
        """Threadgroup memory for nsg simdgroups' online-softmax states (m, d, acc[emax])."""
        return [ir.ArrayDecl("mf_tg_m", "float", nsg, "threadgroup"),
                ir.ArrayDecl("mf_tg_d", "float", nsg, "threadgroup"),
                ir.ArrayDecl("mf_tg_acc", "float", nsg * emax, "threadgroup")]

    def put_state(self, emax: int, m: ir.Expr, d: ir.Expr,
                  acc: Callable[[ir.Expr], ir.Expr]) -> ir.Stmt:
        """This simdgroup's state into `shared_states` (its first key stream's lanes: lane 0
        m and d, each lane its E slots mf_sub * reads_per_thread + j, acc(j))."""
        j = ir.Var("mf_j")
        e = ir.Var("mf_sub") * ir.Lit(self.epl, "uint") + j
        zero = ir.Lit(0, "uint")
        return ir.If(ir.Var("mf_grp").eq(zero), [
            ir.If(ir.Var("mf_lane").eq(zero), [
                ir.Assign(ir.Lane(ir.Var("mf_tg_m"), ir.Var("mf_sg")), m),
                ir.Assign(ir.Lane(ir.Var("mf_tg_d"), ir.Var("mf_sg")), d)]),
            self.slots([ir.Assign(ir.Lane(ir.Var("mf_tg_acc"), ir.Var("mf_sg")
                                          * ir.Lit(emax, "uint") + e), acc(j))])])

    def merge_shared(self, nsg: int, emax: int) -> list[ir.Stmt]:
        """(mf_mm, mf_md, mf_macc) = the merge of the nsg states in `shared_states`."""
        return self.merge_states(
            ir.Lit(nsg, "uint"),
            lambda s: ir.Lane(ir.Var("mf_tg_m"), s), lambda s: ir.Lane(ir.Var("mf_tg_d"), s),
            lambda s, e: ir.Lane(ir.Var("mf_tg_acc"), s * ir.Lit(emax, "uint") + e))

    def share(self, nsg: int, emax: int) -> list[ir.Stmt]:
        """Row by row: the simdgroups' states through threadgroup memory, merged by
        simdgroup 0, which writes the outputs (one block) or the block's partial state."""
        t = ir.Var("mf_t")
        first = ir.Var("mf_grp").eq(ir.Lit(0, "uint"))
        return [
            ir.Comment("row by row: merge the simdgroups' states through threadgroup memory"),
            self.each_row([
                self.put_state(emax, ir.Lane(ir.Var("mf_m"), t), ir.Lane(ir.Var("mf_d"), t),
                               lambda j: ir.Lane(ir.Var("mf_acc"),
                                                 t * ir.Lit(self.epl, "uint") + j)),
                ir.Barrier(),
                ir.If(ir.Var("mf_sg").eq(ir.Lit(0, "uint")).and_(first),
                      self.merge_shared(nsg, emax) + [self.write_row()]),
                ir.Barrier()])]

    def write_row(self, acc: ir.Expr = MACC,
                  each: Optional[Callable[[list[ir.Stmt]], ir.Stmt]] = None,
                  first: Optional[ir.Expr] = None) -> ir.Stmt:
        """The row's merged state (mf_mm, mf_md, `acc` at the lane's E elements, which `each`
        loops over: lanes() unless given): the outputs when the keys are one block, else the
        block's state in the scratch buffer (m and d stored where `first`, lane 0 unless
        given)."""
        partial = ir.Var("mf_partial")
        row_id = self.offset(self.rows)
        each = each or self.lanes
        if first is None:
            first = ir.Var("mf_lane").eq(ir.Lit(0, "uint"))
        return ir.If(ir.Var("mf_splits").eq(ir.Lit(1, "uint")), [
            ir.Comment("one block: outputs = acc / d (all keys masked: 0 / 0 = NaN, as "
                       "softmax gives)"), self.epilogue(acc, each)], [
            ir.Comment("several blocks: this block's state (m, d, acc[E]) for the merge "
                       "kernel"),
            ir.Decl("mf_partial", IDX, (row_id * ir.Cast(IDX, ir.Var("mf_splits"))
                                        + ir.Cast(IDX, ir.Var("mf_block")))
                    * ir.Lit(self.scratch_e + 2, IDX)),
            ir.If(first, [
                ir.Store("mf_scratch", partial, ir.Var("mf_mm")),
                ir.Store("mf_scratch", partial + ir.Lit(1, IDX), ir.Var("mf_md"))]),
            each([ir.Store("mf_scratch", partial + ir.Lit(2, IDX) + ir.Cast(IDX, ir.Var("mf_e")),
                           acc)])])

    def group_head(self, nsg: int, what: str = "") -> list[ir.Stmt]:
        """Which tile of query rows (mf_own, mf_tile) and block of keys [mf_l0, mf_l1) the
        threadgroup takes (`what` it does with them: the comment), and the lane's place: E
        chunk mf_sub of key stream mf_grp (not with stage_kv, whose lanes place themselves per
        phase)."""
        f = self.form
        tiles = (self.span(self.tile_axes) + ir.Lit(self.qt - 1, IDX)) / ir.Lit(self.qt, IDX)
        if what:
            what = f"; {what}"
        elif self.policy.stage_kv:
            what = (", a simdgroup per row; the group stages tiles of mf_kt keys of K and V in "
                    "threadgroup memory, the simdgroups split each tile's keys")
        else:
            what = (f"; {nsg} simdgroups take turns over steps of keys; "
                    + ("each lane scores a key of its own; for the values, " if
                       self.policy.lane_scores else "")
                    + f"a key's E elements are spread over mf_w lanes, {self.epl} "
                    f"consecutive ones each")
        what = (f"threadgroup: query rows mf_tile * {self.qt} + t (t < {self.qt}) of mf_own, "
                f"keys [mf_l0, mf_l1) of block mf_block{what}")
        head: list[ir.Stmt] = [
            ir.Comment(what),
            ir.Decl("mf_block", "uint", ir.Var("mf_group") % ir.Var("mf_splits")),
            ir.Decl("mf_tile", "uint", ir.Cast("uint", ir.Cast(IDX, ir.Var("mf_group")
                                                               / ir.Var("mf_splits")) % tiles)),
            ir.Decl("mf_own", "uint", ir.Cast("uint", ir.Cast(IDX, ir.Var("mf_group")
                                                              / ir.Var("mf_splits")) / tiles)),
            ir.If(ir.Cast(IDX, ir.Var("mf_own")) >= self.span(self.own_axes), [ir.Return()])]
        if not self.policy.stage_kv:
            head += [ir.Decl("mf_sub", "uint", ir.Var("mf_lane") % ir.Var("mf_w")),
                     ir.Decl("mf_grp", "uint", ir.Var("mf_lane") / ir.Var("mf_w")),
                     ir.Decl("mf_kp", "uint", SIMD / ir.Var("mf_w"))]
        head += [ir.Decl("mf_vec_ok", "bool", (self.size(f.e) % ir.Lit(self.vw, IDX)).eq(
                     ir.Lit(0, IDX)))]
        return head

    def key_bounds(self) -> list[tuple[str, Node, int]]:
        """The keys a query row can see, from the scores' mask: when the scores' last step is
        `where(c, s, -inf)`, each conjunct of c comparing index(L) with an integer expression
        f of the other indices, sizes and integer scalars is a bound, ('lo', f, a): keys
        >= f + a, or ('hi', f, a): keys < f + a (causal: hi = pos + 1; a sliding window also
        lo = pos - window + 1). Keys outside them are masked whatever their values."""
        sc = strip_casts(self.form.scores)
        if sc.op != Op.WHERE:
            return []
        cond, _, other = sc.args
        other = strip_casts(other)
        if other.op != Op.CONST or other.attr != float("-inf"):
            return []
        key = self.form.key
        out: list[tuple[str, Node, int]] = []
        for c in _conjuncts(cond):
            if c.op != Op.BINARY or c.attr not in _BOUND or not all(
                    a.dtype.is_int for a in c.args):     # compared as integers, not floats
                continue
            x, y = (strip_casts(a) for a in c.args)
            op = c.attr
            if _is_index(y, key) and _key_free_int(x, key):     # f op L  ==  L op' f
                x, y, op = y, x, _MIRROR[op]
            if _is_index(x, key) and _key_free_int(y, key) and all(
                    m.attr in self.rows for m in topo_order([y]) if m.op == Op.INDEX):
                out.append((_BOUND[op][0], y, _BOUND[op][1]))
        return out

    def block_keys(self) -> list[ir.Stmt]:
        """The threadgroup's block of keys [mf_l0, mf_l1): the keys its rows can see (all of
        L, or the union of the rows' `key_bounds`: masked keys are never read) split into
        mf_splits blocks."""
        splits, length = ir.Cast(IDX, ir.Var("mf_splits")), self.size(self.form.key)
        one = ir.Lit(1, IDX)
        bounds = self.key_bounds()
        if not bounds:
            chunk = (length + splits - one) / splits
            return [ir.Decl("mf_l0", IDX, ir.Cast(IDX, ir.Var("mf_block")) * chunk),
                    ir.Decl("mf_l1", IDX, ir.Call("min", (ir.Var("mf_l0") + chunk, length)))]
        low = self.lowering("mf_kb")
        vals = low.lower([n for _, n, _ in bounds])
        self.helpers |= low.helpers
        zero = ir.Cast("long", ir.Lit(0, IDX))
        lo: ir.Expr = zero
        hi: ir.Expr = ir.Cast("long", length)
        for kind, n, add in bounds:
            v = ir.Cast("long", low.value(n)) + ir.Cast("long", ir.Lit(add, IDX)) if add \
                else ir.Cast("long", low.value(n))
            lo = ir.Select(v > lo, v, lo) if kind == "lo" else lo
            hi = ir.Select(v < hi, v, hi) if kind == "hi" else hi
        klo, khi = ir.Var("mf_klo"), ir.Var("mf_khi")
        rlo, rhi = ir.Var("mf_rlo"), ir.Var("mf_rhi")
        chunk = (ir.Var("mf_kn") + splits - one) / splits
        return [
            ir.Comment(f"the keys the tile's rows can see (the mask's bounds on "
                       f"'{self.form.key}'; masked keys are never read), split into mf_splits "
                       f"blocks"),
            ir.Decl("mf_klo", "long", ir.Cast("long", length), const=False),
            ir.Decl("mf_khi", "long", zero, const=False),
            self.each_row(vals + [
                ir.Decl("mf_rlo", "long", lo), ir.Decl("mf_rhi", "long", hi),
                ir.If(rlo < rhi, [ir.Assign(klo, ir.Select(rlo < klo, rlo, klo)),
                                  ir.Assign(khi, ir.Select(rhi > khi, rhi, khi))])]),
            ir.Decl("mf_kn", IDX, ir.Select(khi > klo, ir.Cast(IDX, khi - klo),
                                            ir.Lit(0, IDX))),
            ir.Decl("mf_l0", IDX, ir.Select(khi > klo, ir.Cast(IDX, klo), ir.Lit(0, IDX))
                    + ir.Cast(IDX, ir.Var("mf_block")) * chunk),
            ir.Decl("mf_l1", IDX, ir.Call("min", (ir.Var("mf_l0") + chunk, ir.Select(
                khi > klo, ir.Cast(IDX, khi), ir.Lit(0, IDX)))))]

    # -- stage_kv: tiles of K and V in threadgroup memory, split across the simdgroups --------
    def tile_arrays(self, runs: bool = True) -> list[ir.Stmt]:
        """Each K/V read's tile: TILE_BYTES of threadgroup memory declared as float4 (16-byte
        units, aligned for vector access of any element type), used as `threadgroup T*
        mf_kv<i>` with rows of mf_chunks chunks of vw elements (E rounded up) padded by
        PAD_BYTES (`mf_kv<i>_stride` elements apart); with `runs`, whether the values loop may
        read runs of `run` elements (mf_run_ok)."""
        out: list[ir.Stmt] = [ir.Comment(
            "the K/V tiles: key mf_key's element e at mf_kv<i>[mf_key * mf_kv<i>_stride + e] "
            f"(rows padded by {PAD_BYTES} bytes: lanes reading different rows hit different "
            "banks)")]
        for n, arr in self.kv.items():
            t = self.tensor_of(n)
            st, size = self.in_stype(t), t.dtype.itemsize
            if self.vw == 8:
                self.helpers.add("mf_pack8_of")
            self.tg_decls.append(ir.ArrayDecl(f"mf_tg_{arr[3:]}", "float4", TILE_BYTES // 16,
                                              "threadgroup"))
            self.tg_bytes += TILE_BYTES
            out += [ir.Decl(arr, f"threadgroup {st}*", ir.Call(
                        f"reinterpret_cast<threadgroup {st}*>", (ir.Var(f"mf_tg_{arr[3:]}"),)),
                        const=False),
                    ir.Decl(f"{arr}_stride", "uint", ir.Var("mf_chunks") * ir.Lit(self.vw, "uint")
                            + ir.Lit(PAD_BYTES // size, "uint"))]
        chunks = (self.size(self.form.e) + ir.Lit(self.vw - 1, IDX)) / ir.Lit(self.vw, IDX)
        run_ok = (self.size(self.form.e) % ir.Lit(self.run, IDX)).eq(ir.Lit(0, IDX))
        head: list[ir.Stmt] = [ir.Decl("mf_chunks", "uint", ir.Cast("uint", chunks))]
        if runs:
            head += [ir.Comment(f"the values' reads: {self.run} consecutive elements a lane at "
                                f"once where E is a multiple of {self.run}"),
                     ir.Decl("mf_run_ok", "bool", run_ok)]
        return head + out

    def tile_reads(self) -> dict[Node, ir.Expr]:
        """Each K/V read as its staged tile's element of key mf_u and E element mf_e, in its
        compute type."""
        return {n: ir.Cast(compute_type(self.tensor_of(n).dtype), ir.Lane(
            ir.Var(arr), ir.Var("mf_u") * ir.Var(f"{arr}_stride") + ir.Var("mf_e")))
            for n, arr in self.kv.items()}

    def key_row(self, n: Node, arr: str) -> tuple[list[ir.Stmt], dict[str, ir.Expr]]:
        """For a gathered K/V read (a paged cache): the statements finding and checking key
        mf_l's row, and that row as the position along the gathered axis."""
        if n.op != Op.TAKE:
            return [], {}
        low = self.lowering(f"{arr}_")
        find, pos = low.gather_position(n)
        self.helpers |= low.helpers
        return find + [ir.Decl(f"mf_{arr}_row", IDX, pos)], {n.attr[1]: ir.Var(f"mf_{arr}_row")}

    def fill_tiles(self) -> list[ir.Stmt]:
        """Every thread of the group copies its share of the tile's mf_tn keys of each K/V
        read into threadgroup memory, a chunk of vw elements (16 bytes) a copy: one vector
        copy when E is a multiple of vw (and innermost in every read), else the chunk's
        elements inside E one by one (a chunk is still one thread's)."""
        vw, group = self.vw, ir.Lit(self.group, "uint")
        key = ir.Var("mf_r")                         # copy mf_i: key mf_r, E from mf_e0
        whole = vw > 1 and all(self.tensor_of(n).axes[-1] == self.form.e for n in self.kv)
        vector: list[ir.Stmt] = [ir.Decl("mf_e", "uint", ir.Var("mf_e0"))]
        scalar: list[ir.Stmt] = []
        for n, arr in self.kv.items():
            t = self.tensor_of(n)
            find, moved = self.key_row(n, arr)
            src = self.offset(t.axes, moved)
            dst = key * ir.Var(f"{arr}_stride") + ir.Var("mf_e")
            st = self.in_stype(t)
            vector.append(ir.Block(find + [ir.Store(arr, dst, ir.Load(
                self.names[t.name], src, vw, st), vw, st, space="threadgroup")]))
            find, moved = self.key_row(n, arr)
            scalar.append(ir.Block(find + [ir.For("mf_x", "uint", ir.Lit(0, "uint"),
                                                  ir.Lit(vw, "uint"), [
                ir.Decl("mf_e", "uint", ir.Var("mf_e0") + ir.Var("mf_x")),
                ir.If(ir.Cast(IDX, ir.Var("mf_e")) < self.size(self.form.e), [
                    ir.Store(arr, dst, ir.Load(self.names[t.name], src))])], unroll=True)]))
        chunks, cc = ir.Var("mf_chunks"), ir.Var("mf_cc")
        body: list[ir.Stmt] = [
            ir.Decl("mf_e0", "uint", cc * ir.Lit(vw, "uint")),
            ir.Decl("mf_l", IDX, ir.Var("mf_tk") + ir.Cast(IDX, key))]
        body += [ir.If(ir.Var("mf_vec_ok"), vector, scalar)] if whole else scalar
        body += [ir.Comment(f"the next copy: {self.group} further (mf_dr keys and mf_dc "
                            "chunks), no division per copy"),
                 ir.Assign(key, key + ir.Var("mf_dr")), ir.Assign(cc, cc + ir.Var("mf_dc")),
                 ir.If(cc >= chunks, [ir.Assign(cc, cc - chunks),
                                      ir.Assign(key, key + ir.Lit(1, "uint"))])]
        copies: ir.Stmt = ir.For("mf_i", "uint", ir.Var("mf_tid"), ir.Var("mf_tn") * chunks,
                                 body, step=group)
        per = self.kt_max * (SIMD_WIDTH * self.epl // vw) // self.group
        if whole and 1 < per <= BATCHED_COPIES and not any(m.op == Op.TAKE for m in self.kv):
            full = ir.Var("mf_vec_ok").and_(ir.Var("mf_dc").eq(ir.Lit(0, "uint"))).and_(
                (ir.Var("mf_tn") * chunks).eq(ir.Lit(per * self.group, "uint")))
            copies = ir.If(full, self.batched_copies(per), [copies])
        return [
            ir.Comment(f"stage keys [mf_tk, mf_tk + mf_tn) of K and V: all {self.group} "
                       f"threads copy, a chunk of {vw} elements (16 bytes) a copy; copy i is "
                       f"key i / mf_chunks, chunk i % mf_chunks"),
            ir.Decl("mf_r", "uint", ir.Var("mf_tid") / chunks, const=False),
            ir.Decl("mf_cc", "uint", ir.Var("mf_tid") % chunks, const=False),
            ir.Decl("mf_dr", "uint", group / chunks),
            ir.Decl("mf_dc", "uint", group % chunks),
            copies,
            ir.Barrier()]

    def batched_copies(self, n: int) -> list[ir.Stmt]:
        """A full tile whose copies keep their chunk (mf_dc = 0): the thread's n copies (keys
        mf_r + j * mf_dr, chunk mf_cc) of each K/V read, all n loads before their stores, so
        that they are in flight together (`BATCHED_COPIES`)."""
        vw = self.vw
        e = ir.Var("mf_e")
        out: list[ir.Stmt] = [
            ir.Comment(f"a full tile: this thread's {n} copies of each read (keys mf_r + j * "
                       f"mf_dr, E from mf_e), every load before its store"),
            ir.Decl(e.name, "uint", ir.Var("mf_cc") * ir.Lit(vw, "uint"))]
        for node, arr in self.kv.items():
            t = self.tensor_of(node)
            st = self.in_stype(t)
            held = ir.Var(f"{arr}_cp")
            keys = [ir.Var("mf_r") + ir.Lit(j, "uint") * ir.Var("mf_dr") for j in range(n)]
            out.append(ir.ArrayDecl(held.name, ir.vector_type(st, vw), n))
            for j, key in enumerate(keys):
                out.append(ir.Block([
                    ir.Decl("mf_l", IDX, ir.Var("mf_tk") + ir.Cast(IDX, key)),
                    ir.Assign(ir.Lane(held, ir.Lit(j, "uint")), ir.Load(
                        self.names[t.name], self.offset(t.axes), vw, st))]))
            for j, key in enumerate(keys):
                out.append(ir.Store(arr, key * ir.Var(f"{arr}_stride") + e,
                                    ir.Lane(held, ir.Lit(j, "uint")), vw, st,
                                    space="threadgroup"))
        return out

    def tile_scores(self) -> list[ir.Stmt]:
        """The scores of this simdgroup's mf_ks keys of the tile against every row of the tile
        (each key's row read and converted once for all of them), into threadgroup memory:
        lane mf_key's part mf_part of the contraction over E from the staged tile, chunk by
        chunk of vw elements (32 / mf_ks lanes share a key, taking every mf_parts-th chunk,
        their parts summed by shuffles), then per row the score's elementwise work
        (Builder.score: scale, masks, caps); -inf past the tile's keys. The key's first lane
        stores `mf_tg_s[t * kt_max + key]`.

        Per chunk, when E is a multiple of vw (mf_vec_ok: every chunk whole): the key's chunk
        as one vw-element (16-byte) vector read of its padded row, each row's q chunk as float4
        reads of its staged row (the same address in every lane: a broadcast), no guards.
        Otherwise the chunk's elements one by one, 0 past E."""
        f, vw = self.form, self.vw
        nodes = [n for n in self.kv if any(n in topo_order([r.args[0]]) for r in f.contractions)]
        c, x, key, t = ir.Var("mf_c"), ir.Var("mf_x"), ir.Var("mf_key"), ir.Var("mf_t")
        e_of_x = ir.Decl("mf_e", "uint", c * ir.Lit(vw, "uint") + x)
        inside = ir.Cast(IDX, ir.Var("mf_e")) < self.size(f.e)

        # K's chunk into registers mf_kv<i>c[x]: one vector read / guarded element reads
        k_vec: list[ir.Stmt] = []
        k_elems: list[ir.Stmt] = []
        for n in nodes:
            arr = self.kv[n]
            tp = self.tensor_of(n)
            ct, st = compute_type(tp.dtype), self.in_stype(tp)
            zero = ir.Lit(0.0, ct) if ct == "float" else ir.Lit(0, ct)
            reg = ir.Lane(ir.Var(f"{arr}c"), x)
            row = key * ir.Var(f"{arr}_stride")
            k_elems += [ir.ArrayDecl(f"{arr}c", ct, vw), ir.For(
                "mf_x", "uint", ir.Lit(0, "uint"), ir.Lit(vw, "uint"), [
                    e_of_x, ir.If(inside, [ir.Assign(reg, ir.Cast(ct, ir.Lane(
                        ir.Var(arr), row + ir.Var("mf_e"))))], [ir.Assign(reg, zero)])],
                unroll=True)]
            vec = ir.Var(f"{arr}v")
            elem = ir.Call("mf_lane8", (vec, x)) if vw == 8 else ir.Lane(vec, x)
            k_vec += [ir.Decl(f"{arr}v", ir.vector_type(st, vw), ir.Load(
                          arr, row + c * ir.Lit(vw, "uint"), vw, st, space="threadgroup")),
                      ir.ArrayDecl(f"{arr}c", ct, vw),
                      ir.For("mf_x", "uint", ir.Lit(0, "uint"), ir.Lit(vw, "uint"), [
                          ir.Assign(reg, ir.Cast(ct, elem))], unroll=True)]

        # row mf_t's q (each staged value every key multiplies), qw floats per read (float4
        # for vw = 4 or 8), each read used at once (x = y * qw + z)
        qw = 4 if vw % 4 == 0 else 2 if vw % 2 == 0 else 1
        y, z = ir.Var("mf_y"), ir.Var("mf_z")
        q_reads: list[ir.Stmt] = []
        q_regs: dict[Node, ir.Expr] = {}
        emax = SIMD_WIDTH * self.epl
        for i, (n, name) in enumerate(self.staged_tg.items()):
            at = t * ir.Lit(emax, "uint") + c * ir.Lit(vw, "uint") + y * ir.Lit(qw, "uint")
            read = ir.Load(name, at, qw, "float", space="threadgroup") if qw > 1 else ir.Lane(
                ir.Var(name), at)
            q_reads.append(ir.Decl(f"mf_qv{i}", ir.vector_type("float", qw) if qw > 1
                                   else "float", read))
            q_regs[n] = ir.Lane(ir.Var(f"mf_qv{i}"), z) if qw > 1 else ir.Var(f"mf_qv{i}")

        # the contractions' parts of the chunk per row: with q from registers (vector path,
        # every element inside E) or from the staged row (element path, guarded)
        self.dot_of = {}
        decls: list[ir.Stmt] = []
        butterfly: list[ir.Stmt] = []
        adds_vec: list[ir.Stmt] = []
        adds_elem: list[ir.Stmt] = []
        for i, r in enumerate(f.contractions):
            dot = ir.Lane(ir.Var(f"mf_dot{i}"), t)
            for adds, qs in ((adds_vec, q_regs), (adds_elem, self.staged)):
                part = self.lowering(f"mf_c{i}_")
                part.values.update(qs)
                part.values.update({n: ir.Lane(ir.Var(f"{self.kv[n]}c"), x) for n in nodes})
                low = part.lower([r.args[0]])
                self.helpers |= part.helpers
                adds += low + [ir.Assign(dot, dot + _float(part.value(r.args[0]), r.args[0]))]
            decls += [ir.ArrayDecl(f"mf_dot{i}", "float", self.qt),
                      ir.For("mf_t", "uint", ir.Lit(0, "uint"), ir.Lit(self.qt, "uint"), [
                          ir.Assign(dot, ir.Lit(0.0, "float"))], unroll=True)]
            butterfly.append(ir.Assign(dot, dot + ir.Call("simd_shuffle_xor",
                                                          (dot, ir.Var("mf_off")))))
            self.dot_of[r] = dot
        each_elem = ir.For("mf_x", "uint", ir.Lit(0, "uint"), ir.Lit(vw, "uint"), [
            e_of_x, ir.If(inside, adds_elem)], unroll=True)

        def chunks(body: list[ir.Stmt]) -> ir.Stmt:
            return ir.For("mf_c", "uint", ir.Var("mf_part"), ir.Var("mf_chunks"), body,
                          step=ir.Var("mf_parts"))
        scan: ir.Stmt = chunks(k_elems + [self.each_row([each_elem])])
        if vw > 1:
            each_vec = ir.For("mf_y", "uint", ir.Lit(0, "uint"), ir.Lit(vw // qw, "uint"), [
                *q_reads, ir.For("mf_z", "uint", ir.Lit(0, "uint"), ir.Lit(qw, "uint"), [
                    ir.Decl("mf_x", "uint", y * ir.Lit(qw, "uint") + z), e_of_x, *adds_vec],
                    unroll=True)], unroll=True)
            # rows past the tile's end have q = 0 staged: their dots are computed unguarded
            # (never used) when the contractions read nothing else
            rows = self.rows_reading([r.args[0] for r in f.contractions],
                                     set(q_regs) | set(nodes))
            scan = ir.If(ir.Var("mf_vec_ok"), [chunks([
                ir.Comment(f"the key's chunk: one {vw}-element read of its row; each row's q: "
                           f"{vw // qw} x float{qw if qw > 1 else ''} (a broadcast)"),
                *k_vec, rows([each_vec])])], [scan])
        sc_body, value = self.score()
        live = key < ir.Var("mf_tn")
        sc = ir.Var("mf_sc")
        return [
            ir.Comment("scores: lane mf_key contracts its key's E elements (chunk mf_part, "
                       "mf_part + mf_parts, ...) with every row's q, from the staged tile"),
            ir.Decl("mf_l", IDX, ir.Var("mf_tk") + ir.Cast(IDX, key)), *decls,
            ir.If(live, [scan]),
            ir.For("mf_off", "uint", ir.Var("mf_ks"), SIMD, [self.every_row(butterfly)],
                   step=ir.Var("mf_off")),
            ir.Comment("each row's score of the key (-inf past the tile), stored by the key's "
                       "first lane"),
            self.each_row([
                ir.Decl("mf_sc", "float", NEG_INF, const=False),
                ir.If(live, sc_body + [ir.Assign(sc, value)]),
                ir.If(ir.Var("mf_part").eq(ir.Lit(0, "uint")), [ir.Assign(ir.Lane(
                    ir.Var("mf_tg_s"), t * ir.Lit(self.kt_max, "uint") + key), sc)])])]

    def tile_softmax(self) -> list[ir.Stmt]:
        """Simdgroup mf_sg's row: one online-softmax update for the tile, a key a lane (two in
        the narrow kernel's 64-key tiles): the tile's max over the simdgroup, the old sums
        rescaled (the factor to `mf_tg_c[row]` for every simdgroup's accumulators), each key's
        weight p to `mf_tg_p[key * rows + row]` (a key's weights of all rows side by side) and
        into the lane-partial d."""
        mm, md, m_new, corr = (ir.Var(v) for v in ("mf_mm", "mf_md", "mf_m_new", "mf_corr"))
        lane, sg = ir.Var("mf_lane"), ir.Var("mf_sg")
        self.helpers.add("mf_simd_max")
        per = self.kt_max // SIMD_WIDTH                  # keys a lane
        sc = [ir.Var(f"mf_sc{i}") for i in range(per)]
        keys = [lane + ir.Lit(i * SIMD_WIDTH, "uint") if i else lane for i in range(per)]
        top: ir.Expr = sc[0]
        for v in sc[1:]:
            top = ir.Call("mf_maximum", (top, v))
        out: list[ir.Stmt] = [
            ir.Comment("online softmax of the simdgroup's row: the tile's max, the old sums' "
                       "factor, each key's weight p")]
        out += [ir.Decl(v.name, "float", ir.Select(k < ir.Var("mf_tn"), ir.Lane(
            ir.Var("mf_tg_s"), sg * ir.Lit(self.kt_max, "uint") + k), NEG_INF))
            for v, k in zip(sc, keys)]
        out += [
            ir.Decl("mf_m_new", "float", ir.Call("mf_maximum", (mm, ir.Call(
                "mf_simd_max", (top,))))),
            ir.Decl("mf_corr", "float", online.rescale(mm, m_new)),
            ir.Assign(md, md * corr)]
        for v, k in zip(sc, keys):
            p = ir.Var(f"mf_p{v.name[5:]}")
            out += [ir.Decl(p.name, "float", online.weight(v, m_new)),
                    ir.Assign(md, md + p),
                    ir.Assign(ir.Lane(ir.Var("mf_tg_pf"), k * ir.Lit(self.qt, "uint") + sg), p)]
        out += [ir.Assign(mm, m_new),
                ir.If(lane.eq(ir.Lit(0, "uint")), [
                    ir.Assign(ir.Lane(ir.Var("mf_tg_c"), sg), corr)])]
        # a row past the tile's end: weights 0 and factor 1, so that tile_values may add its
        # p v and rescale it unguarded (to accumulators never used)
        past: list[ir.Stmt] = [ir.Assign(ir.Lane(ir.Var("mf_tg_pf"), k * ir.Lit(self.qt, "uint")
                                                 + sg), ir.Lit(0.0, "float")) for k in keys]
        past.append(ir.If(lane.eq(ir.Lit(0, "uint")), [
            ir.Assign(ir.Lane(ir.Var("mf_tg_c"), sg), ir.Lit(1.0, "float"))]))
        return [ir.If(sg < ir.Var("mf_nlive"), out, past)]

    def tile_values(self) -> list[ir.Stmt]:
        """This simdgroup's accumulators (every row) rescaled by the rows' factors, then
        acc[t] += p[t] v for its mf_ks keys of the tile one after another, the lanes over E
        reading v from the staged tile once for all rows (the narrow kernel: in key streams of
        NARROW_LANES lanes). Each key's weights of all rows are one read (float4s when the
        rows are a multiple of 4). Per stretch of vlanes x run elements, the lane's run
        consecutive ones as one vec<T, run> read when E is a multiple of run (mf_run_ok: the
        lane's run is wholly inside E or past it, decided once per stretch, not per key), else
        one by one (guarded)."""
        f, run, qt = self.form, self.run, self.qt
        u, x, t = ir.Var("mf_u"), ir.Var("mf_x"), ir.Var("mf_t")
        acc = ir.Lane(ir.Var("mf_racc"), t * ir.Lit(self.epl, "uint") + ir.Var("mf_j"))
        pk = ir.Lane(ir.Var("mf_pk"), t)
        vnodes = [n for n in self.kv if n in topo_order([f.values])]

        def add(reads: Mapping[Node, ir.Expr]) -> list[ir.Stmt]:
            vals = self.lowering("mf_w")
            vals.values.update(self.staged)
            vals.values.update(reads)
            body = vals.lower([f.values])
            self.helpers |= vals.helpers
            return body + [ir.Assign(acc, acc + pk * _float(vals.value(f.values), f.values))]

        streams = SIMD_WIDTH // self.vlanes
        if qt % 4 == 0:
            y, z = ir.Var("mf_y"), ir.Var("mf_z")
            weights: list[ir.Stmt] = [ir.For("mf_y", "uint", ir.Lit(0, "uint"),
                                             ir.Lit(qt // 4, "uint"), [
                ir.Decl("mf_p4", "float4", ir.Load("mf_tg_pf", u * ir.Lit(qt, "uint")
                                                   + y * ir.Lit(4, "uint"), 4, "float",
                                                   space="threadgroup")),
                ir.For("mf_z", "uint", ir.Lit(0, "uint"), ir.Lit(4, "uint"), [
                    ir.Assign(ir.Lane(ir.Var("mf_pk"), y * ir.Lit(4, "uint") + z),
                              ir.Lane(ir.Var("mf_p4"), z))], unroll=True)], unroll=True)]
        else:
            weights = [ir.For("mf_t", "uint", ir.Lit(0, "uint"), ir.Lit(qt, "uint"), [
                ir.Assign(pk, ir.Lane(ir.Var("mf_tg_pf"), u * ir.Lit(qt, "uint") + t))],
                unroll=True)]
        weights.insert(0, ir.ArrayDecl("mf_pk", "float", qt))

        def each_key(body: list[ir.Stmt]) -> ir.Stmt:
            """body for the simdgroup's keys of the tile: every one, or (narrow) every
            streams-th from the lane's stream."""
            first: ir.Expr = ir.Var("mf_u0")
            step: Optional[ir.Expr] = None
            if streams > 1:
                first = first + ir.Var("mf_lane") / ir.Lit(self.vlanes, "uint")
                step = ir.Lit(streams, "uint")
            return ir.For("mf_u", "uint", first, ir.Var("mf_u1"), [
                ir.Decl("mf_l", IDX, ir.Var("mf_tk") + ir.Cast(IDX, u)), *weights, *body],
                step=step)
        by_elems = each_key([self.each_row([self.lanes(add(self.tile_reads()))])])
        each: ir.Stmt = by_elems
        # a vector of run elements is aligned: rows start 16-byte aligned at multiples of vw
        # elements (plus PAD_BYTES), the lane's run at a multiple of run
        if run in (2, 4) and self.vw % run == 0:
            e0 = ir.Var("mf_e0")
            reads: list[ir.Stmt] = []
            for n in vnodes:
                arr = self.kv[n]
                st = self.in_stype(self.tensor_of(n))
                reads.append(ir.Decl(f"{arr}v", ir.vector_type(st, run), ir.Load(
                    arr, u * ir.Var(f"{arr}_stride") + e0, run, st, space="threadgroup")))
                # converted once for all the rows
                ct = compute_type(self.tensor_of(n).dtype)
                reads += [ir.ArrayDecl(f"{arr}f", ct, run), ir.For(
                    "mf_x", "uint", ir.Lit(0, "uint"), ir.Lit(run, "uint"), [ir.Assign(
                        ir.Lane(ir.Var(f"{arr}f"), x),
                        ir.Cast(ct, ir.Lane(ir.Var(f"{arr}v"), x)))], unroll=True)]
            regs = {n: ir.Lane(ir.Var(f"{self.kv[n]}f"), x) for n in vnodes}
            # rows past the tile's end have weight 0 (tile_softmax): unguarded when the
            # values read nothing but the tile and the staged rows
            rows = self.rows_reading([f.values], set(vnodes) | set(self.staged))
            by_runs = ir.For("mf_s", "uint", ir.Lit(0, "uint"), ir.Lit(self.epl // run, "uint"), [
                ir.Decl("mf_e0", "uint", ir.Var("mf_s") * ir.Lit(self.vlanes * run, "uint")
                        + self.vlane() * ir.Lit(run, "uint")),
                ir.If(ir.Cast(IDX, e0) < self.size(f.e), [each_key(reads + [rows([
                    ir.For("mf_x", "uint", ir.Lit(0, "uint"), ir.Lit(run, "uint"), [
                        ir.Decl("mf_j", "uint", ir.Var("mf_s") * ir.Lit(run, "uint") + x),
                        ir.Decl("mf_e", "uint", e0 + x), *add(regs)], unroll=True)])])])],
                unroll=True)
            each = ir.If(ir.Var("mf_run_ok"), [by_runs], [by_elems])
        return [
            ir.Comment("the values: this simdgroup's accumulators rescaled by each row's "
                       "factor, then acc[t] += p[t] v over its keys of the tile"),
            self.every_row([ir.Decl("mf_c", "float", ir.Lane(ir.Var("mf_tg_c"), t)),
                             self.slots([ir.Assign(acc, acc * ir.Var("mf_c"))])]),
            ir.Decl("mf_u0", "uint", ir.Var("mf_sg") * ir.Var("mf_ks")),
            ir.Decl("mf_u1", "uint", ir.Call("min", (ir.Var("mf_u0") + ir.Var("mf_ks"),
                                                     ir.Var("mf_tn")))),
            ir.Comment(f"{run} consecutive elements a lane per stretch of "
                       f"{self.vlanes * run}" + (
                           f"; {streams} key streams of {self.vlanes} lanes taking the keys "
                           f"in turn" if streams > 1 else "")),
            each]

    def stage_kv_body(self) -> list[ir.Stmt]:
        """The stage_kv decode kernel after its head: q staged, then per tile of mf_kt keys:
        the group fills the K/V tiles, a barrier; each simdgroup scores its mf_ks keys of the
        tile against every row (tile_scores), a barrier; simdgroup t updates row t's online
        softmax (tile_softmax), a barrier; each simdgroup adds p v of its keys to its
        accumulators of every row (tile_values), a barrier before the next tile overwrites
        them. Then each row's accumulators are summed across the simdgroups through
        threadgroup memory, and simdgroup t writes row t's state."""
        f, qt = self.form, self.qt
        lane, kt, sg = ir.Var("mf_lane"), ir.Var("mf_kt"), ir.Var("mf_sg")
        self.tg_decls += [
            ir.ArrayDecl("mf_tg_s", "float", qt * self.kt_max, "threadgroup"),
            ir.ArrayDecl("mf_tg_p", "float4", qt * self.kt_max // 4, "threadgroup"),
            ir.ArrayDecl("mf_tg_c", "float", qt, "threadgroup")]
        self.tg_bytes += 4 * (2 * qt * self.kt_max + qt)
        racc = ir.Lane(ir.Var("mf_racc"), ir.Var("mf_t") * ir.Lit(self.epl, "uint")
                       + ir.Var("mf_j"))
        setup: list[ir.Stmt] = [
            ir.Decl("mf_tid", "uint", sg * SIMD + lane),
            ir.Comment(f"scores: the {qt} simdgroups split each tile's keys, mf_ks each; lane "
                       f"mf_key of them, part mf_part of its E chunks (32 / mf_ks lanes per "
                       f"key)"),
            ir.Decl("mf_ks", "uint", kt / ir.Lit(qt, "uint")),
            ir.Decl("mf_key", "uint", sg * ir.Var("mf_ks") + lane % ir.Var("mf_ks")),
            ir.Decl("mf_part", "uint", lane / ir.Var("mf_ks")),
            ir.Decl("mf_parts", "uint", SIMD / ir.Var("mf_ks")),
            *self.tile_arrays(),
            ir.Comment("the keys' weights of all rows side by side, as floats"),
            ir.Decl("mf_tg_pf", "threadgroup float*", ir.Call(
                "reinterpret_cast<threadgroup float*>", (ir.Var("mf_tg_p"),)), const=False),
            ir.Comment("the simdgroup's row's online-softmax state (running max, lane-partial "
                       "sum) and its accumulators of every row over its keys"),
            ir.Decl("mf_mm", "float", NEG_INF, const=False),
            ir.Decl("mf_md", "float", ir.Lit(0.0, "float"), const=False),
            ir.ArrayDecl("mf_racc", "float", qt * self.epl),
            ir.For("mf_t", "uint", ir.Lit(0, "uint"), ir.Lit(qt, "uint"), [
                self.slots([ir.Assign(racc, ir.Lit(0.0, "float"))])], unroll=True)]
        step: list[ir.Stmt] = [ir.Decl("mf_tn", "uint", ir.Cast("uint", ir.Call("min", (
                    ir.Var("mf_l1") - ir.Var("mf_tk"), ir.Cast(IDX, kt)))))]
        fill = self.fill_tiles()
        if self.q_stores:                        # before the copies' barrier
            assert isinstance(fill[-1], ir.Barrier)
            fill[-1:-1] = [ir.Comment("the first tile: the rows' q (loaded before the loop) into "
                                      "threadgroup memory"),
                           ir.If(ir.Var("mf_tk").eq(ir.Var("mf_l0")), self.q_stores)]
        step += fill
        step += self.tile_scores() + [ir.Barrier()]
        step += self.tile_softmax() + [ir.Barrier()]
        step += self.tile_values()
        step += [ir.Comment("every simdgroup is done with the tile before it is refilled"),
                 ir.Barrier()]
        loop = ir.For("mf_tk", IDX, ir.Var("mf_l0"), ir.Var("mf_l1"), step,
                      step=ir.Cast(IDX, kt))
        return setup + [ir.Comment(f"one pass over the block's keys along '{f.key}', a tile "
                                   "at a time (scores never stored)"), loop] + self.sum_rows()

    def sum_rows(self) -> list[ir.Stmt]:
        """After the keys: each row's accumulators summed over the simdgroups (with key
        streams, over the streams first, by shuffles) through threadgroup memory (the K tile's,
        free now, where it holds them), into simdgroup t's mf_macc for row t; then simdgroup t
        writes row t's state."""
        qt, emax = self.qt, self.vlanes * self.epl
        t, sg, lane = ir.Var("mf_t"), ir.Var("mf_sg"), ir.Var("mf_lane")
        racc = ir.Lane(ir.Var("mf_racc"), t * ir.Lit(self.epl, "uint") + ir.Var("mf_j"))
        acc = ir.Lane(ir.Var("mf_macc"), ir.Var("mf_j"))
        red = ir.Var("mf_red")
        e = self.slot_e()
        first = next(iter(self.kv.values()))
        if qt * emax * 4 <= TILE_BYTES:
            where: ir.Stmt = ir.Decl("mf_red", "threadgroup float*", ir.Call(
                "reinterpret_cast<threadgroup float*>", (ir.Var(f"mf_tg_{first[3:]}"),)),
                const=False)
        else:
            self.tg_decls.append(ir.ArrayDecl("mf_tg_red", "float", qt * emax, "threadgroup"))
            self.tg_bytes += 4 * qt * emax
            where = ir.Decl("mf_red", "threadgroup float*", ir.Var("mf_tg_red"), const=False)
        total: ir.Expr = ir.Lane(red, e)
        for s in range(1, qt):
            total = total + ir.Lane(red, ir.Lit(s * emax, "uint") + e)
        own = lane < ir.Lit(self.vlanes, "uint")
        self.row_of = ir.Var("mf_sg")
        write = self.write_row()
        self.row_of = None
        put = self.slots([ir.Decl("mf_e", "uint", e), ir.Assign(
            ir.Lane(red, sg * ir.Lit(emax, "uint") + ir.Var("mf_e")), racc)])
        out: list[ir.Stmt] = []
        if self.vlanes != SIMD_WIDTH:
            out += [ir.Comment("the key streams' accumulators summed (the first stream's lanes "
                               "then hold them)"),
                    self.each_row([ir.For("mf_off", "uint", ir.Lit(self.vlanes, "uint"), SIMD, [
                        self.slots([ir.Assign(racc, racc + ir.Call("simd_shuffle_xor", (
                            racc, ir.Var("mf_off"))))])], step=ir.Var("mf_off"))])]
        return out + [
            ir.Comment("row by row: the simdgroups' accumulators summed through threadgroup "
                       "memory by the row's simdgroup"),
            where,
            ir.ArrayDecl("mf_macc", "float", self.epl),
            self.slots([ir.Assign(acc, ir.Lit(0.0, "float"))]),
            self.each_row([
                put if self.vlanes == SIMD_WIDTH else ir.If(own, [put]),
                ir.Barrier(),
                ir.If(sg.eq(t), [self.slots([ir.Assign(acc, total)])]),
                ir.Barrier()]),
            ir.Comment("the row's state: d summed over the lanes, then the outputs or the "
                       "block's state"),
            ir.If(sg < ir.Var("mf_nlive"), [
                ir.Assign(ir.Var("mf_md"), ir.Call("simd_sum", (ir.Var("mf_md"),))),
                ir.If(own, [write]) if self.vlanes != SIMD_WIDTH else write])]

    def tile_position(self, axis: str, t: ir.Expr) -> ir.Expr:
        """Row t of the tile's position along tile axis `axis` (as `tile` computes it)."""
        r = ir.Cast(IDX, ir.Var("mf_tile") * ir.Lit(self.qt, "uint") + t)
        k = self.tile_axes.index(axis)
        inner = self.tile_axes[k + 1:]
        e = r / self.span(inner) if inner else r
        return e % self.size(axis) if k > 0 else e

    # -- the kernels ----------------------------------------------------------------------
    def decode_kernel(self, variant: str = "decode") -> ir.LoweredKernel:
        """A threadgroup per (rows that share keys, block of keys): its simdgroups take turns
        over the block's keys, each running mf_kp key streams of mf_w lanes; each stream keeps
        an online-softmax state per row; the states merge across streams (shuffles), then
        simdgroups (threadgroup memory); one block per row writes the outputs, several write
        partial states for the merge kernel. With stage_kv, the stage_kv kernel `variant`
        (decode, narrow or wide: see stage_kv_kernel)."""
        f = self.form
        nsg = self.policy.threads_per_group // SIMD_WIDTH
        emax = SIMD_WIDTH * self.epl
        threads = (ir.ThreadInput("mf_group", "uint", "threadgroup_position_in_grid"),
                   ir.ThreadInput("mf_sg", "uint", "simdgroup_index_in_threadgroup"),
                   ir.ThreadInput("mf_lane", "uint", "thread_index_in_simdgroup"))
        self.pre, self.pre_names, self.tiled = [], set(), True
        if self.policy.stage_kv:
            return self.stage_kv_kernel(threads, variant)
        self.tg_decls = self.shared_states(nsg, emax)
        self.tg_bytes = 4 * nsg * (2 + emax)
        head = self.group_head(nsg) + self.tile() + self.block_keys()
        staged = self.stage()
        if self.policy.lane_scores:
            values = set(topo_order([f.values]))
            self.streamed = {n for n in self.kv if n in values}
            step: list[ir.Stmt] = [ir.Decl("mf_l", IDX, ir.Var("mf_step")
                                           + ir.Cast(IDX, ir.Var("mf_lane")))]
            step += self.lane_dots() + self.lane_softmax() + self.lane_values()
            loop = ir.For("mf_step", IDX, ir.Var("mf_l0") + ir.Cast(IDX, ir.Var("mf_sg") * SIMD),
                          ir.Var("mf_l1"), step, step=ir.Lit(SIMD_WIDTH * nsg, IDX))
            tail = self.merge_lanes() + self.share(nsg, emax)
        else:
            self.streamed = set(self.kv)
            step = self.load_keys() + self.dots() + self.softmax_step() + self.accumulate()
            per_step = ir.Cast(IDX, ir.Var("mf_kp") * ir.Lit(self.kps, "uint"))
            loop = ir.For("mf_base", IDX,
                          ir.Var("mf_l0") + ir.Cast(IDX, ir.Var("mf_sg")) * per_step,
                          ir.Var("mf_l1"), step, step=per_step * ir.Lit(nsg, IDX))
            tail = self.merge_streams() + self.share(nsg, emax)
        scan: list[ir.Stmt] = [ir.Comment(f"one pass over the block's keys along '{f.key}' "
                                          f"(scores never stored)"), loop]
        tg = self.tg_decls
        body = head + self.pre + staged + self.state() + scan + tail
        self.tiled = False
        summary = (f"{self.graph.name} (decode): softmax over '{f.key}' of scores contracting "
                   f"'{f.e}', times the values, summed over '{f.key}'; a threadgroup per "
                   f"{self.qt} query rows sharing their keys and block of keys, {nsg} "
                   f"simdgroups over the keys"
                   + (", each lane scoring keys of its own" if self.policy.lane_scores else "")
                   + ", online softmax in one pass, fp32 state")
        return make_kernel(self.graph, self.index64, threads, tg + body, summary, "decode",
                           params=self.params, helpers=tuple(sorted(self.helpers)))

    def stage_kv_kernel(self, threads: tuple[ir.ThreadInput, ...],
                        variant: str) -> ir.LoweredKernel:
        """The decode kernel with stage_kv (see stage_kv_body): a threadgroup of one simdgroup
        per query row of the tile, the simdgroups splitting each tile's keys; K/V tiles in
        threadgroup memory. Each variant holds only the E its calls have (an accumulator per
        row for each `run` elements a lane): `decode` E up to 32 x run, `narrow` up to
        NARROW_LANES x run with the values loop's lanes in 32 / NARROW_LANES key streams,
        `wide` up to 32 x reads_per_thread."""
        f = self.form
        policy_epl = self.epl
        self.epl = policy_epl if variant == "wide" else self.run
        self.tg_decls, self.tg_bytes = [], 0
        head = self.group_head(self.qt) + self.tile() + self.block_keys()
        staged = self.stage()
        self.over_e, self.vlanes = True, NARROW_LANES if variant == "narrow" else SIMD_WIDTH
        self.kt_max = NARROW_TILE_KEYS if variant == "narrow" else TILE_KEYS
        scan = self.stage_kv_body()
        emax = self.vlanes * self.epl
        self.over_e = self.tiled = False
        self.vlanes, self.epl = SIMD_WIDTH, policy_epl
        body = self.tg_decls + head + self.pre + staged + scan
        name = "decode" if variant == "decode" else f"decode_{variant}"
        summary = (f"{self.graph.name} ({name}, stage_kv): softmax over '{f.key}' of scores "
                   f"contracting '{f.e}' (up to {emax}), times the values, summed over "
                   f"'{f.key}'; a threadgroup per {self.qt} query rows sharing their keys and "
                   f"block of keys, a simdgroup per row; tiles of K and V staged in "
                   f"threadgroup memory by the whole group, each simdgroup scoring its share of "
                   f"a tile's keys against every row (a lane per key) and adding their p v for "
                   f"every row, the lanes over E"
                   + (f" in {SIMD_WIDTH // NARROW_LANES} key streams of {NARROW_LANES} lanes"
                      if variant == "narrow" else "")
                   + "; online softmax in one pass, fp32 state")
        return make_kernel(self.graph, self.index64, threads, body, summary, name,
                           params=self.params, helpers=tuple(sorted(self.helpers)),
                           max_threads=self.group)

    def merge_kernel(self) -> ir.LoweredKernel:
        """Threadgroups of MERGE_SIMDGROUPS simdgroups, mf_parts per query row, each for the
        elements of E that mf_wp (at most MERGE_LANES) of a block's mf_w lanes hold. Every
        simdgroup finds the largest max M of all the row's key blocks (a block per lane), then
        sums d_s exp(m_s - M) and acc_s exp(m_s - M) over its share of the blocks: its kp
        streams of mf_wp lanes (a lane holds reads_per_thread elements of E) take MERGE_STEP
        blocks each at a time, their loads issued before any is used, and are summed by
        shuffles. Under one M the simdgroups' sums need no rescaling: through threadgroup
        memory, each thread adds them for its elements of E and writes their outputs (the
        first simdgroup alone took ~400 serial instructions for them on an H100)."""
        emax, nsg = SIMD_WIDTH * self.epl, MERGE_SIMDGROUPS
        threads = (ir.ThreadInput("mf_group", "uint", "threadgroup_position_in_grid"),
                   ir.ThreadInput("mf_sg", "uint", "simdgroup_index_in_threadgroup"),
                   ir.ThreadInput("mf_lane", "uint", "thread_index_in_simdgroup"))
        self.pre, self.pre_names = [], set()
        splits, lane = ir.Var("mf_splits"), ir.Var("mf_lane")
        wp, part = ir.Var("mf_wp"), ir.Var("mf_part")
        span = wp * ir.Lit(self.epl, "uint")            # the threadgroup's elements of E

        def each_element(body: list[ir.Stmt]) -> ir.Stmt:
            """Thread mf_sg * 32 + mf_lane: elements mf_e of the threadgroup's part of E
            from it, every 32 x nsg-th, the simdgroups' sums added."""
            e, s = ir.Var("mf_e"), ir.Var("mf_s")
            return ir.For("mf_e", "uint", part * span + ir.Var("mf_sg") * SIMD + lane,
                          ir.Call("min", (ir.Cast("uint", self.size(self.form.e)),
                                          (part + ir.Lit(1, "uint")) * span)), [
                              ir.Decl("mf_md", "float", ir.Lit(0.0, "float"), const=False),
                              ir.Decl("mf_ae", "float", ir.Lit(0.0, "float"), const=False),
                              ir.For("mf_s", "uint", ir.Lit(0, "uint"), ir.Lit(nsg, "uint"), [
                                  ir.Assign(ir.Var("mf_md"),
                                            ir.Var("mf_md") + ir.Lane(ir.Var("mf_tg_d"), s)),
                                  ir.Assign(ir.Var("mf_ae"), ir.Var("mf_ae") + ir.Lane(
                                      ir.Var("mf_tg_acc"), s * ir.Lit(emax, "uint") + e))],
                                  unroll=True),
                              *body], step=ir.Lit(nsg * SIMD_WIDTH, "uint"))
        fin = self.epilogue(ir.Var("mf_ae"), each_element)
        b0, b1 = ir.Var("mf_b0"), ir.Var("mf_b1")
        base = ir.Cast(IDX, ir.Var("mf_row")) * ir.Cast(IDX, splits)
        s, u, j = ir.Var("mf_s"), ir.Var("mf_u"), ir.Var("mf_j")
        mm, md = ir.Var("mf_mm"), ir.Var("mf_md")
        zero = ir.Lit(0, "uint")
        self.helpers.add("mf_simd_max")

        def at(s: ir.Expr, k: ir.Expr) -> ir.Expr:
            return ir.Load("mf_scratch", (base + ir.Cast(IDX, s)) * ir.Lit(emax + 2, IDX) + k)

        def weight(m: ir.Expr) -> ir.Expr:
            return online.share(m, mm)
        mv = ir.Lane(ir.Var("mf_mv"), u)
        av = ir.Lane(ir.Var("mf_av"), u * ir.Lit(self.epl, "uint") + j)
        acc = ir.Lane(ir.Var("mf_macc"), j)
        e = ir.Var("mf_sub") * ir.Lit(self.epl, "uint") + j
        dv = ir.Lane(ir.Var("mf_dv"), u)

        def load_step(s0: ir.Expr) -> ir.Stmt:
            """The lane's MERGE_STEP blocks of the step from block s0: m, d and its E slots."""
            return ir.For("mf_u", "uint", zero, ir.Lit(MERGE_STEP, "uint"), [
                ir.Decl("mf_s", "uint", s0 + u * ir.Var("mf_kp") + ir.Var("mf_grp")),
                ir.Assign(mv, ir.Select(s < b1, at(s, ir.Lit(0, IDX)), NEG_INF)),
                ir.Assign(dv, ir.Select(s < b1, at(s, ir.Lit(1, IDX)), ir.Lit(0.0, "float"))),
                self.slots([ir.Assign(av, ir.Lit(0.0, "float")),
                            ir.If((s < b1).and_(ir.Cast(IDX, e) < self.size(self.form.e)),
                                  [ir.Assign(av, at(s, ir.Lit(2, IDX) + ir.Cast(IDX, e)))])])],
                unroll=True)
        add = ir.For("mf_u", "uint", zero, ir.Lit(MERGE_STEP, "uint"), [
            ir.Decl("mf_c", "float", weight(mv)),
            ir.Assign(md, md + dv * ir.Var("mf_c")),
            self.slots([ir.Assign(acc, acc + av * ir.Var("mf_c"))])], unroll=True)
        per = ir.Var("mf_kp") * ir.Lit(MERGE_STEP, "uint")
        share = ir.Var("mf_share")
        off = ir.Var("mf_off")
        tg_d, tg_acc = ir.Var("mf_tg_d"), ir.Var("mf_tg_acc")
        sg, grp = ir.Var("mf_sg"), ir.Var("mf_grp")
        own: list[ir.Stmt] = [
            ir.Comment(f"the first {MERGE_STEP} blocks of each of the simdgroup's kp streams, "
                       "loaded before M is known (their loads and M's in one round)"),
            ir.ArrayDecl("mf_mv", "float", MERGE_STEP),
            ir.ArrayDecl("mf_dv", "float", MERGE_STEP),
            ir.ArrayDecl("mf_av", "float", MERGE_STEP * self.epl),
            load_step(b0),
            ir.Comment("M: the largest max of all the row's blocks (every simdgroup, a block "
                       "per lane), so that the simdgroups' sums below need no rescaling"),
            ir.Decl("mf_mm", "float", NEG_INF, const=False),
            ir.For("mf_s", "uint", lane, splits, [ir.Assign(mm, ir.Call(
                "mf_maximum", (mm, at(s, ir.Lit(0, IDX)))))], step=SIMD),
            ir.Assign(mm, ir.Call("mf_simd_max", (mm,))),
            ir.Comment(f"this simdgroup's blocks: d = sum d_s exp(m_s - M) and acc likewise; kp "
                       f"streams of blocks, {MERGE_STEP} blocks each at a time (the next step's "
                       "loads issued once the step is added), summed across the streams"),
            ir.Decl("mf_md", "float", ir.Lit(0.0, "float"), const=False),
            ir.ArrayDecl("mf_macc", "float", self.epl),
            self.slots([ir.Assign(acc, ir.Lit(0.0, "float"))]),
            ir.For("mf_s0", "uint", b0, b1, [
                add, ir.If(ir.Var("mf_s0") + per < b1, [load_step(ir.Var("mf_s0") + per)])],
                step=per),
            ir.For("mf_off", "uint", wp, SIMD, [
                ir.Assign(md, md + ir.Call("simd_shuffle_xor", (md, off))),
                self.slots([ir.Assign(acc, acc + ir.Call("simd_shuffle_xor", (acc, off)))])],
                step=off),
            ir.Comment("this simdgroup's sums for the threadgroup"),
            ir.If(lane.eq(zero), [ir.Assign(ir.Lane(tg_d, sg), md)]),
            ir.If(grp.eq(zero), [self.slots([ir.Assign(
                ir.Lane(tg_acc, sg * ir.Lit(emax, "uint") + e), acc)])])]
        body: list[ir.Stmt] = [
            ir.ArrayDecl("mf_tg_d", "float", nsg, "threadgroup"),
            ir.ArrayDecl("mf_tg_acc", "float", nsg * emax, "threadgroup"),
            ir.Comment(f"mf_parts threadgroups per query row, each the elements of E of up to "
                       f"{MERGE_LANES} lanes of a block (mf_wp); simdgroup mf_sg sums key blocks "
                       "[mf_b0, mf_b1), its lanes in parallel"),
            ir.Decl("mf_wp", "uint", ir.Call("min", (ir.Var("mf_w"),
                                                     ir.Lit(MERGE_LANES, "uint")))),
            ir.Decl("mf_parts", "uint", ir.Var("mf_w") / wp),
            ir.Decl("mf_row", "uint", ir.Var("mf_group") / ir.Var("mf_parts")),
            ir.Decl("mf_part", "uint", ir.Var("mf_group") % ir.Var("mf_parts")),
            ir.If(ir.Cast(IDX, ir.Var("mf_row")) >= self.span(self.rows), [ir.Return()]),
            ir.Decl("mf_sub", "uint", part * wp + lane % wp),
            ir.Decl("mf_grp", "uint", lane / wp),
            ir.Decl("mf_kp", "uint", SIMD / wp),
            ir.Comment(f"each simdgroup at least {MERGE_MIN_SHARE} blocks (its lanes load them "
                       "at once: fewer gain nothing)"),
            ir.Decl("mf_share", "uint", ir.Call("max", (
                (splits + ir.Lit(nsg - 1, "uint")) / ir.Lit(nsg, "uint"),
                ir.Lit(MERGE_MIN_SHARE, "uint")))),
            ir.Decl("mf_b0", "uint", ir.Call("min", (ir.Var("mf_sg") * share, splits))),
            ir.Decl("mf_b1", "uint", ir.Call("min", (b0 + share, splits))),
            *self.pre,
            ir.Block(own),
            ir.Barrier(),
            ir.Comment("each thread its elements of E: the simdgroups' sums added; outputs: "
                       "acc / d (all keys masked: 0 / 0 = NaN)"),
            fin]
        summary = (f"{self.graph.name} (merge): the online-softmax states of a query row's key "
                   f"blocks merged, then the outputs; threadgroups of {nsg} simdgroups per "
                   f"query row, each for a part of E")
        return make_kernel(self.graph, self.index64, threads, body, summary, "merge",
                           params=self.params, helpers=tuple(sorted(self.helpers)))

    def build(self) -> AttentionSchedule:
        base = kernel_params(self)
        extra = [ir.Argument("mf_scratch", len(base), "buffer", "float", ("scratch",), True),
                 ir.Argument("mf_splits", len(base) + 1, "scalar", "uint",
                             ("launch", "key_splits"), cast="int32"),
                 ir.Argument("mf_w", len(base) + 2, "scalar", "uint",
                             ("launch", "lanes_per_key"), cast="int32")]
        if self.policy.stage_kv:
            extra.append(ir.Argument("mf_kt", len(base) + 3, "scalar", "uint",
                                     ("launch", "keys_per_tile"), cast="int32"))
        self.params = base + tuple(extra)
        self.helpers.add("mf_maximum")
        decode = self.decode_kernel()
        narrow = self.decode_kernel("narrow") if self.policy.stage_kv else None
        wide = self.decode_kernel("wide") if self.policy.stage_kv and self.epl > self.run \
            else None
        prefill = prefill_kernel(self, MATRIX_ROWS, NARROW_TILE_KEYS) \
            if self.policy.matrix_rows else None
        merge = self.merge_kernel()
        vector = tuple(dict.fromkeys(self.tensor_of(n).name for n in self.kv)) \
            if self.vw > 1 else ()
        policy = replace(self.policy, uses_simd=True, threadgroup_bytes=self.tg_bytes,
                         vector_width=self.vw)
        validate(policy)
        return AttentionSchedule("attention", self.graph, policy, decode,
                                 (*self.rows, self.form.e), vector, self.index64,
                                 l_axis=self.form.key, e_axis=self.form.e, rows=self.rows,
                                 max_e=SIMD_WIDTH * self.epl, merge=merge, narrow=narrow,
                                 narrow_e=NARROW_LANES * self.run, wide=wide,
                                 mid_e=SIMD_WIDTH * self.run, prefill=prefill,
                                 prefill_e=SIMD_WIDTH * self.run,
                                 own_axes=self.own_axes, tile_axes=self.tile_axes, qt=self.qt,
                                 tile_items=tuple(self.tensor_of(n).dtype.itemsize
                                                  for n in self.kv) if self.policy.stage_kv
                                 else (), tile_vw=self.vw,
                                 bounds=tuple(self.key_bounds()), kv_reads=tuple(self.kv))


# index(L) <op> f as a bound on the keys: (kind, what to add to f)
_BOUND = {"lt": ("hi", 0), "le": ("hi", 1), "gt": ("lo", 1), "ge": ("lo", 0)}
_MIRROR = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}
_INT_ARITH = ("add", "sub", "mul", "floordiv", "maximum", "minimum")


def _conjuncts(n: Node) -> list[Node]:
    n = strip_casts(n)
    if n.op == Op.BINARY and n.attr == "and":
        return _conjuncts(n.args[0]) + _conjuncts(n.args[1])
    return [n]


def _is_index(n: Node, axis: str) -> bool:
    return n.op == Op.INDEX and n.attr == axis


def _key_free_int(n: Node, key: str) -> bool:
    """An integer expression of indices other than `key`, sizes, integer scalars and
    constants (the same for every key of a row)."""
    n = strip_casts(n)
    if not n.dtype.is_int:
        return False
    if n.op in (Op.SIZE, Op.SCALAR) or (n.op == Op.INDEX and n.attr != key):
        return True
    if n.op == Op.CONST:
        return isinstance(n.attr, int) and not isinstance(n.attr, bool)
    return n.op == Op.BINARY and n.attr in _INT_ARITH and all(
        _key_free_int(a, key) for a in n.args)


def _float(e: ir.Expr, n: Node) -> ir.Expr:
    return e if compute_type(n.dtype) == "float" else ir.Cast("float", e)
