"""The keys a block of 8 query rows can see, from the scores' index mask (`attention.bounds`:
causal, sliding window): the matrix kernels skip key blocks no row of the block sees (dq: its
loop over keys runs from the block's lowest bound to its highest; dk/dv: a block of rows that
sees none of the group's keys is skipped), so a causal backward does half the products.

    mf_klo, mf_khi    over the block's rows inside the tile: min of each row's lowest key,
                      max of each row's end (the bounds are integer expressions of the row's
                      positions, sizes and scalars, so any of them: evaluated per row)

A row whose mask leaves it no key gets no gradient from the skipped blocks (where torch, whose
forward gives such a row NaN, gives NaN)."""
from __future__ import annotations

from ... import ir
from ..attention.bounds import key_bounds
from ..attention.match import Form
from ..base import IDX
from ..fragments import UINT, u
from .kernels import Ctx, lowering, positions

LONG = "long"


def block_bounds(ctx: Ctx, form: Form, t0: ir.Expr, count: int = 8) -> list[ir.Stmt]:
    """mf_klo, mf_khi (long) of the `count` rows from t0 of the tile (those inside it)."""
    r = ctx.roles
    bounds = key_bounds(form, r.rows)
    low = lowering(ctx, "mf_b")
    body: list[ir.Stmt] = [*positions(ctx, t0 + ir.Cast(IDX, ir.Var("mf_r")), r.tile)]
    body += low.lower([f for _, f, _ in bounds])
    lo: ir.Expr = ir.Cast(LONG, ir.Lit(0, "int"))
    hi: ir.Expr = ir.Cast(LONG, ctx.size(r.key))
    for kind, f, add in bounds:
        v = ir.Cast(LONG, low.value(f)) + ir.Cast(LONG, ir.Lit(add, "int"))
        if kind == "lo":
            lo = ir.Call("max", (lo, v))
        else:
            hi = ir.Call("min", (hi, v))
    kl, kh = ir.Var("mf_klo"), ir.Var("mf_khi")
    body += [ir.Assign(kl, ir.Call("min", (kl, lo))), ir.Assign(kh, ir.Call("max", (kh, hi)))]
    return [
        ir.Comment("the keys the block's rows can see (the scores' index mask)"),
        ir.Decl("mf_klo", LONG, ir.Cast(LONG, ctx.size(r.key)), const=False),
        ir.Decl("mf_khi", LONG, ir.Cast(LONG, ir.Lit(0, "int")), const=False),
        ir.For("mf_r", UINT, u(0), u(count), [
            ir.If(t0 + ir.Cast(IDX, ir.Var("mf_r")) < ctx.span(r.tile), body)])]


def masked_by_index(form: Form, rows: tuple[str, ...]) -> bool:
    """Whether the scores have index bounds (else every key is visited)."""
    return bool(key_bounds(form, rows))
