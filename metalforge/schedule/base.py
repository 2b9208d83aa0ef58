"""What every schedule family produces (the lowered kernels, how to launch them and what they
move) and the one constructor of their `ir.LoweredKernel`s."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Optional

import torch

from .. import ir
from ..graph import Graph, Node, Op, take_sites
from ..shapes import numel
from .names import IDX as IDX
from .names import kernel_name, template_vars
from .policy import LaunchPolicy
from .reordering import Reordering, reordering, skipped_keys


def host_name(graph: Graph, index64: bool) -> str:
    """`{op}_{dtypes}[_{const}_{value}...][_idx64]`: every mf.Const variant is its own kernel
    with its own name (`attn_f16_causal_true`, `q4_f16_GS_64`)."""
    if graph.dtype_vars:
        tags = [d.name for d in graph.dtype_vars.values()]
    else:
        tags = list(dict.fromkeys(t.dtype.name for t in graph.tensors))
    for name, v in graph.consts.items():
        tags += [name, str(v).lower() if isinstance(v, bool) else str(v).replace("-", "m")]
    return "_".join([graph.name, *tags] + (["idx64"] if index64 else []))


def make_kernel(graph: Graph, index64: bool, threads: tuple[ir.ThreadInput, ...],
                body: list[ir.Stmt], summary: str, variant: Optional[str] = None,
                params: tuple[ir.Argument, ...] = (),
                helpers: tuple[str, ...] = (), max_threads: int = 0) -> ir.LoweredKernel:
    """The kernel template `mf_<op>[_<variant>]`, generic over the graph's dtype variables and
    the index type, with its one instantiation for this graph (host name `host_name(...)`,
    plus `_<variant>`)."""
    suffix = f"_{variant}" if variant else ""
    tvars = template_vars(graph.dtype_vars)
    return ir.LoweredKernel(
        name=kernel_name(graph.name, suffix), op=graph.name, template=(*tvars.keys(), IDX),
        instances=(ir.Instance(host_name(graph, index64) + suffix,
                               (*(d.msl for d in graph.dtype_vars.values()),
                                "ulong" if index64 else "uint")),),
        params=params, threads=threads, body=tuple(body), helpers=helpers, summary=summary,
        max_threads=max_threads)


@dataclass(frozen=True)
class Traffic:
    """Global-memory bytes one call moves (each input element read once, each output written
    once): the number benchmarks divide by time to report achieved bandwidth."""
    read: int
    written: int

    @property
    def total(self) -> int:
        return self.read + self.written


@dataclass(frozen=True)
class Step:
    """One launch of a call: kernel `host_name`, `threads` in groups of `group`."""
    host_name: str
    threads: int
    group: int


@dataclass
class Schedule:
    family: str                        # "elementwise" | "row" | "column"
    graph: Graph
    policy: LaunchPolicy
    kernel: ir.LoweredKernel
    grid_axes: tuple[str, ...]         # the output index space the threads cover
    vector_inputs: tuple[str, ...]     # inputs read with vector loads: must be aligned
    index64: bool
    # gathers (numbers in `take_sites`) an elementwise kernel's vector path reads from the
    # vectors it loaded: they move no bytes when the innermost axis holds whole vectors
    lane_gathers: tuple[int, ...] = ()

    def numel(self, sizes: Mapping[str, int]) -> int:
        return numel(self.grid_axes, sizes)

    def width(self, sizes: Mapping[str, int]) -> int:
        """Elements per vector access of the kernel a call with these sizes launches."""
        return self.policy.vector_width

    def launch(self, sizes: Mapping[str, int]) -> tuple[int, int]:
        """(threads, group_size) for compile_shader's dispatchThreads model."""
        ept = self.width(sizes) * self.policy.vectors_per_thread
        threads = -(-self.numel(sizes) // ept)
        return threads, max(1, min(self.policy.threads_per_group, threads))

    def max_group_size(self, host_name: str) -> int:
        """The most threads per group a launch of kernel `host_name` asks for."""
        return self.policy.threads_per_group

    def traffic(self, sizes: Mapping[str, int]) -> Traffic:
        whole = self.lane_gathers and sizes[self.grid_axes[-1]] % self.width(sizes) == 0
        return self.moved(sizes, {}, self.gathered_bytes(sizes, self.lane_gathers if whole else ()))

    def moved(self, sizes: Mapping[str, int], passes: Mapping[str, int], gathered: int
              ) -> Traffic:
        """Each loaded input read once (`passes[name]` times where given), `gathered` bytes
        more read by gathers, each output written once."""
        loaded = {n.attr for n in self.graph.nodes() if n.op == Op.LOAD}
        read = sum(numel(t.axes, sizes) * t.dtype.itemsize * passes.get(t.name, 1)
                   for t in self.graph.tensors
                   if ("input", t.name) in self._binds and t.name in loaded)
        written = sum(numel(o.axes, sizes) * o.dtype.itemsize for o in self.graph.outputs)
        return Traffic(read + gathered, written)

    def gathered_bytes(self, sizes: Mapping[str, int], held: Iterable[int] = ()) -> int:
        """What the gathers read: one element per element of each gather's result (an
        embedding row per id, a RoPE partner per element), except the gathers numbered in
        `held`, served from registers."""
        total = 0
        skip = set(held)
        for k, n in enumerate(take_sites(self.graph)):
            if k in skip:
                continue
            count = self.graph.tensor(n.attr[0]).dtype.itemsize
            for a in n.axes:
                count *= sizes[a]
            total += count
        return total

    # -- several kernels per schedule (reductions: one per row-length variant) -------------
    @property
    def kernels(self) -> tuple[ir.LoweredKernel, ...]:
        """Every kernel of this schedule, compiled together as one library (the first is
        `kernel`); they share one parameter list, so one argument plan binds them all."""
        return (self.kernel,)

    def host_name(self, sizes: Mapping[str, int]) -> str:
        """The host name of the kernel a call with these axis sizes launches. May raise a
        ValueError for sizes the schedule refuses (before anything is compiled or launched)."""
        return self.kernel.host_name

    def within(self, step: Step, sizes: Mapping[str, int], max_threads: int) -> Step:
        """The launch to make instead of `step` when its group is larger than the compiled
        pipeline allows (`max_threads`); the same step if the schedule has no other (the
        launcher then refuses it)."""
        return step

    def alternatives(self, step: Step, sizes: Mapping[str, int]) -> tuple[Step, ...]:
        """Launches computing the same as `step` with another kernel or in other groups,
        which the launcher takes where the backend says enough more of their threads share a
        core (`launcher._resident_gain`; row: the staged kernel, the looped kernel in groups
        of half the threads)."""
        return ()

    @property
    def alternative_hosts(self) -> frozenset[str]:
        """The kernels that only `alternatives` launches (`check` does not fail them when no
        example's device took them)."""
        return frozenset()

    def steps(self, sizes: Mapping[str, int]) -> tuple[Step, ...]:
        """The launches of one call, in order: the kernel `host_name(sizes)` alone, unless the
        schedule splits the work (attention's key blocks, then their merge)."""
        return (Step(self.host_name(sizes), *self.launch(sizes)),)

    def scratch_floats(self, sizes: Mapping[str, int]) -> int:
        """fp32 elements of the ("scratch",) buffer the steps pass partial results through."""
        return 0

    def counter_words(self, sizes: Mapping[str, int]) -> int:
        """uint words of the ("counter",) buffer (zero between launches; runtime/counters.py)."""
        return 0

    def launch_value(self, name: str, sizes: Mapping[str, int]) -> int:
        """A ("launch", name) argument: a per-call launch parameter (attention's key_splits)."""
        raise KeyError(name)

    def rounded_operands(self, sizes: Mapping[str, int]) -> dict[Node, torch.dtype]:
        """The values a call with these sizes rounds to a narrower type than fp32 before using
        them (attention's softmax weights, as the half operands of its matrix products), with
        that type: testing's reference may round them alike. None by default (empty)."""
        return {}

    @property
    def _binds(self) -> set[tuple[str | int, ...]]:
        return {p.binds for p in self.kernel.params}

    def reordering(self) -> Optional[Reordering]:
        """The float sums the kernels accumulate in their own order, and what follows from it
        (`metalforge.schedule.reordering`; testing's slack reads it); None where every element
        is computed as the reference computes it."""
        return reordering(self, skipped_keys(self))
