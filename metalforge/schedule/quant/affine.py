"""The matvec kernels' arithmetic for the affine form (`form.affine`):

    sum_k (q_k * s + b) * x_k = s * sum_k q_k x_k + b * sum_k x_k      (s, b: one per group)

Each chunk: x of each element and their sum over the chunk (once for the block's rows), each
row's scale and bias loaded with its words, then each row's sums over its words. A value is
unpacked masked where it sits in its half word (`(word >> half) & (mask << at)`: one shift per
half word, not per value), which is the value times 2^at: qmv keeps one sum per place and
scales each once per chunk (`mf_place_weight`); qmvx, whose values each serve several rows of
x, pre-scales x by 2^-at instead, as MLX's qdot does.
"""
from __future__ import annotations

from typing import NamedTuple

from ... import ir
from ..lower import as_float
from .blocks import each_x_row, rows_loop, x_rows_loop
from .context import QuantState
from .form import Affine
from .positions import acc, lowering, numbered, word, x_slot


class AffineChunk(NamedTuple):
    xs: list[ir.Stmt]            # before the rows loops: x of each element, their sum
    arrays: list[ir.Stmt]        # each row's scale and bias registers
    loads: list[ir.Stmt]         # the row's loads of its scale and bias into them
    body: list[ir.Stmt]          # the rows' sums, then s * that + b * sum x


def _uint(v: int) -> ir.Lit:
    return ir.Lit(v, "uint")


def _xsum(st: QuantState) -> ir.Expr:
    return ir.Var("mf_xsum") if st.mb == 1 else ir.Lane(ir.Var("mf_xsum"), ir.Var("mf_i"))


def _place(st: QuantState) -> ir.Expr:
    """The bit where value mf_j sits in its half word."""
    return ir.Var("mf_j") % _uint(16 // st.ctx.bits) * _uint(st.ctx.bits)


def x_values(st: QuantState, f: Affine) -> list[ir.Stmt]:
    """x of each element of the chunk (qmvx: pre-scaled by 2^-place) and their sum."""
    ctx, mb, C = st.ctx, st.mb, st.ctx.chunk
    el = lowering(st, True)
    xsum = _xsum(st)
    xs: list[ir.Stmt] = [ir.ArrayDecl("mf_xe", "float", mb * C)]
    xs += [ir.Decl("mf_xsum", "float", ir.Lit(0.0, "float"), const=False)] if mb == 1 else [
        ir.ArrayDecl("mf_xsum", "float", mb),
        each_x_row(st, [ir.Assign(xsum, ir.Lit(0.0, "float"))])]
    xbody = el.lower([f.x])
    xv = as_float(el.value(f.x), f.x)
    xe = ir.Lane(ir.Var("mf_xe"), x_slot(st, ir.Var("mf_j")))
    # value j is unpacked masked in place in its half word, i.e. times 2^place: qmv keeps one
    # sum per place and scales each once per chunk; qmvx, whose values each serve mb rows of
    # x, pre-scales x_j by 2^-place instead
    xbody += [ir.Assign(xe, xv if mb == 1 else xv * ir.Call("mf_place_weight", (_place(st),))),
              ir.Assign(xsum, xsum + xv)]
    ctx.uses.helpers.add("mf_place_weight")
    xs += x_rows_loop(st, [ir.For("mf_j", "uint", _uint(0), _uint(C), xbody, unroll=True)])
    ctx.uses.helpers.update(el.helpers)
    return xs


def scale_bias(st: QuantState, f: Affine, i: int) -> tuple[list[ir.Stmt], list[ir.Stmt]]:
    """(each row's scale and bias registers of sum i, the row's loads into them)."""
    rows = st.ctx.policy.rows_per_group
    low = lowering(st, True)
    loads = low.lower([f.s, f.b])
    st.ctx.uses.helpers.update(low.helpers)
    r = ir.Var("mf_r")
    scale, bias = ir.Var(numbered("mf_row_scale", i)), ir.Var(numbered("mf_row_bias", i))
    arrays: list[ir.Stmt] = [ir.ArrayDecl(scale.name, "float", rows),
                             ir.ArrayDecl(bias.name, "float", rows)]
    loads += [ir.Assign(ir.Lane(scale, r), as_float(low.value(f.s), f.s)),
              ir.Assign(ir.Lane(bias, r), as_float(low.value(f.b), f.b))]
    return arrays, loads


def unpacked(st: QuantState, f: Affine) -> tuple[list[ir.Stmt], ir.Expr]:
    """(the declarations of value mf_j's half word and place; the value masked there, as a
    float: its half word shifted down, one shift for all the half's values, x_j holding the
    2^-mf_at that undoes it)."""
    ctx = st.ctx
    j = ir.Var("mf_j")
    at_bits: list[ir.Stmt] = [
        ir.Decl("mf_half", "uint", j % _uint(ctx.per_word) / _uint(16 // ctx.bits)
                * _uint(16)),
        ir.Decl("mf_at", "uint", _place(st))]
    mask = _uint((1 << ctx.bits) - 1) << ir.Var("mf_at")
    code = ir.Cast("float", (word(ctx, f.q.args[0].attr) >> ir.Var("mf_half")) & mask)
    return at_bits, code


def _finish(st: QuantState, qx: ir.Expr, i: int) -> ir.Stmt:
    """The row's sum i += s * qx + b * sum x."""
    r, a = ir.Var("mf_r"), acc(st, i)
    bx = ir.Call("fma", (ir.Lane(ir.Var(numbered("mf_row_bias", i)), r), _xsum(st), a))
    return ir.Assign(a, ir.Call("fma", (ir.Lane(ir.Var(numbered("mf_row_scale", i)), r), qx,
                                        bx)))


def place_sums(st: QuantState, f: Affine, i: int) -> list[ir.Stmt]:
    """qmv: every row's sums first, one per place (independent chains), then each row's
    s * sum_p 2^-p sum_(j at p) q_j x_j + b * sum x. H100, 2026-11-27, 4 rows: 6.1-14.5 us this
    way, 8.3-18.6 with x pre-scaled or each row in turn (bench/README.md)."""
    ctx = st.ctx
    rows, places, C = ctx.policy.rows_per_group, 16 // ctx.bits, ctx.chunk
    r, j, per_half = ir.Var("mf_r"), ir.Var("mf_j"), _uint(places)
    at_bits, code = unpacked(st, f)
    xe = ir.Lane(ir.Var("mf_xe"), x_slot(st, j))
    sums = ir.Var(numbered("mf_qx", i))
    at_place = ir.Lane(sums, r * per_half + j % per_half)
    qx: ir.Expr = ir.Lane(sums, r * per_half)
    for p in range(1, places):
        qx = ir.Call("fma", (ir.Lane(sums, r * per_half + _uint(p)), ir.Call(
            "mf_place_weight", (_uint(p * ctx.bits),)), qx))
    return [
        ir.ArrayDecl(sums.name, "float", rows * places),
        ir.For("mf_p", "uint", _uint(0), _uint(rows * places),
               [ir.Assign(ir.Lane(sums, ir.Var("mf_p")), ir.Lit(0.0, "float"))], unroll=True),
        rows_loop(st, [ir.For("mf_j", "uint", _uint(0), _uint(C), at_bits + [
            ir.Assign(at_place, ir.Call("fma", (code, xe, at_place)))], unroll=True)]),
        rows_loop(st, [_finish(st, qx, i)])]


def x_row_sums(st: QuantState, f: Affine, i: int) -> list[ir.Stmt]:
    """qmvx: each value unpacked once, used for every row of x."""
    at_bits, code = unpacked(st, f)
    xe = ir.Lane(ir.Var("mf_xe"), x_slot(st, ir.Var("mf_j")))
    sums = numbered("mf_qx", i)
    qx = ir.Lane(ir.Var(sums), ir.Var("mf_i"))
    row = [ir.ArrayDecl(sums, "float", st.mb),
           each_x_row(st, [ir.Assign(qx, ir.Lit(0.0, "float"))]),
           ir.For("mf_j", "uint", _uint(0), _uint(st.ctx.chunk), at_bits + [
               ir.Decl("mf_q", "float", code),
               each_x_row(st, [ir.Assign(qx, ir.Call("fma", (ir.Var("mf_q"), xe, qx)))])],
               unroll=True),
           each_x_row(st, [_finish(st, qx, i)])]
    return [rows_loop(st, row)]


def affine_chunk(st: QuantState, forms: list[Affine]) -> AffineChunk:
    """The chunk's arithmetic in the affine form (see the module doc), for each sum (of one
    shared x: its values and their sum taken once)."""
    xs = x_values(st, forms[0])
    arrays: list[ir.Stmt] = []
    loads: list[ir.Stmt] = []
    body: list[ir.Stmt] = []
    for i, f in enumerate(forms):
        a, ld = scale_bias(st, f, i)
        arrays += a
        loads += ld
        body += place_sums(st, f, i) if st.mb == 1 else x_row_sums(st, f, i)
    return AffineChunk(xs, arrays, loads, body)
