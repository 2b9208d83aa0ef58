"""The row kernels, one function per variant (`KERNELS`: simd, simd_exact, group, staged,
looped), each building its kernel from a fresh `VariantParts`, and `build`, which builds them
all into a `RowSchedule`."""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from ... import ir
from ...graph import Graph, take_sites
from .. import reduce
from ..base import IDX, make_kernel
from ..hardware import SIMD_WIDTH
from ..policy import LaunchPolicy
from ..unit_gather import unit_sites, with_unit_gathers
from .context import RowContext, RowKernel, outer_load, row_context, row_kernel
from .loads import lit, placement
from .phases import epilogue, section
from .plan import LANES, VARIANTS, WHOLE, RowSchedule, vector_width_for

Built = tuple[ir.LoweredKernel, reduce.VariantParts]


def simd(ctx: RowContext) -> Built:
    """The fewest lanes of a simdgroup per row that hold it, R elements a lane."""
    return kernel(row_kernel(ctx, parts(ctx, "simd")))


def simd_exact(ctx: RowContext) -> Built:
    """The simd kernel for rows its lanes cover exactly, a lane's vector chunks spread over
    the row's lanes."""
    return kernel(row_kernel(ctx, parts(ctx, "simd_exact"), interleave=True))


def group(ctx: RowContext) -> Built:
    """One threadgroup per row, R elements a thread in registers."""
    return kernel(row_kernel(ctx, parts(ctx, "group")))


def staged(ctx: RowContext) -> Built:
    """The group kernel for rows of whole blocks, the second half of the staged inputs'
    blocks in threadgroup memory after the first phase."""
    return kernel(row_kernel(ctx, parts(ctx, "staged"), staged=ctx.stage_plan))


def looped(ctx: RowContext) -> Built:
    """One threadgroup per row, streamed in chunks each phase, online (max, sum) pairs and
    compensated sums; nothing kept in registers across phases."""
    return kernel(row_kernel(ctx, parts(ctx, "looped"), keep=False))


KERNELS: dict[str, Callable[[RowContext], Built]] = {
    "simd": simd, "simd_exact": simd_exact, "group": group, "staged": staged, "looped": looped}


def parts(ctx: RowContext, name: str) -> reduce.VariantParts:
    """A fresh collector for variant `name`, its row values read at the thread's row."""
    return with_unit_gathers(ctx, reduce.variant_parts(ctx, name,
                                                      lambda p, n: outer_load(ctx, p, n)))


def kernel(k: RowKernel) -> Built:
    """The kernel of one variant: a section per phase, the epilogue, the header placing the
    thread."""
    ctx, v = k.ctx, k.parts
    graph = ctx.graph
    looped = v.name == "looped"
    if k.vw == 8:
        ctx.helpers.add("mf_pack8_of")
    # the looped variant adds thousands of elements per thread: compensated sums
    reds = reduce.phases(graph, online=looped, compensated=looped)
    ctx.helpers.update(reduce.helpers_of(reds, simd=True) - {"mf_online_merge"})
    early = () if looped else ctx.early
    for p in range(1 + max(r.phase for r in reds)):
        rs = [r for r in reds if r.phase == p]
        roots = [r.arg for r in rs if r.online_max is None]
        desc = ", ".join(describe(r) for r in rs)
        outs = list(early) if p == 0 else []
        if outs:
            roots += [graph.outputs[j].node for j in outs]
            desc += f"; store {', '.join(ctx.out_names[j] for j in outs)}"
        section(k, roots, rs, outs, f"phase {p + 1}: {desc}")
    epilogue(k, early)
    threads, head = header(k)
    body = list(v.tg_arrays) + head + v.pre + v.main
    return make_kernel(graph, ctx.index64, threads, body, summary(k, reds), v.name), v


# -- the thread's place ---------------------------------------------------------------------------

def header(k: RowKernel) -> tuple[tuple[ir.ThreadInput, ...], list[ir.Stmt]]:
    """(thread inputs, statements placing the thread): its row, its index in the row,
    where its elements start, the chunk count (looped) and whether vector loads apply."""
    ctx, name, reads = k.ctx, k.name, k.reads
    threads, head = lanes_header(k) if name in LANES else group_header()
    t = ir.Var("mf_t")
    if k.interleaved:
        head += [ir.Decl("mf_base", "uint", t * lit(k.vw)),
                 ir.Decl("mf_stride", "uint", ir.Var("mf_w") * lit(k.vw))]
    elif name != "looped":
        head.append(ir.Decl("mf_base", "uint", t * lit(reads)))
    if name == "looped":
        span = ir.Var("mf_tpg") * lit(reads)
        length = ir.Cast("uint", ctx.size(ctx.axis))
        head.append(ir.Decl("mf_chunks", "uint", (length + (span - lit(1))) / span))
    if k.vw > 1 and name not in WHOLE:     # the others take rows of whole blocks
        whole = (ctx.size(ctx.axis) % ir.Lit(k.vw, IDX)).eq(ir.Lit(0, IDX))
        head.append(ir.Decl("mf_vec_ok", "bool", whole))
    if k.strided and name != "looped":     # looped: per chunk (`section`)
        head.append(ir.Comment("rows that are not a multiple of the vector width move "
                               "element by element: a thread's slots strided by the row's "
                               "threads there, a simdgroup's accesses contiguous"))
        head += placement(k, t, ir.Var("mf_w" if name in LANES else "mf_tpg"))
    return threads, head


def lanes_header(k: RowKernel) -> tuple[tuple[ir.ThreadInput, ...], list[ir.Stmt]]:
    """The simd kernels: mf_w lanes a row (computed from the row's length), its row and its
    lane in the row; past the last row, return."""
    ctx, reads = k.ctx, k.reads
    threads = (ir.ThreadInput("mf_tid", "uint", "thread_position_in_grid"),
               ir.ThreadInput("mf_lane", "uint", "thread_index_in_simdgroup"))
    one, shift, per_lane = lit(1), ir.Var("mf_wlog"), lit(reads)
    lanes = (ir.Cast("uint", ctx.size(ctx.axis)) + (per_lane - one)) / per_lane
    return threads, [
        ir.Comment(f"mf_w = 1 << mf_wlog lanes per row: the fewest, a power of two up to 32, "
                   f"that hold it at {reads} elements each (32 / mf_w rows per simdgroup; "
                   f"threads per threadgroup: set at launch)"),
        ir.Decl("mf_wlog", "uint", lit(32) - ir.Call("clz", (ir.Call("max", (lanes, one)) - one,))),
        ir.Decl("mf_w", "uint", one << shift),
        ir.Decl("mf_row", "uint", ir.Var("mf_tid") >> shift),
        ir.If(ir.Cast(IDX, ir.Var("mf_row")) >= ctx.span(ctx.outer), [ir.Return()]),
        ir.Decl("mf_t", "uint", ir.Var("mf_tid") & (ir.Var("mf_w") - one))]


def group_header() -> tuple[tuple[ir.ThreadInput, ...], list[ir.Stmt]]:
    """The threadgroup kernels: one threadgroup per row, its simdgroup count."""
    threads = (ir.ThreadInput("mf_group", "uint", "threadgroup_position_in_grid"),
               ir.ThreadInput("mf_lid", "uint", "thread_position_in_threadgroup"),
               ir.ThreadInput("mf_tpg", "uint", "threads_per_threadgroup"),
               ir.ThreadInput("mf_sg", "uint", "simdgroup_index_in_threadgroup"),
               ir.ThreadInput("mf_lane", "uint", "thread_index_in_simdgroup"))
    return threads, [
        ir.Comment("one threadgroup per row"),
        ir.Decl("mf_row", "uint", ir.Var("mf_group")),
        ir.Decl("mf_t", "uint", ir.Var("mf_lid")),
        ir.Decl("mf_nsg", "uint", (ir.Var("mf_tpg") + lit(SIMD_WIDTH - 1)) / lit(SIMD_WIDTH))]


# -- text ---------------------------------------------------------------------------------------

def describe(r: reduce.Reduction) -> str:
    """A reduction in a phase's title."""
    if r.online_sum is not None:
        return f"{r.kind} and (online) sum of exp(x - max)"
    if r.online_max is not None:
        return "(with the max above)"
    return f"{r.kind} over {r.axis}"


def summary(k: RowKernel, reds: list[reduce.Reduction]) -> str:
    """The kernel's one-line summary."""
    # launch-only choices (threads and rows per group) stay out of the text, so changing
    # them reuses the compiled library
    ctx, reads = k.ctx, k.reads
    lanes = (f"the fewest lanes of a simdgroup per row that hold it, {reads} "
             f"elements per lane in registers")
    spread = (f", each {k.vw}-wide chunk of the row a span of the row's lanes side by "
              f"side" if k.interleaved else "")
    how = {"simd": lanes,
           "simd_exact": f"{lanes}, for rows they cover exactly (D = lanes x "
                         f"{reads}: no row-end checks){spread}",
           "group": f"one threadgroup per row, {reads} elements per thread in registers, "
                    f"global memory read once",
           "staged": f"rows of whole blocks (a multiple of 32 x {reads}), one "
                     f"threadgroup per row, {reads} elements per thread, global "
                     f"memory read once; after the first phase, elements "
                     f"{min(k.staged.values(), default=0)} on of "
                     f"{', '.join(k.staged)} from threadgroup memory, not registers",
           "looped": f"one threadgroup per row (its size set at launch), streamed in "
                     f"chunks of {reads} elements per thread per phase, compensated "
                     f"sums"}[k.name]
    nph = 1 + max(r.phase for r in reds)
    return (f"{ctx.graph.name} ({k.name}): reduces '{ctx.axis}' over rows "
            f"[{', '.join(ctx.outer)}] in {nph} phase(s); {how}; {k.vw}-wide vector "
            f"loads/stores where aligned; fp32 accumulation")


# -- the schedule ---------------------------------------------------------------------------------

def build(graph: Graph, policy: LaunchPolicy, index64: bool) -> RowSchedule:
    """The row schedule of `graph`: every variant's kernel (the staged one where its split
    stages something), one parameter list and helper set."""
    ctx = row_context(graph, policy, index64)
    names = tuple(v for v in VARIANTS if v != "staged" or ctx.stage_plan)
    kernels, passes, tg = reduce.build_variants(ctx, names, lambda name: KERNELS[name](ctx))
    # the widest access any variant makes: the alignment the launcher checks inputs for
    vw = max(vector_width_for(policy, name, set(ctx.itemsizes)) for name in VARIANTS)
    sites = range(len(take_sites(graph)))
    per_row = unit_sites(graph, ctx.axis)
    return RowSchedule(
        "row", graph, replace(policy, threadgroup_bytes=tg, uses_simd=True, vector_width=vw),
        kernels[VARIANTS[0]], tuple(ctx.outer) + (ctx.axis,),
        tuple(t.name for t in ctx.inputs if ctx.axis in t.axes and vw > 1), index64,
        axis=ctx.axis, rows=ctx.outer, variants=kernels,
        reductions=reduce.phases(graph, online=False), passes=passes, itemsize=ctx.itemsize,
        # {variant: the gathers no section of it loads}: registers or shuffles serve them
        # (a gather of one value per row is a load in every variant)
        held_gathers={v: tuple(j for j in sites if j not in ctx.loaded_gathers[v]
                               and j not in per_row) for v in names})
