"""The quantized family's schedule from a graph: which kernels it has (by the launch policy and
the graph's form), each built from a fresh `QuantState`, sharing one parameter list and helper
set."""
from __future__ import annotations

from dataclasses import replace
from typing import Optional, cast

from ... import ir
from ...errors import LaunchError
from ...graph import Graph, Node
from .. import reduce
from ..elementwise import ParamSource, kernel_params
from ..hardware import MAX_THREADGROUP_BYTES
from ..lower import ElementLowering
from ..policy import LaunchPolicy
from . import gathers, matvec, pairing, prologue, staged, tiled
from .blocked import plan_of
from .context import QuantContext, QuantState, context
from .form import factors
from .params import THREADS, TILE_K, TILE_M, TILE_N, TILED, WIDE
from .positions import outer_load, row_position
from .schedule import QuantSchedule
from .teams import kernel as block_kernel

BUILDERS = {"qmm": tiled.kernel, "qmv_staged": staged.kernel}     # the rest: matvec.kernel


def qmm(st: QuantState) -> ir.LoweredKernel:
    """A tiled kernel: on the matrix block where x is half or bfloat (`blocked`; qmm_wide
    with its own tile and teams), else the fp32 kernel (`tiled`)."""
    pl = plan_of(st.ctx, st.name == WIDE)
    return tiled.kernel(st) if pl is None else block_kernel(st, pl)


def qmm_geometry(ctx: QuantContext, name: str) -> tuple[int, int, int, int]:
    """Tiled kernel `name`'s rows of x, weight rows and values of K a step, and its
    threads."""
    pl = plan_of(ctx, name == WIDE)
    if pl is None:
        return TILE_M, TILE_N, TILE_K, THREADS
    return pl.tile.bm, pl.tile.bn, pl.tile.bk * pl.teams, pl.threads


def tiled_names(ctx: QuantContext) -> tuple[str, ...]:
    """The tiled kernels where the graph is a product W * X: qmm, and qmm_wide beside it
    where qmm_wide_rows asks for it and x is half or bfloat (the matrix block's; the fp32
    kernel has one tile)."""
    if factors(ctx) is None:
        return ()
    wide = ctx.policy.qmm_wide_rows > 0 and plan_of(ctx) is not None
    return TILED if wide else ("qmm",)


def kernel_names(ctx: QuantContext) -> tuple[str, ...]:
    """The kernels of the schedule: qmv; qmv_split beside it where K is split by size; qmvx
    (and qmvx_split) where rows of x can be blocked; qmm where the graph is a product W * X;
    (and qmm_wide: `tiled_names`) where the graph is a product W * X; qmv_staged alone where
    the epilogue gathers the kernel's results (`gathers`)."""
    if gathers.value_gathers(ctx.graph):          # the epilogue gathers the kernel's sums
        gathers.check(ctx)
        if ctx.period is None:
            return ("qmv_staged",)
        beside = ctx.policy.k_splits > 1 and ctx.policy.split_grid > 0
        return ("qmv_paired",) + (("qmv_paired_split",) if beside else ()) + ("qmv_staged",)
    if ctx.xsums:                   # sums of x alone: one row of x a simdgroup
        beside = ctx.policy.k_splits > 1 and ctx.policy.split_grid > 0
        return ("qmv",) + (("qmv_split",) if beside else ())
    if ctx.policy.stage_prologue and prologue.wanted(ctx):    # x once per group, staged
        return ("qmv_prologue",)
    policy = ctx.policy
    split = policy.k_splits > 1
    blocked = _x_rows_axis(ctx) and ctx.x_rows > 1 and (not split or policy.split_grid > 0)
    beside = split and policy.split_grid > 0            # the _split kernels, by size
    return ("qmv",) + (("qmv_split",) if beside else ()) \
        + (("qmvx",) + (("qmvx_split",) if beside else ()) if blocked else ()) \
        + tiled_names(ctx)


def _x_rows_axis(ctx: QuantContext) -> bool:
    """Whether the innermost other output axis is x's rows, which qmvx blocks (each unpacked
    value used for x_rows of them): an axis of x (a shared tensor), not of the weights (in
    [M, H, E] = x[M, K] times weights [H, E, K] it is the heads, whose rows differ)."""
    if not ctx.prefix or not ctx.shared:
        return False
    m = ctx.prefix[-1]
    return not any(m in t.axes for t in ctx.inputs if t.name in ctx.packed)


def state(ctx: QuantContext, name: str) -> QuantState:
    """A fresh state for kernel `name`: its rows of x, simdgroups per block and variant record
    (whose row values read the kernel's positions)."""
    mb = ctx.x_rows if name.startswith("qmvx") else 1
    splits = 1 if name in TILED else ctx.splits_of(name)

    def position(axis: str) -> ir.Expr:
        return row_position(st, axis)

    def load(n: Node) -> ir.Expr:
        return outer_load(st, n)

    rows = ElementLowering(ctx.graph, load, position, ctx.size, lambda s: ctx.names[s],
                           prefix="mf_r")
    st = QuantState(ctx, reduce.VariantParts(name, rows), mb, splits)
    return st


def kernels(ctx: QuantContext, names: tuple[str, ...]) -> tuple[dict[str, ir.LoweredKernel], int]:
    """({name: kernel}, the most threadgroup bytes any needs): every kernel with the one
    parameter list and helper set they share."""
    built: dict[str, ir.LoweredKernel] = {}
    tg = 0
    for name in names:
        st = state(ctx, name)
        built[name] = (qmm if name in TILED else BUILDERS.get(name, matvec.kernel))(st)
        ctx.uses.helpers.update(st.v.row_values.helpers)       # per-row values' helpers too
        tg = max(tg, st.v.tg_bytes)
    if tg > MAX_THREADGROUP_BYTES:
        raise LaunchError(f"kernel '{ctx.graph.name}': its reductions need {tg} bytes of "
                          f"threadgroup memory, over the {MAX_THREADGROUP_BYTES}-byte limit")
    # kernel_params only reads the context; ParamSource declares its members as settable
    # variables, which a frozen dataclass's fields are not (to mypy)
    params = kernel_params(cast(ParamSource, ctx))
    helpers = tuple(sorted(ctx.uses.helpers))
    return {n: replace(k, params=params, helpers=helpers) for n, k in built.items()}, tg


def build(graph: Graph, policy: LaunchPolicy, index64: bool,
          form: Optional[Node] = None) -> QuantSchedule:
    """The quantized schedule of `graph` (`form`: its quantized sum, as `form.match` found it;
    the checks of `context` hold for any)."""
    if gathers.value_gathers(graph) and policy.paired_rows:
        policy = replace(policy, rows_per_group=policy.paired_rows)
    ctx = context(graph, policy, index64)
    if gathers.value_gathers(graph):
        ctx = replace(ctx, period=pairing.period(ctx))
    names = kernel_names(ctx)
    built, tg = kernels(ctx, names)
    tiled_ = "qmm" in built
    blocked = "qmvx" in built
    out = replace(policy, uses_simd=True, vector_width=ctx.words, threadgroup_bytes=tg)
    return QuantSchedule("quant", graph, out, built[names[0]], (*ctx.outer, ctx.axis),
                         tuple(ctx.packed) + tuple(t.name for t in ctx.shared), index64,
                         axis=ctx.axis, rows_axis=ctx.rows_axis, outer=ctx.outer,
                         chunk=ctx.chunk, variants=built,
                         m_axis=ctx.prefix[-1] if tiled_ or blocked else None,
                         x_rows=ctx.x_rows,
                         splits={n: ctx.splits_of(n) for n in names if n not in TILED},
                         period=ctx.period,
                         tiles={n: qmm_geometry(ctx, n) for n in names if n in TILED})
