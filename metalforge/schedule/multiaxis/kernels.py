"""The multiaxis kernels: a loop over a stretch of the row's flattened elements, the phases and
the epilogue built from it, and one function per kernel variant.

- ``group``: one threadgroup per row walks the whole row each phase (`mf_f` from the thread's
  index, in steps of the group, so a simdgroup reads 32 neighbouring elements of a contiguous
  run), combines the phase's accumulators simd -> threadgroup -> simd (`rows.combine`), and
  the epilogue walks the row once more to store element outputs (the row's first thread stores
  one value per row).
- ``part<p>``, ``merge<p>``, ``out`` (rows too few to fill the GPU, rows long): the row is split
  into chunks of mf_chunk_len elements, a threadgroup per (row, chunk). part<p> computes phase
  p's partials of its chunk (earlier phases' results read from scratch) and stores them to
  scratch; merge<p>, one thread per row, merges the chunks' partials in chunk order and stores
  the phase's results to scratch (the last merge also stores the one-value-per-row outputs);
  out, a threadgroup per (row, chunk) again, stores the element outputs of its chunk. Fixed
  chunks and a fixed merge order: every run gives the same bits.

Scratch (fp32 words; other accumulator types as their bits): the partial of slot q of chunk
c of row r at (q * chunks + c) * rows + r, then the results, slot q of row r at
Q * chunks * rows + q * rows + r (Q slots: `column.partial_slots`).
"""
from __future__ import annotations

from typing import Sequence

from ... import ir
from ...graph import Node
from .. import reduce
from ..base import IDX, make_kernel
from ..column import ColumnKernel, partial_slots
from ..hardware import SIMD_WIDTH
from ..rows.combine import combine
from .context import MultiContext, Walk

U0 = ir.Lit(0, "uint")


def bits(e: ir.Expr, frm: str, to: str) -> ir.Expr:
    """A 4-byte value of type `frm` as type `to`, bit for bit."""
    return e if frm == to else ir.Call(f"as_type<{to}>", (e,))


def loop(w: Walk, roots: Sequence[Node], rs: list[reduce.Reduction], outs: Sequence[int],
         k0: ir.Expr, k1: ir.Expr) -> list[ir.Stmt]:
    """The row values `roots` need (computed once), then the walk of elements [k0, k1) of
    the row: each thread's elements mf_f = k0 + its index, + the group's size, ...; `rs`
    folded, outputs `outs` stored. Where the schedule reads whole vectors (`Walk.vector`),
    a second walk of mf_vector elements a thread at once, taken where mf_vec_ok."""
    ctx, v = w.ctx, w.parts
    tensors, frontier = ctx.cone(list(roots))
    before = v.row_values.lower(frontier)
    for t in tensors:
        v.passes[t] = v.passes.get(t, 0) + 1
    scalar = walk(w, roots, rs, outs, k0, k1, tensors, 1)
    if w.vector == 1:
        return before + [scalar]
    wide = walk(w, roots, rs, outs, k0, k1, tensors, w.vector)
    return before + [ir.If(ir.Var("mf_vec_ok"), [wide], [scalar])]


def walk(w: Walk, roots: Sequence[Node], rs: list[reduce.Reduction], outs: Sequence[int],
         k0: ir.Expr, k1: ir.Expr, tensors: Sequence[str], vw: int) -> ir.For:
    """One walk of [k0, k1), `vw` consecutive elements a thread at a time (one vector load of
    each tensor holding the row as a run; one load of the others, whose position is the same
    for the vector's elements: `Walk.vector`), folded and stored element by element."""
    ctx = w.ctx
    body: list[ir.Stmt] = []
    if vw > 1:
        body += w.vector_loads(tensors, vw)
        body += [ir.Decl(f"mf_o{k}_{j}", ctx.out_stype(k), None, const=False)
                 for k in outs for j in range(vw)]
    for j in range(vw):
        el = w.element_lowering(j if vw > 1 else None)
        lane = el.lower(list(roots))
        lane += ctx.fold(el, rs, ir.Var("mf_f") + ir.Lit(j, IDX) if j else ir.Var("mf_f"))
        for k in outs:
            name = ctx.out_names[k]
            if vw > 1:          # the vector's element j, stored with the others below
                lane.append(ir.Assign(ir.Var(f"mf_o{k}_{j}"), ctx.out_value(k, el)))
            else:
                lane.append(ir.Store(name, w.at(name, ctx.graph.outputs[k].axes),
                                     ctx.out_value(k, el)))
        ctx.helpers.update(el.helpers)
        body += [ir.Block(lane)] if vw > 1 else lane
    for k in outs if vw > 1 else ():
        name, st = ctx.out_names[k], ctx.out_stype(k)
        body.append(ir.Store(name, w.at(name, ctx.graph.outputs[k].axes), ir.Call(
            ir.vector_type(st, vw), tuple(ir.Var(f"mf_o{k}_{j}") for j in range(vw))), vw, st))
    body = w.take_digits() + body
    lid: ir.Expr = ir.Cast(IDX, ir.Var("mf_lid"))
    step: ir.Expr = ir.Cast(IDX, ir.Var("mf_tpg"))
    if vw > 1:
        lid, step = lid * ir.Lit(vw, IDX), step * ir.Lit(vw, IDX)
    start = lid if isinstance(k0, ir.Lit) and k0.value == 0 else k0 + lid
    return ir.For("mf_f", IDX, start, k1, body, step=step)


def phase(w: Walk, rs: list[reduce.Reduction], k0: ir.Expr, k1: ir.Expr) -> list[ir.Stmt]:
    """Phase `rs` over elements [k0, k1): accumulate, then combine across the group (every
    thread ends with the group's partials)."""
    roots = [r.arg for r in rs if r.online_max is None]
    out: list[ir.Stmt] = [ir.Comment(f"phase {rs[0].phase + 1}: " +
                                     ", ".join(describe(r) for r in rs))]
    for r in rs:
        out += reduce.declare(r)
    out += loop(w, roots, rs, [], k0, k1)
    out += reduce.finish(rs)
    return out + combine(w.parts, rs)


def describe(r: reduce.Reduction) -> str:
    if r.online_sum is not None:
        return f"{r.kind} and (online) sum of exp(x - max) over {r.axis}"
    if r.online_max is not None:
        return "(the sum, with the max)"
    return f"{r.kind} over {r.axis}"


def element_outputs(ctx: MultiContext) -> list[int]:
    return [k for k, o in enumerate(ctx.graph.outputs) if any(a in ctx.reduced for a in o.axes)]


def row_outputs(w: Walk, first: ir.Expr) -> list[ir.Stmt]:
    """The one-value-per-row outputs, computed by every thread, stored where `first`."""
    ctx = w.ctx
    ks = [k for k in range(len(ctx.graph.outputs)) if k not in element_outputs(ctx)]
    if not ks:
        return []
    stmts = w.parts.row_values.lower([ctx.graph.outputs[k].node for k in ks])
    stores: list[ir.Stmt] = [
        ir.Store(ctx.out_names[k], w.base(ctx.out_names[k], ctx.graph.outputs[k].axes),
                 ctx.out_value(k, w.parts.row_values)) for k in ks]
    return [ir.Comment("the row's results"), *stmts, ir.If(first, stores)]


def group_threads() -> tuple[ir.ThreadInput, ...]:
    return (ir.ThreadInput("mf_group", "uint", "threadgroup_position_in_grid"),
            ir.ThreadInput("mf_lid", "uint", "thread_position_in_threadgroup"),
            ir.ThreadInput("mf_tpg", "uint", "threads_per_threadgroup"),
            ir.ThreadInput("mf_sg", "uint", "simdgroup_index_in_threadgroup"),
            ir.ThreadInput("mf_lane", "uint", "thread_index_in_simdgroup"))


def nsg() -> ir.Decl:
    return ir.Decl("mf_nsg", "uint", (ir.Var("mf_tpg") + ir.Lit(SIMD_WIDTH - 1, "uint")) /
                   ir.Lit(SIMD_WIDTH, "uint"))


def chunk_count(ctx: MultiContext) -> list[ir.Stmt]:
    """mf_flat (elements of a row, never 0 where the row is split), mf_chunks of mf_chunk_len
    elements."""
    one = ir.Lit(1, IDX)
    return [ir.Decl("mf_flat", IDX, ctx.flat),
            ir.Decl("mf_chunks", IDX, (ir.Var("mf_flat") + ir.Var("mf_chunk_len") - one) /
                    ir.Var("mf_chunk_len"))]


def chunk_header(ctx: MultiContext) -> list[ir.Stmt]:
    """A threadgroup per (row, chunk): its row, chunk, and elements [mf_k0, mf_k1)."""
    chunks = ir.Var("mf_chunks")
    return [ir.Comment("a threadgroup per (row, chunk of the row's elements)"),
            *chunk_count(ctx), nsg(),
            ir.Decl("mf_row", "uint", ir.Cast("uint", ir.Cast(IDX, ir.Var("mf_group")) / chunks)),
            ir.Decl("mf_chunk", IDX, ir.Cast(IDX, ir.Var("mf_group")) % chunks),
            ir.Decl("mf_k0", IDX, ir.Var("mf_chunk") * ir.Var("mf_chunk_len")),
            ir.Decl("mf_k1", IDX, ir.Call("min", (ir.Var("mf_flat"), ir.Var("mf_k0") +
                                                   ir.Var("mf_chunk_len"))))]


def chunk_header_of(w: Walk) -> list[ir.Stmt]:
    return chunk_header(w.ctx) + w.vec_ok()


# -- scratch -------------------------------------------------------------------------------------

def slot_numbers(reds: list[reduce.Reduction]) -> dict[str, tuple[int, str]]:
    """{accumulator variable: (its slot q, its MSL type)}, over every phase in order."""
    return {name: (q, typ) for q, (name, typ) in enumerate(partial_slots(reds))}


def partial_at(ctx: MultiContext, q: int, chunk: ir.Expr) -> ir.Expr:
    rows = ctx.span(ctx.outer)
    return (ir.Lit(q, IDX) * ir.Var("mf_chunks") + chunk) * rows + ir.Cast(IDX, ir.Var("mf_row"))


def result_at(ctx: MultiContext, q: int, nslots: int) -> ir.Expr:
    rows = ctx.span(ctx.outer)
    return (ir.Lit(nslots, IDX) * ir.Var("mf_chunks") + ir.Lit(q, IDX)) * rows + \
        ir.Cast(IDX, ir.Var("mf_row"))


def load_results(w: Walk, reds: list[reduce.Reduction], upto: int) -> list[ir.Stmt]:
    """The results of phases < `upto` from scratch, as the row values of their nodes."""
    slots = slot_numbers(reds)
    earlier = [r for r in reds if r.phase < upto]
    out: list[ir.Stmt] = []
    for name, typ in partial_slots(earlier):
        q = slots[name][0]
        out.append(ir.Decl(name, typ, bits(ir.Load("mf_scratch", result_at(w.ctx, q, len(slots))),
                                           "float", typ)))
    for r in earlier:
        w.parts.row_values.values[r.node] = reduce.result(r)
    return ([ir.Comment("the results of the earlier phases, from scratch")] if out else []) + out


# -- kernels -------------------------------------------------------------------------------------

def group_kernel(w: Walk, reds: list[reduce.Reduction]) -> ir.LoweredKernel:
    """One threadgroup per row: every phase over the whole row, then the outputs."""
    ctx, v = w.ctx, w.parts
    head: list[ir.Stmt] = [ir.Comment("one threadgroup per row"),
                           ir.Decl("mf_row", "uint", ir.Var("mf_group")), nsg(),
                           ir.Decl("mf_flat", IDX, ctx.flat), *w.vec_ok()]
    k0, k1 = ir.Lit(0, IDX), ir.Var("mf_flat")
    for p in range(nphases(reds)):
        rs = [r for r in reds if r.phase == p]
        v.main += phase(w, rs, k0, k1)
        for r in rs:
            v.row_values.values[r.node] = reduce.result(r)
    outs = element_outputs(ctx)
    if outs:
        v.main.append(ir.Comment("epilogue: the row's element outputs"))
        v.main += loop(w, [ctx.graph.outputs[k].node for k in outs], [], outs, k0, k1)
    v.main += row_outputs(w, ir.Var("mf_lid").eq(U0))
    return finish_kernel(w, head, "one threadgroup per row walks its flattened elements "
                                  "each phase")


def part_kernel(w: Walk, reds: list[reduce.Reduction], p: int) -> ir.LoweredKernel:
    """Phase p's partials of one chunk of a row, to scratch."""
    ctx, v = w.ctx, w.parts
    v.main += load_results(w, reds, p)
    rs = [r for r in reds if r.phase == p]
    v.main += phase(w, rs, ir.Var("mf_k0"), ir.Var("mf_k1"))
    slots = slot_numbers(reds)
    stores: list[ir.Stmt] = [
        ir.Store("mf_scratch", partial_at(ctx, slots[name][0], ir.Var("mf_chunk")),
                 bits(ir.Var(name), typ, "float")) for name, typ in partial_slots(rs)]
    v.main += [ir.Comment("the chunk's partials to scratch"),
               ir.If(ir.Var("mf_lid").eq(U0), stores)]
    return finish_kernel(w, chunk_header_of(w), f"phase {p + 1} of {nphases(reds)}: the partials "
                                               f"of a chunk of a row, to scratch")


def merge_kernel(w: Walk, reds: list[reduce.Reduction], p: int) -> ir.LoweredKernel:
    """One thread per row: phase p's partials merged in chunk order, its results to scratch
    (the last phase: also the one-value-per-row outputs)."""
    ctx, v = w.ctx, w.parts
    rs = [r for r in reds if r.phase == p]
    slots = slot_numbers(reds)
    own = partial_slots(rs)
    loads = [ir.Decl(f"mf_p{slots[name][0]}", typ, bits(ir.Load(
        "mf_scratch", partial_at(ctx, slots[name][0], ir.Var("mf_c"))), "float", typ))
        for name, typ in own]
    merges: list[ir.Stmt] = []
    for r in rs:
        if r.compensated and r.online_max is None:
            merges += reduce.update(r, ir.Var(f"mf_p{slots[r.acc][0]}"), ir.Var("mf_c"))
        elif r.online_max is None:
            merges += ColumnKernel.merges([r], lambda n: ir.Var(f"mf_p{slots[n][0]}"))[1]
    decls: list[ir.Stmt] = []
    for r in rs:
        decls += reduce.declare(r)
    v.main += [ir.Comment(f"merge the chunks' partials of phase {p + 1}, in chunk order"),
               *decls, ir.For("mf_c", IDX, ir.Lit(0, IDX), ir.Var("mf_chunks"), loads + merges),
               *reduce.finish(rs), ir.Comment("the row's results to scratch"),
               *[ir.Store("mf_scratch", result_at(ctx, slots[name][0], len(slots)),
                          bits(ir.Var(name), typ, "float")) for name, typ in own]]
    if p == nphases(reds) - 1:
        v.main += load_results(w, reds, p)
        for r in rs:
            v.row_values.values[r.node] = reduce.result(r)
        v.main += row_outputs(w, ir.Lit(True, "bool"))
    head: list[ir.Stmt] = [
        ir.Comment("one thread per row"), *chunk_count(ctx),
        ir.If(ir.Cast(IDX, ir.Var("mf_row")) >= ctx.span(ctx.outer), [ir.Return()])]
    threads = (ir.ThreadInput("mf_row", "uint", "thread_position_in_grid"),)
    return finish_kernel(w, head, f"merges phase {p + 1}'s partials of every chunk of a row, in "
                                  f"chunk order", threads)


def out_kernel(w: Walk, reds: list[reduce.Reduction]) -> ir.LoweredKernel:
    """The element outputs of one chunk of a row, from the results in scratch."""
    ctx, v = w.ctx, w.parts
    v.main += load_results(w, reds, nphases(reds))
    outs = element_outputs(ctx)
    v.main.append(ir.Comment("the chunk's element outputs"))
    v.main += loop(w, [ctx.graph.outputs[k].node for k in outs], [], outs,
                   ir.Var("mf_k0"), ir.Var("mf_k1"))
    return finish_kernel(w, chunk_header_of(w), "the element outputs of a chunk of a row, from "
                                               "the results in scratch")


def nphases(reds: list[reduce.Reduction]) -> int:
    return 1 + max(r.phase for r in reds)


def finish_kernel(w: Walk, head: list[ir.Stmt], how: str,
                  threads: tuple[ir.ThreadInput, ...] = ()) -> ir.LoweredKernel:
    ctx, v = w.ctx, w.parts
    body = list(v.tg_arrays) + head + v.pre + v.main
    summary = (f"{ctx.graph.name} ({v.name}): reduces {ctx.axis} (flattened) for each row of "
               f"[{', '.join(ctx.outer)}]; {how}; fp32 accumulation, compensated sums")
    return make_kernel(ctx.graph, ctx.index64, threads or group_threads(), body, summary, v.name)
