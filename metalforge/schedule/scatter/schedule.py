"""The scatter schedule: its kernels (atomic: zero, add and, for f16/bf16, finish; or the one
segmented kernel), the launches of a call, and what they move."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

from ... import ir
from ...errors import LaunchError
from ...graph import Graph
from ...shapes import numel
from ..base import Schedule, Step, Traffic, make_kernel
from ..policy import LaunchPolicy
from ..reordering import Reordering
from .atomic import FILL, add_body, finish_body, zero_body
from .context import ScatterContext
from .form import ScatterForm
from .segmented import segmented_body

_THREAD = (ir.ThreadInput("mf_tid", "uint", "thread_position_in_grid"),)


@dataclass
class ScatterSchedule(Schedule):
    form: ScatterForm | None = None
    all_kernels: tuple[ir.LoweredKernel, ...] = ()

    @property
    def kernels(self) -> tuple[ir.LoweredKernel, ...]:
        return self.all_kernels

    def _form(self) -> ScatterForm:
        assert self.form is not None
        return self.form

    def launch_value(self, name: str, sizes: Mapping[str, int]) -> int:
        if name == "sources":
            return numel(self._form().grid, sizes)
        raise KeyError(name)

    def scratch_floats(self, sizes: Mapping[str, int]) -> int:
        return self.numel(sizes) if self._form().accumulator else 0

    def _group(self, threads: int) -> int:
        return max(1, min(self.policy.threads_per_group, threads))

    def steps(self, sizes: Mapping[str, int]) -> tuple[Step, ...]:
        """Deterministic: the segmented kernel over the output. Atomic: zero the target, add
        every source element (none to add: no launch), finish f16/bf16 outputs."""
        out = self.numel(sizes)
        if self._form().deterministic:
            return (Step(self.kernel.host_name, out, self._group(out)),)
        fill = -(-out // FILL)                      # zero and finish: FILL elements a thread
        first = Step(self.kernel.host_name, fill, self._group(fill))
        src = self.launch_value("sources", sizes)
        if src >= 2 ** 31 and not self.index64:
            raise LaunchError(
                f"kernel '{self.graph.name}': {src} source elements (the values' and index's "
                f"axes {list(self._form().grid)}) need 64-bit indexing, but no tensor is that "
                f"large; pass launch={{'index64': True}}")
        steps = [first]
        if src:
            steps.append(Step(self.kernels[1].host_name, src, self._group(src)))
        if self._form().accumulator:
            steps.append(Step(self.kernels[2].host_name, fill, self._group(fill)))
        return tuple(steps)

    def reordering(self) -> Optional[Reordering]:
        """A float scatter sums each output element's terms in an order of its own (the
        atomics', or the sorted index's), not the reference's."""
        f = self._form()
        return Reordering((f.node,), frozenset()) if f.dtype.is_float else None

    def traffic(self, sizes: Mapping[str, int]) -> Traffic:
        """Each input read once, the output written once, plus what the mode adds: the f32
        accumulator (written by zero, read and written by the adds' atomics, read by finish)
        or the sorted keys and order (16 bytes an index, read once)."""
        base = self.moved(sizes, {}, self.gathered_bytes(sizes))
        f, out = self._form(), self.numel(sizes)
        if f.accumulator:
            return Traffic(base.read + 4 * out, base.written + 4 * out)
        if f.deterministic:
            return Traffic(base.read + 16 * numel(f.rows, sizes), base.written)
        return Traffic(base.read, base.written + out * f.dtype.itemsize)   # the zeroing


def build(graph: Graph, policy: LaunchPolicy, index64: bool, form: ScatterForm) -> Schedule:
    """The scatter kernels of `form`, one library sharing one parameter list."""
    c = ScatterContext(graph, form, index64)
    bodies: list[tuple[Optional[str], list[ir.Stmt], str]]
    if form.deterministic:
        bodies = [(None, segmented_body(c), "sums each output element's run of the index "
                                            "sorted before the launch (deterministic)")]
    else:
        what = "f32 accumulator" if form.accumulator else "output"
        bodies = [("zero", zero_body(c), f"zeroes the {what}, one element a thread"),
                  (None, add_body(c), f"adds each source element at its index into the {what}, "
                                      f"one a thread, relaxed atomics")]
        if form.accumulator:
            bodies.append(("finish", finish_body(c), "rounds the f32 accumulator to the "
                                                     "output's type"))
    params = c.params()
    width = "64" if index64 else "32"
    kernels = tuple(make_kernel(graph, index64, _THREAD, body,
                                f"{graph.name}: scatter_add along '{form.axis}': {summary}, "
                                f"{width}-bit indexing", variant=variant, params=params,
                                helpers=tuple(sorted(c.helpers)))
                    for variant, body, summary in bodies)
    return ScatterSchedule("scatter", graph, policy, kernels[0], form.out_axes, (), index64,
                           form=form, all_kernels=kernels)
