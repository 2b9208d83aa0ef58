"""The quantized family's host side: which kernel a call launches (`variant`: by the rows of
x and the length of K), its grid, the sizes that select each kernel (testing's coverage), the
thresholds of K where a kernel's path changes, and the bytes a call moves."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional

from ... import ir
from ...errors import LaunchError
from ...graph import Node
from ...shapes import numel, size_multiple
from ..base import Schedule, Traffic
from ..hardware import SIMD_WIDTH
from . import pairing
from .gathers import MAX_STAGED_ROWS
from .params import TILED, WIDE
from .staged import STAGED_THREADS


@dataclass
class QuantSchedule(Schedule):
    axis: str = "K"
    rows_axis: str = "N"                 # the output's innermost axis: blocks of rows
    outer: tuple[str, ...] = ()          # every output axis but K

    chunk: int = 32                      # values per lane per chunk
    variants: dict[str, ir.LoweredKernel] = field(default_factory=dict)   # qmv (qmv_split, ...)
    m_axis: Optional[str] = None         # the rows of x that qmvx and the tiled qmm block
    x_rows: int = 1                      # rows of x per simdgroup in qmvx
    splits: dict[str, int] = field(default_factory=dict)    # simdgroups per block, per kernel
    period: Optional[Node] = None        # Q of the paired kernel (`pairing`)
    # each tiled kernel's (qmm, qmm_wide) rows of x, weight rows, values of K a step and
    # threads (`build`)
    tiles: dict[str, tuple[int, int, int, int]] = field(default_factory=dict)

    @property
    def kernels(self) -> tuple[ir.LoweredKernel, ...]:
        return tuple(self.variants.values())

    @property
    def wide_rows(self) -> int:
        """The rows of x from which qmm_wide runs (where the kernel has it): qmm_wide_rows,
        and never below qmm_min_rows (it is a tiled kernel)."""
        return max(self.policy.qmm_min_rows, self.policy.qmm_wide_rows)

    def variant(self, sizes: Mapping[str, int]) -> str:
        """By the rows of x: qmm_wide from `wide_rows` on where its grid has
        qmm_wide_groups threadgroups or more (fewer, larger tiles leave cores idle) and qmm
        from qmm_min_rows on (where the kernel has them: the same tiled kernel, each with its
        own tile), qmvx (x_rows of them per simdgroup) from x_rows on, else qmv; each of the
        last two as its _split kernel where K is longer than one stretch of 32 chunks and
        the grid is small: qmv's
        with fewer than split_grid simdgroups per stretch each would walk (few simdgroups for
        their chains of loads), qmvx's with at most split_grid simdgroups (its simdgroups do
        x_rows times the arithmetic a load; H100, 2026-11-27: split, qmvx lost 10-25% at
        every grid of 512 simdgroups or more it was timed at, bench/README.md)."""
        if "qmv_prologue" in self.variants:
            return "qmv_prologue"
        m = 1 if self.m_axis is None else sizes[self.m_axis]
        if WIDE in self.variants and m >= self.wide_rows:
            tm, tn, _, _ = self.tiles[WIDE]
            if self.blocks(sizes, tn, tm) >= self.policy.qmm_wide_groups:
                return WIDE
        if "qmm" in self.variants and m >= self.policy.qmm_min_rows:
            return "qmm"
        name = "qmvx" if "qmvx" in self.variants and m >= self.x_rows else "qmv"
        if "qmv_staged" in self.variants:   # paired where the call's sizes pair every row
            if self.period is None or not pairing.fits(self.graph, self.period,
                                                       self.rows_axis, sizes):
                return "qmv_staged"
            name = "qmv_paired"
        stretches = -(-sizes[self.axis] // (SIMD_WIDTH * self.chunk))
        if name == "qmvx":
            small = self.simdgroups(sizes, self.x_rows) <= self.policy.split_grid
        else:
            small = self.simdgroups(sizes, 1) < self.policy.split_grid * stretches
        return f"{name}_split" if f"{name}_split" in self.variants and stretches > 1 \
            and small else name

    def blocks(self, sizes: Mapping[str, int], rows: int, x_rows: int) -> int:
        """Blocks of `rows` weight rows at each position of the other output axes, the rows of
        x (m_axis) `x_rows` at once."""
        blocks = -(-sizes[self.rows_axis] // rows)
        for a in self.outer[:-1]:
            blocks *= -(-sizes[a] // x_rows) if a == self.m_axis else sizes[a]
        return blocks

    def simdgroups(self, sizes: Mapping[str, int], x_rows: int) -> int:
        """Unsplit simdgroups: one per block of rows_per_group weight rows, x_rows rows of x."""
        return self.blocks(sizes, self.policy.rows_per_group, x_rows)

    def selecting(self, host_name: str) -> list[dict[str, int]]:
        """Sizes that make a call launch kernel `host_name` (testing's coverage): qmvx with a
        last block of x's rows that is partly past M; the _split kernels with K two stretches
        of chunks long, the others with one (rows of weights as few as testing draws); qmm
        with a tile of rows of x and of weight rows plus one each (rows past M and N) over two
        steps along K (the tiles rewritten, a step loaded ahead) and two groups or more, from
        the first M it runs at (qmm_wide: `wide_rows`; qmm: qmm_min_rows, below `wide_rows`)."""
        name = next((n for n, k in self.variants.items() if k.host_name == host_name), None)
        if name is None:
            return []
        if name == "qmv_staged":        # an odd size pairs no rows
            return [{self.rows_axis: 2 * self.policy.rows_per_group - 1}]
        if name.startswith("qmv_paired"):     # an even one does (K as qmv's, below)
            stretch = SIMD_WIDTH * self.chunk
            k = 2 * stretch if name.endswith("_split") else stretch
            return [{self.rows_axis: 2 * self.policy.rows_per_group, self.axis: k}]
        if name in TILED:
            return self._selecting_tiled(name)
        stretch = SIMD_WIDTH * self.chunk
        base = name.removesuffix("_split")
        pins = ({self.axis: 2 * stretch} if name != base else
                {self.axis: stretch} if f"{name}_split" in self.variants else {})
        if self.m_axis is None:
            return [pins] if pins else []
        top = self.policy.qmm_min_rows - 1 if "qmm" in self.variants else 1 << 30
        pick = {"qmvx": max(self.x_rows, min(top, self.x_rows + 1)),
                "qmv": 1 if "qmvx" in self.variants else max(1, top)}
        return [{**pins, self.m_axis: pick[base]}]

    def _selecting_tiled(self, name: str) -> list[dict[str, int]]:
        """`selecting` for tiled kernel `name` (none where another takes all its rows)."""
        mult = size_multiple(self.graph.tensors, self.axis)
        tm, tn, tk, _ = self.tiles[name]
        first = self.wide_rows if name == WIDE else self.policy.qmm_min_rows
        top = self.wide_rows - 1 if name == "qmm" and WIDE in self.variants else 1 << 30
        m = min(first + 1 if first % tm == 0 else first, top)
        if m < first:
            return []
        assert self.m_axis is not None
        tiles = 2                        # of weight rows, the last partial; qmm_wide's grid
        if name == WIDE:                 # as large as qmm_wide_groups asks
            tiles = max(tiles, -(-self.policy.qmm_wide_groups // -(-m // tm)))
        return [{self.axis: -(-2 * tk // mult) * mult, self.rows_axis: tn * (tiles - 1) + 1,
                 self.m_axis: m}]

    @property
    def thresholds(self) -> list[int]:
        """Sizes of K where the kernel's path changes: one chunk per lane across the
        simdgroup, and across the block's k_splits simdgroups (testing draws sizes at each,
        and one on either side)."""
        out = [self.chunk, SIMD_WIDTH * self.chunk]
        if max(self.splits.values(), default=1) > 1:
            out.append(self.policy.k_splits * SIMD_WIDTH * self.chunk)
        return out

    def launch(self, sizes: Mapping[str, int]) -> tuple[int, int]:
        """qmm, qmm_wide: one group per tile (of its threads). qmv, qmvx: a simdgroup per block of
        rows_per_group rows; the _split kernels: k_splits of them. With k_splits > 1 the grid
        is padded to whole threadgroups (the kernel has a barrier: no thread may be missing);
        the group size is a multiple of 32 x k_splits, so a block's simdgroups share one."""
        v = self.variant(sizes)
        if v == "qmv_staged":           # a threadgroup per position of the other output axes
            return numel(self.outer[:-1], sizes) * STAGED_THREADS, STAGED_THREADS
        if v == "qmv_prologue":         # each row of x's blocks padded to whole groups
            g = max(1, self.policy.threads_per_group // SIMD_WIDTH)
            blocks = -(-sizes[self.rows_axis] // self.policy.rows_per_group)
            threads = numel(self.outer[:-1], sizes) * -(-blocks // g) * g * SIMD_WIDTH
            return threads, g * SIMD_WIDTH
        if v in TILED:
            tm, tn, _, threads = self.tiles[v]
            return self.blocks(sizes, tn, tm) * threads, threads
        S = self.splits.get(v, 1)
        blocks = self.simdgroups(sizes, self.x_rows if v.startswith("qmvx") else 1)
        threads = blocks * S * SIMD_WIDTH
        group = max(S * SIMD_WIDTH, min(self.policy.threads_per_group, threads))
        if S > 1:
            threads = -(-threads // group) * group
        return threads, group

    def host_name(self, sizes: Mapping[str, int]) -> str:
        # offsets stay inside each tensor: the largest one (not M x N x K) sets the width
        axes = [t.axes for t in self.graph.tensors] + [o.axes for o in self.graph.outputs]
        n: int = max(numel(ax, sizes) for ax in axes)
        if self.variant(sizes) == "qmv_staged" and sizes[self.rows_axis] > MAX_STAGED_ROWS:
            raise LaunchError(f"kernel '{self.graph.name}': its epilogue gathers its own rows, "
                              f"so one threadgroup stages every row of '{self.rows_axis}'; "
                              f"{sizes[self.rows_axis]} rows are over the {MAX_STAGED_ROWS} it "
                              f"holds")
        if not self.index64 and max(n, sizes[self.axis]) >= 2 ** 31:
            raise LaunchError(f"kernel '{self.graph.name}': {n} elements need 64-bit "
                              f"indexing; call it with launch={{'index64': True}}")
        return self.variants[self.variant(sizes)].host_name

    def max_group_size(self, host_name: str) -> int:
        for name, tile in self.tiles.items():
            if host_name == self.variants[name].host_name:
                return tile[3]
        if "qmv_staged" in self.variants and host_name == self.variants["qmv_staged"].host_name:
            return STAGED_THREADS
        return self.policy.threads_per_group

    def traffic(self, sizes: Mapping[str, int]) -> Traffic:
        """Each input read once (x once per block of rows: from cache after the first), each
        output written once: the bytes the decode kernel must move."""
        return super().traffic(sizes)

