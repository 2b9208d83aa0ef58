"""How the column kernels merge the chunks of a chunked reduced axis (`column`): the slices of
a threadgroup through threadgroup memory (`combine_slices`), each chunk's partials to scratch
(`chunk_exit`), and the combine kernel that merges them in a second launch; the shared pieces of
the single-launch merge (`column_ticket`)."""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from .. import ir
from . import reduce
from .base import IDX, make_kernel
from .column_context import ColumnContext, _bits, partial_slots
from .folds import extreme
from .hardware import SIMD_WIDTH


class ChunkMerges:
    """The merging methods of `column.ColumnKernel` (a mixin: `ctx` and `epilogue` are the
    kernel's)."""
    ctx: ColumnContext
    parts: reduce.VariantParts

    def epilogue(self, v: reduce.VariantParts, slices: int) -> None:
        raise NotImplementedError

    def merge_parts(self) -> tuple[ChunkMerges, reduce.VariantParts]:
        """A fresh collector for merge code inside another kernel, and a kernel of it."""
        raise NotImplementedError

    def combine_slices(self, v: reduce.VariantParts, rs: list[reduce.Reduction],
                       slices: int) -> list[ir.Stmt]:
        """The split variant: every slice's partials through threadgroup memory, merged by
        every slice in slice order (so argmax keeps the first index)."""
        tpg = self.ctx.policy.threads_per_group
        stores: list[ir.Stmt] = []
        tg: dict[str, str] = {}                   # accumulator -> its threadgroup array
        for r in rs:
            tg[r.acc] = f"mf_tg{r.i}"
            v.tg_arrays.append(ir.ArrayDecl(tg[r.acc], r.acc_type if r.online_max is None
                                            else "float", tpg, "threadgroup"))
            stores.append(ir.Assign(ir.Lane(ir.Var(tg[r.acc]), ir.Var("mf_lid")),
                                    ir.Var(r.acc)))
            if r.has_index:
                tg[r.idx] = f"mf_tgi{r.i}"
                v.tg_arrays.append(ir.ArrayDecl(tg[r.idx], "uint", tpg, "threadgroup"))
                stores.append(ir.Assign(ir.Lane(ir.Var(tg[r.idx]), ir.Var("mf_lid")),
                                        ir.Var(r.idx)))
        slot = ir.Var("mf_s") * ir.Lit(SIMD_WIDTH, "uint") + ir.Var("mf_lane")
        resets, merges = self.merges(rs, lambda name: ir.Lane(ir.Var(tg[name]), slot))
        return [ir.Comment(f"combine the {slices} slices of each column through threadgroup "
                           f"memory, in slice order"),
                *stores, ir.Barrier(), *resets,
                ir.For("mf_s", "uint", ir.Lit(0, "uint"), ir.Lit(slices, "uint"), merges)]

    @staticmethod
    def merges(rs: list[reduce.Reduction], other: Callable[[str], ir.Expr]
               ) -> tuple[list[ir.Stmt], list[ir.Stmt]]:
        """(accumulators reset to their identity, merges of another partial into them): the
        other partial's accumulator named `n` read as `other(n)`."""
        resets: list[ir.Stmt] = []
        merges: list[ir.Stmt] = []
        for r in rs:
            if r.online_max is not None:
                continue
            resets.append(ir.Assign(ir.Var(r.acc), reduce.identity(r)))
            if r.has_index:
                resets.append(ir.Assign(ir.Var(r.idx), ir.Lit(reduce.SENTINEL, "uint")))
            if r.online_sum is not None:
                resets.append(ir.Assign(ir.Var(r.online_sum.acc), ir.Lit(0.0, "float")))
                merges += reduce.merge(r, other(r.acc), other(r.online_sum.acc))
            else:
                own = extreme(r, other(r.acc))
                merges += own if own is not None else \
                    reduce.merge(r, other(r.acc), other(r.idx) if r.has_index else None)
        return resets, merges

    def scratch_load(self, at: ir.Expr) -> ir.Expr:
        """A partial from scratch (one launch: through a coherent(device) pointer, the other
        groups' stores)."""
        if self.ctx.ticket:
            return ir.Call("mf_coherent_load", (ir.Var("mf_scratch"), at))
        return ir.Load("mf_scratch", at)

    def scratch_store(self, at: ir.Expr, value: ir.Expr) -> ir.Stmt:
        """A partial to scratch (one launch: through a coherent(device) pointer)."""
        if self.ctx.ticket:
            return ir.Eval(ir.Call("mf_coherent_store", (ir.Var("mf_scratch"), at, value)))
        return ir.Store("mf_scratch", at, value)

    def scratch_at(self, q: int, chunk: ir.Expr, chunks: ir.Expr,
                   col: ir.Expr | None = None) -> ir.Expr:
        """Where partial value q of this column's chunk `chunk` sits in scratch: value-major,
        then chunk, then column (neighbouring columns side by side)."""
        ncols = self.ctx.span(self.ctx.outer)
        row = chunk if q == 0 else ir.Lit(q, "uint") * chunks + chunk
        return ir.Cast(IDX, row) * ncols + ir.Cast(IDX, col if col is not None
                                                   else ir.Var("mf_col"))

    def chunk_exit(self, epilogue: list[ir.Stmt],
                   columns: tuple[list[reduce.Reduction], ...] = ()) -> list[ir.Stmt]:
        """The split kernel of a chunked graph: one chunk stores the outputs (`epilogue`);
        several store their partials to scratch for the combine kernel (the wide kernel:
        column j's from the reductions `columns[j]`)."""
        chunks = ir.Var("mf_chunks")
        stores: list[ir.Stmt] = []
        for j, rs in enumerate(columns) if columns else [(0, [])]:
            slots = partial_slots(rs) if columns else self.ctx.slots
            stores += [self.scratch_store(self.scratch_at(q, ir.Var("mf_chunk"), chunks) +
                                          ir.Lit(j, IDX) if j else
                                          self.scratch_at(q, ir.Var("mf_chunk"), chunks),
                                          _bits(ir.Var(name), typ, "float"))
                       for q, (name, typ) in enumerate(slots)]
        return [ir.If(chunks.eq(ir.Lit(1, "uint")), epilogue, [
            ir.Comment("several chunks: this chunk's partials to scratch (slice 0)"),
            ir.If(ir.Var("mf_live").and_(ir.Var("mf_slice").eq(ir.Lit(0, "uint"))), stores),
            *self.chunks_merged()])]

    def chunks_merged(self) -> list[ir.Stmt]:
        """What the split kernel does after storing its chunk's partials: nothing (the combine
        launch merges them; `column_ticket` overrides it)."""
        return []

    def combine_kernel(self, v: reduce.VariantParts) -> ir.LoweredKernel:
        """Threadgroups of 32 columns x S slices (S = rows_per_group): slice s merges the
        partials of chunks s, s + S, s + 2S, ... in chunk order (float sums compensated),
        reads_per_thread chunks' partials loaded at once; the slices' results meet in
        threadgroup memory, merged in slice order (deterministic; argmax keeps the first
        index); slice 0 stores the column's outputs."""
        slices = self.ctx.policy.rows_per_group
        self.merge_chunks(v)
        live = ir.Var("mf_live")
        v.main += [ir.Comment("slice 0 of each live column stores its outputs"),
                   ir.If(ir.Unary("!", live.and_(ir.Var("mf_slice").eq(ir.Lit(0, "uint")))),
                         [ir.Return()])]
        self.epilogue(v, 1)
        threads, head = self.combine_header(slices)
        summary = (f"{self.ctx.graph.name} (combine): merges the fp32 partials the split kernel's "
                   f"chunks of '{self.ctx.axis}' left in scratch, 32 columns x {slices} slices "
                   f"of the chunks per threadgroup, each slice in chunk order, the slices in "
                   f"slice order, then stores the outputs")
        body = list(v.tg_arrays) + head + v.pre + v.main
        return make_kernel(self.ctx.graph, self.ctx.index64, threads, body, summary, v.name)

    def merge_chunks(self, v: reduce.VariantParts, reads: int = 0) -> None:
        """The chunks' partials of column mf_col merged (every slice of it ends with the
        column's results, the row values of the reductions' nodes); `reads` chunks' partials
        loaded at once (0: reads_per_thread; the merges' order, so the bits, do not depend
        on it)."""
        slices = self.ctx.policy.rows_per_group
        reds = reduce.phases(self.ctx.graph, online=True, compensated=True)
        self.ctx.helpers.update(reduce.helpers_of(reds, simd=False))
        decls: list[ir.Stmt] = []
        for r in reds:
            decls += reduce.declare(r)
        live = ir.Var("mf_live")
        v.main += [ir.Comment(f"merge the chunks' partials: slice s takes chunks s, s + "
                              f"{slices}, ... in chunk order"), *decls, self.chunk_count(),
                   ir.If(live, self.chunk_merges(reds, slices, reads)), *reduce.finish(reds)]
        v.main += self.combine_slices(v, reds, slices)
        for r in reds:
            v.row_values.values[r.node] = reduce.result(r)

    def chunk_merges(self, reds: list[reduce.Reduction], slices: int, reads: int = 0,
                     per: tuple[tuple[list[reduce.Reduction], ir.Expr], ...] = ()
                     ) -> list[ir.Stmt]:
        """The combine kernel's loop over this slice's chunks (mf_c): whole steps of
        reads_per_thread chunks (their partials loaded first, into mf_p<q>[], then merged in
        order), then the last chunks one at a time. `per`: several columns at once, each its
        reductions (copies of `reds`) and its column (the partials of all loaded together)."""
        reads = reads or self.ctx.policy.reads_per_thread
        chunks, i, u = ir.Var("mf_chunks"), ir.Var("mf_i"), ir.Var("mf_u")
        s_lit, r_lit = ir.Lit(slices, "uint"), ir.Lit(reads, "uint")
        base = {name: q for q, (name, _) in enumerate(self.ctx.slots)}
        per = per or ((reds, ir.Var("mf_col")),)
        owns = [own_slots(base, reds, rs) for rs, _ in per]

        def step(c: ir.Expr, n: int) -> list[ir.Stmt]:
            loads: list[ir.Stmt] = [ir.Decl("mf_c", "uint", c)]
            merges: list[ir.Stmt] = [ir.Decl("mf_c", "uint", c)]
            for j, ((rs, col), own) in enumerate(zip(per, owns)):
                k: ir.Expr = ir.Lit(0, "uint") if n == 1 else u
                if j:
                    k = ir.Lit(j * n, "uint") + k
                loads += [
                    ir.Assign(ir.Lane(ir.Var(f"mf_p{q}"), k), _bits(self.scratch_load(
                        self.scratch_at(q, ir.Var("mf_c"), chunks, col)), "float", typ))
                    for q, (_, typ) in enumerate(self.ctx.slots)]
                merges += self.slot_merges(rs, own, k)
            arrays: list[ir.Stmt] = [ir.ArrayDecl(f"mf_p{q}", typ, n * len(per))
                                     for q, (_, typ) in enumerate(self.ctx.slots)]
            if n == 1:
                return arrays + [ir.Block(loads), ir.Block(merges)]
            return arrays + [
                ir.For("mf_u", "uint", ir.Lit(0, "uint"), r_lit, loads, unroll=True),
                ir.For("mf_u", "uint", ir.Lit(0, "uint"), r_lit, merges, unroll=True)]
        c = i * s_lit + ir.Var("mf_slice")
        return [
            ir.Comment(f"whole steps: {reads} chunks a thread at once"),
            ir.For("mf_i", "uint", ir.Lit(0, "uint"), chunks / ir.Lit(slices * reads, "uint"),
                   step((i * r_lit + u) * s_lit + ir.Var("mf_slice"), reads)),
            ir.Comment("the last chunks, one at a time"),
            ir.For("mf_i", "uint", chunks / ir.Lit(slices * reads, "uint") * r_lit,
                   (chunks + ir.Lit(slices - 1, "uint")) / s_lit,
                   [ir.If(c < chunks, step(c, 1))])]

    def slot_merges(self, rs: list[reduce.Reduction], own: dict[str, int],
                    k: ir.Expr) -> list[ir.Stmt]:
        """Merge one chunk's partials (lane k of mf_p<q>[], q = own[variable]) into `rs`, in
        order (float sums compensated)."""
        out: list[ir.Stmt] = []
        for r in rs:
            if r.compensated and r.online_max is None:
                out += reduce.update(r, ir.Lane(ir.Var(f"mf_p{own[r.acc]}"), k),
                                     ir.Var("mf_c"))
            else:
                out += self.merges([r], lambda name: ir.Lane(ir.Var(f"mf_p{own[name]}"), k))[1]
        return out

    def combine_header(self, slices: int) -> tuple[tuple[ir.ThreadInput, ...], list[ir.Stmt]]:
        """(thread inputs, statements placing a combine thread on its column and slice)."""
        ncols = self.ctx.span(self.ctx.outer)
        threads = (ir.ThreadInput("mf_group", "uint", "threadgroup_position_in_grid"),
                   ir.ThreadInput("mf_lid", "uint", "thread_position_in_threadgroup"))
        return threads, [
            ir.Comment(f"32 columns x {slices} slices of the chunks per threadgroup"),
            ir.Decl("mf_lane", "uint", ir.Var("mf_lid") % ir.Lit(SIMD_WIDTH, "uint")),
            ir.Decl("mf_slice", "uint", ir.Var("mf_lid") / ir.Lit(SIMD_WIDTH, "uint")),
            ir.Decl("mf_col", "uint", ir.Var("mf_group") * ir.Lit(SIMD_WIDTH, "uint") +
                    ir.Var("mf_lane")),
            ir.Comment("threads past the last column still take part in the barrier"),
            ir.Decl("mf_live", "bool", ir.Cast(IDX, ir.Var("mf_col")) < ncols)]

    def chunk_count(self) -> ir.Decl:
        """mf_chunks: chunks of mf_chunk_rows positions covering the reduced axis (> 0)."""
        r = ir.Cast("uint", self.ctx.size(self.ctx.axis))
        return ir.Decl("mf_chunks", "uint", (r - ir.Lit(1, "uint")) / ir.Var("mf_chunk_rows")
                       + ir.Lit(1, "uint"))


def own_slots(base: dict[str, int], reds: list[reduce.Reduction],
              copy: list[reduce.Reduction]) -> dict[str, int]:
    """The scratch slot of each variable of `copy` (renamed copies of `reds`, whose
    variables' slots are `base`)."""
    out: dict[str, int] = {}
    for r, c in zip(reds, copy):
        for a, b in ((r.acc, c.acc), (r.idx, c.idx)):
            if a in base:
                out[b] = base[a]
        if r.online_sum is not None and c.online_sum is not None and r.online_sum.acc in base:
            out[c.online_sum.acc] = base[r.online_sum.acc]
    return out


def copies(reds: list[reduce.Reduction], j: int) -> list[reduce.Reduction]:
    """The reductions of a thread's column j (accumulators numbered apart: mf_acc<i>)."""
    out = [replace(r, i=r.i + j * len(reds)) for r in reds]
    twin = {id(r): o for r, o in zip(reds, out)}
    for r, o in zip(reds, out):
        o.online_sum = twin[id(r.online_sum)] if r.online_sum is not None else None
        o.online_max = twin[id(r.online_max)] if r.online_max is not None else None
    return out
