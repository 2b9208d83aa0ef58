"""The row kernels, one function per variant (`KERNELS`: simd, simd_exact, group, staged,
looped), each building its kernel from a fresh `VariantParts`, and `build`, which builds them
all into a `RowSchedule`."""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from ... import ir
from ...graph import Graph, take_sites
from .. import reduce
from ..base import make_kernel
from ..policy import LaunchPolicy
from ..unit_gather import unit_sites
from . import split
from .context import RowContext, RowKernel, row_context, row_kernel
from .phases import epilogue, section
from .place import group_header, header, parts
from .plan import SLICES, SPLIT, VARIANTS, RowSchedule, vector_width_for
from .split import SCRATCH, one_pass

Built = tuple[ir.LoweredKernel, reduce.VariantParts]
__all__ = ["KERNELS", "build", "group_header"]     # group_header: the scan kernels' too


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
    "simd": simd, "simd_exact": simd_exact, "group": group, "staged": staged, "looped": looped,
    "split": split.pass_kernel(0), "split_2": split.pass_kernel(1),
    "split_3": split.pass_kernel(2), "finish": split.finish}


def kernel(k: RowKernel) -> Built:
    """The kernel of one variant: a section per phase, the epilogue, the header placing the
    thread."""
    ctx, v = k.ctx, k.parts
    graph = ctx.graph
    looped = v.name == "looped"
    if k.vw == 8:
        ctx.helpers.add("mf_pack8_of")
    # the looped variant adds thousands of elements per thread: compensated sums
    reds = reduce.phases(graph, online=looped, compensated=looped,
                         centered=looped and ctx.policy.centered is True)
    ctx.helpers.update(reduce.helpers_of(reds, simd=True)
                       - {"mf_online_merge", "mf_centered_merge"})          # split rows' merges
    early = () if looped else ctx.early
    for p in range(1 + max(r.phase for r in reds)):
        rs = [r for r in reds if r.phase == p]
        roots = [r.arg for r in rs if r.rides is None]
        desc = ", ".join(d for d in map(describe, rs) if d)
        outs = list(early) if p == 0 else []
        if outs:
            roots += [graph.outputs[j].node for j in outs]
            desc += f"; store {', '.join(ctx.out_names[j] for j in outs)}"
        section(k, roots, rs, outs, f"phase {p + 1}: {desc}")
    epilogue(k, early)
    threads, head = header(k)
    body = list(v.tg_arrays) + head + v.pre + v.main
    return make_kernel(graph, ctx.index64, threads, body, summary(k, reds), v.name), v


# -- text ---------------------------------------------------------------------------------------

def describe(r: reduce.Reduction) -> str:
    """A reduction in a phase's title."""
    if r.online_sum is not None:
        return f"{r.kind} and (online) sum of exp(x - max)"
    if r.squares is not None:
        return f"{r.kind} over {r.axis} and (centered) its squares around a value of it"
    if r.squares_of is not None:
        return ""
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
    stages something; the split and finish kernels where fill_groups asks for them and the
    graph allows them, `split.passes`), one parameter list and helper set."""
    ctx = row_context(graph, policy, index64)
    names = tuple(v for v in VARIANTS if v != "staged" or ctx.stage_plan)
    sliced = split.passes(ctx) if policy.fill_groups else ()
    if sliced:
        ctx.loaded_gathers.update({v: set() for v in SPLIT})
        names += sliced
    kernels, passes, tg = reduce.build_variants(ctx, names, lambda name: KERNELS[name](ctx))
    if sliced:
        kernels = with_scratch(kernels)
        done = [passes.pop(v) for v in sliced]    # the split variant's count: every launch
        passes["split"] = {t: sum(d.get(t, 0) for d in done) for d in done for t in d}
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
                               and j not in per_row) for v in names},
        slots=sum(n for _, n in split.layout(one_pass(ctx)).values()) if sliced else 0)


def with_scratch(kernels: dict[str, ir.LoweredKernel]) -> dict[str, ir.LoweredKernel]:
    """Every kernel of the library with the split kernels' two parameters after the others:
    the scratch buffer and the slices per row (a launch value)."""
    params = kernels[VARIANTS[0]].params
    extra = (ir.Argument(SCRATCH, len(params), "buffer", "float", ("scratch",), True),
             ir.Argument("mf_slices", len(params) + 1, "scalar", "uint", ("launch", SLICES),
                         cast="int32"))
    return {n: replace(k, params=params + extra) for n, k in kernels.items()}
