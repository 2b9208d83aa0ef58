"""The passes over a row: each phase's section (load the inputs it needs, compute element
values, fold them into the phase's reductions, store outputs, combine across the row) and the
epilogue."""
from __future__ import annotations

from typing import Callable

from ... import ir
from ...graph import Node, ReduceOp, take_sites
from .. import folds, reduce
from ..lower import ElementLowering, compute_type
from ..unit_gather import gathers_once
from .combine import combine
from .context import RowKernel, Section, element_nodes, row_base
from .gathers import element_lowering, row_takes, shuffle_block
from .loads import each_slot, holding, lit, load_block, placement, slot_pos, store_block
from .plan import SPLIT, STREAMED, WHOLE

Each = Callable[[list[ir.Stmt], bool], ir.Stmt]


def element_loop(k: RowKernel, roots: list[Node], reds: list[reduce.Reduction],
                 outs: list[int], kept: list[Node]
                 ) -> tuple[list[ir.Stmt], list[str], list[ir.Stmt], list[ir.Stmt]]:
    """(row statements before the loop, the tensors the loop reads from registers, the
    statements fetching gathered elements from other lanes (run once the registers are
    loaded), the loop over this thread's R elements, which also fills the register arrays
    of the `kept` values it computes)."""
    ctx, parts = k.ctx, k.parts
    tensors, frontier = ctx.cone(roots, k.stored)
    fresh = frozenset(tensors) - parts.loaded     # read from the registers just loaded
    row_stmts = parts.row_values.lower(frontier)
    held = set(tensors) | (set() if k.name in STREAMED else parts.loaded)
    own, shuffled = row_takes(k, roots, held)
    sec = Section(fresh, own)
    fetch = shuffle_block(k, sec, shuffled, frontier) if shuffled else []
    el = element_lowering(k, sec, frontier)
    sites = take_sites(ctx.graph)
    for n in shuffled:
        el.values[n] = ir.Lane(ir.Var(f"mf_gather{sites.index(n)}"), ir.Var("mf_k"))
    for n in k.stored:
        el.values[n] = ir.Lane(ir.Var(k.keep[n]), ir.Var("mf_k"))
    values = el.lower(roots)
    ctx.helpers.update(el.helpers)
    pos = ir.Var("mf_pos")
    rest: list[ir.Stmt] = []                   # after the reductions' folds
    for n in kept:
        rest.append(ir.Assign(ir.Lane(ir.Var(k.keep[n]), ir.Var("mf_k")), el.value(n)))
    for j in outs:
        rest.append(ir.Assign(ir.Lane(ir.Var(f"mf_reg_{ctx.out_names[j]}"), ir.Var("mf_k")),
                              ctx.out_value(j, el)))
    body = values + ctx.fold(el, reds, pos) + rest
    decl_pos: list[ir.Stmt] = [ir.Decl("mf_pos", "uint", slot_pos(k, ir.Var("mf_k")))]

    def each(stmts: list[ir.Stmt], guarded: bool) -> ir.Stmt:
        if guarded:
            stmts = decl_pos + [ir.If(pos < ctx.size(ctx.axis), stmts)]
        else:
            stmts = (decl_pos if ir.mentions(stmts, "mf_pos") else []) + stmts
        return each_slot(k, stmts)
    whole: list[ir.Stmt] = [ir.Comment("all of them in the row: no per-element check")]
    chunked = [r for r in reds if r.online_sum is not None or r.squares is not None or (
        k.name in STREAMED and k.reads > 1 and folds.blocked(r))]
    if chunked:
        whole += chunk_folds(k, el, reds, chunked, values, rest, each)
    else:
        whole.append(each(body, False))
    if k.name in WHOLE:                    # rows of whole blocks
        return row_stmts, tensors, fetch, whole
    end = ir.Var("mf_base") + lit(k.reads)
    inside = (ir.Var("mf_last") < ctx.size(ctx.axis) if k.strided
              else end <= ctx.size(ctx.axis))
    loop: list[ir.Stmt] = [ir.If(inside, whole, holding(k, [
        ir.Comment("the row's end: each element checked"), each(body, True)]))]
    return row_stmts, tensors, fetch, loop


def chunk_folds(k: RowKernel, el: ElementLowering, reds: list[reduce.Reduction],
                chunked: list[reduce.Reduction], values: list[ir.Stmt], rest: list[ir.Stmt],
                each: Each) -> list[ir.Stmt]:
    """The element loop over a chunk wholly in the row, folding the `chunked` reductions once
    per chunk instead of element by element: the loop keeps each one's argument in a register
    array, then
    - an online (max, sum) pair folds it with one `mf_online_add_chunk` (one rescale test and
      one compensated add per chunk: f32 softmax rows of 16384 went from 0.93x to 1.02x torch
      eager on the H100), a centered (sum, squares) pair with one `mf_centered_add_chunk`;
    - a compensated sum adds the chunk's values in plain fp32, in order, then that into its
      sum with one compensated add, and a float max / min takes the chunk's extreme first
      (`folds.fold_block`: the streamed rows were ALU-bound on the compensated add's ten or
      so instructions an element)."""
    others = [r for r in reds if r not in chunked]
    keep: list[ir.Stmt] = []
    decls: list[ir.Stmt] = []
    after: list[ir.Stmt] = []
    for r in chunked:
        pair = r.online_sum is not None or r.squares is not None
        arr = f"mf_on{r.i}" if pair else f"mf_e{r.i}"
        decls.append(ir.ArrayDecl(arr, "float" if pair else r.acc_type, k.reads))
        keep.append(ir.Assign(ir.Lane(ir.Var(arr), ir.Var("mf_k")), k.ctx.acc_value(el, r)))
        if pair:
            after += reduce.update_chunk(r, arr, k.reads)
        else:
            after.append(ir.Block(folds.fold_block(r, ir.Var(arr), k.reads, ir.Var("mf_base"))))
    if any(r.online_sum is not None for r in chunked):
        k.ctx.helpers.add("mf_online_add_chunk")
    body = values + k.ctx.fold(el, others, ir.Var("mf_pos")) + keep + rest
    what = " and ".join(dict.fromkeys(
        "the running max and sum" if r.online_sum is not None else
        "the running count, sum and squares around the mean" if r.squares is not None else
        "its sum" if r.kind == ReduceOp.SUM else f"its {r.kind}" for r in chunked))
    return decls + [each(body, False), ir.Comment(f"fold the chunk into {what} at once")] + after


def section(k: RowKernel, roots: list[Node], rs: list[reduce.Reduction], outs: list[int],
            title: str) -> None:
    """One pass over the row, added to the variant's main statements: load the inputs it
    needs (once per row in the register variants, per chunk in the looped one), compute
    element values, fold the reductions `rs` and store the outputs `outs`; then combine `rs`
    across the row."""
    ctx, v = k.ctx, k.parts
    reads, looped = k.reads, k.name in STREAMED
    reach = element_nodes(ctx, roots, k.stored)
    kept = [n for n in k.keep if n in reach and n not in k.stored]
    row_stmts, tensors, fetch, loop = element_loop(k, roots, rs, outs, kept)
    v.main.append(ir.Comment(title))
    v.main.extend(row_stmts)
    for r in rs:
        v.main.extend(reduce.declare(r))
    regs = [ir.ArrayDecl(f"mf_reg_{ctx.out_names[j]}", ctx.out_stype(j), reads) for j in outs]
    regs += [ir.ArrayDecl(k.keep[n], compute_type(n.dtype), reads) for n in kept]
    body: list[ir.Stmt] = []
    new = [t for t in tensors if looped or t not in v.loaded]
    for t in new:
        v.passes[t] = v.passes.get(t, 0) + 1
    if looped:
        chunk, tpg, me = ir.Var("mf_j"), ir.Var("mf_tpg"), ir.Var("mf_t")
        body += [ir.Decl("mf_base", "uint", (chunk * tpg + me) * lit(reads))]
        body += placement(k, chunk * tpg * lit(reads) + me, tpg)
        if new:
            body += load_block(k, new, declare=True)
        body += regs
    else:
        if new:
            v.main.extend(load_block(k, new, declare=True))
            v.loaded.update(new)
        v.main.extend(regs)
    body += fetch + [ir.Comment(f"each of this thread's {reads} elements")] + loop
    if outs:
        body += store_block(k, outs)
    if looped:
        first, end = ((ir.Var("mf_j0"), ir.Var("mf_j1")) if k.name in SPLIT    # its slice
                      else (lit(0), ir.Var("mf_chunks")))
        v.main.append(ir.For("mf_j", "uint", first, end, body))
    else:
        v.main.extend(body)
    k.stored.update(kept)
    if rs:
        v.main.extend(reduce.finish(rs))
        v.main.extend(combine(v, rs))
        v.main.extend(reduce.results(v.row_values, rs))


def epilogue(k: RowKernel, early: tuple[int, ...], first: ir.Expr | None = None) -> None:
    """The outputs the first phase did not store (`early`): those along the row in one more
    section; one value per row stored by the row's first thread (where `first`, if given)."""
    ctx, v = k.ctx, k.parts
    graph = ctx.graph
    along = [j for j, o in enumerate(graph.outputs) if ctx.elem(o.node) or ctx.axis in o.axes]
    el_outs = [j for j in along if j not in early]
    row_outs = [j for j in range(len(graph.outputs)) if j not in along]
    if el_outs:
        section(k, [graph.outputs[j].node for j in el_outs], [], el_outs,
                "epilogue: compute and store the outputs along the row")
    if row_outs:
        roots = [graph.outputs[j].node for j in row_outs]
        once = gathers_once(v.row_values, roots)
        stmts = v.row_values.lower(roots)
        stores: list[ir.Stmt] = []
        for j in row_outs:
            stores.append(ir.Store(ctx.out_names[j], row_base(
                ctx, v, ctx.out_names[j], graph.outputs[j].axes),
                ctx.out_value(j, v.row_values)))
        first = first if first is not None else ir.Var("mf_t").eq(lit(0))
        if once:
            v.main += [ir.Comment("epilogue: the row's results, computed and stored by its "
                                  "first thread (it alone reads the row's gathered elements)"),
                       ir.If(first, stmts + stores)]
            return
        v.main += [ir.Comment("epilogue: the row's results, stored by its first thread")]
        v.main += stmts + [ir.If(first, stores)]
