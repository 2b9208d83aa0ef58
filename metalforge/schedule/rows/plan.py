"""The row schedule's host side: the variants, their sizes and thresholds, and `RowSchedule`,
which picks a variant per call (see the package docstring)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from ... import ir
from ...errors import LaunchError
from ...graph import Graph
from .. import reduce
from ..base import Schedule, Step, Traffic
from ..hardware import SIMD_WIDTH
from ..policy import MAX_READS_PER_THREAD, LaunchPolicy, access_width

VARIANTS = ("simd", "simd_exact", "group", "staged", "looped")
UINT_LIMIT = 2 ** 32
READS = {"simd": "simd_reads_per_thread", "simd_exact": "simd_reads_per_thread",
         "group": "reads_per_thread", "staged": "reads_per_thread",
         "looped": "looped_reads_per_thread", "split": "looped_reads_per_thread",
         "split_2": "looped_reads_per_thread", "split_3": "looped_reads_per_thread",
         "finish": "looped_reads_per_thread"}
LANES = ("simd", "simd_exact")     # the variants whose rows share a simdgroup
HELD = ("group", "staged")         # the variants holding a row of a threadgroup in registers
WHOLE = ("simd_exact", "staged")   # the variants taking only rows of whole blocks
# few long rows (`RowSchedule.slices`): each row's chunks split over several threadgroups,
# their partial results through scratch (`split`, one launch per phase of the reductions, at
# most three), merged by each of them again (the later phases, `finish`)
SPLIT_PASSES = ("split", "split_2", "split_3")
SPLIT = SPLIT_PASSES + ("finish",)
STREAMED = ("looped",) + SPLIT     # the kernels streaming the row in chunks per phase
SLICES = "row_slices"              # the launch value: threadgroups a row is split over


def reads_for(p: LaunchPolicy, variant: str, itemsize: int) -> int:
    """Elements each thread (lane) of this variant holds in registers per input, for row
    tensors of at most `itemsize` bytes."""
    r: int = getattr(p, READS[variant])
    if variant in HELD and itemsize < 4:
        r = max(r, min(MAX_READS_PER_THREAD, r * 4 // itemsize))
    return r


def group_limit(p: LaunchPolicy, itemsize: int) -> int:
    """The longest row the group (and staged) kernel takes: looped_limit counts 4-byte
    elements, as reads_per_thread does, so rows of 2-byte types may be twice as long (same
    threads)."""
    return p.looped_limit * reads_for(p, "group", itemsize) // p.reads_per_thread


def group_threads(p: LaunchPolicy, itemsize: int, d: int) -> int:
    """Threads of the group (and staged) kernel for a row of d elements: a thread per R,
    rounded up to whole simdgroups."""
    t = -(-d // reads_for(p, "group", itemsize))
    return -(-t // SIMD_WIDTH) * SIMD_WIDTH


def vector_width_for(p: LaunchPolicy, variant: str, itemsizes: set[int]) -> int:
    """Elements per vector access of row tensors of these element sizes: up to the policy's
    vector_width, at most 16 bytes (`access_width`), at most the thread's reads."""
    return access_width(min(p.vector_width, reads_for(p, variant, max(itemsizes))), itemsizes)


def is_row(graph: Graph, axis: str) -> bool:
    """Whether `axis` is innermost (contiguous) in every tensor and output that has it."""
    for t in graph.tensors:
        if axis in t.axes and t.axes[-1] != axis:
            return False
    for o in graph.outputs:
        if axis in o.axes and o.axes[-1] != axis:
            return False
    return True


@dataclass
class RowSchedule(Schedule):
    axis: str = ""
    rows: tuple[str, ...] = ()
    variants: dict[str, ir.LoweredKernel] = field(default_factory=dict)
    reductions: list[reduce.Reduction] = field(default_factory=list)
    passes: dict[str, dict[str, int]] = field(default_factory=dict)  # variant → {input: reads}
    # variant → the gathers (numbers in take_sites) it serves from registers or shuffles
    held_gathers: dict[str, tuple[int, ...]] = field(default_factory=dict)
    itemsize: int = 4                                  # bytes of the widest row tensor
    slots: int = 0                     # fp32 partials per slice of a split row (0: no split)

    @property
    def kernels(self) -> tuple[ir.LoweredKernel, ...]:
        return tuple(self.variants.values())

    def _rows(self, sizes: Mapping[str, int]) -> int:
        n = 1
        for a in self.rows:
            n *= sizes[a]
        return n

    @property
    def group_limit(self) -> int:
        return group_limit(self.policy, self.itemsize)

    def variant(self, sizes: Mapping[str, int]) -> str:
        d = sizes[self.axis]
        p = self.policy
        if d <= SIMD_WIDTH * p.simd_reads_per_thread:
            return "simd_exact" if self.exact(d) else "simd"
        if d > self.group_limit:
            return "looped"
        return "staged" if self.policy.stage_rows and self.stages(d) else "group"

    def exact(self, d: int) -> bool:
        """Whether the simd_exact kernel (always built) takes rows of d elements: its lanes'
        blocks cover them exactly (d = lanes x R: 128 at R = 8), so no lane checks the row's
        end."""
        return d == self.lanes_per_row(d) * self.policy.simd_reads_per_thread

    def stages(self, d: int) -> bool:
        """Whether the staged kernel takes rows of d elements: it is built, and they are whole
        blocks of its threads (d a multiple of 32 x R: every load a full vector, no thread
        past the row's end)."""
        return "staged" in self.variants and \
            d % (SIMD_WIDTH * reads_for(self.policy, "staged", self.itemsize)) == 0

    @property
    def staged_rows(self) -> tuple[int, ...]:
        """Row lengths a test should try for the staged kernel (none unless it is built): the
        shortest whole-block row above the simd rows (`check` adds them to its boundary
        sizes; the group limit is one already)."""
        if "staged" not in self.variants:
            return ()
        block = SIMD_WIDTH * reads_for(self.policy, "staged", self.itemsize)
        return ((SIMD_WIDTH * self.policy.simd_reads_per_thread // block + 1) * block,)

    def alternatives(self, step: Step, sizes: Mapping[str, int]) -> tuple[Step, ...]:
        """The staged kernel for a group-variant step where it takes the row (stage_rows None:
        the launcher takes it where the backend says twice as many of its groups share a
        core); the looped kernel in groups of half the threads (it reads its group size at
        run time), which the launcher takes where half again as many threads share a core: a
        looped kernel past 32 registers holds one group of 1024 on an H200 core, three of
        512 (f32 layer_norm 2048x16384 124.0 -> 94.2 us, 1024x16384 64.1 -> 50.7)."""
        if self.alternative_hosts and self.stages(sizes[self.axis]) and \
                step.host_name == self.variants["group"].host_name:
            return (Step(self.variants["staged"].host_name, step.threads, step.group),)
        looped = self.variants.get("looped")
        if looped is not None and step.host_name == looped.host_name and step.group > 256:
            half = step.group // 2
            return (Step(step.host_name, step.threads // step.group * half, half),)
        return ()

    @property
    def alternative_hosts(self) -> frozenset[str]:
        """The staged kernel, where it is built and the launcher chooses (stage_rows None)."""
        staged = self.policy.stage_rows is None and "staged" in self.variants
        return frozenset((self.variants["staged"].host_name,) if staged else ())

    def host_name(self, sizes: Mapping[str, int]) -> str:
        reduce.check_sizes(self.graph, self.reductions, sizes)
        d = sizes[self.axis]
        if d >= UINT_LIMIT:
            raise LaunchError(f"kernel '{self.graph.name}': rows of {d} elements along "
                              f"'{self.axis}' are over the 2^32 a row reduction indexes")
        if not self.index64 and self._rows(sizes) * d >= 2 ** 31:
            raise LaunchError(f"kernel '{self.graph.name}': {self._rows(sizes) * d} elements "
                              f"need 64-bit indexing; call it with launch={{'index64': True}}")
        kernel: ir.LoweredKernel = self.variants[self.variant(sizes)]
        return kernel.host_name

    def launch(self, sizes: Mapping[str, int]) -> tuple[int, int]:
        return self._launch(self.variant(sizes), sizes)

    def _launch(self, v: str, sizes: Mapping[str, int]) -> tuple[int, int]:
        rows, d = self._rows(sizes), sizes[self.axis]
        p = self.policy
        if v in LANES:
            w = self.lanes_per_row(d)
            return rows * w, min(p.rows_per_group * SIMD_WIDTH, rows * w)
        if v in HELD:
            t = self._group_threads(d)
            return rows * t, t
        return rows * p.threads_per_group, p.threads_per_group

    def lanes_per_row(self, d: int) -> int:
        """Simd variant: the fewest lanes (a power of two, at most 32) holding a row of d
        elements at `simd_reads_per_thread` each; the kernel computes the same from d."""
        n = max(1, -(-d // self.policy.simd_reads_per_thread))
        return 1 << (n - 1).bit_length()

    def _group_threads(self, d: int) -> int:
        return group_threads(self.policy, self.itemsize, d)

    def within(self, step: Step, sizes: Mapping[str, int], max_threads: int) -> Step:
        """A group-variant row needing more threads than its pipeline allows (registers: an
        f16 row of 16384 needs 1024 threads of 16 values) runs looped instead."""
        if step.host_name not in (self.variants[v].host_name for v in HELD if v in self.variants):
            return step
        return Step(self.variants["looped"].host_name, *self._launch("looped", sizes))

    def max_group_size(self, host_name: str) -> int:
        """The group variant asks for up to 1024 threads, but a pipeline allowing fewer only
        sends its longest rows to the looped kernel (`within`): it must take the threads of
        the shortest group row."""
        v = next(n for n, k in self.variants.items() if k.host_name == host_name)
        p = self.policy
        if v in LANES:
            return p.rows_per_group * SIMD_WIDTH
        if v in HELD:
            return self._group_threads(SIMD_WIDTH * p.simd_reads_per_thread + 1)
        return p.threads_per_group

    def slices(self, sizes: Mapping[str, int]) -> int:
        """Threadgroups each row is split over (1: none): where the looped kernel would run
        fewer than fill_groups threadgroups (64 rows of 65536 on a GPU of 132 cores), enough
        slices of whole chunks (threads_per_group x R elements) to reach it, each slice at
        least one chunk."""
        p = self.policy
        if not self.slots or not p.fill_groups or self.variant(sizes) != "looped":
            return 1
        chunk = p.threads_per_group * reads_for(p, "looped", self.itemsize)
        chunks = -(-sizes[self.axis] // chunk)
        want = min(-(-p.fill_groups // max(1, self._rows(sizes))), chunks)
        return 1 if want <= 1 else -(-chunks // -(-chunks // want))

    def selecting(self, host: str) -> list[dict[str, Any]]:
        """Sizes that run the looped kernel where few rows would split (`check`): rows enough
        to fill the groups (a batch axis by its leading shape), the shortest looped row."""
        if not self.slots or host != self.variants["looped"].host_name:
            return []
        axis = self.rows[0]
        batch = any(d.batch for t in self.graph.tensors for d in t.dims if d.name == axis)
        n = self.policy.fill_groups
        return [{axis: (n,) if batch else n, self.axis: self.group_limit + 1}]

    def steps(self, sizes: Mapping[str, int]) -> tuple[Step, ...]:
        """One launch, or for split rows one per phase (the slices' partials) and one more
        (their merge and the outputs; `slices`)."""
        n = self.slices(sizes)
        if n == 1:
            return super().steps(sizes)
        self.host_name(sizes)                  # its checks
        tpg = self.policy.threads_per_group
        threads = self._rows(sizes) * n * tpg
        return tuple(Step(self.variants[v].host_name, threads, tpg) for v in SPLIT
                     if v in self.variants)

    def scratch_floats(self, sizes: Mapping[str, int]) -> int:
        n = self.slices(sizes)
        return 0 if n == 1 else self._rows(sizes) * n * self.slots

    def launch_value(self, name: str, sizes: Mapping[str, int]) -> int:
        if name == SLICES:
            return self.slices(sizes)
        raise KeyError(name)

    def traffic(self, sizes: Mapping[str, int], variant: str = "") -> Traffic:
        """Bytes this call moves: each output written once; each input read once in the
        register variants, once per pass that needs it in the looped one (the variant
        `variant(sizes)` unless named: `within` may have picked another)."""
        variant = variant or self.variant(sizes)
        return self.moved(sizes, self.passes[variant],
                          self.gathered_bytes(sizes, self.held_gathers.get(variant, ())))
