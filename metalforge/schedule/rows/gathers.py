"""mf.take inside rows: the element lowering of a row thread's slots, and where each gather
along the row is served from (the thread's own slots, other lanes' registers through simd
shuffles, or a guarded global load)."""
from __future__ import annotations

from ... import ir
from ...graph import Node, Op, take_sites
from .. import gather as takes
from ..base import IDX
from ..lower import ElementLowering, compute_type
from .context import RowKernel, Section, el_position, element_nodes
from .loads import each_slot, lit, reg_value, slot_pos
from .plan import LANES


def gather(k: RowKernel, sec: Section, n: Node, pos: ir.Expr) -> ir.Expr:
    """A gathered element (mf.take) of this element: from this thread's own registers
    where the index provably stays in its block of R (`sec.own_slots`: slot k ^ c), else a
    guarded global load (the row's other elements sit in other threads' registers), from
    cache for a row just read. Gathers fetched by simd shuffles never get here: their
    values are set before the element loop (`shuffle_block`)."""
    name, axis = n.attr
    if n in sec.own_slots:
        c = sec.own_slots[n]
        slot: ir.Expr = ir.Var("mf_k")
        return reg_value(k, sec, name, slot ^ lit(c) if c else slot)
    t = k.ctx.graph.tensor(name)
    e: ir.Expr = ir.Lit(0, IDX)
    for i, a in enumerate(t.axes):
        p = pos if a == axis else ir.Cast(IDX, el_position(k, a))
        e = p if i == 0 else e * k.ctx.size(a) + p
    return ir.Cast(compute_type(t.dtype), ir.Load(k.ctx.names[name], e))


def element_lowering(k: RowKernel, sec: Section, frontier: list[Node], prefix: str = "mf_v"
                     ) -> ElementLowering:
    """Lowering of this thread's element mf_k (at row position mf_pos): tensors from its
    registers, the row values `frontier` as the row computed them."""
    ctx = k.ctx
    el = ElementLowering(ctx.graph, lambda n: reg_value(k, sec, n.attr, ir.Var("mf_k")),
                         lambda a: el_position(k, a), ctx.size, lambda s: ctx.names[s],
                         prefix=prefix, take=lambda n, pos: gather(k, sec, n, pos))
    for n in frontier:
        el.values[n] = k.parts.row_values.value(n)
    return el


def row_takes(k: RowKernel, roots: list[Node], held: set[str]
              ) -> tuple[dict[Node, int], list[Node]]:
    """The gathers along the row among the element values of `roots` that registers can
    serve: ({gather: c} read from this thread's own slot k ^ c, [gathers fetched from
    other lanes by simd shuffles]). Both need the gathered tensor held in registers
    (`held`) for this row; a shuffle needs the simd variant (one simdgroup holds the row),
    an index a lane can compute for any position (`lane_computable`) and a 32-bit value.
    The rest are loads (`gather`), recorded in the context's `loaded_gathers`."""
    ctx = k.ctx
    own: dict[Node, int] = {}
    shuffled: list[Node] = []
    sites = take_sites(ctx.graph)
    loaded = ctx.loaded_gathers[k.name]
    for n in sorted((n for n in element_nodes(ctx, roots) if n.op == Op.TAKE and n in sites),
                    key=sites.index):       # (w[:, j] of a literal dim is no site: a load)
        name, axis = n.attr
        if n in k.stored:             # kept in registers by an earlier phase
            continue
        c = takes.own_slot(n, k.reads)
        if axis != ctx.axis or name not in held:
            loaded.add(sites.index(n))
        elif c is not None:
            own[n] = c
        elif (k.name in LANES and takes.lane_computable(n, axis)
              and compute_type(ctx.graph.tensor(name).dtype) in takes.SHUFFLE_TYPES):
            shuffled.append(n)
        else:
            loaded.add(sites.index(n))
    return own, shuffled


def shuffle_block(k: RowKernel, sec: Section, shuffled: list[Node], frontier: list[Node]
                  ) -> list[ir.Stmt]:
    """Simd variant: fetch gathered elements from the lanes that hold them. The row's lane
    l holds its elements [l*R, l*R + R), so element p is the row's lane p / R, slot p % R
    (the row's lanes start at mf_lane - mf_t). Every lane computes (and checks) the index
    of each of its R slots, then takes the element with `simd_shuffle` (all lanes take
    part, in uniform control flow). When every element in the row gathers from its own
    slot number (offsets a multiple of R: rotate-half RoPE on head dims that are multiples
    of 2R), one shuffle per element; otherwise R per element, keeping the one at the
    gathered slot. Fills mf_gather<g>[R] (g: the gather's number) for the element loop."""
    ctx, reads, axis = k.ctx, k.reads, k.ctx.axis
    slot_k, pos = ir.Var("mf_k"), ir.Var("mf_pos")
    first = ir.Var("mf_lane") - ir.Var("mf_t")        # the row's first lane
    in_row = pos < ctx.size(axis)
    sites = take_sites(ctx.graph)
    el = element_lowering(k, sec, frontier, prefix="mf_i")
    names = ", ".join(f"{sites.index(n)} from '{n.attr[0]}'" for n in shuffled)
    out: list[ir.Stmt] = [ir.Comment(
        f"gathers along {axis} from the lanes holding them (gather {names}): row element p "
        f"is lane p / {reads}, slot p % {reads}")]
    index_loop: list[ir.Stmt] = [ir.Decl("mf_pos", "uint", slot_pos(k, slot_k))]
    flag, past_end = ir.Var("mf_same_slot"), pos >= ctx.size(axis)
    same: list[ir.Stmt] = []            # mf_same_slot: each gather at its own slot number
    fetch_same: list[ir.Stmt] = []
    fetch_any: list[ir.Stmt] = []
    for n in shuffled:
        g = sites.index(n)
        src, val = ir.Var(f"mf_from{g}"), ir.Var(f"mf_gather{g}")
        ct = compute_type(ctx.graph.tensor(n.attr[0]).dtype)

        def reg(i: ir.Expr, name: str = n.attr[0]) -> ir.Expr:
            return reg_value(k, sec, name, i)
        out += [ir.ArrayDecl(src.name, "uint", reads), ir.ArrayDecl(val.name, ct, reads)]
        stmts, checked = el.gather_position(n, report_if=in_row)
        index_loop += stmts + [ir.Assign(ir.Lane(src, slot_k), ir.Cast("uint", checked))]
        slot = ir.Lane(src, slot_k) % lit(reads)
        same.append(ir.Assign(flag, flag.and_(past_end.or_(slot.eq(slot_k)))))
        lane = ir.Cast("ushort", first + ir.Lane(src, slot_k) / lit(reads))
        fetch_same.append(ir.Assign(ir.Lane(val, slot_k),
                                    ir.Call("simd_shuffle", (reg(slot_k), lane))))
        s, t = ir.Var("mf_s"), ir.Var(f"mf_t{g}")
        fetch_any += [
            ir.Assign(ir.Lane(val, slot_k), ir.Call("simd_shuffle", (reg(lit(0)), lane))),
            ir.For("mf_s", "uint", lit(1), lit(reads), [
                ir.Decl(t.name, ct, ir.Call("simd_shuffle", (reg(s), lane))),
                ir.Assign(ir.Lane(val, slot_k), ir.Select(slot.eq(s), t, ir.Lane(val, slot_k)))],
                unroll=True)]
    ctx.helpers.update(el.helpers)
    if reads == 1:                  # one slot per lane: the source lane is all there is
        return out + [each_slot(k, index_loop), ir.Comment("one shuffle per element"),
                      each_slot(k, fetch_same)]
    index_loop += same
    return out + [
        ir.Decl(flag.name, "bool", ir.Lit(True, "bool"), const=False),
        ir.Comment(f"each of this lane's {reads} elements: where its gathered element is"),
        each_slot(k, index_loop),
        ir.If(ir.Call("simd_all", (flag,)), [
            ir.Comment("every element in the row gathers from its own slot number of "
                       "another lane: one shuffle each"), each_slot(k, fetch_same)],
            [ir.Comment(f"from any slot: shuffle all {reads} slots of the source lane, keep "
                        f"the gathered one"), each_slot(k, fetch_any)])]
