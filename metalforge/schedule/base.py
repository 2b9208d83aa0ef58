"""What every schedule family produces: the lowered kernel plus how to launch it and what it moves."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from .. import ir
from ..graph import Graph
from .policy import LaunchPolicy


@dataclass(frozen=True)
class Traffic:
    """Global-memory bytes one call moves (each input element read once, each output written
    once): the number benchmarks divide by time to report achieved bandwidth."""
    read: int
    written: int

    @property
    def total(self) -> int:
        return self.read + self.written


@dataclass
class Schedule:
    family: str                        # "elementwise" (row/column reductions next)
    graph: Graph
    policy: LaunchPolicy
    kernel: ir.Kernel
    grid_axes: tuple[str, ...]         # the output index space the threads cover
    vector_inputs: tuple[str, ...]     # inputs read with vector loads: must be aligned
    index64: bool

    def numel(self, sizes: Mapping[str, int]) -> int:
        n = 1
        for a in self.grid_axes:
            n *= sizes[a]
        return n

    def launch(self, sizes: Mapping[str, int]) -> tuple[int, int]:
        """(threads, group_size) for compile_shader's dispatchThreads model."""
        ept = self.policy.elements_per_thread
        threads = -(-self.numel(sizes) // ept)
        return threads, max(1, min(self.policy.threads_per_group, threads))

    def traffic(self, sizes: Mapping[str, int]) -> Traffic:
        def numel(axes) -> int:
            n = 1
            for a in axes:
                n *= sizes[a]
            return n
        read = sum(numel(t.axes) * t.dtype.itemsize for t in self.graph.tensors
                   if ("input", t.name) in self._binds)
        written = sum(numel(o.axes) * o.dtype.itemsize for o in self.graph.outputs)
        return Traffic(read, written)

    # -- several kernels per schedule (reductions: one per row-length variant) -------------
    @property
    def kernels(self) -> tuple[ir.Kernel, ...]:
        """Every kernel of this schedule, compiled together as one library (the first is
        `kernel`); they share one parameter list, so one argument plan binds them all."""
        return (self.kernel,)

    def host_name(self, sizes: Mapping[str, int]) -> str:
        """The host name of the kernel a call with these axis sizes launches. May raise a
        ValueError for sizes the schedule refuses (before anything is compiled or launched)."""
        return self.kernel.host_name

    @property
    def _binds(self) -> set:
        return {p.binds for p in self.kernel.params}
