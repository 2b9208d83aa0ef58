"""The attention backward's shared pieces (`Ctx`: what its kernels read; positions, loads,
the per-pair work `pair`) and its simd kernels, for E above the matrix kernels' (`matrix`):
a simdgroup per row, NSG rows a threadgroup.

    dq    a simdgroup per query row: its q and dO in registers (lane mf_lane holds E
          elements mf_lane, mf_lane + 32, ...), its lse and delta; per key: P, dP and dc
          (`pair`: the score's elementwise work and its derivative), dq += dc k.
    dkdv  a simdgroup per key (of each kv head): its k and v in registers; over every
          query row reading it (the tile axes: GQA's R, the positions S), in order: P, dP,
          dc from the row's lse and delta, dv += P dO, dk += dc q.

Each (row, key) pair's two contractions over E (q k and dO v) are `dots`: a lane's part
of each, then `simd_sum`. Deterministic: every sum in a fixed order, no atomics.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from ... import ir
from ...dtypes import F32
from ...graph import Graph, Node, Op, ScalarParam, TensorParam
from ..attention.context import ParamView
from ..base import IDX, make_kernel
from ..elementwise import input_stype, kernel_params, msl_names, output_stype
from ..hardware import SIMD_WIDTH
from ..lower import ElementLowering, as_float, compute_type, convert, ident
from ..names import template_vars
from .roles import Roles

EPL = 8                          # E elements a lane holds: E <= 256
NSG = 4                          # simdgroups (rows) per threadgroup
MAX_E = SIMD_WIDTH * EPL
THREADS = (ir.ThreadInput("mf_group", "uint", "threadgroup_position_in_grid"),
           ir.ThreadInput("mf_sg", "uint", "simdgroup_index_in_threadgroup"),
           ir.ThreadInput("mf_lane", "uint", "thread_index_in_simdgroup"))
F0 = ir.Lit(0.0, "float")


@dataclass(frozen=True)
class Ctx:
    graph: Graph
    roles: Roles
    index64: bool
    names: Mapping[str, str]
    out_names: tuple[str, ...]
    inputs: tuple[TensorParam, ...]
    scalars: tuple[ScalarParam, ...]
    sizes_used: tuple[str, ...]

    def size(self, axis: str) -> ir.Expr:
        return ir.Var(f"mf_size_{ident(axis)}")

    def span(self, axes: Sequence[str]) -> ir.Expr:
        e: ir.Expr = ir.Lit(1, IDX)
        for i, a in enumerate(axes):
            e = self.size(a) if i == 0 else e * self.size(a)
        return e

    def in_stype(self, t: TensorParam) -> str:
        return input_stype(t, template_vars(self.graph.dtype_vars))

    def out_stype(self, k: int) -> str:
        return output_stype(self.graph, template_vars(self.graph.dtype_vars), k)

    @property
    def params(self) -> tuple[ir.Argument, ...]:
        return kernel_params(ParamView(self.graph, list(self.inputs), dict(self.names),
                                     list(self.out_names), list(self.scalars),
                                     list(self.sizes_used), self.index64, self.in_stype,
                                     self.out_stype), proven=frozenset())




def context(graph: Graph, roles: Roles, index64: bool) -> Ctx:
    names, out_names = msl_names(graph)
    used = {n.attr for n in graph.nodes() if n.op == Op.LOAD}
    inputs = tuple(t for t in graph.tensors if t.name in used)
    scal = {n.attr for n in graph.nodes() if n.op == Op.SCALAR}
    sizes = [roles.key, roles.e, *roles.rows]
    for t in inputs:
        sizes += [a for a in t.axes if a not in sizes]
    return Ctx(graph, roles, index64, names, tuple(out_names), inputs,
               tuple(s for s in graph.scalars if s.name in scal), tuple(sizes))


# --------------------------------------------------------------------------- pieces

def positions(ctx: Ctx, flat: ir.Expr, axes: Sequence[str]) -> list[ir.Stmt]:
    """mf_pos_<axis> of each of `axes` in the row-major index `flat` over them."""
    out: list[ir.Stmt] = []
    for k, a in enumerate(axes):
        e: ir.Expr = flat
        if axes[k + 1:]:
            e = e / ctx.span(axes[k + 1:])
        if k > 0:
            e = e % ctx.size(a)
        out.append(ir.Decl(f"mf_pos_{ident(a)}", IDX, e))
    return out


def at(ctx: Ctx, axis: str) -> ir.Expr:
    if axis == ctx.roles.e:
        return ir.Cast(IDX, ir.Var("mf_e"))
    if axis == ctx.roles.key:
        return ir.Var("mf_l")
    return ir.Var(f"mf_pos_{ident(axis)}")


def offset(ctx: Ctx, axes: Sequence[str]) -> ir.Expr:
    e: ir.Expr = ir.Lit(0, IDX)
    for i, a in enumerate(axes):
        e = at(ctx, a) if i == 0 else e * ctx.size(a) + at(ctx, a)
    return e


def load(ctx: Ctx, n: Node) -> ir.Expr:
    t = ctx.graph.tensor(n.attr)
    return ir.Cast(compute_type(t.dtype), ir.Load(ctx.names[t.name], offset(ctx, t.axes)))


def as_f32(ctx: Ctx, n: Node) -> ir.Expr:
    """Load n (a tensor read) as a float."""
    t = ctx.graph.tensor(n.attr)
    return convert(load(ctx, n), t.dtype, F32)


def lowering(ctx: Ctx, prefix: str) -> ElementLowering:
    return ElementLowering(ctx.graph, lambda n: load(ctx, n), lambda a: at(ctx, a),
                           ctx.size, lambda s: ctx.names[s], prefix=prefix,
                           proven=frozenset())


def slots(ctx: Ctx, body: Sequence[ir.Stmt], guard: bool = True) -> ir.Stmt:
    """`body` for each of the lane's E elements mf_e = j * 32 + lane (inside E)."""
    inner: list[ir.Stmt] = [ir.If(ir.Cast(IDX, ir.Var("mf_e")) < ctx.size(ctx.roles.e),
                                  list(body))] if guard else list(body)
    return ir.For("mf_j", "uint", ir.Lit(0, "uint"), ir.Lit(EPL, "uint"), [
        ir.Decl("mf_e", "uint", ir.Var("mf_j") * ir.Lit(SIMD_WIDTH, "uint")
                + ir.Var("mf_lane")), *inner], unroll=True)


def reg(name: str) -> ir.Expr:
    return ir.Lane(ir.Var(name), ir.Var("mf_j"))


def registers(ctx: Ctx, what: Mapping[str, Node]) -> list[ir.Stmt]:
    """Arrays `name`[EPL] holding the lane's E elements of each read (0 past E)."""
    out: list[ir.Stmt] = [ir.ArrayDecl(name, "float", EPL) for name in what]
    out.append(zeros(list(what)))
    out.append(slots(ctx, [ir.Assign(reg(name), as_f32(ctx, n)) for name, n in what.items()]))
    return out


def zeros(names: Sequence[str]) -> ir.Stmt:
    return ir.For("mf_j", "uint", ir.Lit(0, "uint"), ir.Lit(EPL, "uint"),
                  [ir.Assign(reg(n), F0) for n in names], unroll=True)


def dots(ctx: Ctx) -> list[ir.Stmt]:
    """mf_c = sum_E q k and mf_dp = sum_E dO v of the pair (mf_q, mf_k, mf_do, mf_v in
    registers): each lane's part, then summed over the simdgroup."""
    c, dp = ir.Var("mf_c"), ir.Var("mf_dp")
    return [
        ir.Decl("mf_c", "float", F0, const=False), ir.Decl("mf_dp", "float", F0, const=False),
        ir.For("mf_j", "uint", ir.Lit(0, "uint"), ir.Lit(EPL, "uint"), [
            ir.Assign(c, c + reg("mf_q") * reg("mf_k")),
            ir.Assign(dp, dp + reg("mf_do") * reg("mf_v"))], unroll=True),
        ir.Assign(c, ir.Call("simd_sum", (c,))), ir.Assign(dp, ir.Call("simd_sum", (dp,)))]


def preset(low: ElementLowering, n: Node, value: ir.Expr) -> None:
    low.values[n] = value if compute_type(n.dtype) == "float" else ir.Cast(
        compute_type(n.dtype), value)


def pair(ctx: Ctx, prefix: str, known: Mapping[Node, ir.Expr], roots: Sequence[Node],
         helpers: set[str]) -> tuple[list[ir.Stmt], list[ir.Expr]]:
    """The statements computing `roots` of the pair (the score's work, P, dc) from the
    dots and `known` values, and each root's value as a float."""
    r = ctx.roles
    low = lowering(ctx, prefix)
    preset(low, r.c, ir.Var("mf_c"))
    preset(low, r.dp, ir.Var("mf_dp"))
    for n, v in known.items():
        preset(low, n, v)
    body = low.lower(list(roots))
    helpers |= low.helpers | {"mf_maximum"}
    return body, [as_float(low.value(n), n) for n in roots]


def kernel_of(ctx: Ctx, body: list[ir.Stmt], variant: str, summary: str,
              helpers: set[str], threads: int = NSG * SIMD_WIDTH) -> ir.LoweredKernel:
    return make_kernel(ctx.graph, ctx.index64, THREADS, body, summary, variant,
                       params=ctx.params, helpers=tuple(sorted(helpers)),
                       max_threads=threads)


def simdgroup_row(ctx: Ctx, axes: Sequence[str]) -> list[ir.Stmt]:
    """The simdgroup's row of the grid over `axes` (whole simdgroups leave past the end)."""
    row = ir.Var("mf_group") * ir.Lit(NSG, "uint") + ir.Var("mf_sg")
    return [ir.Decl("mf_row", IDX, ir.Cast(IDX, row)),
            ir.If(ir.Var("mf_row") >= ctx.span(axes), [ir.Return()])]


def store(ctx: Ctx, kind: str, value: ir.Expr) -> list[ir.Stmt]:
    """Output `kind` (if the graph has it) at the element's position, as its storage type."""
    if kind not in ctx.roles.outputs:
        return []
    k = ctx.roles.outputs.index(kind)
    o = ctx.graph.outputs[k]
    return [ir.Store(ctx.out_names[k], offset(ctx, o.axes),
                     ir.Cast(ctx.out_stype(k), convert(value, F32, o.dtype)))]


def each(var: str, stop: ir.Expr, body: list[ir.Stmt]) -> ir.For:
    return ir.For(var, IDX, ir.Lit(0, IDX), stop, body)


def row_stats(ctx: Ctx) -> list[ir.Stmt]:
    """mf_lse and mf_delta: the row's values from the earlier kernels' buffers."""
    r = ctx.roles
    return [ir.Decl("mf_lse", "float", load(ctx, r.lse)),
            ir.Decl("mf_delta", "float", load(ctx, r.delta))]


STATS = {"lse": ir.Var("mf_lse"), "delta": ir.Var("mf_delta")}


def dq_kernel(ctx: Ctx) -> ir.LoweredKernel:
    r = ctx.roles
    helpers: set[str] = set()
    g_body, (dc,) = pair(ctx, "mf_g", {r.lse: STATS["lse"], r.delta: STATS["delta"]},
                         [r.dc], helpers)
    body: list[ir.Stmt] = [
        ir.Comment("the simdgroup's query row: its q and dO in registers, its lse and delta"),
        *simdgroup_row(ctx, r.rows), *positions(ctx, ir.Var("mf_row"), r.rows),
        *registers(ctx, {"mf_q": r.q, "mf_do": r.dy}), *row_stats(ctx),
        ir.Comment("per key: P = exp(s - lse), dc = f'(c) P (dP - delta); dq += dc k"),
        ir.ArrayDecl("mf_dq", "float", EPL),
        zeros(["mf_dq"]),
        each("mf_l", ctx.size(r.key), [
            *registers(ctx, {"mf_k": r.k, "mf_v": r.v}), *dots(ctx), *g_body,
            ir.Decl("mf_dc", "float", dc),
            slots(ctx, [ir.Assign(reg("mf_dq"), reg("mf_dq") + ir.Var("mf_dc")
                                  * reg("mf_k"))], guard=False)]),
        ir.Comment("the row's dq"),
        slots(ctx, store(ctx, "dq", reg("mf_dq")))]
    summary = (f"{ctx.graph.name} (attention backward, dq): a simdgroup per query row; "
               "dq = sum_L dc k")
    return kernel_of(ctx, body, "dq", summary, helpers)


def dkdv_kernel(ctx: Ctx) -> ir.LoweredKernel:
    r = ctx.roles
    helpers: set[str] = set()
    g_body, (p, dc) = pair(ctx, "mf_g", {r.lse: STATS["lse"], r.delta: STATS["delta"]},
                           [r.p, r.dc], helpers)
    keys = (*r.own, r.key)
    acc = [ir.Assign(reg("mf_dv"), reg("mf_dv") + ir.Var("mf_p") * reg("mf_do")),
           ir.Assign(reg("mf_dk"), reg("mf_dk") + ir.Var("mf_dc") * reg("mf_q"))]
    body: list[ir.Stmt] = [
        ir.Comment("the simdgroup's key (of its kv head); its k and v in registers"),
        *simdgroup_row(ctx, keys), *positions(ctx, ir.Var("mf_row"), keys),
        ir.Decl("mf_l", IDX, ir.Var(f"mf_pos_{ident(r.key)}")),
        *registers(ctx, {"mf_k": r.k, "mf_v": r.v}),
        ir.ArrayDecl("mf_dk", "float", EPL), ir.ArrayDecl("mf_dv", "float", EPL),
        zeros(["mf_dk", "mf_dv"]),
        ir.Comment("every query row reading the key, in order (GQA: the kv head's query "
                   "heads too): P, dc from the row's lse and delta; dv += P dO, dk += dc q"),
        each("mf_tr", ctx.span(r.tile), [
            *positions(ctx, ir.Var("mf_tr"), r.tile),
            *registers(ctx, {"mf_q": r.q, "mf_do": r.dy}), *row_stats(ctx), *dots(ctx),
            *g_body,
            ir.Decl("mf_p", "float", p), ir.Decl("mf_dc", "float", dc),
            slots(ctx, acc, guard=False)]),
        ir.Comment("the key's dk and dv"),
        slots(ctx, store(ctx, "dk", reg("mf_dk")) + store(ctx, "dv", reg("mf_dv")))]
    summary = (f"{ctx.graph.name} (attention backward, dk dv): a simdgroup per key; "
               "dk = sum dc q, dv = sum P dO over the query rows reading it")
    return kernel_of(ctx, body, "dkdv", summary, helpers)
