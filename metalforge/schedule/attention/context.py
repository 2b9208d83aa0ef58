"""What an attention kernel is built from: the frozen `CallContext` (what is fixed for the whole
schedule: graph, form, policy, the tensors and their names, the sizes the kernels read, the
tiling of query rows), the frozen per-kernel `KernelState` (tile rows, lanes, elements a lane,
the staged values) that each kernel module builds fresh, and the small `Emitted` collector of
what a kernel declares while it is emitted (preamble positions, threadgroup arrays, helpers).

The functions here place an element: `at` (an axis' position in the kernel), `offset`, loads
and gathers, and `lowering`, the elementwise lowering that reads through them."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Optional, Sequence

from ... import ir
from ...dtypes import DType
from ...errors import UnsupportedConstruct
from ...errors import at as where_at
from ...graph import Graph, Node, Op, ScalarParam, TensorParam, topo_order
from ..base import IDX
from ..elementwise import input_stype, kernel_params, msl_names, output_stype, product, used_params
from ..hardware import SIMD_WIDTH
from ..lower import ElementLowering, compute_type, convert, ident
from ..names import template_vars
from ..policy import LaunchPolicy, access_width
from ..reduce import declare_position
from .lse import is_lse
from .match import Form
from .params import TILE_KEYS, VALUE_RUN

SIMD = ir.Lit(SIMD_WIDTH, "uint")
MACC = ir.Lane(ir.Var("mf_macc"), ir.Var("mf_j"))     # a merged accumulator at the lane's slot
THREADS = (ir.ThreadInput("mf_group", "uint", "threadgroup_position_in_grid"),
           ir.ThreadInput("mf_sg", "uint", "simdgroup_index_in_threadgroup"),
           ir.ThreadInput("mf_lane", "uint", "thread_index_in_simdgroup"))


@dataclass(frozen=True)
class CallContext:
    """What every kernel of one attention schedule shares (built once by `context`)."""
    graph: Graph
    form: Form
    policy: LaunchPolicy               # stage_kv resolved
    index64: bool
    rows: tuple[str, ...]              # the query-row axes (every output axis but E)
    tile_axes: tuple[str, ...]         # query-row axes sharing keys (R, S): tiled
    own_axes: tuple[str, ...]          # query-row axes the keys depend on (B, G)
    qt: int                            # query rows per tile of the decode kernels
    kv: Mapping[Node, str]             # the K/V reads and their registers / tiles (mf_kv<i>)
    vw: int                            # elements of a vector access of K/V
    kps: int                           # keys a lane's key stream takes at once
    run: int                           # stage_kv: consecutive E elements a lane holds
    scratch_e: int                     # E slots of a block's state in scratch
    inputs: tuple[TensorParam, ...]
    scalars: tuple[ScalarParam, ...]
    tvars: Mapping[str, DType]
    names: Mapping[str, str]
    out_names: tuple[str, ...]
    sizes_used: tuple[str, ...]
    params: tuple[ir.Argument, ...] = ()

    def tensor_of(self, n: Node) -> TensorParam:
        return self.graph.tensor(n.attr[0] if n.op == Op.TAKE else n.attr)

    def in_stype(self, t: TensorParam) -> str:
        return input_stype(t, self.tvars)

    def out_stype(self, k: int) -> str:
        return output_stype(self.graph, self.tvars, k)

    def size(self, axis: str) -> ir.Expr:
        return ir.Var(f"mf_size_{ident(axis)}")

    def span(self, axes: Sequence[str]) -> ir.Expr:
        return product(self.size, axes)

    def out_value(self, k: int, low: ElementLowering) -> ir.Expr:
        """Output k's value (lowered by `low`) converted to its storage type."""
        o = self.graph.outputs[k]
        return ir.Cast(self.out_stype(k), convert(low.value(o.node), o.node.dtype, o.dtype))


@dataclass
class Emitted:
    """What one kernel declares while it is emitted: positions computed once up front
    (`pre`, by name), its threadgroup arrays, the helper functions it calls."""
    pre: list[ir.Stmt] = field(default_factory=list)
    pre_names: set[str] = field(default_factory=set)
    tg_decls: list[ir.Stmt] = field(default_factory=list)
    helpers: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class KernelState:
    """The layout of one kernel (built by its module, never changed: a variant with another
    row is `replace(ks, row_of=...)`, sharing the collector `out`)."""
    out: Emitted
    qt: int                            # query rows per tile
    group: int                         # threads per group
    epl: int                           # E elements a lane holds
    over_e: bool = False               # stage_kv: slots spread over the value lanes ...
    vlanes: int = SIMD_WIDTH           # ... that many (32, narrow 16)
    kt_max: int = TILE_KEYS            # stage_kv: the kernel's largest tile of keys
    tiled: bool = True                 # positions of the tile's rows (not a flat row)
    # the tile's row as a run-time value (not an unrolled loop's): positions computed from it,
    # not read from the tile's arrays (indexing those by a run-time value would put them in
    # memory for the whole kernel)
    row_of: Optional[ir.Expr] = None
    # ... and read from the threadgroup table `head.row_positions` fills (one load, not the
    # division and remainder of `tile_position` per element)
    row_table: bool = False
    # ... or one of the lane's two rows (the register-resident prefill: `row_lanes` targets),
    # its positions in registers (`mf_rpos_<axis>0` / `1`, read from the table once), the
    # second where this holds (the element's row is in the upper 8 of its simdgroup's 16)
    row_pick: Optional[ir.Expr] = None
    staged: Mapping[Node, ir.Expr] = field(default_factory=dict)     # q in registers / tg
    staged_tg: Mapping[Node, str] = field(default_factory=dict)      # ... their tg arrays
    streamed: frozenset[Node] = frozenset()                          # what load_keys loads

    def with_row(self, row: Optional[ir.Expr], table: bool = False) -> "KernelState":
        return replace(self, row_of=row, row_table=table)


def context(graph: Graph, policy: LaunchPolicy, index64: bool, form: Form) -> CallContext:
    """The schedule's fixed facts, after the checks that the graph's outputs and reductions
    are those the attention schedule computes."""
    nodes = list(graph.nodes())
    widest = max(graph.outputs, key=lambda o: len(o.axes)).axes
    if form.e not in widest:
        raise UnsupportedConstruct(f"kernel '{graph.name}': the attention output must keep "
                                   f"'{form.e}'")
    rows = tuple(a for a in widest if a != form.e)
    for o in graph.outputs:
        if is_lse(form, o.node) and tuple(o.axes) == rows:     # the rows' logsumexp
            continue
        if tuple(a for a in o.axes if a != form.e) != rows or form.e not in o.axes:
            raise UnsupportedConstruct(
                f"kernel '{graph.name}': every output of an attention kernel is over the "
                f"query rows {list(rows)} and '{form.e}'")
    for r in graph.reductions():
        if r not in (form.out, form.max, form.denom, *form.contractions):
            raise UnsupportedConstruct(
                f"kernel '{graph.name}': mf.{r.attr[0]}(..., axis={r.attr[1]!r}){where_at(r.loc)}"
                " is a reduction the attention schedule does not fuse (it takes the score "
                "contractions, one softmax and the contraction with the values)")
    inputs, scalars = used_params(graph, nodes)
    names, out_names = msl_names(graph)
    sizes_used: list[str] = [form.key, form.e, *rows]
    for t in inputs:                    # gathered (N) and derived (L/BS) dims too
        sizes_used += [a for a in t.axes if a not in sizes_used]
    # rows that read the same keys share a threadgroup: the query-row axes no tensor
    # with keys along L has (GQA's R, the query positions S)
    roots = [o.node for o in graph.outputs]
    keyed = {a for n in topo_order(roots) if n.op in (Op.LOAD, Op.TAKE)
             and form.key in n.axes for a in n.axes}
    tile_axes = tuple(a for a in rows if a not in keyed)
    own_axes = tuple(a for a in rows if a in keyed)
    kv = _key_tensors(graph, form, tile_axes)
    itemsizes = {graph.tensor(n.attr[0] if n.op == Op.TAKE else n.attr).dtype.itemsize
                 for n in kv}
    if policy.stage_kv is None:              # the schedule's choice (policy.py)
        policy = replace(policy, stage_kv=(
            policy.threads_per_group == SIMD_WIDTH * policy.rows_per_group))
    epl = policy.reads_per_thread
    ctx = CallContext(
        graph=graph, form=form, policy=policy, index64=index64, rows=rows,
        tile_axes=tile_axes, own_axes=own_axes,
        qt=policy.rows_per_group if tile_axes else 1, kv=kv,
        vw=access_width(epl, itemsizes or {4}), kps=policy.keys_per_step,
        run=min(VALUE_RUN, epl), scratch_e=SIMD_WIDTH * epl, inputs=tuple(inputs),
        scalars=tuple(scalars), tvars=template_vars(graph.dtype_vars), names=names,
        out_names=tuple(out_names), sizes_used=tuple(sizes_used))
    base = kernel_params(ParamView(graph, inputs, names, out_names, scalars, sizes_used,
                                      index64, ctx.in_stype, ctx.out_stype),
                          proven=frozenset())        # attention checks every gather
    extra = [ir.Argument("mf_scratch", len(base), "buffer", "float", ("scratch",), True),
             ir.Argument("mf_splits", len(base) + 1, "scalar", "uint",
                         ("launch", "key_splits"), cast="int32"),
             ir.Argument("mf_w", len(base) + 2, "scalar", "uint",
                         ("launch", "lanes_per_key"), cast="int32")]
    if policy.stage_kv:
        extra.append(ir.Argument("mf_kt", len(base) + 3, "scalar", "uint",
                                 ("launch", "keys_per_tile"), cast="int32"))
    return replace(ctx, params=base + tuple(extra))


@dataclass
class ParamView:
    """The builder-shaped view of the context that `kernel_params` reads."""
    graph: Graph
    inputs: list[TensorParam]
    names: dict[str, str]
    out_names: list[str]
    scalars: list[ScalarParam]
    sizes_used: list[str]
    index64: bool
    in_stype: Callable[[TensorParam], str]
    out_stype: Callable[[int], str]


def _key_tensors(graph: Graph, form: Form, tile_axes: tuple[str, ...]) -> dict[Node, str]:
    """Reads along the keys and E (k, v; loads or gathers through a block table) that no
    tile axis changes: each key's E elements are loaded once per lane into registers
    (`mf_kv<i>`) and shared by the tile's query rows."""
    f = form
    roots = [r.args[0] for r in f.contractions] + [f.values]
    out: dict[Node, str] = {}
    for n in topo_order(roots):
        if n.op == Op.LOAD or (n.op == Op.TAKE and n.attr[1] != f.e):
            axes = n.axes if n.op == Op.TAKE else graph.tensor(n.attr).axes
            if f.key in axes and f.e in axes and not set(axes) & set(tile_axes):
                out[n] = f"mf_kv{len(out)}"
    return out


def position_in(ctx: CallContext, ks: KernelState, flat: str, axes: Sequence[str], axis: str,
                name: str) -> ir.Var:
    """`axis`'s position in `flat` (`reduce.declare_position`), in the kernel's preamble."""
    return declare_position(flat, axes, axis, name, ks.out, ctx.size, ctx.span)


def flat_position(ctx: CallContext, ks: KernelState, axis: str, axes: tuple[str, ...],
                  var: str) -> ir.Expr:
    """`axis`'s position in the flat index `var` over `axes` (declared once, up front)."""
    return position_in(ctx, ks, var, axes, axis, f"mf_pos_{ident(axis)}")


def at(ctx: CallContext, ks: KernelState, axis: str) -> ir.Expr:
    if axis == ctx.form.key:
        return ir.Var("mf_l")
    if axis == ctx.form.e:
        return ir.Cast(IDX, ir.Var("mf_e"))
    if axis in ctx.tile_axes and ks.tiled:
        if ks.row_of is not None:        # row mf_t picked at run time: computed
            if ks.row_pick is not None:
                return ir.Select(ks.row_pick, ir.Var(f"mf_rpos_{ident(axis)}1"),
                                 ir.Var(f"mf_rpos_{ident(axis)}0"))
            if ks.row_table:
                return ir.Lane(ir.Var(f"mf_tg_tpos_{ident(axis)}"), ks.row_of)
            return tile_position(ctx, ks, axis, ks.row_of)
        return ir.Lane(ir.Var(f"mf_tpos_{ident(axis)}"), ir.Var("mf_t"))
    if axis in ctx.own_axes and ks.tiled:
        return flat_position(ctx, ks, axis, ctx.own_axes, "mf_own")
    if axis in ctx.rows:
        return flat_position(ctx, ks, axis, ctx.rows, "mf_row")
    spec = ctx.graph.axis_spec(axis)
    if spec.base == ctx.form.key and spec.mul == 1 and spec.add == 0:
        return ir.Var("mf_l") / ir.Lit(spec.div, IDX)      # L/BS: key l reads l / BS
    raise UnsupportedConstruct(f"kernel '{ctx.graph.name}': axis '{axis}' is neither a "
                               f"query-row axis, '{ctx.form.key}' nor '{ctx.form.e}'")


def tile_position(ctx: CallContext, ks: KernelState, axis: str, t: ir.Expr) -> ir.Expr:
    """Row t of the tile's position along tile axis `axis` (as `tile` computes it)."""
    r = ir.Cast(IDX, ir.Var("mf_tile") * ir.Lit(ks.qt, "uint") + t)
    k = ctx.tile_axes.index(axis)
    inner = ctx.tile_axes[k + 1:]
    e = r / ctx.span(inner) if inner else r
    return e % ctx.size(axis) if k > 0 else e


def offset(ctx: CallContext, ks: KernelState, axes: Sequence[str], moved: Mapping[str,
           ir.Expr] = {}) -> ir.Expr:
    """The element's index in a tensor over `axes` (at the positions in `moved` along
    those axes: a gather's row)."""
    e: ir.Expr = ir.Lit(0, IDX)
    for i, a in enumerate(axes):
        p = moved[a] if a in moved else at(ctx, ks, a)
        e = p if i == 0 else e * ctx.size(a) + p
    return e


def load(ctx: CallContext, ks: KernelState, n: Node) -> ir.Expr:
    t = ctx.graph.tensor(n.attr)
    return ir.Cast(compute_type(t.dtype), ir.Load(ctx.names[t.name], offset(ctx, ks, t.axes)))


def take(ctx: CallContext, ks: KernelState, n: Node, pos: ir.Expr) -> ir.Expr:
    """A gather (the index already checked): the tensor's element at `pos` along the
    gathered axis, at this element's positions along the others."""
    t = ctx.tensor_of(n)
    return ir.Cast(compute_type(t.dtype), ir.Load(ctx.names[t.name], offset(ctx, ks,
        t.axes, {n.attr[1]: pos})))


def lowering(ctx: CallContext, ks: KernelState, prefix: str) -> ElementLowering:
    return ElementLowering(ctx.graph, lambda n: load(ctx, ks, n), lambda a: at(ctx, ks, a),
                           ctx.size, lambda s: ctx.names[s], prefix=prefix,
                           take=lambda n, pos: take(ctx, ks, n, pos), proven=frozenset())
