"""The attention backward kernels on the matrix block (`schedule/matrix/strided`): every product
a 16 x 16 block with the tensors' own half or bfloat values as operands and fp32 accumulation
(Metal 4 tensor ops where the target has them: apple10, cuda's tensor cores; simdgroup_matrix
elsewhere), P and dS cast to the operand type before their products, as FlashAttention-2 does.
A threadgroup of SGS simdgroups, 16 keys (dk/dv) or 16 query rows (dq) each, of one kv head:

    dkdv   the group's K, V rows staged once; per block of 16 query rows (every row reading
           the keys, in order: deterministic, GQA summed without atomics) q and dO staged by
           the group, then per simdgroup S^T = K Q^T, dP^T = V dO^T (B k-inner), per element
           P^T and dS^T (`pair`: the score's work and its derivative, the row's lse and delta)
           to its own scratch as the operand type, dV += P^T dO, dK += dS^T Q (B k-outer).
    dq     the group's q, dO rows staged once; per block of 16 keys K and V staged, then
           S = Q K^T, dP = dO V^T, per element dS to the scratch, dQ += dS K.

Staged operands are zero past their rows and past E (up to whole 16-blocks), so products read
whole blocks; an element past the keys or the rows gets P = dS = 0. At tensor-op targets
(`block_kernels`) the rows are ROW apart and zero up to MAT_E, and each product is one run over
the whole E: S and dP one matmul2d(16, 16, MAT_E) each, every gradient ONE 16 x MAT_E
accumulator (`rowacc`); the staged query rows' lse, delta and positions sit in threadgroup
arrays the element-wise work reads (`row_positions`). Key blocks an index mask
hides are skipped (`bounds`). Built (`operand`) when q, k, v and dO are one half / bfloat type
the target multiplies; f32 inputs, E over MAT_E and the `grad_fp32` launch option keep the
fp32 kernels (`matrix`, `kernels`).
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

from ... import ir
from ...graph import Node
from ...target import Target
from ..base import IDX
from ..fragments import UINT, lane_place, u
from ..hardware import SIMD_WIDTH
from ..lower import as_float, ident
from ..matrix import strided
from ..matrix.tile import MPP, SIMDGROUP, operand_type
from . import staging
from .bounds import LONG, lane_bounds, masked_by_index
from .kernels import Ctx, load, lowering, offset, positions, preset, store
from .matrix import MAT_E

SIDE = strided.SIDE
SGS = 2                          # simdgroups a threadgroup (16 keys or rows each)
PAD = 8                          # elements past each staged row (bank spread)
ROW = MAT_E + PAD                # a staged row's capacity
PS = SIDE + PAD                  # a scratch row (P^T, dS) of 16 values
ACC = MAT_E // SIDE              # output blocks of 16 E elements
VW = 8                           # elements a vector copy (16 bytes of half / bfloat)


def operand(ctx: Ctx, target: Target) -> Optional[str]:
    """The operands' MSL type when the block kernels apply (q, k, v, dO one half or bfloat
    type the target multiplies), else None."""
    r = ctx.roles
    types = {ctx.graph.tensor(n.attr).dtype for n in (r.q, r.k, r.v, r.dy)}
    if len(types) != 1:
        return None
    (t,) = types
    op = operand_type(t, t, target)
    return None if op == "float" else op


def lowering_of(target: Target) -> str:
    return MPP if target.tensor_ops else SIMDGROUP


def buffers(op: str, shared: Sequence[str], own: Sequence[str], scratch: Sequence[str],
            sgs: int = SGS, pos: Sequence[str] = (), shared_rows: int = SIDE) -> list[ir.Stmt]:
    """Threadgroup arrays of `op`: `shared` of `shared_rows` rows (the step's rows every
    simdgroup reads), `own` of `sgs` x 16 rows (each simdgroup's rows), ROW a row; the
    scratch of P^T and dS (16 x PS a simdgroup each); the query rows' lse and delta (mf_tl,
    mf_td, fp32); the thread's index mf_tid and its simdgroup's scratch offset mf_sp."""
    out: list[ir.Stmt] = [ir.Comment(f"threadgroup operands as {op}; scratch for P and dS")]
    out += [ir.ArrayDecl(n, op, shared_rows * ROW, "threadgroup") for n in shared]
    out += [ir.ArrayDecl(n, op, sgs * SIDE * ROW, "threadgroup") for n in own]
    out += [ir.ArrayDecl(n, op, sgs * SIDE * PS, "threadgroup") for n in scratch]
    out += [ir.ArrayDecl(n, "float", sgs * SIDE, "threadgroup") for n in ("mf_tl", "mf_td")]
    out += [ir.ArrayDecl(n, IDX, sgs * SIDE, "threadgroup") for n in pos]
    return out + [
        ir.Decl("mf_tid", UINT, ir.Var("mf_sg") * u(SIMD_WIDTH) + ir.Var("mf_lane")),
        ir.Decl("mf_sp", UINT, ir.Var("mf_sg") * u(SIDE * PS))]


def head(ctx: Ctx, count: ir.Expr, sgs: int = SGS, whole: bool = False) -> list[ir.Stmt]:
    """The group's kv head (own axes) and first row or key mf_b0 of its 16 x sgs of `count`;
    E's 16-blocks mf_eb, mf_ew = 16 mf_eb, a staged row mf_rs (mf_ew plus PAD; `whole`: ROW,
    for products that read MAT_E values of a row)."""
    grp = ir.Cast(IDX, ir.Var("mf_group"))
    per = ir.Lit(SIDE * sgs, IDX)
    nblk = ir.Var("mf_nblk")
    e = ctx.size(ctx.roles.e)
    return [
        ir.Comment(f"the group's kv head and its {SIDE * sgs} rows or keys; E in 16-blocks"),
        ir.Decl("mf_nblk", IDX, (count + per - ir.Lit(1, IDX)) / per),
        ir.If(grp >= ctx.span(ctx.roles.own) * nblk, [ir.Return()]),
        *positions(ctx, grp / nblk, ctx.roles.own),
        ir.Decl("mf_b0", IDX, grp % nblk * per),
        ir.Decl("mf_eb", UINT, ir.Cast(UINT, (e + ir.Lit(SIDE - 1, IDX)) / ir.Lit(SIDE, IDX))),
        ir.Decl("mf_ew", UINT, ir.Var("mf_eb") * u(SIDE)),
        ir.Decl("mf_rs", UINT, u(ROW) if whole else ir.Var("mf_ew") + u(PAD)),
        ir.Decl("mf_vec_ok", "bool", (e % ir.Lit(VW, IDX)).eq(ir.Lit(0, IDX)))]


Place = Callable[[ir.Expr], list[ir.Stmt]]


def accounting(ctx: Ctx, op: str, sgs: int, own: int, scratches: int, resident: bool,
               rows: int = SIDE) -> str:
    """The generated comment's accounting of a block kernel: threadgroup memory (the step's
    two shared tiles of `rows` rows, `own` staged arrays of sgs x 16 rows, `scratches` scratch
    arrays a simdgroup, the rows' lse, delta and positions), staged bytes and barriers a
    step."""
    size = 2                                       # half / bfloat
    shared = 2 * rows * ROW * size
    owned = own * sgs * SIDE * ROW * size
    scratch = scratches * sgs * SIDE * PS * size
    stats = (2 * 4 + len(staged_positions(ctx)) * (8 if ctx.index64 else 4)) * sgs * SIDE
    where = (f"the own operands (2 x 16 x {MAT_E} {op}) in registers" if resident else
             f"{owned} the group's own rows")
    return (f"threadgroup memory {shared + owned + scratch + stats} bytes of 32768 ({shared} "
            f"the step's two staged {rows}-row tiles as {op}, {scratch} the {sgs} simdgroups' P / "
            f"dS scratch, {stats} the query rows' lse, delta and positions; {where}); per "
            f"step {2 * rows * MAT_E * size} bytes staged (at E = {MAT_E}) for {sgs} "
            "simdgroups, two threadgroup barriers")


def staged_positions(ctx: Ctx) -> list[str]:
    """Threadgroup arrays of the staged query rows' positions (mf_tpos_<axis>, a row's at its
    lse's place) where the rows span several axes (GQA's (R, S)): the element-wise work
    reads them instead of dividing its row's flat index per element."""
    tile = ctx.roles.tile
    return [f"mf_tpos_{ident(a)}" for a in tile] if len(tile) > 1 else []


def store_positions(ctx: Ctx, at_row: ir.Expr) -> list[ir.Stmt]:
    """The row's positions (mf_pos_<axis>, declared) to the staged arrays at `at_row`."""
    names = staged_positions(ctx)
    return [ir.Store(n, at_row, ir.Var(f"mf_pos_{ident(a)}"), space="threadgroup")
            for n, a in zip(names, ctx.roles.tile if names else ())]


def row_positions(ctx: Ctx, stat: ir.Expr) -> list[ir.Stmt]:
    """mf_pos_<axis> of the staged row at `stat` (its lse's place), read back; a single axis
    is the row index mf_tr itself."""
    names = staged_positions(ctx)
    if not names:
        return positions(ctx, ir.Var("mf_tr"), ctx.roles.tile)
    return [ir.Decl(f"mf_pos_{ident(a)}", IDX, ir.Lane(ir.Var(n), stat))
            for n, a in zip(names, ctx.roles.tile)]


def stage(ctx: Ctx, op: str, arrs: Sequence[tuple[str, Node]], first: ir.Expr, rows: int,
          count: ir.Expr, place: Place, stats: bool = False, sgs: int = SGS,
          stat_at: Optional[ir.Expr] = None) -> ir.Stmt:
    """Rows first .. first + rows - 1 of the tensor reads into their arrays as `op`, E up to
    mf_ew (0 past E and past `count`): a simdgroup a row (its positions once, `place(index)`),
    the lanes along E (`sgs` simdgroups); where E is a multiple of 8, innermost, and the rows
    whole pairs for every simdgroup, `staging.two_phase` (every load before any store); with
    `stats`, the query row's lse and delta to mf_tl, mf_td at stat_at + its row of the
    `rows`."""
    e = ir.Var("mf_e")
    at = ir.Var("mf_sr") * ir.Var("mf_rs") + e
    zero: list[ir.Stmt] = [ir.Store(a, at, ir.Cast(op, ir.Lit(0.0, "float")),
                                    space="threadgroup") for a, _ in arrs]
    fill: list[ir.Stmt] = [ir.Store(a, at, ir.Cast(op, load(ctx, n)), space="threadgroup")
                           for a, n in arrs]
    lanes = ir.Var("mf_lane"), ir.Var("mf_ew")
    inside = ir.Cast(IDX, e) < ctx.size(ctx.roles.e)
    copy: ir.Stmt = ir.For("mf_e", UINT, lanes[0], lanes[1], [ir.If(inside, fill, zero)],
                           step=u(SIMD_WIDTH))
    vec = all(ctx.graph.tensor(n.attr).axes[-1] == ctx.roles.e for _, n in arrs)
    if vec and not staging.applies(rows, sgs):
        copy = ir.If(ir.Var("mf_vec_ok"), [_chunks(ctx, arrs, at, inside, zero)], [copy])
    live: list[ir.Stmt] = [*place(ir.Var("mf_si")), copy]
    if stats:
        r = ctx.roles
        at_row = ir.Var("mf_sr") if stat_at is None else stat_at + ir.Var("mf_sr")
        live.append(ir.If(ir.Var("mf_lane").eq(u(0)), [
            ir.Store("mf_tl", at_row, load(ctx, r.lse), space="threadgroup"),
            ir.Store("mf_td", at_row, load(ctx, r.delta), space="threadgroup"),
            *store_positions(ctx, at_row)]))
    loop = ir.For("mf_sr", UINT, ir.Var("mf_sg"), u(rows), [
        ir.Decl("mf_si", IDX, first + ir.Cast(IDX, ir.Var("mf_sr"))),
        ir.If(ir.Var("mf_si") < count, live, [
            ir.For("mf_e", UINT, lanes[0], lanes[1], zero, step=u(SIMD_WIDTH))])],
        step=u(sgs))
    if vec and staging.applies(rows, sgs):
        return ir.If(ir.Var("mf_vec_ok"), [ir.Block(staging.two_phase(
            ctx, arrs, first, rows, count, place, stats, sgs, stat_at, store_positions))],
            [loop])
    return loop


def _chunks(ctx: Ctx, arrs: Sequence[tuple[str, Node]], at: ir.Expr, inside: ir.Expr,
            zero: list[ir.Stmt]) -> ir.Stmt:
    """The row's copy in chunks of VW elements (16 bytes) a lane, E a multiple of VW (each
    chunk inside E or past it whole; the ones past it zeros)."""
    fill: list[ir.Stmt] = []
    for a, n in arrs:
        t = ctx.graph.tensor(n.attr)
        st = ctx.in_stype(t)
        fill.append(ir.Store(a, at, ir.Load(ctx.names[t.name], offset(ctx, t.axes), VW, st),
                             VW, st, space="threadgroup"))
    e0 = ir.Var("mf_lane") * u(VW)
    zeros = ir.For("mf_x", UINT, u(0), u(VW), [
        ir.Block([ir.Decl("mf_e", UINT, ir.Var("mf_e0") + ir.Var("mf_x")), *zero])],
        unroll=True)
    return ir.For("mf_e0", UINT, e0, ir.Var("mf_ew"), [
        ir.Decl("mf_e", UINT, ir.Var("mf_e0")),
        ir.If(inside, fill, [zeros])], step=u(SIMD_WIDTH * VW))


def key_place(idx: ir.Expr) -> list[ir.Stmt]:
    return [ir.Decl("mf_l", IDX, idx)]


def row_place(ctx: Ctx) -> Place:
    return lambda idx: positions(ctx, idx, ctx.roles.tile)


def products(blk: strided.Blocks, pairs: Sequence[tuple[str, str]], a_row: ir.Expr,
             b_row: ir.Expr) -> ir.Stmt:
    """Blocks 0, 1, ... = sum over E's 16-blocks of A B^T for each (A, B) of `pairs` (A from
    row a_row of its array, B from row b_row: both k-inner along E)."""
    es = ir.Var("mf_es")
    rs = ir.Var("mf_rs")
    body: list[ir.Stmt] = []
    for i, (a, b) in enumerate(pairs):
        body += strided.multiply(blk, i, ir.Var(a) + a_row * rs + es * u(SIDE), rs,
                                 ir.Var(b) + b_row * rs + es * u(SIDE), rs)
    clears = [s for i in range(len(pairs)) for s in strided.clear(blk, i)]
    return ir.Block([*clears, ir.For("mf_es", UINT, u(0), ir.Var("mf_eb"), body)])


def grads(ctx: Ctx, roots: Sequence[Node], helpers: set[str]) -> tuple[list[ir.Stmt],
                                                                        list[ir.Expr]]:
    """The roots (P, dS) of the pair (key mf_l, the row's positions) from its dots mf_sd
    (q k), mf_pd (dO v) and the row's lse and delta (`kernels.pair`'s work, other names)."""
    r = ctx.roles
    low = lowering(ctx, "mf_g")
    preset(low, r.c, ir.Var("mf_sd"))
    preset(low, r.dp, ir.Var("mf_pd"))
    preset(low, r.lse, ir.Var("mf_lse"))
    preset(low, r.delta, ir.Var("mf_delta"))
    body = low.lower(list(roots))
    helpers |= low.helpers | {"mf_maximum"}
    return body, [as_float(low.value(n), n) for n in roots]


Where = Callable[[ir.Expr, ir.Expr], ir.Expr]


def elements(ctx: Ctx, op: str, blk: strided.Blocks, key: Where, row: Where, stat: Where,
             outs: Sequence[tuple[Node, str]], helpers: set[str], coops: bool = False
             ) -> list[ir.Stmt]:
    """Per element (i, j) of blocks 0 (scores' dot) and 1 (dP's dot) the lane holds: the
    pair (key(i, j), row(i, j)), the row's lse and delta at mf_tl, mf_td[stat(i, j)]; each
    root of `outs` to its scratch at [i][j] as `op` (0 past the keys or the rows), or with
    `coops` to the same element of the cooperative tensor that `outs` names (a left input
    whose elements lie as the blocks': `Target.row_lanes`)."""
    r = ctx.roles
    body, values = grads(ctx, [n for n, _ in outs], helpers)
    names = [f"mf_w{i}" for i in range(len(outs))]

    def put(i: ir.Expr, j: ir.Expr, ref: ir.Expr) -> list[ir.Stmt]:
        other = _twin(ref, blk)
        at = ir.Var("mf_sp") + i * u(PS) + j
        inside = (ir.Var("mf_l") < ctx.size(r.key)).and_(ir.Var("mf_tr") < ctx.span(r.tile))
        return [ir.Decl("mf_sd", "float", ref), ir.Decl("mf_pd", "float", other),
                *(ir.Decl(n, "float", ir.Lit(0.0, "float"), const=False) for n in names),
                ir.Decl("mf_l", IDX, key(i, j)), ir.Decl("mf_tr", IDX, row(i, j)),
                ir.If(inside, [*row_positions(ctx, stat(i, j)),
                               ir.Decl("mf_lse", "float", ir.Lane(ir.Var("mf_tl"), stat(i, j))),
                               ir.Decl("mf_delta", "float", ir.Lane(ir.Var("mf_td"),
                                                                    stat(i, j))), *body,
                               *(ir.Assign(ir.Var(n), v) for n, v in zip(names, values))]),
                *(ir.Assign(ir.Lane(ir.Var(arr), ir.Var("mf_c")), ir.Cast(op, ir.Var(n)))
                  if coops else ir.Store(arr, at, ir.Cast(op, ir.Var(n)), space="threadgroup")
                  for n, (_, arr) in zip(names, outs))]
    if coops:
        return strided.each(blk, 0, put)
    return [*strided.each(blk, 0, put),
            ir.Comment("the simdgroup's scratch is written before its products read it"),
            ir.Barrier("simdgroup")]


def _twin(ref: ir.Expr, blk: strided.Blocks) -> ir.Expr:
    """Block 1's element at the place of block 0's `ref` (both blocks share one layout)."""
    if isinstance(ref, ir.Lane):
        return ir.Lane(_twin(ref.vec, blk), ref.lane)
    assert isinstance(ref, ir.Var) and ref.name == blk.var(0).name, ref
    return blk.var(1)


def accumulate(blk: strided.Blocks, first: int, a: str, b: str, b_row: ir.Expr
               ) -> list[ir.Stmt]:
    """Blocks first + d += A (the simdgroup's scratch `a`: 16 x 16) x B (rows b_row .. + 15
    of `b`, E elements 16 d ..), over E's blocks d."""
    a_at = ir.Var(a) + ir.Var("mf_sp")
    out: list[ir.Stmt] = []
    for d in range(ACC):
        b_at = ir.Var(b) + b_row * ir.Var("mf_rs") + u(d * SIDE)
        out.append(ir.If(u(d) < ir.Var("mf_eb"), strided.multiply(
            blk, first + d, a_at, u(PS), b_at, ir.Var("mf_rs"))))
    return out


def store_acc(ctx: Ctx, blk: strided.Blocks, first: int, kind: str,
              where: Callable[[ir.Expr], list[ir.Stmt]], live: Callable[[ir.Expr], ir.Expr]
              ) -> list[ir.Stmt]:
    """Output `kind` from blocks first + d: element (i, j) is E element 16 d + j of the
    simdgroup's row or key i (`where(i)` declares its positions, `live(i)` inside)."""
    if kind not in ctx.roles.outputs:
        return []
    out: list[ir.Stmt] = []
    for d in range(ACC):
        def put(i: ir.Expr, j: ir.Expr, ref: ir.Expr, d: int = d) -> list[ir.Stmt]:
            e = ir.Var("mf_e")
            return [ir.Decl("mf_e", UINT, u(d * SIDE) + j), ir.If(
                live(i).and_(ir.Cast(IDX, e) < ctx.size(ctx.roles.e)),
                [*where(i), *store(ctx, kind, ref)])]
        out.append(ir.If(u(d) < ir.Var("mf_eb"), strided.each(blk, first + d, put)))
    return out


def rows_seen(ctx: Ctx, k0: ir.Expr, keys: int, step: list[ir.Stmt], rows: int = SIDE
              ) -> list[ir.Stmt]:
    """`step` for the `rows` rows from mf_t0 when one of them sees one of the `keys` keys
    from k0 (always without an index mask: `bounds`)."""
    r = ctx.roles
    if r.form is None or not masked_by_index(r.form, r.rows):
        return step
    k = ir.Cast(LONG, k0)
    return [*lane_bounds(ctx, r.form, ir.Var("mf_t0"), rows),
            ir.If((ir.Var("mf_khi") > k).and_(
                ir.Var("mf_klo") < k + ir.Cast(LONG, ir.Lit(keys, "int"))), step)]


def key_blocks(ctx: Ctx, step: list[ir.Stmt], sgs: int = SGS, keys: int = SIDE
               ) -> list[ir.Stmt]:
    """The loop over the blocks of `keys` keys (from a multiple of 16) the group's 16 x sgs
    rows (from mf_b0) can see."""
    r = ctx.roles
    loop = ir.For("mf_k0", IDX, ir.Var("mf_kbeg"), ir.Var("mf_kend"), step,
                  step=ir.Lit(keys, IDX))
    if r.form is None or not masked_by_index(r.form, r.rows):
        return [ir.Comment(f"every key, {keys} at a time"),
                ir.Decl("mf_kbeg", IDX, ir.Lit(0, IDX)),
                ir.Decl("mf_kend", IDX, ctx.size(r.key)), loop]
    zero = ir.Cast(LONG, ir.Lit(0, "int"))
    return [*lane_bounds(ctx, r.form, ir.Var("mf_b0"), SIDE * sgs),
            ir.Comment(f"the key blocks they see, {keys} keys at a time"),
            ir.Decl("mf_kbeg", IDX, ir.Cast(IDX, ir.Call("max", (ir.Var("mf_klo"), zero)))
                    / ir.Lit(SIDE, IDX) * ir.Lit(SIDE, IDX)),
            ir.Decl("mf_kend", IDX, ir.Cast(IDX, ir.Call("max", (ir.Call("min", (
                ir.Var("mf_khi"), ir.Cast(LONG, ctx.size(r.key)))), zero)))), loop]


def start(ctx: Ctx, lowering_: str, op: str, arrays: tuple[Sequence[str], Sequence[str],
                                                         Sequence[str]], count: ir.Expr,
          sgs: int = SGS, whole: bool = False, shared_rows: int = SIDE) -> list[ir.Stmt]:
    """The buffers (`arrays`: shared of `shared_rows` rows, own, scratch), the group's head
    (`whole`: rows of ROW), the lane's place."""
    body = [*buffers(op, *arrays, sgs=sgs, pos=staged_positions(ctx), shared_rows=shared_rows),
            *head(ctx, count, sgs, whole)]
    return body + (lane_place(ir.Var("mf_lane")) if lowering_ == SIMDGROUP else [])


def how(lowering_: str) -> str:
    return ("Metal 4 tensor ops (matmul2d over threadgroup tensors)" if lowering_ == MPP
            else "simdgroup_matrix products")
