"""Blocks the quantized kernels share: loops over the block's weight rows and rows of x, the
chunk's loads into registers (packed words, one vector per row; shared values, 16-byte vector
loads), the plain per-element sum, and the epilogue that computes and stores the outputs from
a row's sum."""
from __future__ import annotations

from typing import Optional

from ... import ir
from ...graph import ReduceOp
from .. import reduce
from ..base import IDX
from ..lower import compute_type, convert
from ..names import tensor_var
from . import pairing
from .context import QuantContext, QuantState
from .positions import acc, at, lowering, offset, x_slot


def rows_loop(st: QuantState, body: list[ir.Stmt], clamp: bool = True) -> ir.Stmt:
    """Each row mf_r of the block, as row mf_n. With `clamp`, rows past N (the last block of a
    size N that is not a multiple of rows_per_group) repeat row N - 1: they read in bounds and
    take the same branches, and their results are never stored (the stores' loop tests
    mf_n < N instead)."""
    ctx = st.ctx
    rows = ctx.policy.rows_per_group
    n = ir.Var("mf_n0") + ir.Cast(IDX, ir.Var("mf_r"))
    last = ctx.size(ctx.rows_axis) - ir.Lit(1, IDX)
    decl: list[ir.Stmt] = [ir.Decl("mf_n", IDX, n if rows == 1 or not clamp else
                                   ir.Call("min", (n, last)))]
    if pairing.is_paired(st):                 # rows u0 + r and their partners u0 + Q + r
        decl = [ir.Decl("mf_n", IDX, pairing.row(st, clamp))]
    return ir.For("mf_r", "uint", ir.Lit(0, "uint"), ir.Lit(rows, "uint"),
                  (decl if ir.mentions(body, "mf_n") else []) + body, unroll=True)


def each_x_row(st: QuantState, body: list[ir.Stmt]) -> ir.Stmt:
    """`body` for each row mf_i of x of the simdgroup's block (unrolled)."""
    return ir.For("mf_i", "uint", ir.Lit(0, "uint"), ir.Lit(st.mb, "uint"), body, unroll=True)


def x_rows_loop(st: QuantState, body: list[ir.Stmt], clamp: bool = True) -> list[ir.Stmt]:
    """`body` for each row mf_i of x of the simdgroup's block, as row mf_m (with `clamp`, rows
    past M repeat row M - 1: read in bounds, never stored); just `body` without x blocking."""
    if st.mb == 1:
        return body
    m: ir.Expr = ir.Var("mf_m0") + ir.Cast(IDX, ir.Var("mf_i"))
    if clamp:
        m = ir.Call("min", (m, st.ctx.size(st.ctx.prefix[-1]) - ir.Lit(1, IDX)))
    return [each_x_row(st, [ir.Decl("mf_m", IDX, m)] + body)]


def load_shared(st: QuantState) -> list[ir.Stmt]:
    """The chunk's values of the tensors every row uses, into registers (vector loads)."""
    ctx = st.ctx
    out: list[ir.Stmt] = []
    vw, C = ctx.vw, ctx.chunk
    for t in ctx.shared:
        ct, stype = compute_type(t.dtype), ctx.in_stype(t)
        reg = ir.Var(tensor_var(t.name, "reg"))
        start = (offset(st, t, ir.Var("mf_k0"))
                 + ir.Cast(IDX, ir.Var("mf_v") * ir.Lit(vw, "uint")))
        vec = ir.Var(tensor_var(t.name, "v"))
        lane = (lambda i: ir.Call("mf_lane8", (vec, i))) if vw == 8 else \
            (lambda i: ir.Lane(vec, i))
        if vw == 8:
            ctx.uses.helpers.add("mf_pack8_of")
        slot = x_slot(st, ir.Var("mf_v") * ir.Lit(vw, "uint") + ir.Var("mf_l"))
        out += [ir.ArrayDecl(reg.name, ct, st.mb * C)] + x_rows_loop(st, [
            ir.For("mf_v", "uint", ir.Lit(0, "uint"), ir.Lit(C // vw, "uint"), [
                ir.Decl(vec.name, ir.vector_type(stype, vw),
                        ir.Load(ctx.names[t.name], start, vw, stype)),
                ir.For("mf_l", "uint", ir.Lit(0, "uint"), ir.Lit(vw, "uint"), [
                    ir.Assign(ir.Lane(reg, slot), ir.Cast(ct, lane(ir.Var("mf_l"))))],
                    unroll=True)], unroll=True)])
    return out


def load_words(st: QuantState) -> tuple[list[ir.Stmt], list[ir.Stmt]]:
    """(one register array of packed words per packed tensor, a vector per row; the row's
    load of its chunk of words into it: one vector load)."""
    ctx = st.ctx
    arrays: list[ir.Stmt] = []
    loads: list[ir.Stmt] = []
    wtype = ir.vector_type("uint", ctx.words) if ctx.words > 1 else "uint"
    for name in ctx.packed:
        t = ctx.graph.tensor(name)
        base = offset(st, t, ir.Var("mf_k0"))         # the chunk's first word
        arrays.append(ir.ArrayDecl(tensor_var(name, "w"), wtype, ctx.policy.rows_per_group))
        loads.append(ir.Assign(ir.Lane(ir.Var(tensor_var(name, "w")), ir.Var("mf_r")),
                               ir.Load(ctx.names[name], base, ctx.words, "uint")))
    return arrays, loads


def aligned(ctx: QuantContext) -> ir.Expr:
    """Whether every row's words and shared values start at a whole vector (else all chunks
    take the guarded element path)."""
    ok: ir.Expr = ir.Lit(True, "bool")
    for name in ctx.packed:
        words = ctx.size(ctx.graph.tensor(name).axes[-1])
        ok = ok.and_((words % ir.Lit(ctx.words, IDX)).eq(ir.Lit(0, IDX)))
    if ctx.shared:
        ok = ok.and_((ctx.size(ctx.axis) % ir.Lit(ctx.vw, IDX)).eq(ir.Lit(0, IDX)))
    return ok


def element(st: QuantState, fast: bool) -> list[ir.Stmt]:
    """Add element mf_j of the chunk to the row's accumulator of each sum."""
    args = [r.args[0] for r in st.ctx.reds]
    el = lowering(st, fast)
    body = el.lower(args)
    st.ctx.uses.helpers.update(el.helpers)
    for i, arg in enumerate(args):
        v = el.value(arg)
        if compute_type(arg.dtype) != "float":
            v = ir.Cast("float", v)
        a = acc(st, i)
        body.append(ir.Assign(a, a + v))
    return body


def epilogue(st: QuantState, totals: Optional[list[ir.Expr]] = None
             ) -> tuple[list[reduce.Reduction], list[ir.Stmt]]:
    """(each sum as a reduction whose running value is in `totals` (by default its row's
    accumulator); the statements that compute every output from them, at the row's position,
    and store them)."""
    ctx = st.ctx
    totals = totals or [acc(st, i) for i in range(len(ctx.reds))]
    reds = [reduce.Reduction(n, ReduceOp.SUM, ctx.axis, i + 1, acc_at=t)
            for i, (n, t) in enumerate(zip(ctx.reds, totals))]
    rv = st.v.row_values
    for red in reds:
        rv.values[red.node] = red.acc_ref
    stmts = rv.lower([o.node for o in ctx.graph.outputs])
    stores: list[ir.Stmt] = []
    for k, o in enumerate(ctx.graph.outputs):
        off: ir.Expr = ir.Lit(0, IDX)
        for i, a in enumerate(o.axes):
            p = at(st, a, ir.Lit(0, IDX))
            off = p if i == 0 else off * ctx.size(a) + p
        value = ir.Cast(ctx.out_stype(k), convert(rv.value(o.node), o.node.dtype, o.dtype))
        stores.append(ir.Store(ctx.out_names[k], off, value))
    return reds, stmts + stores
