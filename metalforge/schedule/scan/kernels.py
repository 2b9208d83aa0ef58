"""The two scan kernels: `row` (the scan axis innermost: one threadgroup per row, streamed in
chunks, a serial scan in registers, a simdgroup prefix and a threadgroup carry) and `column`
(the scan axis outer: one thread per column of the other axes, scanning serially along the
axis, neighbouring threads on neighbouring addresses)."""
from __future__ import annotations

from ... import ir
from ...graph import Node, scan_reversed
from .. import reduce
from ..base import IDX, make_kernel
from ..column import ColumnContext, ColumnKernel
from ..lower import ElementLowering
from ..rows.context import RowContext, RowKernel, Section, outer_load
from ..rows.gathers import element_lowering
from ..rows.kernels import group_header
from ..rows.loads import each_slot, load_block, slot_pos, store_block
from ..rows.place import lanes_of_rows
from . import segments
from .blocks import (
    acc_value,
    combine,
    helpers,
    identity,
    lit,
    result,
    simd_exclusive,
    tg_arrays,
    threadgroup_carry,
)
from .context import Scan, mirrored, reads, vector_width

Built = tuple[ir.LoweredKernel, reduce.VariantParts]


def title(scans: list[Scan]) -> str:
    return ", ".join(f"{s.kind} over {s.node.attr[1]}" + (" (reverse: from the axis's end)"
                                                           if scan_reversed(s.node) else "")
                     for s in scans)


def cones(ctx: reduce.ReductionContext, scans: list[Scan], outputs: bool = True
          ) -> tuple[list[str], list[Node]]:
    """(the tensors along the axis the scans' arguments and the `outputs` read, the per-row
    values they use), the outputs' read through the scans' results."""
    roots = [a for s in scans for a in s.args] + \
        ([o.node for o in ctx.graph.outputs] if outputs else [])
    return ctx.cone(roots, {s.node for s in scans})


# -- the row kernel -------------------------------------------------------------------------

def row(ctx: RowContext, scans: list[Scan], name: str = "row", split: bool = False) -> Built:
    """Kernel `name`: ``row``, one threadgroup per row (per segment of a row where `split`),
    chunks of threads x R elements in turn, a running carry; ``totals``, only each segment's
    total, to scratch (the first launch of a split call); ``simd``, one simdgroup per row
    (rows of one chunk of 32 x R: several rows a threadgroup, no threadgroup memory)."""
    totals, lanes = name == "totals", name == "simd"
    parts = reduce.variant_parts(ctx, name, lambda p, n: outer_load(ctx, p, n))
    k = RowKernel(ctx, parts, reads(ctx), vector_width(ctx), staged={}, interleaved=False,
                  strided=False, keep={}, mirrored=mirrored(ctx.graph))
    tensors, frontier = cones(ctx, scans, outputs=not totals)
    for t in tensors:
        parts.passes[t] = 1
    for s in scans:
        ctx.helpers.update(helpers(s))
    if k.vw == 8:                             # 16-byte accesses of 2-byte types
        ctx.helpers.add("mf_pack8_of")
    rowvals = parts.row_values.lower(frontier)
    width = ir.Var("mf_w" if lanes else "mf_tpg")     # threads along the row
    chunk: list[ir.Stmt] = [
        ir.Comment(f"phase 1: this thread's {k.reads} elements of the chunk into registers"),
        ir.Decl("mf_base", "uint", (ir.Var("mf_j") * width + ir.Var("mf_t")) * lit(k.reads))]
    if tensors:
        chunk += load_block(k, tensors, declare=True)
    chunk += serial_scan(k, scans, frontier, record=not totals)
    chunk += across(scans, totals, lanes)
    if not totals:
        chunk += apply(k, scans, frontier)
    threads, head = place(ctx, k, name, split)
    carries: list[ir.Stmt] = [ir.Comment("the running value of the chunks before")]
    carries += [ir.Decl(s.name("carry"), s.acc_type, identity(s), const=False) for s in scans]
    if split and not totals:
        carries += segments.carry_in(ctx, scans)
    first, stop = (ir.Var("mf_j0"), ir.Var("mf_j1")) if split else (lit(0), ir.Var("mf_chunks"))
    body = ([] if lanes else list(tg_arrays(scans))) + head + parts.pre + rowvals + carries + [
        ir.For("mf_j", "uint", first, stop, chunk)]
    if totals:
        body += segments.store_totals(ctx, scans)
    return make_kernel(ctx.graph, ctx.index64, threads, body, summary(k, scans, name, split),
                       name), parts


def place(ctx: RowContext, k: RowKernel, name: str, split: bool
          ) -> tuple[tuple[ir.ThreadInput, ...], list[ir.Stmt]]:
    """(thread inputs, statements placing the thread): its row (and segment), its index
    along the row, the row's chunks, whether vector accesses apply."""
    if split:
        threads, head = segments.header(ctx)
    elif name == "simd":
        threads, head = lanes_header(ctx, k.reads)
    else:
        threads, head = group_header()
    if not split:
        width = ir.Var("mf_w" if name == "simd" else "mf_tpg")
        span = width * lit(k.reads)
        length = ir.Cast("uint", ctx.size(ctx.axis))
        head += [ir.Decl("mf_chunks", "uint", (length + (span - lit(1))) / span)]
    if k.vw > 1:
        whole = (ctx.size(ctx.axis) % ir.Lit(k.vw, IDX)).eq(ir.Lit(0, IDX))
        head.append(ir.Decl("mf_vec_ok", "bool", whole))
    return threads, head


def lanes_header(ctx: RowContext, reads: int
                 ) -> tuple[tuple[ir.ThreadInput, ...], list[ir.Stmt]]:
    """The simd kernel: mf_w = 1 << mf_wlog lanes per row, the fewest (a power of two up to
    32) holding it at R elements each, computed from the row's length as the host does, so
    32 / mf_w rows share a simdgroup; past the last row (a grid rounded up to whole groups),
    a row's lanes leave together (no barrier waits for them)."""
    lanes = (ir.Cast("uint", ctx.size(ctx.axis)) + lit(reads - 1)) / lit(reads)
    return lanes_of_rows(ctx, lanes, "mf_w = 1 << mf_wlog lanes per row: the fewest, a power of "
                         f"two up to 32, that hold it at {reads} elements each (32 / mf_w rows "
                         "a simdgroup)")


def across(scans: list[Scan], totals: bool, lanes: bool) -> list[ir.Stmt]:
    """Phases 3 and 4: the simdgroup's prefix of the threads' totals, the threadgroup carry
    (not where one simdgroup holds the row: `lanes`), each thread's prefix before it
    (mf_pre{i}; not in the totals kernel) and the running carry past the chunk."""
    out: list[ir.Stmt] = [ir.Comment("phase 3: the simdgroup's prefix of the threads' totals")]
    for s in scans:
        out += simd_exclusive(s, segmented=lanes)
    if not lanes:
        out.append(ir.Comment("phase 4: the threadgroup carry: the totals of the simdgroups "
                              "before this one, and of the whole chunk"))
        out += threadgroup_carry(scans)
    for s in scans:
        carry = ir.Var(s.name("carry"))
        chunk = ir.Var(s.name("simd" if lanes else "chunk"))
        if not totals:
            before = carry if lanes else combine(s, carry, ir.Var(s.name("before")))
            out.append(ir.Decl(s.name("pre"), s.acc_type, combine(s, before,
                                                                  ir.Var(s.name("excl")))))
        out.append(ir.Assign(carry, combine(s, carry, chunk)))
    return out


def summary(k: RowKernel, scans: list[Scan], name: str, split: bool) -> str:
    ctx = k.ctx
    unit = {"simd": "the fewest lanes of a simdgroup per row that hold it",
            "totals": "one threadgroup per segment of a row (mf_segs a row)",
            "row": "one threadgroup per " + ("segment of a row (mf_segs a row)" if split
                                             else "row")}[name]
    what = ("each segment's total to scratch (a split call's first launch)"
            if name == "totals" else
            "a serial scan in registers, a simdgroup prefix" +
            ("" if name == "simd" else ", a threadgroup carry") +
            (", the earlier segments' totals from scratch" if split and name == "row" else ""))
    return (f"{ctx.graph.name} ({name}): {title(scans)} along each row of "
            f"[{', '.join(ctx.outer)}], {unit}, in chunks of threads x {k.reads} elements: "
            f"{what}; " + ("scalar loads/stores at the mirrored positions D - 1 - p"
                          if k.mirrored else f"{k.vw}-wide loads/stores where aligned") +
            "; fp32 accumulation")


def in_row(k: RowKernel, body: list[ir.Stmt], checked: list[ir.Stmt]) -> list[ir.Stmt]:
    """`body` for each slot where the thread's block lies wholly in the row (no checks),
    else `checked` (which checks mf_pos itself)."""
    pos: list[ir.Stmt] = [ir.Decl("mf_pos", "uint", slot_pos(k, ir.Var("mf_k")))]
    inside = ir.Var("mf_base") + lit(k.reads) <= k.ctx.size(k.ctx.axis)
    return [ir.If(inside, [each_slot(k, (pos if ir.mentions(body, "mf_pos") else []) + body)], [
        ir.Comment("the row's end: each element checked"), each_slot(k, pos + checked)])]


def serial_scan(k: RowKernel, scans: list[Scan], frontier: list[Node], record: bool = True
                ) -> list[ir.Stmt]:
    """Phase 2: each element's scanned value, combined in order into the thread's running
    value mf_run{i}, which each slot of mf_scan{i} records where `record` (positions past the
    row's end leave it as it is; the totals kernel keeps only the running value)."""
    el = element_lowering(k, Section(), frontier)
    values = el.lower([a for s in scans for a in s.args])
    k.ctx.helpers.update(el.helpers)
    out: list[ir.Stmt] = [ir.Comment("phase 2: the serial (inclusive) scan of the thread's "
                                     "elements, in registers")]
    folds: list[ir.Stmt] = []
    records: list[ir.Stmt] = []
    for s in scans:
        run = ir.Var(s.name("run"))
        if record:
            out.append(ir.ArrayDecl(s.name("scan"), s.acc_type, k.reads))
            records.append(ir.Assign(ir.Lane(ir.Var(s.name("scan")), ir.Var("mf_k")), run))
        out.append(ir.Decl(run.name, s.acc_type, identity(s), const=False))
        folds.append(ir.Assign(run, combine(s, run, acc_value(s, *[el.value(a) for a in s.args]))))
    guard = ir.Var("mf_pos") < k.ctx.size(k.ctx.axis)
    return out + in_row(k, values + folds + records,
                        [ir.If(guard, values + folds)] + records)


def apply(k: RowKernel, scans: list[Scan], frontier: list[Node]) -> list[ir.Stmt]:
    """Phase 5: each slot's scanned value with the thread's prefix before it, the outputs'
    values from it (the epilogue), stored."""
    ctx = k.ctx
    el = element_lowering(k, Section(), frontier, prefix="mf_o")
    fix: list[ir.Stmt] = []
    for s in scans:
        at = ir.Lane(ir.Var(s.name("scan")), ir.Var("mf_k"))
        fix.append(ir.Assign(at, combine(s, ir.Var(s.name("pre")), at)))
        el.values[s.node] = result(s, at)
    outs = list(range(len(ctx.graph.outputs)))
    values = el.lower([ctx.graph.outputs[j].node for j in outs])
    ctx.helpers.update(el.helpers)
    regs: list[ir.Stmt] = [ir.Assign(ir.Lane(ir.Var(f"mf_reg_{ctx.out_names[j]}"), ir.Var("mf_k")),
                      ctx.out_value(j, el)) for j in outs]
    decls: list[ir.Stmt] = [ir.ArrayDecl(f"mf_reg_{ctx.out_names[j]}", ctx.out_stype(j),
                                         k.reads) for j in outs]
    guard = ir.Var("mf_pos") < ctx.size(ctx.axis)
    return [ir.Comment("phase 5: the prefix before this thread applied; the outputs")] + \
        decls + in_row(k, fix + values + regs, [ir.If(guard, fix + values + regs)]) + \
        store_block(k, outs)


# -- the column kernel ------------------------------------------------------------------------

def column(ctx: ColumnContext, scans: list[Scan], name: str = "column", split: bool = False
           ) -> Built:
    """One thread per column (per segment of a column's axis where `split`), scanning
    serially along the axis, R positions at a time: the scanned values of all R first (their
    loads in flight together), then combined in order and the outputs stored;
    ``col_totals``: only each segment's totals, to scratch (a split call's first launch)."""
    totals = name == "col_totals"
    kind = MirroredColumn if mirrored(ctx.graph) else ColumnKernel
    parts = reduce.variant_parts(ctx, name, lambda p, n: kind(ctx, p).col_load(n))
    ck = kind(ctx, parts)
    tensors, frontier = cones(ctx, scans, outputs=not totals)
    for t in tensors:
        parts.passes[t] = 1
    for s in scans:
        ctx.helpers.update(helpers(s))
    colvals = parts.row_values.lower(frontier)
    r = ctx.policy.reads_per_thread
    first, end = (ir.Var("mf_k_first"), ir.Var("mf_k_end")) if split else \
        (lit(0), ir.Cast("uint", ctx.size(ctx.axis)))
    pos: list[ir.Stmt] = [ir.Decl("mf_k", "uint", ir.Var("mf_k0") + ir.Var("mf_u"))]
    el = column_lowering(ctx, ck, parts, frontier, "mf_v")
    values = el.lower([a for s in scans for a in s.args])
    carries: list[ir.Stmt] = [ir.Comment("the running value of each scan")]
    held: list[ir.Stmt] = []
    keep: list[ir.Stmt] = []
    folds: list[ir.Stmt] = []
    out = column_lowering(ctx, ck, parts, frontier, "mf_o")
    for s in scans:
        run, val = ir.Var(s.name("carry")), ir.Lane(ir.Var(s.name("val")), ir.Var("mf_u"))
        carries.append(ir.Decl(run.name, s.acc_type, identity(s), const=False))
        held.append(ir.ArrayDecl(s.name("val"), s.acc_type, r))
        keep.append(ir.Assign(val, acc_value(s, *[el.value(a) for a in s.args])))
        folds.append(ir.Assign(run, combine(s, run, val)))
        out.values[s.node] = result(s, run)
    if split and not totals:
        carries += segments.carry_in(ctx, scans, "mf_col")
    if not totals:
        folds += column_outputs(ctx, ck, out)
    ctx.helpers.update(el.helpers | out.helpers)
    inside = ir.Var("mf_k") < end
    step = held + [
        ir.Comment(f"the scanned values of {r} positions (their loads in flight together)"),
        ir.For("mf_u", "uint", lit(0), lit(r), pos + [ir.If(inside, values + keep)],
               unroll=True),
        ir.Comment("combined in order into the running values" +
                   ("" if totals else "; the outputs stored")),
        ir.For("mf_u", "uint", lit(0), lit(r), pos + [ir.If(inside, folds)], unroll=True)]
    threads, head = segments.column_header(ctx) if split else ck.header("column", 1)
    main = parts.pre + colvals + carries + [
        ir.Comment(f"along '{ctx.axis}', {r} positions at a time"),
        ir.For("mf_k0", "uint", first, end, step, step=lit(r))]
    if totals:
        main += segments.store_totals(ctx, scans, "mf_col")
    what = ("each segment's totals to scratch (a split call's first launch)" if totals else
            f"scanning serially, {r} positions' loads at a time")
    summary = (f"{ctx.graph.name} ({name}): {title(scans)} (not innermost) for each column of "
               f"[{', '.join(ctx.outer)}], one thread per column" +
               (" and segment of the axis" if split else "") + f", {what}; fp32 accumulation")
    return make_kernel(ctx.graph, ctx.index64, threads, head + main, summary, name), parts


def column_outputs(ctx: ColumnContext, ck: ColumnKernel, out: ElementLowering
                   ) -> list[ir.Stmt]:
    """The outputs at position mf_k, computed (`out` holds the scans' running values) and
    stored."""
    graph = ctx.graph
    stmts = out.lower([o.node for o in graph.outputs])
    for j, o in enumerate(graph.outputs):
        name = ctx.out_names[j]
        stmts.append(ir.Store(name, ck.at(name, o.axes), ctx.out_value(j, out)))
    return stmts


def column_lowering(ctx: ColumnContext, ck: ColumnKernel, parts: reduce.VariantParts,
                    frontier: list[Node], prefix: str) -> ElementLowering:
    """Element mf_k of this column: tensors loaded there, the column values as computed."""
    el = ElementLowering(ctx.graph, ck.col_load, ck.el_position, ctx.size,
                         lambda n: ctx.names[n], prefix=prefix)
    for n in frontier:
        el.values[n] = parts.row_values.value(n)
    return el


class MirroredColumn(ColumnKernel):
    """The column kernel of a reverse scan: step k of the serial scan reads and writes
    position D - 1 - k of the axis (and mf.index of the axis is that position)."""

    def _mirror(self) -> ir.Expr:
        return ir.Cast("uint", self.ctx.size(self.ctx.axis)) - lit(1) - ir.Var("mf_k")

    def at(self, name: str, axes: tuple[str, ...]) -> ir.Expr:
        b, st = self.bases(name, axes)
        if self.ctx.axis not in axes:
            return b
        return b + ir.Cast(IDX, self._mirror()) * st

    def el_position(self, axis: str) -> ir.Expr:
        return self._mirror() if axis == self.ctx.axis else self.position(axis)
