"""Scores: the contractions over E of each (key, row) (`dots` for key streams, `lane_dots` for
lane scores, `tile_scores` from staged tiles) and their elementwise work (`score`)."""
from __future__ import annotations

from typing import Mapping, Optional

from ... import ir
from ...graph import Node, topo_order
from ..base import IDX
from ..hardware import SIMD_WIDTH
from ..lower import as_float, compute_type
from ..matrix.strided import SIDE
from ..online import NEG_INF
from .bounds import unmasked
from .context import SIMD, CallContext, KernelState, lowering
from .loops import each_key, each_row, every_row, keys, lanes, rows_reading
from .staging import elements, key_value, own_key_chunks, zero_padded


def dots(ctx: CallContext, ks: KernelState) -> tuple[list[ir.Stmt], dict[Node, ir.Expr]]:
    """The step's score contractions: each lane's part over its E elements for every
    (key, row), then summed over the key's mf_w lanes (xor butterfly)."""
    f = ctx.form
    out: list[ir.Stmt] = [ir.Comment("scores: each lane's part of every contraction, then "
                                     "summed across the key's lanes")]
    dot_at = ir.Var("mf_u") * ir.Lit(ks.qt, "uint") + ir.Var("mf_t")
    dot_of: dict[Node, ir.Expr] = {}
    for i, r in enumerate(f.contractions):
        part = lowering(ctx, ks, f"mf_c{i}_")
        key_value(ctx, ks, part)
        body = part.lower([r.args[0]])
        dot = ir.Lane(ir.Var(f"mf_dot{i}"), dot_at)
        add = body + [ir.Assign(dot, dot + as_float(part.value(r.args[0]), r.args[0]))]
        each = elements(ctx, ks, r.args[0], add) if zero_padded(ctx, ks, r.args[0]) else \
            lanes(ctx, ks, add)
        ks.out.helpers |= part.helpers
        rows = ir.For("mf_t", "uint", ir.Lit(0, "uint"), ir.Lit(ks.qt, "uint"),
                      [ir.Assign(dot, ir.Lit(0.0, "float"))], unroll=True)
        off = ir.Var("mf_off")
        out += [ir.ArrayDecl(f"mf_dot{i}", "float", ctx.kps * ks.qt),
                each_key(ctx, ks, [rows]), keys(ctx, ks, [each_row(ctx, ks, [each])]),
                ir.For("mf_off", "uint", ir.Lit(1, "uint"), ir.Var("mf_w"), [
                    each_key(ctx, ks, [each_row(ctx, ks, [ir.Assign(dot, dot + ir.Call(
                        "simd_shuffle_xor", (dot, off)))])])], step=off)]
        dot_of[r] = dot
    return out, dot_of


def lane_dots(ctx: CallContext, ks: KernelState) -> tuple[list[ir.Stmt], dict[Node, ir.Expr]]:
    """Lane scores: each lane's own key mf_l = mf_step + lane, its whole contraction with
    every row of the tile (q from threadgroup memory), chunk by chunk of vw elements."""
    f = ctx.form
    vw = ctx.vw
    out: list[ir.Stmt] = [ir.Comment("scores: each lane takes a key of its own and "
                                     "contracts all of E with every row of the tile")]
    dot_of: dict[Node, ir.Expr] = {}
    nodes = [n for n in ctx.kv if any(n in topo_order([r.args[0]])
                                       for r in f.contractions)]
    find, chunk = own_key_chunks(ctx, ks, nodes)
    adds: list[ir.Stmt] = []
    t = ir.Var("mf_t")
    for i, r in enumerate(f.contractions):
        part = lowering(ctx, ks, f"mf_c{i}_")
        part.values.update(ks.staged)
        part.values.update({n: ir.Lane(ir.Var(f"{ctx.kv[n]}c"), ir.Var("mf_x"))
                            for n in nodes})
        body = part.lower([r.args[0]])
        ks.out.helpers |= part.helpers
        dot = ir.Lane(ir.Var(f"mf_dot{i}"), t)
        adds.append(each_row(ctx, ks, body + [ir.Assign(dot, dot + as_float(
            part.value(r.args[0]), r.args[0]))]))
        out += [ir.ArrayDecl(f"mf_dot{i}", "float", ks.qt),
                ir.For("mf_t", "uint", ir.Lit(0, "uint"), ir.Lit(ks.qt, "uint"),
                       [ir.Assign(dot, ir.Lit(0.0, "float"))], unroll=True)]
        dot_of[r] = dot
    chunks = (ctx.size(f.e) + ir.Lit(vw - 1, IDX)) / ir.Lit(vw, IDX)
    each = ir.For("mf_x", "uint", ir.Lit(0, "uint"), ir.Lit(vw, "uint"), [
        ir.Decl("mf_e", "uint", ir.Var("mf_c") * ir.Lit(vw, "uint") + ir.Var("mf_x")),
        ir.If(ir.Cast(IDX, ir.Var("mf_e")) < ctx.size(f.e), adds)], unroll=True)
    out.append(ir.If(ir.Var("mf_l") < ir.Var("mf_l1"), find + [
        ir.For("mf_c", "uint", ir.Lit(0, "uint"), ir.Cast("uint", chunks),
               chunk + [each])]))
    return out, dot_of


def score(ctx: CallContext, ks: KernelState, dot_of: Mapping[Node, ir.Expr],
          node: Optional[Node] = None) -> tuple[list[ir.Stmt], ir.Expr]:
    """The scores' elementwise work (scale, masks, caps) on the contractions `dot_of`: its
    statements and the score as a float (`node`: that part of the scores instead, e.g.
    `bounds.unmasked`)."""
    n = ctx.form.scores if node is None else node
    low = lowering(ctx, ks, "mf_s")
    for r, dot in dot_of.items():
        low.values[r] = dot if compute_type(r.dtype) == "float" else ir.Cast(
            compute_type(r.dtype), dot)
    body = low.lower([n])
    ks.out.helpers |= low.helpers | {"mf_maximum"}
    return body, as_float(low.value(n), n)


def element_score(ctx: CallContext, ks: KernelState, guard: Optional[ir.Expr]
                  ) -> list[ir.Stmt]:
    """`mf_sv`: the score of the element whose contraction is mf_dot (key mf_l, row mf_qrow):
    the scores' work where `guard` holds, -inf elsewhere; without a guard (None: a tile
    `inside_bounds`), the scores' work without its mask (`bounds.unmasked`)."""
    dot = {ctx.form.contractions[0]: ir.Var("mf_dot")}
    if guard is None:
        body, value = score(ctx, ks, dot, node=unmasked(ctx.form, ctx.rows))
        return body + [ir.Decl("mf_sv", "float", value)]
    body, value = score(ctx, ks, dot)
    return [ir.Decl("mf_sv", "float", NEG_INF, const=False),
            ir.If(guard, body + [ir.Assign(ir.Var("mf_sv"), value)])]


def inside_bounds(ctx: CallContext, kt: ir.Expr) -> Optional[ir.Expr]:
    """Whether the tile of keys from mf_tk is whole (`kt` keys), the simdgroup's 16 rows
    (from mf_row0) live and every key inside every row's bounds ([mf_kilo, mf_kihi):
    `head.block_keys`), so that its scores need no mask or guard; None where the mask is
    more than bounds."""
    if unmasked(ctx.form, ctx.rows) is None:
        return None
    tk = ir.Cast("long", ir.Var("mf_tk"))
    return ir.Var("mf_tn").eq(kt).and_(
        ir.Var("mf_row0") + ir.Lit(SIDE, "uint") <= ir.Var("mf_nlive")).and_(
        tk >= ir.Var("mf_kilo")).and_(tk + ir.Cast("long", kt) <= ir.Var("mf_kihi"))


def _key_chunk(ctx: CallContext, nodes: list[Node]) -> tuple[list[ir.Stmt], list[ir.Stmt]]:
    """K's chunk mf_c of key mf_key into registers mf_kv<i>c[x]: (one vector read of the
    staged row, guarded element reads)."""
    vw = ctx.vw
    c, x, key = ir.Var("mf_c"), ir.Var("mf_x"), ir.Var("mf_key")
    e_of_x = ir.Decl("mf_e", "uint", c * ir.Lit(vw, "uint") + x)
    inside = ir.Cast(IDX, ir.Var("mf_e")) < ctx.size(ctx.form.e)
    k_vec: list[ir.Stmt] = []
    k_elems: list[ir.Stmt] = []
    for n in nodes:
        arr = ctx.kv[n]
        tp = ctx.tensor_of(n)
        ct, st = compute_type(tp.dtype), ctx.in_stype(tp)
        zero = ir.Lit(0.0, ct) if ct == "float" else ir.Lit(0, ct)
        reg = ir.Lane(ir.Var(f"{arr}c"), x)
        row = key * ir.Var(f"{arr}_stride")
        k_elems += [ir.ArrayDecl(f"{arr}c", ct, vw), ir.For(
            "mf_x", "uint", ir.Lit(0, "uint"), ir.Lit(vw, "uint"), [
                e_of_x, ir.If(inside, [ir.Assign(reg, ir.Cast(ct, ir.Lane(
                    ir.Var(arr), row + ir.Var("mf_e"))))], [ir.Assign(reg, zero)])],
            unroll=True)]
        vec = ir.Var(f"{arr}v")
        elem = ir.Call("mf_lane8", (vec, x)) if vw == 8 else ir.Lane(vec, x)
        k_vec += [ir.Decl(f"{arr}v", ir.vector_type(st, vw), ir.Load(
                      arr, row + c * ir.Lit(vw, "uint"), vw, st, space="threadgroup")),
                  ir.ArrayDecl(f"{arr}c", ct, vw),
                  ir.For("mf_x", "uint", ir.Lit(0, "uint"), ir.Lit(vw, "uint"), [
                      ir.Assign(reg, ir.Cast(ct, elem))], unroll=True)]

    return k_vec, k_elems


def _q_chunk(ctx: CallContext, ks: KernelState) -> tuple[int, list[ir.Stmt], dict[Node, ir.Expr]]:
    """Row mf_t's q (each staged value every key multiplies), qw floats per read (float4
    for vw = 4 or 8), each read used at once (x = y * qw + z): (qw, the reads, the values
    as registers)."""
    vw = ctx.vw
    c, t = ir.Var("mf_c"), ir.Var("mf_t")
    qw = 4 if vw % 4 == 0 else 2 if vw % 2 == 0 else 1
    y, z = ir.Var("mf_y"), ir.Var("mf_z")
    q_reads: list[ir.Stmt] = []
    q_regs: dict[Node, ir.Expr] = {}
    emax = SIMD_WIDTH * ks.epl
    for i, (n, name) in enumerate(ks.staged_tg.items()):
        at = t * ir.Lit(emax, "uint") + c * ir.Lit(vw, "uint") + y * ir.Lit(qw, "uint")
        read = ir.Load(name, at, qw, "float", space="threadgroup") if qw > 1 else ir.Lane(
            ir.Var(name), at)
        q_reads.append(ir.Decl(f"mf_qv{i}", ir.vector_type("float", qw) if qw > 1
                               else "float", read))
        q_regs[n] = ir.Lane(ir.Var(f"mf_qv{i}"), z) if qw > 1 else ir.Var(f"mf_qv{i}")

    return qw, q_reads, q_regs


def _chunk_dots(ctx: CallContext, ks: KernelState, nodes: list[Node],
                q_regs: Mapping[Node, ir.Expr]) -> tuple[list[ir.Stmt], list[ir.Stmt],
                                                         list[ir.Stmt], list[ir.Stmt],
                                                         dict[Node, ir.Expr]]:
    """The contractions' parts of the chunk per row: with q from registers (vector path,
    every element inside E) or from the staged row (element path, guarded). Returns (the
    dots' declarations, their butterfly, the vector path's adds, the element path's, the
    dot of each contraction)."""
    f = ctx.form
    x, t = ir.Var("mf_x"), ir.Var("mf_t")
    dot_of: dict[Node, ir.Expr] = {}
    decls: list[ir.Stmt] = []
    butterfly: list[ir.Stmt] = []
    adds_vec: list[ir.Stmt] = []
    adds_elem: list[ir.Stmt] = []
    for i, r in enumerate(f.contractions):
        dot = ir.Lane(ir.Var(f"mf_dot{i}"), t)
        for adds, qs in ((adds_vec, q_regs), (adds_elem, ks.staged)):
            part = lowering(ctx, ks, f"mf_c{i}_")
            part.values.update(qs)
            part.values.update({n: ir.Lane(ir.Var(f"{ctx.kv[n]}c"), x) for n in nodes})
            low = part.lower([r.args[0]])
            ks.out.helpers |= part.helpers
            adds += low + [ir.Assign(dot, dot + as_float(part.value(r.args[0]), r.args[0]))]
        decls += [ir.ArrayDecl(f"mf_dot{i}", "float", ks.qt),
                  ir.For("mf_t", "uint", ir.Lit(0, "uint"), ir.Lit(ks.qt, "uint"), [
                      ir.Assign(dot, ir.Lit(0.0, "float"))], unroll=True)]
        butterfly.append(ir.Assign(dot, dot + ir.Call("simd_shuffle_xor",
                                                      (dot, ir.Var("mf_off")))))
        dot_of[r] = dot
    return decls, butterfly, adds_vec, adds_elem, dot_of


def tile_scores(ctx: CallContext, ks: KernelState) -> list[ir.Stmt]:
    """The scores of this simdgroup's mf_ks keys of the tile against every row of the tile
    (each key's row read and converted once for all of them), into threadgroup memory:
    lane mf_key's part mf_part of the contraction over E from the staged tile, chunk by
    chunk of vw elements (32 / mf_ks lanes share a key, taking every mf_parts-th chunk,
    their parts summed by shuffles), then per row the score's elementwise work
    (`score`: scale, masks, caps); -inf past the tile's keys. The key's first lane
    stores `mf_tg_s[t * kt_max + key]`.

    Per chunk, when E is a multiple of vw (mf_vec_ok: every chunk whole): the key's chunk
    as one vw-element (16-byte) vector read of its padded row, each row's q chunk as float4
    reads of its staged row (the same address in every lane: a broadcast), no guards.
    Otherwise the chunk's elements one by one, 0 past E."""
    f, vw = ctx.form, ctx.vw
    nodes = [n for n in ctx.kv if any(n in topo_order([r.args[0]]) for r in f.contractions)]
    c, x, key, t = ir.Var("mf_c"), ir.Var("mf_x"), ir.Var("mf_key"), ir.Var("mf_t")
    e_of_x = ir.Decl("mf_e", "uint", c * ir.Lit(vw, "uint") + x)
    inside = ir.Cast(IDX, ir.Var("mf_e")) < ctx.size(f.e)

    k_vec, k_elems = _key_chunk(ctx, nodes)
    qw, q_reads, q_regs = _q_chunk(ctx, ks)
    y, z = ir.Var("mf_y"), ir.Var("mf_z")
    decls, butterfly, adds_vec, adds_elem, dot_of = _chunk_dots(ctx, ks, nodes, q_regs)
    each_elem = ir.For("mf_x", "uint", ir.Lit(0, "uint"), ir.Lit(vw, "uint"), [
        e_of_x, ir.If(inside, adds_elem)], unroll=True)

    def chunks(body: list[ir.Stmt]) -> ir.Stmt:
        return ir.For("mf_c", "uint", ir.Var("mf_part"), ir.Var("mf_chunks"), body,
                      step=ir.Var("mf_parts"))
    scan: ir.Stmt = chunks(k_elems + [each_row(ctx, ks, [each_elem])])
    if vw > 1:
        each_vec = ir.For("mf_y", "uint", ir.Lit(0, "uint"), ir.Lit(vw // qw, "uint"), [
            *q_reads, ir.For("mf_z", "uint", ir.Lit(0, "uint"), ir.Lit(qw, "uint"), [
                ir.Decl("mf_x", "uint", y * ir.Lit(qw, "uint") + z), e_of_x, *adds_vec],
                unroll=True)], unroll=True)
        # rows past the tile's end have q = 0 staged: their dots are computed unguarded
        # (never used) when the contractions read nothing else
        rows = rows_reading(ctx, ks, [r.args[0] for r in f.contractions],
                                 set(q_regs) | set(nodes))
        scan = ir.If(ir.Var("mf_vec_ok"), [chunks([
            ir.Comment(f"the key's chunk: one {vw}-element read of its row; each row's q: "
                       f"{vw // qw} x float{qw if qw > 1 else ''} (a broadcast)"),
            *k_vec, rows([each_vec])])], [scan])
    sc_body, value = score(ctx, ks, dot_of)
    live = key < ir.Var("mf_tn")
    sc = ir.Var("mf_sc")
    return [
        ir.Comment("scores: lane mf_key contracts its key's E elements (chunk mf_part, "
                   "mf_part + mf_parts, ...) with every row's q, from the staged tile"),
        ir.Decl("mf_l", IDX, ir.Var("mf_tk") + ir.Cast(IDX, key)), *decls,
        ir.If(live, [scan]),
        ir.For("mf_off", "uint", ir.Var("mf_ks"), SIMD, [every_row(ctx, ks, butterfly)],
               step=ir.Var("mf_off")),
        ir.Comment("each row's score of the key (-inf past the tile), stored by the key's "
                   "first lane"),
        each_row(ctx, ks, [
            ir.Decl("mf_sc", "float", NEG_INF, const=False),
            ir.If(live, sc_body + [ir.Assign(sc, value)]),
            ir.If(ir.Var("mf_part").eq(ir.Lit(0, "uint")), [ir.Assign(ir.Lane(
                ir.Var("mf_tg_s"), t * ir.Lit(ks.kt_max, "uint") + key), sc)])])]
