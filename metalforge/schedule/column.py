"""The column-reduction schedule: reductions over an axis that is not the innermost one.

Threads run along the output's columns (every axis but the reduced one, the contiguous one
fastest), so neighbouring threads read neighbouring addresses; each thread loops over the
reduced axis. Kernels of one library, chosen per call from the sizes:

- ``column`` (reduced axis <= looped_limit): one thread per column, groups of threads_per_group
  columns, no threadgroup memory.
- ``split`` (longer): a group holds 32 columns x rows_per_group slices; slice s takes positions
  s, s + S, s + 2S, ... of its stretch of the reduced axis, reads_per_thread positions at once
  (whole steps unrolled, so that many loads are in flight; the stretch's last rows one at a
  time, guarded); the partials meet in threadgroup memory and every slice merges them in slice
  order (so argmax keeps the first index).
- ``combine`` (built for *chunked* graphs: one phase, every output one value per column): where
  the column blocks alone would leave the GPU idle (fewer than fill_groups groups), the split
  kernel's grid also splits the reduced axis into chunks of at least chunk_rows positions
  (`ColumnSchedule.chunk_rows`, a launch parameter): group g takes column block g % blocks
  and chunk g / blocks, and writes its fp32 partials (and argmax indices, as their bits) to
  the scratch buffer; a second launch merges them: threadgroups of 32 columns x
  rows_per_group slices, slice s taking chunks s, s + S, ... in chunk order
  (reads_per_thread chunks' partials loaded at once), the slices' results merged in slice
  order through threadgroup memory (deterministic; argmax keeps the first index), slice 0
  storing the outputs. With one chunk the split kernel stores the outputs itself.
  With launch={"one_launch": True} there is no second launch: the last threadgroup of each
  column block to finish (an atomic ticket) merges the chunks the same way, in the same
  launch (`column_ticket`: the same bits).
- ``wide`` (chunked graphs whose loaded tensors all have the reduced axis and keep the columns'
  innermost axis innermost, no gathers or index expressions; taken where that axis is a
  multiple of its columns): the split kernel with `wide` adjacent columns a thread
  (vector_width, at most COLUMN_LOAD_BYTES of the widest tensor: 2 f32 or 4 f16), each row's
  elements of them one vector load per tensor, each column its own accumulators, threadgroup
  slots and scratch partials (the combine kernel is the same).

Split and wide steps compute the values of their reads_per_thread rows first (into register
arrays), then fold them in row order, so the loads are not held back by the folds' chain; a
compensated sum's or a float max / min's step values are combined among themselves first and
folded once (`folds`).

Phases as in `reduce`; each phase loops over the reduced axis again (a max followed by
sum(exp(a - max)) runs as one online pass), and the epilogue loops once more to write outputs
that keep the reduced axis (softmax over a column).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping

from .. import ir
from ..errors import LaunchError
from ..graph import Graph, Node
from . import reduce
from .base import IDX, Step, make_kernel
from .column_context import ColumnContext, column_context, partial_slots, wide_columns
from .column_merge import ChunkMerges, copies
from .column_ticket import TicketMerges, counter_argument
from .column_words import grouped
from .folds import step_folds
from .hardware import SIMD_WIDTH
from .lower import ElementLowering, compute_type
from .policy import LaunchPolicy
from .rows import RowSchedule
from .unit_gather import gathers_once, with_unit_gathers

__all__ = ["ColumnContext", "ColumnKernel", "ColumnSchedule", "build", "column_context",
           "partial_slots", "wide_columns"]

VARIANTS = ("column", "split")
CHUNK_ROWS = "chunk_rows"                 # the launch parameter: rows per chunk


@dataclass
class ColumnSchedule(RowSchedule):
    """Same interface as RowSchedule: `rows` are the column axes, `axis` the reduced one."""

    partials: int = 0                     # chunked graphs: fp32 values per column and chunk
    wide: int = 1                         # columns a thread of the `wide` kernel takes
    inner: str = ""                       # the columns' innermost axis (wide: a multiple of it)
    ticket: bool = False                  # one_launch: the split kernel merges its chunks

    def variant(self, sizes: Mapping[str, int]) -> str:
        if sizes[self.axis] <= self.policy.looped_limit:
            return "column"
        return "wide" if "wide" in self.variants and sizes[self.inner] % self.wide == 0 \
            else "split"

    def columns_per_thread(self, sizes: Mapping[str, int]) -> int:
        return self.wide if self.variant(sizes) == "wide" else 1

    def selecting(self, host: str) -> list[dict[str, int]]:
        """Sizes that run the split and wide kernels (`check`): the columns' innermost axis
        a multiple of the wide kernel's columns or not, one chunk or several."""
        if "wide" not in self.variants:
            return []
        long = {self.axis: 2 * self.policy.chunk_rows + 3}
        if host == self.variants["wide"].host_name:
            return [{**long, self.inner: 8 * self.wide}]
        if host == self.variants["split"].host_name:
            return [{**long, self.inner: 8 * self.wide + 1}]
        return []

    @property
    def thresholds(self) -> tuple[int, ...]:
        """Reduced lengths where the kernel or its chunking changes (`check`'s boundaries):
        the split kernel's first, one chunk's worth and a partial second chunk."""
        p = self.policy
        return (p.looped_limit, p.chunk_rows, 2 * p.chunk_rows + 3)

    def host_name(self, sizes: Mapping[str, int]) -> str:
        reduce.check_sizes(self.graph, self.reductions, sizes)
        n = self._rows(sizes) * sizes[self.axis]
        if not self.index64 and n >= 2 ** 31:
            raise LaunchError(f"kernel '{self.graph.name}': {n} elements need 64-bit indexing; "
                              f"call it with launch={{'index64': True}}")
        if sizes[self.axis] >= 2 ** 32 or self._rows(sizes) >= 2 ** 32:
            raise LaunchError(f"kernel '{self.graph.name}': over 2^32 columns or rows")
        kernel: ir.LoweredKernel = self.variants[self.variant(sizes)]
        return kernel.host_name

    def chunk_rows(self, sizes: Mapping[str, int]) -> int:
        """Positions of the reduced axis per chunk (the whole axis: one chunk): chunks enough
        that blocks x chunks reach fill_groups, each at least chunk_rows long, a whole number
        of the group's unrolled steps (rows_per_group x reads_per_thread)."""
        r, p = sizes[self.axis], self.policy
        if not self.partials or self.variant(sizes) == "column" or not p.fill_groups:
            return max(1, r)
        blocks = -(-self._rows(sizes) // (SIMD_WIDTH * self.columns_per_thread(sizes)))
        want = min(-(-p.fill_groups // max(1, blocks)), -(-r // p.chunk_rows))
        if want <= 1:
            return r
        step = p.rows_per_group * p.reads_per_thread
        return -(-(-(-r // want)) // step) * step

    def chunks(self, sizes: Mapping[str, int]) -> int:
        return -(-max(1, sizes[self.axis]) // self.chunk_rows(sizes))

    def launch(self, sizes: Mapping[str, int]) -> tuple[int, int]:
        cols = self._rows(sizes)
        p = self.policy
        if self.variant(sizes) == "column":
            return cols, max(1, min(p.threads_per_group, cols))
        groups = -(-cols // (SIMD_WIDTH * self.columns_per_thread(sizes))) * self.chunks(sizes)
        return groups * p.threads_per_group, p.threads_per_group

    def steps(self, sizes: Mapping[str, int]) -> tuple[Step, ...]:
        first = (Step(self.host_name(sizes), *self.launch(sizes)),)
        if self.chunks(sizes) == 1 or self.ticket:
            return first
        tpg = self.policy.threads_per_group
        blocks = -(-self._rows(sizes) // SIMD_WIDTH)
        return first + (Step(self.variants["combine"].host_name, blocks * tpg, tpg),)

    def scratch_floats(self, sizes: Mapping[str, int]) -> int:
        chunks = self.chunks(sizes)
        return 0 if chunks == 1 else self.partials * chunks * self._rows(sizes)

    def counter_words(self, sizes: Mapping[str, int]) -> int:
        """Words of the counter buffer a one-launch call binds: one per column block."""
        if not self.ticket:
            return 0
        return -(-self._rows(sizes) // (SIMD_WIDTH * self.columns_per_thread(sizes)))

    def launch_value(self, name: str, sizes: Mapping[str, int]) -> int:
        if name == CHUNK_ROWS:
            return self.chunk_rows(sizes)
        raise KeyError(name)



@dataclass(frozen=True, eq=False)
class ColumnKernel(TicketMerges):
    """One column kernel being built: the call's context and the variant's fresh collector
    (`parts`), which `bases` and the loads declare their per-column offsets in."""
    ctx: ColumnContext
    parts: reduce.VariantParts

    def position(self, axis: str) -> ir.Expr:
        """The thread's position along one of the column axes."""
        return self.ctx.position(axis, self.parts)

    def bases(self, name: str, axes: tuple[str, ...]) -> tuple[ir.Expr, ir.Expr]:
        """(offset of this column's element at position 0 of the reduced axis, stride of the
        reduced axis) in a tensor/output with these axes."""
        b, st = f"mf_col_{name}", f"mf_stride_{name}"
        if b not in self.parts.pre_names:
            e = None
            for a in axes:
                pos = None if a == self.ctx.axis else self.position(a)
                if e is not None:
                    e = e * self.ctx.size(a)
                if pos is not None:
                    e = pos if e is None else e + pos
            self.parts.pre.append(ir.Decl(b, IDX, e if e is not None else ir.Lit(0, IDX)))
            self.parts.pre_names.add(b)
            if self.ctx.axis in axes:
                after = axes[axes.index(self.ctx.axis) + 1:]
                self.parts.pre.append(ir.Decl(st, IDX, self.ctx.span(after) if after
                                              else ir.Lit(1, IDX)))
        return ir.Var(b), ir.Var(st)

    def at(self, name: str, axes: tuple[str, ...]) -> ir.Expr:
        b, st = self.bases(name, axes)
        if self.ctx.axis not in axes:
            return b
        return b + ir.Cast(IDX, ir.Var("mf_k")) * st

    def col_load(self, n: Node) -> ir.Expr:
        t = self.ctx.graph.tensor(n.attr)
        v: ir.Expr = ir.Cast(compute_type(t.dtype),
                             ir.Load(self.ctx.names[t.name], self.at(t.name, t.axes)))
        if self.parts.name == "split":       # threads past the last column read nothing
            zero = ir.Lit(0.0 if t.dtype.is_float else (False if t.dtype.kind == "bool" else 0),
                          compute_type(t.dtype))
            v = ir.Select(ir.Var("mf_live"), v, zero)
        return v

    def merge_parts(self) -> tuple[ChunkMerges, reduce.VariantParts]:
        parts = reduce.variant_parts(self.ctx, "combine",
                                     lambda p, n: ColumnKernel(self.ctx, p).col_load(n))
        with_unit_gathers(self.ctx, parts, None)
        return ColumnKernel(self.ctx, parts), parts

    def outer_load(self, n: Node) -> ir.Expr:
        return self.col_load(n)

    def el_position(self, axis: str) -> ir.Expr:
        return ir.Var("mf_k") if axis == self.ctx.axis else self.position(axis)

    def kernel(self, v: reduce.VariantParts) -> ir.LoweredKernel:
        if v.name == "combine":
            return self.combine_kernel(v)
        if v.name == "wide":
            return self.wide_kernel(v)
        graph = self.ctx.graph
        split = v.name == "split"
        slices = self.ctx.policy.rows_per_group if split else 1
        # each thread adds a long stretch of the column in sequence: compensated sums
        reds = reduce.phases(graph, online=True, compensated=True)
        nph = 1 + max(r.phase for r in reds)
        self.ctx.helpers.update(reduce.helpers_of(reds, simd=False))
        for p in range(nph):
            rs = [r for r in reds if r.phase == p]
            roots = [r.arg for r in rs if r.online_max is None]
            v.main.append(ir.Comment(f"phase {p + 1}: " + ", ".join(
                f"{r.kind} over {r.axis}" + (" (online, with the sum of exp(x - max))"
                                              if r.online_sum else "")
                for r in rs if r.online_max is None)))
            pre, lp = self.loop(v, roots, rs, [], slices)
            v.main += pre
            for r in rs:
                v.main += reduce.declare(r)
            v.main += [ir.If(ir.Var("mf_live"), lp)] if split else lp
            v.main += reduce.finish(rs)
            if split:
                v.main += self.combine_slices(v, rs, slices)
            for r in rs:
                v.row_values.values[r.node] = reduce.result(r)
        start = len(v.main)
        self.epilogue(v, slices)
        if split and self.ctx.chunked:
            v.main[start:] = self.chunk_exit(v.main[start:])
        threads, head = self.header(v.name, slices)
        summary = (f"{graph.name} ({v.name}): reduces '{self.ctx.axis}' (not innermost) for each "
                   f"column of [{', '.join(self.ctx.outer)}] in {nph} phase(s); " +
                   (f"32 columns x {slices} slices per threadgroup, partials merged in threadgroup "
                    f"memory" + ("; several chunks of the axis: partials to scratch"
                                 if self.ctx.chunked else "")
                    if split else "one thread per column, looping over the axis") +
                   "; fp32 accumulation, compensated sums")
        body = list(v.tg_arrays) + head + v.pre + v.main
        return make_kernel(graph, self.ctx.index64, threads, body, summary, v.name)

    def element_body(self, v: reduce.VariantParts, roots: list[Node], rs: list[reduce.Reduction],
                     outs: list[int], frontier: list[Node]) -> list[ir.Stmt]:
        """Element mf_k's values, folded into `rs`, outputs `outs` stored."""
        graph = self.ctx.graph
        el = ElementLowering(graph, self.col_load, self.el_position, self.ctx.size,
                             lambda s: self.ctx.names[s], prefix="mf_v")
        for n in frontier:
            el.values[n] = v.row_values.value(n)
        body = el.lower(roots)
        self.ctx.helpers.update(el.helpers)
        body += self.ctx.fold(el, rs, ir.Var("mf_k"))
        for k in outs:
            body.append(ir.Store(self.ctx.out_names[k], self.at(self.ctx.out_names[k],
                                                            graph.outputs[k].axes),
                                 self.ctx.out_value(k, el)))
        return body

    def loop(self, v: reduce.VariantParts, roots: list[Node], rs: list[reduce.Reduction],
             outs: list[int],
             slices: int) -> tuple[list[ir.Stmt], list[ir.Stmt]]:
        """(column values computed before it, the loop over this thread's positions of the
        reduced axis): element values, folded into `rs`, outputs `outs` stored."""
        tensors, frontier = self.ctx.cone(roots)
        for t in tensors:
            v.passes[t] = v.passes.get(t, 0) + 1
        pre = v.row_values.lower(frontier)
        if v.name != "split":
            inner: list[ir.Stmt] = [ir.Decl("mf_k", "uint", ir.Var("mf_i"))]
            inner += self.element_body(v, roots, rs, outs, frontier)
            return pre, [ir.For("mf_i", "uint", ir.Lit(0, "uint"),
                                ir.Cast("uint", self.ctx.size(self.ctx.axis)), inner)]
        # split: whole steps of slices x reads rows unrolled (reads loads in flight a thread),
        # then the stretch's last rows one at a time, guarded
        reads = self.ctx.policy.reads_per_thread
        i, u, k0 = ir.Var("mf_i"), ir.Var("mf_u"), ir.Var("mf_k0")
        s_lit, r_lit = ir.Lit(slices, "uint"), ir.Lit(reads, "uint")
        pos = (i * r_lit + u) * s_lit + ir.Var("mf_slice")
        whole: list[ir.Stmt] = self.whole_step(v, roots, rs, outs, frontier, k0 + pos)
        k = k0 + i * s_lit + ir.Var("mf_slice")
        tail: list[ir.Stmt] = [ir.Decl("mf_k", "uint", k),
                               ir.If(ir.Var("mf_k") < ir.Var("mf_k1"),
                                     self.element_body(v, roots, rs, outs, frontier))]
        n = ir.Var("mf_k1") - k0
        steps = (n + ir.Lit(slices - 1, "uint")) / s_lit
        return pre, [
            ir.Comment(f"whole steps: {reads} rows a thread at once"),
            ir.For("mf_i", "uint", ir.Lit(0, "uint"), n / ir.Lit(slices * reads, "uint"),
                   whole),
            ir.Comment("the stretch's last rows, one at a time"),
            ir.For("mf_i", "uint", n / ir.Lit(slices * reads, "uint") * r_lit, steps, tail)]

    def whole_step(self, v: reduce.VariantParts, roots: list[Node], rs: list[reduce.Reduction],
                   outs: list[int], frontier: list[Node], k: ir.Expr) -> list[ir.Stmt]:
        """One whole step of the split loop: reads_per_thread elements (mf_u), position `k`.
        Folding into reductions, every element's value is computed first (its loads issued
        together, into register arrays mf_e<i>[reads]), then folded in order: the folds'
        dependency chain does not hold back the next loads."""
        reads = self.ctx.policy.reads_per_thread
        each = [r for r in rs if r.online_max is None]
        u = ir.For("mf_u", "uint", ir.Lit(0, "uint"), ir.Lit(reads, "uint"), [], unroll=True)
        if not each or outs:
            u.body = [ir.Decl("mf_k", "uint", k)] + \
                self.element_body(v, roots, rs, outs, frontier)
            return [u]
        el = ElementLowering(self.ctx.graph, self.col_load, self.el_position, self.ctx.size,
                             lambda s: self.ctx.names[s], prefix="mf_v")
        for n in frontier:
            el.values[n] = v.row_values.value(n)
        u.body = [ir.Decl("mf_k", "uint", k)] + el.lower(roots) + [
            ir.Assign(ir.Lane(ir.Var(f"mf_e{r.i}"), ir.Var("mf_u")), self.ctx.acc_value(el, r))
            for r in each]
        self.ctx.helpers.update(el.helpers)
        return [ir.Comment(f"{reads} elements' values first (their loads together), then "
                           f"their folds"),
                *[ir.ArrayDecl(f"mf_e{r.i}", r.acc_type, reads) for r in each],
                u, *step_folds(each, k, reads)]

    # -- the wide kernel: several adjacent columns a thread ---------------------------------
    @staticmethod
    def copies(reds: list[reduce.Reduction], j: int) -> list[reduce.Reduction]:
        """The reductions of a thread's column j (`column_merge.copies`)."""
        return copies(reds, j)

    def wide_kernel(self, v: reduce.VariantParts) -> ir.LoweredKernel:
        """The split kernel of chunked graphs, `wide` adjacent columns a thread: each row's
        elements of them one vector load per tensor, each column its own accumulators."""
        c, slices = self.ctx.wide, self.ctx.policy.rows_per_group
        reds = reduce.phases(self.ctx.graph, online=True, compensated=True)
        self.ctx.helpers.update(reduce.helpers_of(reds, simd=False))
        per = tuple(self.copies(reds, j) for j in range(c))
        roots = [r.arg for r in reds if r.online_max is None]
        tensors, frontier = self.ctx.cone(roots)
        for t in tensors:
            v.passes[t] = 1
        v.main.append(ir.Comment(f"phase 1, each of the thread's {c} columns: " + ", ".join(
            f"{r.kind} over {r.axis}" for r in reds if r.online_max is None)))
        v.main += v.row_values.lower(frontier)
        for rs in per:
            for r in rs:
                v.main += reduce.declare(r)
        reads, i, k0 = self.ctx.policy.reads_per_thread, ir.Var("mf_i"), ir.Var("mf_k0")
        s_lit, r_lit = ir.Lit(slices, "uint"), ir.Lit(reads, "uint")
        n = ir.Var("mf_k1") - k0
        whole = self.wide_rows(v, roots, per, frontier,
                               k0 + (i * r_lit + ir.Var("mf_u")) * s_lit + ir.Var("mf_slice"),
                               reads)
        k = k0 + i * s_lit + ir.Var("mf_slice")
        tail: list[ir.Stmt] = [ir.If(k < ir.Var("mf_k1"),
                                     self.wide_rows(v, roots, per, frontier, k, 1))]
        v.main.append(ir.If(ir.Var("mf_live"), [
            ir.Comment(f"whole steps: {reads} rows a thread at once"),
            ir.For("mf_i", "uint", ir.Lit(0, "uint"), n / ir.Lit(slices * reads, "uint"), whole),
            ir.Comment("the stretch's last rows, one at a time"),
            ir.For("mf_i", "uint", n / ir.Lit(slices * reads, "uint") * r_lit,
                   (n + ir.Lit(slices - 1, "uint")) / s_lit, tail)]))
        flat = [r for rs in per for r in rs]
        v.main += reduce.finish(flat)
        v.main += self.combine_slices(v, flat, slices)
        v.main += self.chunk_exit(self.wide_outputs(per), per)
        threads, head = self.header(v.name, slices)
        summary = (f"{self.ctx.graph.name} (wide): reduces '{self.ctx.axis}' (not innermost) "
                   f"for each "
                   f"column of [{', '.join(self.ctx.outer)}]; 32 threads x {c} adjacent columns "
                   f"(one vector load a row) x {slices} slices per threadgroup, partials merged "
                   f"in threadgroup memory, several chunks of the axis: partials to scratch; "
                   f"fp32 accumulation, compensated sums")
        body = list(v.tg_arrays) + head + v.pre + v.main
        return make_kernel(self.ctx.graph, self.ctx.index64, threads, body, summary, v.name)

    def wide_rows(self, v: reduce.VariantParts, roots: list[Node],
                  per: tuple[list[reduce.Reduction], ...], frontier: list[Node], k: ir.Expr,
                  reads: int) -> list[ir.Stmt]:
        """`reads` rows (mf_u) at position `k`: each tensor's vector of the thread's columns
        loaded, every column's element values computed (into register arrays mf_e<i>), then
        folded in order."""
        c = self.ctx.wide
        tensors, _ = self.ctx.cone(roots)
        u = ir.Var("mf_u")
        each = [[r for r in rs if r.online_max is None] for rs in per]
        loads: list[ir.Stmt] = [ir.Decl("mf_k", "uint", k)]
        for name in tensors:
            t = self.ctx.graph.tensor(name)
            st = self.ctx.in_stype(t)
            if self.ctx.inner in t.axes:
                loads.append(ir.Decl(f"mf_w_{name}", ir.vector_type(st, c), ir.Load(
                    self.ctx.names[name], self.at(name, t.axes), c, st)))
            elif grouped(self.ctx, self.ctx.inner, t):      # one word (group): all the columns
                loads.append(ir.Comment(f"{name}: one element for the thread's {c} columns"))
                loads.append(ir.Decl(f"mf_w_{name}", st, ir.Load(
                    self.ctx.names[name], self.at(name, t.axes))))
        for j in range(c):
            el = self.column_lowering(j, "mf_v")
            for nd in frontier:
                el.values[nd] = v.row_values.value(nd)
            body = el.lower(roots)
            self.ctx.helpers.update(el.helpers)
            body += [ir.Assign(ir.Lane(ir.Var(f"mf_e{r.i}"), u), self.ctx.acc_value(el, r))
                     for r in each[j]]
            loads.append(ir.Block([ir.Comment(f"column {j}")] + body))
        return [*[ir.ArrayDecl(f"mf_e{r.i}", r.acc_type, reads) for rs in each for r in rs],
                ir.For("mf_u", "uint", ir.Lit(0, "uint"), ir.Lit(reads, "uint"), loads,
                       unroll=True),
                *step_folds([r for rs in each for r in rs], k, reads)]

    def column_lowering(self, j: int, prefix: str) -> ElementLowering:
        """Lowering of values of the thread's column j (wide kernel): a tensor with the
        columns' innermost axis read from lane j of its loaded vector mf_w_<t>."""
        def load(n: Node) -> ir.Expr:
            t = self.ctx.graph.tensor(n.attr)
            if self.ctx.axis in t.axes and self.ctx.inner in t.axes:
                return ir.Cast(compute_type(t.dtype),
                               ir.Lane(ir.Var(f"mf_w_{t.name}"), ir.Lit(j, "uint")))
            if self.ctx.axis in t.axes and grouped(self.ctx, self.ctx.inner, t):
                return ir.Cast(compute_type(t.dtype), ir.Var(f"mf_w_{t.name}"))
            return self.col_load(n)

        def position(axis: str) -> ir.Expr:     # column j's (an unpacked value's slot)
            p = self.el_position(axis)
            return p + ir.Lit(j, IDX) if j and axis == self.ctx.inner else p
        return ElementLowering(self.ctx.graph, load, position, self.ctx.size,
                               lambda s: self.ctx.names[s], prefix=prefix)

    def wide_outputs(self, per: tuple[list[reduce.Reduction], ...]) -> list[ir.Stmt]:
        """The outputs of each of the thread's columns (slice 0 stores them)."""
        graph = self.ctx.graph
        out: list[ir.Stmt] = [ir.Comment("epilogue: the columns' results")]
        for j, rs in enumerate(per):
            el = self.column_lowering(j, f"mf_r{j}_")
            for r in rs:
                el.values[r.node] = reduce.result(r)
            body = el.lower([o.node for o in graph.outputs])
            self.ctx.helpers.update(el.helpers)
            stores: list[ir.Stmt] = [
                ir.Store(self.ctx.out_names[k], self.at(self.ctx.out_names[k], o.axes) +
                         ir.Lit(j, IDX) if j else self.at(self.ctx.out_names[k], o.axes),
                         self.ctx.out_value(k, el))
                for k, o in enumerate(graph.outputs)]
            out.append(ir.Block(body + [ir.If(ir.Var("mf_live").and_(
                ir.Var("mf_slice").eq(ir.Lit(0, "uint"))), stores)]))
        return out

    def epilogue(self, v: reduce.VariantParts, slices: int) -> None:
        """Outputs along the column in one more loop; one value per column stored once."""
        graph, split = self.ctx.graph, v.name == "split"
        live = ir.Var("mf_live")
        el_outs = [k for k, o in enumerate(graph.outputs) if self.ctx.axis in o.axes]
        col_outs = [k for k in range(len(graph.outputs)) if k not in el_outs]
        if el_outs:
            v.main.append(ir.Comment("epilogue: compute and store the outputs along the column"))
            pre, lp = self.loop(v, [graph.outputs[k].node for k in el_outs], [], el_outs, slices)
            v.main += pre + ([ir.If(live, lp)] if split else lp)
        if col_outs:
            roots = [graph.outputs[k].node for k in col_outs]
            once = split and gathers_once(v.row_values, roots)
            stmts = v.row_values.lower(roots)
            stores: list[ir.Stmt] = []
            for k in col_outs:
                stores.append(ir.Store(self.ctx.out_names[k], self.at(self.ctx.out_names[k],
                                                                  graph.outputs[k].axes),
                                       self.ctx.out_value(k, v.row_values)))
            v.main.append(ir.Comment("epilogue: the column's results"))
            first = live.and_(ir.Var("mf_slice").eq(ir.Lit(0, "uint")))
            if once:                # the column's gathered elements read by its first slice
                v.main.append(ir.If(first, stmts + stores))
                return
            v.main += stmts
            if split:
                v.main.append(ir.If(first, stores))
            else:
                v.main += stores

    def header(self, variant: str, slices: int) -> tuple[tuple[ir.ThreadInput, ...], list[ir.Stmt]]:
        """(thread inputs, statements placing the thread on its column and slice)."""
        ncols = self.ctx.span(self.ctx.outer)
        if variant not in ("split", "wide"):
            return ((ir.ThreadInput("mf_col", "uint", "thread_position_in_grid"),),
                    [ir.Comment("one thread per column"),
                     ir.If(ir.Cast(IDX, ir.Var("mf_col")) >= ncols, [ir.Return()])])
        threads = (ir.ThreadInput("mf_group", "uint", "threadgroup_position_in_grid"),
                   ir.ThreadInput("mf_lid", "uint", "thread_position_in_threadgroup"))
        r = ir.Cast("uint", self.ctx.size(self.ctx.axis))
        head: list[ir.Stmt] = [
            ir.Comment(f"32 x {self.ctx.wide if variant == 'wide' else 1} columns x {slices} "
                       f"slices of the reduced axis per threadgroup"),
            ir.Decl("mf_lane", "uint", ir.Var("mf_lid") % ir.Lit(SIMD_WIDTH, "uint")),
            ir.Decl("mf_slice", "uint", ir.Var("mf_lid") / ir.Lit(SIMD_WIDTH, "uint"))]
        c = self.ctx.wide if variant == "wide" else 1
        if self.ctx.chunked:
            blocks = (ir.Cast("uint", ncols) + ir.Lit(SIMD_WIDTH * c - 1, "uint")) / \
                ir.Lit(SIMD_WIDTH * c, "uint")
            k0 = ir.Var("mf_chunk") * ir.Var("mf_chunk_rows")
            head += [
                ir.Comment(f"the group's block of {SIMD_WIDTH * c} columns and chunk of the "
                           f"reduced axis (rows mf_k0 to mf_k1)"),
                self.chunk_count(),
                ir.Decl("mf_blocks", "uint", blocks),
                ir.Decl("mf_block", "uint", ir.Var("mf_group") % ir.Var("mf_blocks")),
                ir.Decl("mf_chunk", "uint", ir.Var("mf_group") / ir.Var("mf_blocks")),
                ir.Decl("mf_k0", "uint", k0),
                ir.Decl("mf_k1", "uint", ir.Var("mf_k0") + ir.Call("min", (
                    r - ir.Var("mf_k0"), ir.Var("mf_chunk_rows"))))]
        else:
            head += [ir.Comment("the group's block of 32 columns, the whole reduced axis"),
                     ir.Decl("mf_block", "uint", ir.Var("mf_group")),
                     ir.Decl("mf_k0", "uint", ir.Lit(0, "uint")),
                     ir.Decl("mf_k1", "uint", r)]
        col: ir.Expr = ir.Var("mf_block") * ir.Lit(SIMD_WIDTH, "uint") + ir.Var("mf_lane")
        if c > 1:
            head.append(ir.Comment(f"each thread {c} adjacent columns, from mf_col"))
            col = col * ir.Lit(c, "uint")
        head += [
            ir.Decl("mf_col", "uint", col),
            ir.Comment("threads past the last column still take part in the barriers"),
            ir.Decl("mf_live", "bool", ir.Cast(IDX, ir.Var("mf_col")) < ncols)]
        return threads, head


def build(graph: Graph, policy: LaunchPolicy, index64: bool) -> ColumnSchedule:
    """The column schedule of `graph`: the column and split kernels, the combine kernel for
    chunked graphs, the wide one where it applies; one parameter list and helper set."""
    ctx = column_context(graph, policy, index64)

    def kernel(name: str) -> tuple[ir.LoweredKernel, reduce.VariantParts]:
        parts = reduce.variant_parts(ctx, name, lambda p, n: ColumnKernel(ctx, p).col_load(n))
        with_unit_gathers(ctx, parts, ir.Var("mf_live") if name == "split" else None)
        return ColumnKernel(ctx, parts).kernel(parts), parts
    names = VARIANTS + (("combine",) if ctx.chunked and not ctx.ticket else ()) + \
        (("wide",) if ctx.wide > 1 else ())
    kernels, passes, tgb = reduce.build_variants(ctx, names, kernel, "; lower rows_per_group")
    if ctx.chunked:
        params = kernels["column"].params
        extra: tuple[ir.Argument, ...] = (
            ir.Argument("mf_scratch", len(params), "buffer", "float", ("scratch",), True),
            ir.Argument("mf_chunk_rows", len(params) + 1, "scalar", "uint",
                        ("launch", CHUNK_ROWS), cast="int32"))
        if ctx.ticket:
            extra += (counter_argument(len(params) + 2),)
        kernels = {n: replace(k, params=params + extra) for n, k in kernels.items()}
    passes.pop("combine", None)
    vector = tuple(t.name for t in ctx.inputs if ctx.inner in t.axes) if ctx.wide > 1 else ()
    return ColumnSchedule("column", graph, replace(policy, threadgroup_bytes=tgb),
                          kernels["column"], tuple(ctx.outer) + (ctx.axis,), vector, index64,
                          axis=ctx.axis, rows=ctx.outer, variants=kernels,
                          reductions=reduce.phases(graph, online=False), passes=passes,
                          partials=len(ctx.slots), wide=ctx.wide, inner=ctx.inner,
                          ticket=ctx.ticket)
