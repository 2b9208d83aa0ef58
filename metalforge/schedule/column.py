"""The column-reduction schedule: reductions over an axis that is not the innermost one.

Threads run along the output's columns (every axis but the reduced one, the contiguous one
fastest), so neighbouring threads read neighbouring addresses; each thread loops over the
reduced axis. Two kernels in one library, chosen per call from the reduced length:

- ``column`` (reduced axis <= looped_limit): one thread per column, groups of threads_per_group
  columns, no threadgroup memory.
- ``split`` (taller): a group holds 32 columns x rows_per_group slices; slice s takes positions
  s, s + S, s + 2S, ... of the reduced axis; the partials meet in threadgroup memory and every
  slice merges them in slice order (so argmax keeps the first index). One launch, no atomics and
  no second pass; the price is parallelism limited to ceil(columns / 32) groups.

Phases as in `reduce`; each phase loops over the reduced axis again (a max followed by
sum(exp(a - max)) runs as one online pass), and the epilogue loops once more to write outputs
that keep the reduced axis (softmax over a column).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping

from .. import ir
from ..graph import Graph, Node
from .base import IDX, make_kernel
from .lower import ElementLowering, compute_type
from ..errors import LaunchError
from .policy import LaunchPolicy, SIMD_WIDTH
from .row import RowSchedule
from . import reduce

VARIANTS = ("column", "split")


@dataclass
class ColumnSchedule(RowSchedule):
    """Same interface as RowSchedule: `rows` are the column axes, `axis` the reduced one."""

    def variant(self, sizes: Mapping[str, int]) -> str:
        return "split" if sizes[self.axis] > self.policy.looped_limit else "column"

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

    def launch(self, sizes: Mapping[str, int]) -> tuple[int, int]:
        cols = self._rows(sizes)
        p = self.policy
        if self.variant(sizes) == "column":
            return cols, max(1, min(p.threads_per_group, cols))
        groups = -(-cols // SIMD_WIDTH)
        return groups * p.threads_per_group, p.threads_per_group


def build(graph: Graph, policy: LaunchPolicy, index64: bool) -> ColumnSchedule:
    return _Builder(graph, policy, index64).build()


class _Builder(reduce.Builder):
    def __init__(self, graph: Graph, policy: LaunchPolicy, index64: bool):
        super().__init__(graph, policy, index64, graph.reductions()[0].attr[1], "col", "column")

    def bases(self, name: str, axes: tuple[str, ...]) -> tuple[ir.Expr, ir.Expr]:
        """(offset of this column's element at position 0 of the reduced axis, stride of the
        reduced axis) in a tensor/output with these axes."""
        b, st = f"mf_col_{name}", f"mf_stride_{name}"
        if b not in self.v.pre_names:
            e = None
            for a in axes:
                pos = None if a == self.axis else self.position(a)
                if e is not None:
                    e = e * self.size(a)
                if pos is not None:
                    e = pos if e is None else e + pos
            self.v.pre.append(ir.Decl(b, IDX, e if e is not None else ir.Lit(0, IDX)))
            self.v.pre_names.add(b)
            if self.axis in axes:
                after = axes[axes.index(self.axis) + 1:]
                self.v.pre.append(ir.Decl(st, IDX, self.span(after) if after else ir.Lit(1, IDX)))
        return ir.Var(b), ir.Var(st)

    def at(self, name: str, axes: tuple[str, ...]) -> ir.Expr:
        b, st = self.bases(name, axes)
        if self.axis not in axes:
            return b
        return b + ir.Cast(IDX, ir.Var("mf_k")) * st

    def col_load(self, n: Node) -> ir.Expr:
        t = self.graph.tensor(n.attr)
        v: ir.Expr = ir.Cast(compute_type(t.dtype),
                             ir.Load(self.names[t.name], self.at(t.name, t.axes)))
        if self.v.name == "split":       # threads past the last column read nothing
            zero = ir.Lit(0.0 if t.dtype.is_float else (False if t.dtype.kind == "bool" else 0),
                          compute_type(t.dtype))
            v = ir.Select(ir.Var("mf_live"), v, zero)
        return v

    def outer_load(self, n: Node) -> ir.Expr:
        return self.col_load(n)

    def el_position(self, axis: str) -> ir.Expr:
        return ir.Var("mf_k") if axis == self.axis else self.position(axis)

    def kernel(self, v: reduce.Variant) -> ir.LoweredKernel:
        graph = self.graph
        split = v.name == "split"
        slices = self.policy.rows_per_group if split else 1
        # each thread adds a long stretch of the column in sequence: compensated sums
        reds = reduce.phases(graph, online=True, compensated=True)
        nph = 1 + max(r.phase for r in reds)
        self.helpers |= reduce.helpers_of(reds, simd=False)
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
        self.epilogue(v, slices)
        threads, head = self.header(v.name, slices)
        summary = (f"{graph.name} ({v.name}): reduces '{self.axis}' (not innermost) for each "
                   f"column of [{', '.join(self.outer)}] in {nph} phase(s); " +
                   (f"32 columns x {slices} slices per threadgroup, partials merged in threadgroup "
                    f"memory" if split else "one thread per column, looping over the axis") +
                   "; fp32 accumulation, compensated sums")
        body = list(v.tg_arrays) + head + v.pre + v.main
        return make_kernel(graph, self.index64, threads, body, summary, v.name)

    def loop(self, v: reduce.Variant, roots: list[Node], rs: list[reduce.Reduction],
             outs: list[int],
             slices: int) -> tuple[list[ir.Stmt], list[ir.Stmt]]:
        """(column values computed before it, the loop over this thread's positions of the
        reduced axis): element values, folded into `rs`, outputs `outs` stored."""
        graph, split = self.graph, v.name == "split"
        tensors, frontier = self.cone(roots)
        for t in tensors:
            v.passes[t] = v.passes.get(t, 0) + 1
        pre = v.row_values.lower(frontier)
        el = ElementLowering(graph, self.col_load, self.el_position, self.size,
                             lambda s: self.names[s], prefix="mf_v")
        for n in frontier:
            el.values[n] = v.row_values.value(n)
        body = el.lower(roots)
        self.helpers |= el.helpers
        body += self.fold(el, rs, ir.Var("mf_k"))
        for k in outs:
            body.append(ir.Store(self.out_names[k], self.at(self.out_names[k],
                                                            graph.outputs[k].axes),
                                 self.out_value(k, el)))
        k_expr: ir.Expr = ir.Var("mf_i")
        if split:
            k_expr = ir.Var("mf_i") * ir.Lit(slices, "uint") + ir.Var("mf_slice")
        inner: list[ir.Stmt] = [ir.Decl("mf_k", "uint", k_expr)]
        if split:
            inner.append(ir.If(ir.Cast(IDX, ir.Var("mf_k")) < self.size(self.axis), body))
        else:
            inner += body
        stop = ir.Var("mf_steps") if split else ir.Cast("uint", self.size(self.axis))
        return pre, [ir.For("mf_i", "uint", ir.Lit(0, "uint"), stop, inner)]

    def combine_slices(self, v: reduce.Variant, rs: list[reduce.Reduction],
                       slices: int) -> list[ir.Stmt]:
        """The split variant: every slice's partials through threadgroup memory, merged by
        every slice in slice order (so argmax keeps the first index)."""
        tpg = self.policy.threads_per_group
        stores: list[ir.Stmt] = []
        for r in rs:
            v.tg_arrays.append(ir.ArrayDecl(f"mf_tg{r.i}", r.acc_type if r.online_max is None
                                            else "float", tpg, "threadgroup"))
            stores.append(ir.Assign(ir.Lane(ir.Var(f"mf_tg{r.i}"), ir.Var("mf_lid")),
                                    ir.Var(r.acc)))
            if r.has_index:
                v.tg_arrays.append(ir.ArrayDecl(f"mf_tgi{r.i}", "uint", tpg, "threadgroup"))
                stores.append(ir.Assign(ir.Lane(ir.Var(f"mf_tgi{r.i}"), ir.Var("mf_lid")),
                                        ir.Var(r.idx)))
        resets: list[ir.Stmt] = []
        merges: list[ir.Stmt] = []
        slot = ir.Var("mf_s") * ir.Lit(SIMD_WIDTH, "uint") + ir.Var("mf_lane")
        for r in rs:
            if r.online_max is not None:
                continue
            resets.append(ir.Assign(ir.Var(r.acc), reduce.identity(r)))
            if r.has_index:
                resets.append(ir.Assign(ir.Var(r.idx), ir.Lit(reduce.SENTINEL, "uint")))
            if r.online_sum is not None:
                resets.append(ir.Assign(ir.Var(r.online_sum.acc), ir.Lit(0.0, "float")))
                merges += reduce.merge(r, ir.Lane(ir.Var(f"mf_tg{r.i}"), slot),
                                    ir.Lane(ir.Var(f"mf_tg{r.online_sum.i}"), slot))
            else:
                merges += reduce.merge(r, ir.Lane(ir.Var(f"mf_tg{r.i}"), slot),
                                    ir.Lane(ir.Var(f"mf_tgi{r.i}"), slot)
                                    if r.has_index else None)
        return [ir.Comment(f"combine the {slices} slices of each column through threadgroup "
                           f"memory, in slice order"),
                *stores, ir.Barrier(), *resets,
                ir.For("mf_s", "uint", ir.Lit(0, "uint"), ir.Lit(slices, "uint"), merges)]

    def epilogue(self, v: reduce.Variant, slices: int) -> None:
        """Outputs along the column in one more loop; one value per column stored once."""
        graph, split = self.graph, v.name == "split"
        live = ir.Var("mf_live")
        el_outs = [k for k, o in enumerate(graph.outputs) if self.axis in o.axes]
        col_outs = [k for k in range(len(graph.outputs)) if k not in el_outs]
        if el_outs:
            v.main.append(ir.Comment("epilogue: compute and store the outputs along the column"))
            pre, lp = self.loop(v, [graph.outputs[k].node for k in el_outs], [], el_outs, slices)
            v.main += pre + ([ir.If(live, lp)] if split else lp)
        if col_outs:
            stmts = v.row_values.lower([graph.outputs[k].node for k in col_outs])
            stores: list[ir.Stmt] = []
            for k in col_outs:
                stores.append(ir.Store(self.out_names[k], self.at(self.out_names[k],
                                                                  graph.outputs[k].axes),
                                       self.out_value(k, v.row_values)))
            v.main.append(ir.Comment("epilogue: the column's results"))
            v.main += stmts
            if split:
                v.main.append(ir.If(live.and_(ir.Var("mf_slice").eq(ir.Lit(0, "uint"))), stores))
            else:
                v.main += stores

    def header(self, variant: str, slices: int) -> tuple[tuple[ir.ThreadInput, ...], list[ir.Stmt]]:
        """(thread inputs, statements placing the thread on its column and slice)."""
        ncols = self.span(self.outer)
        if variant != "split":
            return ((ir.ThreadInput("mf_col", "uint", "thread_position_in_grid"),),
                    [ir.Comment("one thread per column"),
                     ir.If(ir.Cast(IDX, ir.Var("mf_col")) >= ncols, [ir.Return()])])
        threads = (ir.ThreadInput("mf_group", "uint", "threadgroup_position_in_grid"),
                   ir.ThreadInput("mf_lid", "uint", "thread_position_in_threadgroup"))
        head: list[ir.Stmt] = [
            ir.Comment(f"32 columns x {slices} slices of the reduced axis per threadgroup"),
            ir.Decl("mf_lane", "uint", ir.Var("mf_lid") % ir.Lit(SIMD_WIDTH, "uint")),
            ir.Decl("mf_slice", "uint", ir.Var("mf_lid") / ir.Lit(SIMD_WIDTH, "uint")),
            ir.Decl("mf_col", "uint",
                    ir.Var("mf_group") * ir.Lit(SIMD_WIDTH, "uint") + ir.Var("mf_lane")),
            ir.Comment("threads past the last column still take part in the barriers"),
            ir.Decl("mf_live", "bool", ir.Cast(IDX, ir.Var("mf_col")) < ncols),
            ir.Decl("mf_steps", "uint", (ir.Cast("uint", self.size(self.axis)) +
                                         ir.Lit(slices - 1, "uint")) / ir.Lit(slices, "uint"))]
        return threads, head

    def build(self) -> ColumnSchedule:
        kernels, passes, tgb = self.variants(VARIANTS, "; lower rows_per_group")
        policy = replace(self.policy, threadgroup_bytes=tgb)
        return ColumnSchedule("column", self.graph, policy, kernels["column"],
                              tuple(self.outer) + (self.axis,), (), self.index64, axis=self.axis,
                              rows=self.outer, variants=kernels,
                              reductions=reduce.phases(self.graph, online=False), passes=passes)
