"""kv_prefetch with stage_kv: the stage_kv decode kernels (`staged`) with their K/V copies a
tile ahead. Each thread holds its copies of the next tile (16-byte vectors of the storage
type, every K and V load issued together, a gathered key's row found first) in registers
while the group computes the current tile, and stores them into the tiles after that tile's
last barrier; the kernel waits on memory once per tile with all of its loads in flight, not
once per copy. Calls whose K/V rows are not whole vectors (E not a multiple of the vector
width) take `staged`'s copies, at the top of each tile."""
from __future__ import annotations

from ... import ir
from ..base import IDX, make_kernel
from ..hardware import SIMD_WIDTH
from .context import THREADS, CallContext, Emitted, KernelState, offset
from .head import block_keys, group_head, tile
from .params import NARROW_LANES, NARROW_TILE_KEYS, TILE_BYTES, TILE_KEYS
from .staged import stage_kv_body
from .staging import stage, with_staged
from .tiles import key_row


def kernel(ctx: CallContext, variant: str = "decode") -> ir.LoweredKernel:
    """`staged.kernel`'s decode kernel (`variant` decode, narrow or wide: the same E
    ranges), its tiles filled from registers loaded during the tile before."""
    f = ctx.form
    narrow = variant == "narrow"
    ks = with_staged(ctx, KernelState(
        Emitted(), qt=ctx.qt, group=SIMD_WIDTH * ctx.qt,
        epl=ctx.policy.reads_per_thread if variant == "wide" else ctx.run, over_e=True,
        vlanes=NARROW_LANES if narrow else SIMD_WIDTH,
        kt_max=NARROW_TILE_KEYS if narrow else TILE_KEYS))
    head = group_head(ctx, ks, ks.qt) + tile(ctx, ks) + block_keys(ctx, ks)
    staged, q_stores = stage(ctx, ks)
    scan = pipelined_body(ctx, ks, q_stores)
    emax = ks.vlanes * ks.epl
    body = ks.out.tg_decls + head + ks.out.pre + staged + scan
    name = "decode" if variant == "decode" else f"decode_{variant}"
    summary = (f"{ctx.graph.name} ({name}, stage_kv, kv_prefetch): softmax over '{f.key}' "
               f"of scores contracting '{f.e}' (up to {emax}), times the values, summed over "
               f"'{f.key}'; a threadgroup per {ks.qt} query rows sharing their keys and "
               f"block of keys, a simdgroup per row; tiles of K and V staged in threadgroup "
               f"memory from registers each thread loaded during the tile before, each "
               f"simdgroup scoring its share of a tile's keys against every row and adding "
               f"their p v for every row; online softmax in one pass, fp32 state")
    # no declared group size: on cuda a declared one caps registers at 64 a thread (1024
    # threads a core, translate._launch_bounds), where the next tile's copies in registers
    # would spill; undeclared, the library drops its 32-register cap once it spills
    return make_kernel(ctx.graph, ctx.index64, THREADS, body, summary, name,
                       params=ctx.params, helpers=tuple(sorted(ks.out.helpers)))


def copies_per_thread(ctx: CallContext, ks: KernelState) -> int:
    """The most vector copies of one K/V tile a thread makes: a tile holds at most
    TILE_BYTES and kt_max keys of the kernel's largest E; the group's threads take every
    group-th copy."""
    if ctx.vw == 1:
        return 0
    item = min(ctx.tensor_of(n).dtype.itemsize for n in ctx.kv)
    most = min(TILE_BYTES // (ctx.vw * item), ks.kt_max * -(-ks.vlanes * ks.epl // ctx.vw))
    return -(-most // ks.group)


def pipelined_body(ctx: CallContext, ks: KernelState,
                   q_stores: list[ir.Stmt]) -> list[ir.Stmt]:
    """`staged.stage_kv_body` with its tile copies split: the stores from registers at the
    top of a tile (or, without whole vectors, the copies themselves), then the barrier,
    then the next tile's loads into registers before the scores, softmax and values."""
    out = stage_kv_body(ctx, ks, [])
    at = next(i for i, s in enumerate(out) if isinstance(s, ir.For) and s.var == "mf_tk")
    loop = out[at]
    assert isinstance(loop, ir.For)
    cut = next(i for i, s in enumerate(loop.body) if isinstance(s, ir.Barrier))
    tn, copies, compute = loop.body[0], loop.body[1:cut], loop.body[cut + 1:]
    whole = ctx.vw > 1 and all(ctx.tensor_of(n).axes[-1] == ctx.form.e for n in ctx.kv)
    if not whole:
        return _with_q(out, at, loop, [tn, *copies], q_stores, compute)
    kt, tk = ir.Cast(IDX, ir.Var("mf_kt")), ir.Var("mf_tk")
    first: list[ir.Stmt] = [tn, ir.If(ir.Var("mf_vec_ok"), _stores(ctx, ks), copies)]
    nxt = ir.Call("min", (ir.Var("mf_l1") - ir.Call("min", (tk + kt, ir.Var("mf_l1"))), kt))
    ahead: list[ir.Stmt] = [
        ir.Comment("the next tile's copies into registers: in flight while this tile computes"),
        ir.If(ir.Var("mf_vec_ok"), _loads(ctx, ks, tk + kt, nxt))]
    lead = [*_registers(ctx, ks),
            ir.Comment("the first tile's copies into registers"),
            ir.If(ir.Var("mf_vec_ok"), _loads(ctx, ks, ir.Var("mf_l0"), ir.Call("min", (
                ir.Var("mf_l1") - ir.Call("min", (ir.Var("mf_l0"), ir.Var("mf_l1"))), kt))))]
    return _with_q(out[:at] + lead + out[at:], at + len(lead), loop, first, q_stores,
                   ahead + compute)


def _with_q(out: list[ir.Stmt], at: int, loop: ir.For, fill: list[ir.Stmt],
            q_stores: list[ir.Stmt], compute: list[ir.Stmt]) -> list[ir.Stmt]:
    """`out` with its tile loop (at `at`) made of `fill`, the first tile's q stores, the
    barrier and `compute`."""
    q: list[ir.Stmt] = [
        ir.Comment("the first tile: the rows' q (loaded before the loop) into threadgroup memory"),
        ir.If(ir.Var("mf_tk").eq(ir.Var("mf_l0")), q_stores)] if q_stores else []
    body: list[ir.Stmt] = [*fill, *q, ir.Barrier(), *compute]
    return out[:at] + [ir.For(loop.var, loop.type, loop.start, loop.stop, body,
                              loop.unroll, step=loop.step)] + out[at + 1:]


def _registers(ctx: CallContext, ks: KernelState) -> list[ir.Stmt]:
    """Each K/V read's registers for this thread's copies of a tile (vectors of the storage
    type), and each copy's key and chunk (copy mf_tid + c x group: key / mf_chunks, chunk
    % mf_chunks; the same for every tile)."""
    n = copies_per_thread(ctx, ks)
    c = ir.Var("mf_c")
    i = ir.Var("mf_tid") + c * ir.Lit(ks.group, "uint")
    out: list[ir.Stmt] = [
        ir.Comment(f"this thread's copies of a tile: copy mf_tid + c x {ks.group} (c < {n}) "
                   "is key mf_pr[c], chunk mf_pe[c]"),
        ir.ArrayDecl("mf_pr", "uint", n), ir.ArrayDecl("mf_pe", "uint", n),
        ir.For("mf_c", "uint", ir.Lit(0, "uint"), ir.Lit(n, "uint"), [
            ir.Assign(ir.Lane(ir.Var("mf_pr"), c), i / ir.Var("mf_chunks")),
            ir.Assign(ir.Lane(ir.Var("mf_pe"), c), i % ir.Var("mf_chunks"))], unroll=True)]
    for node, arr in ctx.kv.items():
        out.append(ir.ArrayDecl(f"{arr}_pf", ir.vector_type(ctx.in_stype(ctx.tensor_of(node)),
                                                           ctx.vw), n))
    return out


def _each_copy(ctx: CallContext, ks: KernelState, count: ir.Expr,
               body: list[ir.Stmt]) -> ir.Stmt:
    """`body` for each of this thread's copies c of a tile of `count` keys (mf_r its key,
    mf_e its first E element)."""
    c = ir.Var("mf_c")
    return ir.For("mf_c", "uint", ir.Lit(0, "uint"), ir.Lit(copies_per_thread(ctx, ks), "uint"), [
        ir.Decl("mf_r", "uint", ir.Lane(ir.Var("mf_pr"), c)),
        ir.If(ir.Var("mf_r") < ir.Cast("uint", count), [
            ir.Decl("mf_e", "uint", ir.Lane(ir.Var("mf_pe"), c) * ir.Lit(ctx.vw, "uint")),
            *body])], unroll=True)


def _loads(ctx: CallContext, ks: KernelState, start: ir.Expr, count: ir.Expr) -> list[ir.Stmt]:
    """This thread's copies of keys [start, start + count) loaded into its registers, every
    K and V load before any is used (a gathered key's row found and checked first)."""
    body: list[ir.Stmt] = [ir.Decl("mf_l", IDX, start + ir.Cast(IDX, ir.Var("mf_r")))]
    for n, arr in ctx.kv.items():
        t = ctx.tensor_of(n)
        find, moved = key_row(ctx, ks, n, arr)
        body.append(ir.Block(find + [ir.Assign(
            ir.Lane(ir.Var(f"{arr}_pf"), ir.Var("mf_c")),
            ir.Load(ctx.names[t.name], offset(ctx, ks, t.axes, moved), ctx.vw,
                    ctx.in_stype(t)))]))
    return [ir.Decl("mf_pn", IDX, count), _each_copy(ctx, ks, ir.Var("mf_pn"), body)]


def _stores(ctx: CallContext, ks: KernelState) -> list[ir.Stmt]:
    """The tile's copies from this thread's registers into the K/V tiles."""
    body: list[ir.Stmt] = []
    for n, arr in ctx.kv.items():
        st = ctx.in_stype(ctx.tensor_of(n))
        body.append(ir.Store(arr, ir.Var("mf_r") * ir.Var(f"{arr}_stride") + ir.Var("mf_e"),
                             ir.Lane(ir.Var(f"{arr}_pf"), ir.Var("mf_c")), ctx.vw, st,
                             space="threadgroup"))
    return [ir.Comment("stage the tile's keys from the registers loaded during the tile "
                       "before"), _each_copy(ctx, ks, ir.Var("mf_tn"), body)]
