"""The attention schedule's host side: which kernel a call launches (`host_name`), its key
blocks and threadgroups (`splits`, `launch`, `steps`), scratch, launch values, the bytes it
moves (`traffic`, counting only the keys the mask lets it read) and the sizes that select each
kernel (testing's coverage)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

import torch

from ... import ir
from ...errors import LaunchError, ShapeError
from ...graph import Node, Op, topo_order
from ...reference import evaluate_expressions
from ...shapes import numel
from ..base import Schedule, Step, Traffic
from ..hardware import SIMD_WIDTH
from .params import (
    MATRIX_GROUP,
    MATRIX_ROWS,
    MERGE_LANES,
    MERGE_SIMDGROUPS,
    MIN_KEYS,
    MIN_STAGED_KEYS,
    NARROW_PREFILL_E,
    NARROW_TILE_KEYS,
    PAD_BYTES,
    TARGET_GROUPS,
    TARGET_GROUPS_RESIDENT,
    TARGET_GROUPS_STAGED,
    TILE_BYTES,
    TILE_KEYS,
    lanes_per_key,
)


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
    prefill_rows: int = MATRIX_ROWS             # ... query rows a tile
    prefill_keys: int = 0                       # ... keys a staged tile (0: keys_per_tile's rule;
                                                # set: flash.py's kernel, TARGET_GROUPS_RESIDENT)
    prefill_narrow: Optional[ir.LoweredKernel] = None   # flash.py's, E up to NARROW_PREFILL_E
    prefill_narrow_keys: int = 0                        # ... its keys a staged tile
    prefill_weights: Optional[tuple[Node, torch.dtype]] = None  # P, rounded to this to multiply V
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
        return tuple(k for k in (self.kernel, self.narrow, self.wide, self.prefill,
                                 self.prefill_narrow, self.merge)
                     if k is not None)

    def _rows(self, sizes: Mapping[str, int]) -> int:
        return numel(self.rows, sizes)

    def _prefill(self, sizes: Mapping[str, int]) -> bool:
        """Whether a call with these sizes runs a prefill kernel (matrix products): at least
        matrix_rows query rows share their keys and E fits it."""
        rows = self.policy.matrix_rows
        return self.prefill is not None and rows > 0 and sizes[self.e_axis] <= self.prefill_e \
            and numel(self.tile_axes, sizes) >= rows

    def _tile_rows(self, sizes: Mapping[str, int]) -> int:
        return self.prefill_rows if self._prefill(sizes) else self.qt

    def _tiles(self, sizes: Mapping[str, int]) -> int:
        """Threadgroups per key block: own rows x tiles of rows sharing keys."""
        tiled = numel(self.tile_axes, sizes)
        return numel(self.own_axes, sizes) * -(-tiled // self._tile_rows(sizes))

    def _per_block(self) -> int:
        if self.policy.stage_kv:                # the simdgroups share every key
            return MIN_STAGED_KEYS
        return self.policy.threads_per_group // SIMD_WIDTH * MIN_KEYS

    def _group(self, sizes: Optional[Mapping[str, int]] = None) -> int:
        """Threads per group of the decode kernel (stage_kv: a simdgroup per row of the tile;
        the prefill kernel: one per 8 rows)."""
        if sizes is not None and self._prefill(sizes):
            return self._prefill_kernel(sizes).max_threads or MATRIX_GROUP
        return SIMD_WIDTH * self.qt if self.policy.stage_kv else self.policy.threads_per_group

    def _narrow_prefill(self, sizes: Mapping[str, int]) -> bool:
        """Whether a prefill call runs the narrow register-resident kernel (E up to
        NARROW_PREFILL_E)."""
        return self.prefill_narrow is not None and sizes[self.e_axis] <= NARROW_PREFILL_E

    def _prefill_kernel(self, sizes: Mapping[str, int]) -> ir.LoweredKernel:
        """The prefill kernel a prefill call runs (the narrow twin where it takes E)."""
        if self.prefill_narrow is not None and self._narrow_prefill(sizes):
            return self.prefill_narrow
        assert self.prefill is not None
        return self.prefill

    def _narrow(self, sizes: Mapping[str, int]) -> bool:
        """Whether a call with these sizes runs the narrow decode kernel (and its tiles)."""
        return self.narrow is not None and sizes[self.e_axis] <= self.narrow_e

    def keys_per_tile(self, sizes: Mapping[str, int]) -> int:
        """stage_kv: keys per staged tile, TILE_KEYS (the narrow kernel's calls:
        NARROW_TILE_KEYS) unless a tile's rows (E rounded up to whole chunks, padded by
        PAD_BYTES) would not fit its TILE_BYTES: then the largest power of two that does; 0 if
        none fits."""
        if self.prefill_keys and self._prefill(sizes):
            return self.prefill_narrow_keys if self._narrow_prefill(sizes) else self.prefill_keys
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
        if self.prefill_keys and self._prefill(sizes):        # the register-resident prefill
            target = TARGET_GROUPS_RESIDENT
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
        owns, tiled = numel(self.own_axes, sizes), numel(self.tile_axes, sizes)
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
            kv += numel(n.axes if n.op == Op.TAKE else t.axes, sizes) \
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

    def rounded_operands(self, sizes: Mapping[str, int]) -> dict[Node, torch.dtype]:
        """The prefill kernels' weights P, rounded to the operand type to multiply V where a
        call runs them on half / bfloat operands."""
        if self.prefill_weights is None or not self._prefill(sizes):
            return {}
        p, dtype = self.prefill_weights
        return {p: dtype}

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
        counts = [self._rows(sizes) * sizes[self.e_axis], self.scratch_floats(sizes)] + [
            numel(t.axes, sizes) for t in self.graph.tensors]
        if not self.index64 and any(n >= 2 ** 31 for n in counts):   # no max(): an export
            raise LaunchError(f"{where}: {2 ** 31} elements or more need 64-bit indexing; "
                              "call it with launch={'index64': True}")   # traces this rule
        # a safety net: the policies validate() admits keep a tile's keys >= its rows (16 rows
        # already need more threadgroup memory than Metal has)
        if self.policy.stage_kv and self.keys_per_tile(sizes) < self.qt:
            raise LaunchError(f"{where}: stage_kv: a tile of {self.keys_per_tile(sizes)} keys "
                              f"('{self.e_axis}' = {sizes[self.e_axis]}) cannot give each of the "
                              f"rows_per_group={self.qt} simdgroups a key; lower rows_per_group "
                              f"or call it without stage_kv")
        if self.prefill is not None and self._prefill(sizes):
            return self._prefill_kernel(sizes).host_name
        if self.narrow is not None and self._narrow(sizes):
            return self.narrow.host_name
        if self.wide is not None and sizes[self.e_axis] > self.mid_e:
            return self.wide.host_name
        return self.kernel.host_name

    def selecting(self, host_name: str) -> list[dict[str, int]]:
        """Sizes that make a call launch kernel `host_name` (testing's coverage). The decode
        kernels (stage_kv): E = narrow_e for the narrow kernel and E just past the E of the
        kernel below for the others (narrow_e + 1, mid_e + 1); the prefill kernel: E = 33 (four
        whole 8-element blocks and one of a single element; beside a narrow prefill kernel,
        which takes those, NARROW_PREFILL_E + 1) with prefill_rows + 1 positions along the
        innermost tile axis a tensor names. Each kernel gets two examples (`_two_ways`)."""
        main, narrow = self.prefill, self.prefill_narrow
        if main is not None and host_name in (main.host_name, narrow and narrow.host_name):
            axis = self._innermost(self.tile_axes)
            if axis is None:
                return []
            rows = {axis: self.prefill_rows + 1}
            if host_name != main.host_name:
                return self._two_ways(rows, 33, self.prefill_narrow_keys)
            if narrow is not None:                                # past the narrow kernel's E
                return self._two_ways(rows, NARROW_PREFILL_E + 1, self.prefill_keys)
            return self._two_ways(rows, 33, self.prefill_keys or NARROW_TILE_KEYS)
        if self.narrow is None:
            return []
        pick = {self.narrow.host_name: self.narrow_e, self.kernel.host_name: self.narrow_e + 1}
        if self.wide is not None:
            pick[self.wide.host_name] = self.mid_e + 1
        if host_name not in pick:
            return []
        tile = self._innermost(self.tile_axes)
        rows = {} if tile is None else {tile: self.qt + 1}      # a tile and a partial one
        keys = NARROW_TILE_KEYS if host_name == self.narrow.host_name else TILE_KEYS
        return self._two_ways(rows, pick[host_name], keys)

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
        for k in (self.prefill, self.prefill_narrow):
            if k is not None and host_name == k.host_name:
                return k.max_threads or MATRIX_GROUP
        return self._group()
