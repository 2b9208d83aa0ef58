"""The host side of the multiaxis schedule: which kernels a call launches (one threadgroup per
row, or the row split into chunks with merges between the phases), the scratch they pass
partials through, the bytes they move; and `build`, which builds every kernel of the library."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping, Optional

from ... import ir
from ...errors import LaunchError, empty_extreme
from ...graph import Graph, ReduceOp
from ...shapes import numel
from .. import reduce
from ..base import IDX, Schedule, Step, Traffic
from ..policy import LaunchPolicy
from . import kernels as K
from .context import multi_context, vector_width, walk_parts
from .form import AxesForm, collapse

CHUNK_LEN = "chunk_len"                   # the launch parameter: elements of a row per chunk
_EXTREME = (ReduceOp.MAX, ReduceOp.MIN)


@dataclass
class MultiSchedule(Schedule):
    """Reductions over several axes together (`form.reduced`), one row per element of the
    outer axes."""
    form: AxesForm = AxesForm((), ())
    variants: dict[str, ir.LoweredKernel] = field(default_factory=dict)
    phases: int = 1
    slots: int = 0                        # fp32 words of partials per row and chunk
    passes: dict[str, int] = field(default_factory=dict)
    element_outputs: bool = False
    # (kind, user file and line) of each max/min: refused over an empty row
    extremes: tuple[tuple[str, Optional[tuple[str, int]]], ...] = ()

    @property
    def kernels(self) -> tuple[ir.LoweredKernel, ...]:
        return tuple(self.variants.values())

    def rows(self, sizes: Mapping[str, int]) -> int:
        return numel(self.form.outer, sizes)

    def flat(self, sizes: Mapping[str, int]) -> int:
        return numel(self.form.reduced, sizes)

    def chunk_len(self, sizes: Mapping[str, int]) -> int:
        """Elements of a row per chunk (the whole row: one chunk, the group kernel): where the
        rows alone are fewer than fill_groups groups, chunks enough to reach it, each at least
        chunk_rows elements, a whole number of the group's threads."""
        p, flat, rows = self.policy, self.flat(sizes), self.rows(sizes)
        if "part0" not in self.variants or not p.fill_groups or rows >= p.fill_groups:
            return max(1, flat)
        want = min(-(-p.fill_groups // max(1, rows)), flat // p.chunk_rows)
        if want <= 1:
            return max(1, flat)
        tpg = p.threads_per_group
        return -(-(-(-flat // want)) // tpg) * tpg

    def chunks(self, sizes: Mapping[str, int]) -> int:
        return max(1, -(-self.flat(sizes) // self.chunk_len(sizes)))

    def check(self, sizes: Mapping[str, int]) -> None:
        if self.flat(sizes) == 0 and self.extremes:
            kind, loc = self.extremes[0]
            empty = next(a for a in self.form.reduced if sizes[a] == 0)
            raise empty_extreme(self.graph.name, kind, empty, loc)
        n = self.rows(sizes) * self.flat(sizes)
        if not self.index64 and n >= 2 ** 31:
            raise LaunchError(f"kernel '{self.graph.name}': {n} elements need 64-bit indexing; "
                              f"call it with launch={{'index64': True}}")
        if self.rows(sizes) * self.chunks(sizes) >= 2 ** 32:
            raise LaunchError(f"kernel '{self.graph.name}': over 2^32 threadgroups")

    def host_name(self, sizes: Mapping[str, int]) -> str:
        self.check(sizes)
        name = "group" if self.chunks(sizes) == 1 else "part0"
        return self.variants[name].host_name

    def launch(self, sizes: Mapping[str, int]) -> tuple[int, int]:
        tpg = self.policy.threads_per_group
        return self.rows(sizes) * self.chunks(sizes) * tpg, tpg

    def steps(self, sizes: Mapping[str, int]) -> tuple[Step, ...]:
        first = Step(self.host_name(sizes), *self.launch(sizes))
        if self.chunks(sizes) == 1:
            return (first,)
        rows = self.rows(sizes)
        merge = max(1, min(self.policy.threads_per_group, rows))
        out: list[Step] = []
        for p in range(self.phases):
            out += [Step(self.variants[f"part{p}"].host_name, *self.launch(sizes)),
                    Step(self.variants[f"merge{p}"].host_name, rows, merge)]
        if self.element_outputs:
            out.append(Step(self.variants["out"].host_name, *self.launch(sizes)))
        return tuple(out)

    def within(self, step: Step, sizes: Mapping[str, int], max_threads: int) -> Step:
        """Group kernels walk their rows in steps of the group's size, whatever it is."""
        if step.group <= max_threads or step.threads % step.group:
            return step
        g = max(32, max_threads // 32 * 32)
        return Step(step.host_name, step.threads // step.group * g, g)

    def max_group_size(self, host_name: str) -> int:
        return self.policy.threads_per_group

    def scratch_floats(self, sizes: Mapping[str, int]) -> int:
        chunks = self.chunks(sizes)
        return 0 if chunks == 1 else self.slots * self.rows(sizes) * (chunks + 1)

    def launch_value(self, name: str, sizes: Mapping[str, int]) -> int:
        if name == CHUNK_LEN:
            return self.chunk_len(sizes)
        raise KeyError(name)

    def traffic(self, sizes: Mapping[str, int]) -> Traffic:
        return self.moved(sizes, self.passes, 0)

    @property
    def thresholds(self) -> tuple[int, ...]:
        """Sizes of the innermost reduced axis where a row's walk changes (`check`'s
        boundaries): a simdgroup, a threadgroup's threads, a row of two chunks and a part."""
        p = self.policy
        return (32, p.threads_per_group, 2 * p.chunk_rows + 3)

    def selecting(self, host: str) -> list[dict[str, int]]:
        """Sizes that split rows into chunks (`check`): three rows of 2 x (2 chunk_rows + 3)
        elements, for the part, merge and out kernels."""
        if host == self.variants["group"].host_name or "part0" not in self.variants:
            return []
        red, outer = self.form.reduced, self.form.outer
        pins = {**{a: 1 for a in outer + red}, red[0]: 2, red[-1]: 2 * self.policy.chunk_rows + 3}
        if outer:
            pins[outer[-1]] = 3
        return [pins]


def build(graph: Graph, policy: LaunchPolicy, index64: bool, form: AxesForm) -> MultiSchedule:
    """Every kernel of the multiaxis library of `graph` (the chunked ones where fill_groups
    allows), one parameter list and helper set."""
    flat = collapse(graph, form)
    ctx = multi_context(flat, form, policy, index64)
    reds = reduce.phases(flat, online=True, compensated=True)
    ctx.helpers.update(reduce.helpers_of(reds, simd=True))
    nph = K.nphases(reds)
    outs = bool(K.element_outputs(ctx))
    names = ["group"]
    if policy.fill_groups:
        names += [f"{k}{p}" for p in range(nph) for k in ("part", "merge")] + \
            (["out"] if outs else [])

    def kernel(name: str) -> tuple[ir.LoweredKernel, reduce.VariantParts]:
        w = walk_parts(ctx, name)
        rs = reduce.phases(flat, online=True, compensated=True)
        if name == "group":
            k = K.group_kernel(w, rs)
        elif name == "out":
            k = K.out_kernel(w, rs)
        else:
            part = name.startswith("part")
            k = (K.part_kernel if part else K.merge_kernel)(w, rs, int(name[4 if part else 5:]))
        return k, w.parts
    built, passes, tg = reduce.build_variants(ctx, tuple(names), kernel)
    if len(names) > 1:
        params = built["group"].params
        icast = None if index64 else "int32"
        extra = (ir.Argument("mf_scratch", len(params), "buffer", "float", ("scratch",), True),
                 ir.Argument("mf_chunk_len", len(params) + 1, "scalar", IDX,
                             ("launch", CHUNK_LEN), cast=icast))
        built = {n: replace(k, params=params + extra) for n, k in built.items()}
    extremes = tuple((r.kind, r.node.loc) for r in reds if r.kind in _EXTREME)
    vw = vector_width(ctx)
    red = form.reduced
    vector = tuple(t.name for t in ctx.inputs if tuple(t.axes[-len(red):]) == red) \
        if vw > 1 else ()
    return MultiSchedule("multiaxis", graph, replace(policy, threadgroup_bytes=tg, uses_simd=True,
                                                     vector_width=vw),
                         built["group"], form.outer + form.reduced, vector, index64, form=form,
                         variants=built, phases=nph, slots=len(K.slot_numbers(reds)),
                         passes=passes["group"], element_outputs=outs, extremes=extremes)
