"""Where a row kernel's thread is: its row (or slice of a row), its index in the row, where its
elements start, the chunks it streams, whether vector loads apply; and the fresh collector of a
variant (`parts`)."""
from __future__ import annotations

from ... import ir
from .. import reduce
from ..base import IDX
from ..hardware import SIMD_WIDTH
from ..unit_gather import with_unit_gathers
from .context import RowContext, RowKernel, outer_load
from .loads import lit, placement
from .plan import LANES, SPLIT, STREAMED, WHOLE


def parts(ctx: RowContext, name: str) -> reduce.VariantParts:
    """A fresh collector for variant `name`, its row values read at the thread's row."""
    return with_unit_gathers(ctx, reduce.variant_parts(ctx, name,
                                                      lambda p, n: outer_load(ctx, p, n)))


# -- the thread's place ---------------------------------------------------------------------------

def header(k: RowKernel) -> tuple[tuple[ir.ThreadInput, ...], list[ir.Stmt]]:
    """(thread inputs, statements placing the thread): its row, its index in the row,
    where its elements start, the chunk count (looped) and whether vector loads apply."""
    ctx, name, reads = k.ctx, k.name, k.reads
    threads, head = lanes_header(k) if name in LANES else group_header(name in SPLIT)
    t = ir.Var("mf_t")
    if k.interleaved:
        head += [ir.Decl("mf_base", "uint", t * lit(k.vw)),
                 ir.Decl("mf_stride", "uint", ir.Var("mf_w") * lit(k.vw))]
    elif name not in STREAMED:
        head.append(ir.Decl("mf_base", "uint", t * lit(reads)))
    if name in STREAMED:
        span = ir.Var("mf_tpg") * lit(reads)
        length = ir.Cast("uint", ctx.size(ctx.axis))
        head.append(ir.Decl("mf_chunks", "uint", (length + (span - lit(1))) / span))
        if name in SPLIT:
            head += slice_bounds()
    if k.vw > 1 and name not in WHOLE:     # the others take rows of whole blocks
        whole = (ctx.size(ctx.axis) % ir.Lit(k.vw, IDX)).eq(ir.Lit(0, IDX))
        head.append(ir.Decl("mf_vec_ok", "bool", whole))
    if k.strided and name not in STREAMED:     # looped: per chunk (`section`)
        head.append(ir.Comment("rows that are not a multiple of the vector width move "
                               "element by element: a thread's slots strided by the row's "
                               "threads there, a simdgroup's accesses contiguous"))
        head += placement(k, t, ir.Var("mf_w" if name in LANES else "mf_tpg"))
    return threads, head


def lanes_header(k: RowKernel) -> tuple[tuple[ir.ThreadInput, ...], list[ir.Stmt]]:
    """The simd kernels: mf_w lanes a row (computed from the row's length), its row and its
    lane in the row; past the last row, return."""
    one, per_lane = lit(1), lit(k.reads)
    return lanes_of_rows(
        k.ctx, (ir.Cast("uint", k.ctx.size(k.ctx.axis)) + (per_lane - one)) / per_lane,
        f"mf_w = 1 << mf_wlog lanes per row: the fewest, a power of two up to 32, that hold it "
        f"at {k.reads} elements each (32 / mf_w rows per simdgroup; threads per threadgroup: "
        "set at launch)")


def lanes_of_rows(ctx: RowContext, lanes: ir.Expr, comment: str
                  ) -> tuple[tuple[ir.ThreadInput, ...], list[ir.Stmt]]:
    """A row's mf_w = 1 << mf_wlog lanes: the fewest, a power of two up to 32, at least
    `lanes` (the row's length over a lane's elements); the thread's row mf_row (past the last
    row: return) and its lane in the row mf_t."""
    threads = (ir.ThreadInput("mf_tid", "uint", "thread_position_in_grid"),
               ir.ThreadInput("mf_lane", "uint", "thread_index_in_simdgroup"))
    one, shift = lit(1), ir.Var("mf_wlog")
    return threads, [
        ir.Comment(comment),
        ir.Decl("mf_wlog", "uint", lit(32) - ir.Call("clz", (ir.Call("max", (lanes, one)) - one,))),
        ir.Decl("mf_w", "uint", one << shift),
        ir.Decl("mf_row", "uint", ir.Var("mf_tid") >> shift),
        ir.If(ir.Cast(IDX, ir.Var("mf_row")) >= ctx.span(ctx.outer), [ir.Return()]),
        ir.Decl("mf_t", "uint", ir.Var("mf_tid") & (ir.Var("mf_w") - one))]


def group_header(sliced: bool = False) -> tuple[tuple[ir.ThreadInput, ...], list[ir.Stmt]]:
    """The threadgroup kernels: one threadgroup per row (`sliced`: per slice of a row, mf_slices
    of them a row), its simdgroup count."""
    threads = (ir.ThreadInput("mf_group", "uint", "threadgroup_position_in_grid"),
               ir.ThreadInput("mf_lid", "uint", "thread_position_in_threadgroup"),
               ir.ThreadInput("mf_tpg", "uint", "threads_per_threadgroup"),
               ir.ThreadInput("mf_sg", "uint", "simdgroup_index_in_threadgroup"),
               ir.ThreadInput("mf_lane", "uint", "thread_index_in_simdgroup"))
    where: list[ir.Stmt] = [ir.Comment("one threadgroup per row"),
                            ir.Decl("mf_row", "uint", ir.Var("mf_group"))]
    if sliced:
        slices = ir.Var("mf_slices")
        where = [ir.Comment("mf_slices threadgroups per row, each a slice of its chunks"),
                 ir.Decl("mf_row", "uint", ir.Var("mf_group") / slices),
                 ir.Decl("mf_slice", "uint", ir.Var("mf_group") % slices)]
    return threads, where + [
        ir.Decl("mf_t", "uint", ir.Var("mf_lid")),
        ir.Decl("mf_nsg", "uint", (ir.Var("mf_tpg") + lit(SIMD_WIDTH - 1)) / lit(SIMD_WIDTH))]


def slice_bounds() -> list[ir.Stmt]:
    """The chunks [mf_j0, mf_j1) of the row that this threadgroup's slice takes."""
    per = (ir.Var("mf_chunks") + ir.Var("mf_slices") - lit(1)) / ir.Var("mf_slices")
    return [ir.Decl("mf_per", "uint", per),
            ir.Decl("mf_j0", "uint", ir.Call("min", (ir.Var("mf_slice") * ir.Var("mf_per"),
                                                     ir.Var("mf_chunks")))),
            ir.Decl("mf_j1", "uint", ir.Call("min", (ir.Var("mf_j0") + ir.Var("mf_per"),
                                                     ir.Var("mf_chunks"))))]
