"""A step's rows staged with every global load issued before any threadgroup store (the
vector path of `blocks.stage`, E a multiple of 8 and innermost in every staged tensor): two
rows a simdgroup at a time, a half-simdgroup a row, one 16-byte chunk a lane (E up to
MAT_E = 128 is 16 chunks), so a simdgroup's rows / (2 x sgs) loads a tensor are in flight
together instead of one row's latency after another's (a load of the next row could not pass
the previous row's store: the pointers are generic on cuda).

    mf_e = 8 (lane % 16)                     the lane's chunk; mf_ein: inside E
    mf_sr<i> = 2 sg + lane / 16 + 2 sgs i     the lane's i-th row of the block
    phase 1: mf_c<j>_<i> = tensor j's chunk (0 past E or past `count`), lse / delta
    phase 2: the chunks to the arrays (up to mf_ew), lse / delta by the row's first lane
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

from ... import ir
from ...graph import Node
from ..base import IDX
from ..fragments import UINT, u
from .kernels import Ctx, load, offset, positions

VW = 8                           # elements a chunk (16 bytes of half / bfloat)
HALF = 16                        # lanes a row


def applies(rows: int, sgs: int) -> bool:
    return rows % (2 * sgs) == 0


def _zero_pack(st: str) -> ir.Expr:
    return ir.Call("mf_pack8_of", tuple(ir.Cast(st, ir.Lit(0, "int")) for _ in range(VW)))


def _positions(ctx: Ctx, flat: ir.Expr, at_row: ir.Expr,
               store: Callable[[Ctx, ir.Expr], list[ir.Stmt]]) -> list[ir.Stmt]:
    """The row's positions (computed again here, after the loads) to the staged arrays."""
    got = store(ctx, at_row)
    return [ir.Block([*positions(ctx, flat, ctx.roles.tile), *got])] if got else []


def two_phase(ctx: Ctx, arrs: Sequence[tuple[str, Node]], first: ir.Expr, rows: int,
              count: ir.Expr, place: Callable[[ir.Expr], list[ir.Stmt]], stats: bool,
              sgs: int, stat_at: Optional[ir.Expr],
              store: Callable[[Ctx, ir.Expr], list[ir.Stmt]]) -> list[ir.Stmt]:
    """Rows first .. first + rows - 1 of the tensors into their arrays (`blocks.stage`'s
    contract, its vector path; `store(ctx, at_row)`: the row's positions to the staged
    arrays, `blocks.store_positions`)."""
    r = ctx.roles
    e = ir.Var("mf_e")
    types = [ctx.in_stype(ctx.graph.tensor(n.attr)) for _, n in arrs]
    out: list[ir.Stmt] = [
        ir.Comment("every load of the block's rows issued before any store"),
        ir.Decl("mf_e", UINT, ir.Var("mf_lane") % u(HALF) * u(VW)),
        ir.Decl("mf_ein", "bool", ir.Cast(IDX, e) < ctx.size(r.e))]
    stores: list[ir.Stmt] = []
    for i in range(rows // (2 * sgs)):
        row = ir.Var(f"mf_sr{i}")
        vals = [f"mf_c{j}_{i}" for j in range(len(arrs))]
        out += [ir.Decl(row.name, UINT, ir.Var("mf_sg") * u(2) + ir.Var("mf_lane") / u(HALF)
                        + u(2 * sgs * i)),
                ir.Decl(f"mf_live{i}", "bool", first + ir.Cast(IDX, row) < count)]
        out += [ir.Decl(v, ir.vector_type(st, VW), _zero_pack(st), const=False)
                for v, st in zip(vals, types)]
        got: list[ir.Stmt] = [ir.Assign(ir.Var(v), ir.Load(
            ctx.names[ctx.graph.tensor(n.attr).name], offset(ctx, ctx.graph.tensor(n.attr).axes),
            VW, st)) for v, st, (_, n) in zip(vals, types, arrs)]
        live: list[ir.Stmt] = [*place(first + ir.Cast(IDX, row)), ir.If(ir.Var("mf_ein"), got)]
        at = row * ir.Var("mf_rs") + e
        stores.append(ir.If(e < ir.Var("mf_ew"), [
            ir.Store(a, at, ir.Var(v), VW, st, space="threadgroup")
            for v, st, (a, _) in zip(vals, types, arrs)]))
        if stats:
            sl, sd = f"mf_sl{i}", f"mf_sd{i}"
            out += [ir.Decl(sl, "float", ir.Lit(0.0, "float"), const=False),
                    ir.Decl(sd, "float", ir.Lit(0.0, "float"), const=False)]
            live += [ir.Assign(ir.Var(sl), load(ctx, r.lse)),
                     ir.Assign(ir.Var(sd), load(ctx, r.delta))]
            at_row = row if stat_at is None else stat_at + row
            stores.append(ir.If((ir.Var("mf_lane") % u(HALF)).eq(u(0)).and_(
                ir.Var(f"mf_live{i}")), [
                    ir.Store("mf_tl", at_row, ir.Var(sl), space="threadgroup"),
                    ir.Store("mf_td", at_row, ir.Var(sd), space="threadgroup"),
                    *_positions(ctx, first + ir.Cast(IDX, row), at_row, store)]))
        out.append(ir.If(ir.Var(f"mf_live{i}"), [ir.Block(live)]))
    return [*out, *stores]
