"""A row thread's elements in registers: its slots' row positions (`slot_pos`, `placement`),
wide loads and stores with guarded tails (`load_block`, `store_block`), register blocks and
the staged kernel's threadgroup copies (`reg_value`, `stage_chunk`)."""
from __future__ import annotations

from ... import ir
from ...graph import TensorParam
from ..base import IDX
from ..lower import compute_type
from ..names import tensor_var
from .context import RowKernel, Section, most_threads, row_base, row_gathers
from .plan import WHOLE

U = "uint"


def lit(v: int) -> ir.Lit:
    """A uint literal."""
    return ir.Lit(v, U)


def each_slot(k: RowKernel, body: list[ir.Stmt]) -> ir.For:
    """`body` for each slot mf_k of the thread's block (unrolled)."""
    return ir.For("mf_k", U, lit(0), lit(k.reads), body, unroll=True)


# -- register blocks ------------------------------------------------------------------------

def reg(k: RowKernel, name: str) -> str:
    """A tensor's register block (after its MSL name: never an output's, mf_reg_mf_out)."""
    return f"mf_reg_{k.ctx.names[name]}"


def reg_type(k: RowKernel, t: TensorParam) -> str:
    """The type of a tensor's register block: the tensor's own for floats (a half or bfloat
    row, converted to fp32 where used: half the space in Apple's 16-bit registers; on the
    H100 f16 rms_norm 4096x8192 went from 88 to 97% of copy bandwidth, bench/README.md),
    the compute type otherwise."""
    ct = compute_type(t.dtype)
    return k.ctx.in_stype(t) if ct == "float" else ct


def reg_value(k: RowKernel, sec: Section, name: str, slot_k: ir.Expr) -> ir.Expr:
    """Slot `slot_k` of a tensor's register block, in its compute type (in the staged variant,
    slots from `staged[name]` on are in threadgroup memory, unless `sec` just loaded them)."""
    t = k.ctx.graph.tensor(name)
    ct, rt = compute_type(t.dtype), reg_type(k, t)
    slot: ir.Expr = ir.Lane(ir.Var(reg(k, name)), slot_k)
    if name in k.staged and name not in sec.fresh:
        vw, st = lit(k.vw), k.ctx.in_stype(t)
        first = lit(k.staged[name] // k.vw)
        # copied out of threadgroup memory (mf_lane8 takes a thread-space reference)
        chunk = ir.Cast(ir.vector_type(st, k.vw), ir.Load(
            stage(name), stage_chunk(slot_k / vw - first) * vw, k.vw, st, space="threadgroup"))
        slot = ir.Select(slot_k < lit(k.staged[name]), slot, lane(k, chunk, slot_k % vw))
    return slot if rt == ct else ir.Cast(ct, slot)


def stage(name: str) -> str:
    """The staged kernel's threadgroup copy of a tensor's staged slots."""
    return f"mf_stage_{name}"


def stage_chunk(i: ir.Expr) -> ir.Expr:
    """Staged variant: where chunk i of this thread's staged slots sits in threadgroup
    memory, in chunks: chunk-major over the group's threads (16-byte accesses, one chunk
    a thread, side by side)."""
    return i * ir.Var("mf_tpg") + ir.Var("mf_t")


def fill(e: ir.Expr, frm: str, rt: str) -> ir.Expr:
    """A value of type `frm` as a register slot of type `rt`."""
    return e if rt == frm else ir.Cast(rt, e)


def lane(k: RowKernel, v: ir.Expr, i: ir.Expr) -> ir.Expr:
    """Element i of a loaded vector (an mf_pack8 through its helper)."""
    return ir.Call("mf_lane8", (v, i)) if k.vw == 8 else ir.Lane(v, i)


# -- where the thread's slots lie ---------------------------------------------------------------

def slot_pos(k: RowKernel, slot_k: ir.Expr) -> ir.Expr:
    """Row position of slot k of this thread's block: mf_base + k; in a `strided` kernel
    mf_first + k * mf_step (`placement`); in an `interleaved` one (chunk c of the row's lane
    t at (c * mf_w + t) * vw) mf_base + k / vw * mf_stride + k % vw (mf_base = t * vw,
    mf_stride = mf_w * vw). A `mirrored` kernel (scalar accesses only) reads and writes
    position D - 1 - (mf_base + k): a slot past the row's end wraps above D (uint), so its
    guard `< D` still fails."""
    if k.mirrored:
        return ir.Cast("uint", k.ctx.size(k.ctx.axis)) - lit(1) - (ir.Var("mf_base") + slot_k)
    if k.strided:
        return ir.Var("mf_first") + slot_k * ir.Var("mf_step")
    if not k.interleaved:
        return ir.Var("mf_base") + slot_k
    vw = lit(k.vw)
    return ir.Var("mf_base") + slot_k / vw * ir.Var("mf_stride") + slot_k % vw


def placement(k: RowKernel, first: ir.Expr, span: ir.Expr) -> list[ir.Stmt]:
    """Where a `strided` kernel's thread holds its slots (after mf_base and mf_vec_ok):
    contiguously from mf_base in rows that are a multiple of the vector width; in the
    others, which move element by element, slot k at first + k * span, the row's threads
    side by side in each slot, so that a simdgroup's access is one contiguous span instead
    of touching a 32-byte sector a thread (H100, f16 softmax: 4096x4097 175 -> 36 µs, rows
    of 4098 64 µs in 4-byte vectors, 8192x101 6.5 -> 3.9 µs). mf_last: the last slot's
    position."""
    if not k.strided:
        return []
    ok = ir.Var("mf_vec_ok")
    return [ir.Decl("mf_first", U, ir.Select(ok, ir.Var("mf_base"), first)),
            ir.Decl("mf_step", U, ir.Select(ok, lit(1), span)),
            ir.Decl("mf_last", U, slot_pos(k, lit(k.reads - 1)))]


def chunk_step(k: RowKernel) -> ir.Expr:
    """How far apart along the row a thread's vector chunks start (see `slot_pos`)."""
    return ir.Cast(IDX, ir.Var("mf_stride")) if k.interleaved else ir.Lit(k.vw, IDX)


def holding(k: RowKernel, tail: list[ir.Stmt]) -> list[ir.Stmt]:
    """A lane's row-end path (each element checked), run only where the lane holds part of
    the row: a lane wholly past its end skips it instead of stepping through its checks
    (D = 96 at 8 a lane leaves 4 of a row's 16 lanes empty; on the H100 f16 log_softmax
    8192x96 went from 0.75x to 0.97-0.99x torch eager, softmax 0.9x to 1.11-1.15x)."""
    first = ir.Var("mf_first" if k.strided else "mf_base")
    return [ir.If(first < k.ctx.size(k.ctx.axis), tail)]


def full(k: RowKernel) -> ir.Expr:
    """Whether the thread's whole block is in the row and vector accesses apply."""
    end = ir.Var("mf_base") + lit(k.reads)
    return ir.Var("mf_vec_ok").and_(end <= k.ctx.size(k.ctx.axis))


# -- loads and stores ---------------------------------------------------------------------------

def load_block(k: RowKernel, tensors: list[str], declare: bool) -> list[ir.Stmt]:
    """Fill mf_reg_<t>[R] with this thread's R elements of each tensor (guarded). The
    staged kernel takes only rows of whole blocks (`RowSchedule.stages`), so its loads are
    all whole vectors; a staged tensor's chunks from slot S on also go to threadgroup
    memory (`stage_chunk`), where the later phases read them."""
    ctx, reads, vw = k.ctx, k.reads, k.vw
    base, c, slot_k = ir.Var("mf_base"), ir.Var("mf_c"), ir.Var("mf_k")
    staged = [n for n in tensors if n in k.staged]
    where = (f"; of {', '.join(staged)}, elements {k.staged[staged[0]]} on also into "
             f"threadgroup memory, where later phases read them" if staged else "")
    out: list[ir.Stmt] = [ir.Comment(f"load {reads} elements per thread of "
                                     f"{', '.join(tensors)} into registers{where}")]
    vec: list[ir.Stmt] = []
    sca: list[ir.Stmt] = []
    for name in tensors:
        t = ctx.graph.tensor(name)
        ct, st, rt = compute_type(t.dtype), ctx.in_stype(t), reg_type(k, t)
        rb = row_base(ctx, k.parts, ctx.names[name], t.axes)
        held = k.staged.get(name, reads)            # slots only in registers
        arr, got = ir.Var(reg(k, name)), ir.Var(tensor_var(name, "v"))
        if declare:
            out.append(ir.ArrayDecl(arr.name, rt, reads))
        start = rb + ir.Cast(IDX, base) + c * chunk_step(k)
        load = ir.Decl(got.name, ir.vector_type(st, vw), ir.Load(ctx.names[name], start, vw, st))
        to_regs = ir.For("mf_l", U, lit(0), lit(vw), [
            ir.Assign(ir.Lane(arr, c * lit(vw) + ir.Var("mf_l")),
                      fill(lane(k, got, ir.Var("mf_l")), st, rt))], unroll=True)
        vec.append(ir.For("mf_c", U, lit(0), lit(held // vw), [load, to_regs], unroll=True))
        sca.append(ir.Assign(ir.Lane(arr, slot_k), ir.Select(
            slot_pos(k, slot_k) < ctx.size(ctx.axis),
            fill(ir.Load(ctx.names[name], rb + ir.Cast(IDX, slot_pos(k, slot_k))), st, rt),
            fill(ir.Lit(0.0 if ct == "float" else 0, ct), ct, rt))))
        if held < reads:
            out += stage_block(k, t, held, declare)
            at = stage_chunk(c - lit(held // vw)) * lit(vw)
            vec.append(ir.For("mf_c", U, lit(held // vw), lit(reads // vw), [
                load, to_regs, ir.Store(stage(name), at, got, vw, st, space="threadgroup")],
                unroll=True))
    scalar: list[ir.Stmt] = [each_slot(k, sca)]
    if k.name in WHOLE:
        return out + [ir.Comment(f"{vw}-wide vector loads (rows of whole blocks)")] + vec
    if vw > 1:
        # registers a lane past the row's end skips are never read, except as the values it
        # offers to a row gather's shuffles: zeros there
        tail = [ir.Comment("row tail or unaligned rows: scalar, guarded")] + scalar
        return out + [ir.If(full(k), [ir.Comment(f"{vw}-wide vector loads")] + vec,
                            tail if row_gathers(ctx) else holding(k, tail))]
    return out + scalar


def stage_block(k: RowKernel, t: TensorParam, held: int, declare: bool) -> list[ir.Stmt]:
    """The staged kernel's threadgroup array for tensor t's slots from `held` on (declared
    with the variant's threadgroup arrays) and the thread's pointer into it."""
    if not declare:
        return []
    st, name = k.ctx.in_stype(t), stage(t.name)
    chunk_bytes = k.vw * t.dtype.itemsize
    k.parts.tg_arrays.append(ir.ArrayDecl(
        f"{name}_mem", "float4",
        -(-(k.reads - held) // k.vw * chunk_bytes * most_threads(k.ctx) // 16), "threadgroup"))
    return [ir.Decl(name, f"threadgroup {st}*", ir.Call(
        f"reinterpret_cast<threadgroup {st}*>", (ir.Var(f"{name}_mem"),)), const=False)]


def store_block(k: RowKernel, outs: list[int]) -> list[ir.Stmt]:
    """Store the thread's slots of each output in `outs` (vector stores where the thread's
    block is whole, else each slot checked)."""
    ctx, reads, vw = k.ctx, k.reads, k.vw
    base = ir.Var("mf_base")
    vec: list[ir.Stmt] = []
    sca: list[ir.Stmt] = []
    for j in outs:
        o = ctx.graph.outputs[j]
        st = ctx.out_stype(j)
        arr = ir.Var(f"mf_reg_{ctx.out_names[j]}")
        rb = row_base(ctx, k.parts, ctx.out_names[j], o.axes)
        start = rb + ir.Cast(IDX, base) + ir.Var("mf_c") * chunk_step(k)
        first = ir.Var("mf_c") * lit(vw)
        lanes = tuple(ir.Lane(arr, first + lit(i)) for i in range(vw))
        vec.append(ir.For("mf_c", U, lit(0), lit(reads // vw), [
            ir.Store(ctx.out_names[j], start,
                     ir.Call("mf_pack8_of" if vw == 8 else ir.vector_type(st, vw), lanes),
                     vw, st)],
            unroll=True))
        pos = slot_pos(k, ir.Var("mf_k"))
        sca.append(ir.If(pos < ctx.size(ctx.axis), [
            ir.Store(ctx.out_names[j], rb + ir.Cast(IDX, pos), ir.Lane(arr, ir.Var("mf_k")))]))
    scalar: list[ir.Stmt] = [each_slot(k, sca)]
    if k.name in WHOLE:                    # rows of whole blocks
        return [ir.Comment(f"store the row's outputs, {vw}-wide")] + vec
    if vw > 1:
        return [ir.Comment("store the row's outputs"),
                ir.If(full(k), [ir.Comment(f"{vw}-wide vector stores")] + vec,
                      holding(k, [ir.Comment("row tail or unaligned rows: scalar, "
                                             "guarded")] + scalar))]
    return [ir.Comment("store the row's outputs")] + scalar
