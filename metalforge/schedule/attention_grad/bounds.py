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
from ..hardware import SIMD_WIDTH
from .kernels import Ctx, lowering, positions

LONG = "long"


def _row_bounds(ctx: Ctx, form: Form, t0: ir.Expr) -> tuple[list[ir.Stmt], ir.Expr, ir.Expr]:
    """(statements, lowest key, end) of row t0 + mf_r of the tile: the lowest at least 0, the
    end at most the key count."""
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
    return body, lo, hi


def block_bounds(ctx: Ctx, form: Form, t0: ir.Expr, count: int = 8) -> list[ir.Stmt]:
    """mf_klo, mf_khi (long) of the `count` rows from t0 of the tile (those inside it)."""
    r = ctx.roles
    body, lo, hi = _row_bounds(ctx, form, t0)
    kl, kh = ir.Var("mf_klo"), ir.Var("mf_khi")
    body += [ir.Assign(kl, ir.Call("min", (kl, lo))), ir.Assign(kh, ir.Call("max", (kh, hi)))]
    return [
        ir.Comment("the keys the block's rows can see (the scores' index mask)"),
        ir.Decl("mf_klo", LONG, ir.Cast(LONG, ctx.size(r.key)), const=False),
        ir.Decl("mf_khi", LONG, ir.Cast(LONG, ir.Lit(0, "int")), const=False),
        ir.For("mf_r", UINT, u(0), u(count), [
            ir.If(t0 + ir.Cast(IDX, ir.Var("mf_r")) < ctx.span(r.tile), body)])]


def lane_bounds(ctx: Ctx, form: Form, t0: ir.Expr, count: int) -> list[ir.Stmt]:
    """`block_bounds` with the rows dealt to the simdgroup's lanes (row mf_lane, + 32, ...)
    and merged by simd_min / simd_max (in uint: the bounds clamped to 0 .. the key count);
    every lane of the simdgroup reaches it. 64-bit indices keep `block_bounds`."""
    if ctx.index64:
        return block_bounds(ctx, form, t0, count)
    r = ctx.roles
    body, lo, hi = _row_bounds(ctx, form, t0)
    n = ctx.size(r.key)
    ll, lh = ir.Var("mf_llo"), ir.Var("mf_lhi")
    zero = ir.Cast(LONG, ir.Lit(0, "int"))
    body += [
        ir.Assign(ll, ir.Call("min", (ll, ir.Cast(UINT, ir.Call("min", (lo, ir.Cast(LONG, n))))))),
        ir.Assign(lh, ir.Call("max", (lh, ir.Cast(UINT, ir.Call("max", (hi, zero))))))]
    return [
        ir.Comment("the keys the block's rows can see (the scores' index mask): a row a "
                   "lane, merged across the simdgroup"),
        ir.Decl("mf_llo", UINT, ir.Cast(UINT, n), const=False),
        ir.Decl("mf_lhi", UINT, u(0), const=False),
        ir.For("mf_r", UINT, ir.Var("mf_lane"), u(count), [
            ir.If(t0 + ir.Cast(IDX, ir.Var("mf_r")) < ctx.span(r.tile), body)],
            step=u(SIMD_WIDTH)),
        ir.Decl("mf_klo", LONG, ir.Cast(LONG, ir.Call("simd_min", (ll,)))),
        ir.Decl("mf_khi", LONG, ir.Cast(LONG, ir.Call("simd_max", (lh,))))]


def masked_by_index(form: Form, rows: tuple[str, ...]) -> bool:
    """Whether the scores have index bounds (else every key is visited)."""
    return bool(key_bounds(form, rows))
