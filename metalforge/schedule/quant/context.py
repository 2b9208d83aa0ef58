"""What a quantized kernel's blocks read: the per-call context (`QuantContext`: the graph's
reduction, axes, packed and shared tensors, chunk sizes; fixed once the graph and launch policy
are) and the per-kernel state (`QuantState`: which kernel, its rows of x and simdgroups per
block, its `reduce.VariantParts`).

The one thing the kernels of a call add to as they are built is `Uses`: the axis sizes they
read (in order of first use: the shared parameter list) and the helper functions they call.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional

from ... import ir
from ...dtypes import DType
from ...errors import UnsupportedConstruct, at
from ...graph import Graph, Node, Op, ReduceOp, ScalarParam, TensorParam, topo_order
from ...shapes import size_multiple
from .. import reduce
from ..elementwise import input_stype, msl_names, output_stype, product, used_params
from ..lower import ident
from ..names import template_vars
from ..policy import MAX_QUANT_ROWS, LaunchPolicy, access_width


@dataclass
class Uses:
    """What the kernels of one call use, collected while they are built: axis sizes (in order
    of first use; the parameter list binds them in this order) and helper functions."""
    sizes: list[str]
    helpers: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class QuantContext:
    """The quantized sum of one graph under one launch policy: y[prefix..., n] = sum over
    `axis` (K) of the reduction's argument, with `rows_axis` (N, the output's innermost axis)
    in blocks of weight rows and `prefix` the other output axes (the last one: the rows of x)."""
    graph: Graph
    policy: LaunchPolicy
    index64: bool
    reds: tuple[Node, ...]                    # the sums over K, each unpacking words
    axis: str                                 # K
    outer: tuple[str, ...]                    # every output axis but K
    inputs: list[TensorParam]
    scalars: list[ScalarParam]
    tvars: dict[str, DType]
    names: dict[str, str]                     # parameter -> its name in MSL
    out_names: list[str]
    packed: dict[str, int]                    # {packed tensor: bits}
    bits: int
    words: int                                # words per lane per chunk
    shared: list[TensorParam]                 # tensors over K the block's rows share (x)
    vw: int                                   # elements per vector load of a shared tensor
    k_multiple: int                           # what K is a multiple of whatever the call
    uses: Uses
    # sums over K of the shared values alone (RMSNorm's sum of x * x beside the projection of
    # x: `xsums`), taken once per simdgroup from the chunk's registers
    xsums: tuple[Node, ...] = ()
    # Q where the epilogue's gathers read row i + Q or i - Q (RoPE's half): `pairing`
    period: Optional[Node] = None

    @property
    def red(self) -> Node:
        """The first sum (the only one in most kernels)."""
        return self.reds[0]

    @property
    def rows_axis(self) -> str:
        return self.outer[-1]

    @property
    def prefix(self) -> tuple[str, ...]:
        return self.outer[:-1]

    @property
    def per_word(self) -> int:
        return 32 // self.bits

    @property
    def chunk(self) -> int:
        """Values per lane per chunk."""
        return self.words * self.per_word

    @property
    def whole_k(self) -> bool:
        """K is a multiple of the chunk (its derived dims): every chunk is whole and aligned."""
        return self.k_multiple % self.chunk == 0

    @property
    def sizes_used(self) -> list[str]:
        return self.uses.sizes

    @property
    def x_rows(self) -> int:
        """Rows of x per simdgroup in qmvx: x_rows, fewer where rows_per_group x x_rows sums
        would pass MAX_QUANT_ROWS (registers)."""
        return max(1, min(self.policy.x_rows, MAX_QUANT_ROWS // self.policy.rows_per_group))

    def splits_of(self, variant: str) -> int:
        """Simdgroups per block of rows in kernel `variant`: k_splits in the _split kernels, and
        in qmv too where split_grid is 0 (every call splits)."""
        always = self.policy.split_grid == 0
        return self.policy.k_splits if variant.endswith("_split") or (
            variant in ("qmv", "qmv_paired") and always) else 1

    def size(self, axis: str) -> ir.Expr:
        if axis not in self.uses.sizes:
            self.uses.sizes.append(axis)
        return ir.Var(f"mf_size_{ident(axis)}")

    def span(self, axes: Iterable[str]) -> ir.Expr:
        return product(self.size, axes)

    def in_stype(self, t: TensorParam) -> str:
        return input_stype(t, self.tvars)

    def out_stype(self, k: int) -> str:
        return output_stype(self.graph, self.tvars, k)


@dataclass(frozen=True)
class QuantState:
    """One kernel being built: its variant record (`v.name`: qmv, qmv_split, qmvx, qmvx_split
    or qmm), its rows of x per simdgroup (`mb`) and simdgroups per block (`splits`)."""
    ctx: QuantContext
    v: reduce.VariantParts
    mb: int = 1
    splits: int = 1

    @property
    def name(self) -> str:
        return self.v.name


def _unpacks(n: Node) -> bool:
    return any(m.op == Op.UNPACK for m in topo_order([n.args[0]]))


def _the_sums(graph: Graph) -> tuple[tuple[Node, ...], tuple[Node, ...]]:
    """(the graph's sums of values unpacked from words (gate and up projections sharing their
    x), its sums over the same axis of values without the weight rows' axis (`xsums`: an
    RMSNorm's sum of x * x)); an error naming any other reduction."""
    reds = graph.reductions()
    first = next(r for r in reds if _unpacks(r))
    axis = first.attr[1]
    rows = max(graph.outputs, key=lambda o: len(o.axes)).axes[-1:]
    xsums = tuple(n for n in reds if n.attr[0] == ReduceOp.SUM and n.attr[1] == axis
                  and not _unpacks(n) and not set(rows) & set(n.args[0].axes)
                  and not any(m.op in (Op.REDUCE, Op.TAKE, Op.TAKE_VALUE, Op.RANDOM)
                              for m in topo_order([n.args[0]])))
    reds = [n for n in reds if n not in xsums]
    for n in reds:
        inner = next((m for m in topo_order([n.args[0]]) if m.op == Op.REDUCE), None)
        if inner is not None:
            raise UnsupportedConstruct(
                f"kernel '{graph.name}': mf.{inner.attr[0]}(...){at(inner.loc)} inside the "
                f"argument of a sum that unpacks words: scale the sum's result instead (a norm "
                f"of x: rsqrt(mean(x * x)) * sum(w * x), not sum(w * x * rsqrt(...)))")
        if n.attr[0] != ReduceOp.SUM or n.attr[1] != axis:
            raise UnsupportedConstruct(
                f"kernel '{graph.name}': mf.{n.attr[0]}(..., axis={n.attr[1]!r}){at(n.loc)}: a "
                f"kernel that unpacks words (mf.unpack) reduces them with mf.sum over one axis "
                f"('{axis}'); split other reductions into their own kernel")
        if not any(m.op == Op.UNPACK for m in topo_order([n.args[0]])):
            raise UnsupportedConstruct(
                f"kernel '{graph.name}': mf.sum(..., axis={axis!r}){at(n.loc)} sums no "
                f"unpacked words, beside a sum that does: a kernel that unpacks words may "
                f"have several sums only where each unpacks its own weights, or sums values "
                f"without the weight rows' axis (as an RMSNorm's mean of x * x)")
    return tuple(reds), xsums


def _packed_inputs(reds: tuple[Node, ...], rows_axis: str) -> dict[str, int]:
    """{tensor: bits} of the words unpacked in the reductions; each must be a tensor argument
    with one word row per output row."""
    out: dict[str, int] = {}
    for n in topo_order([r.args[0] for r in reds]):
        if n.op != Op.UNPACK:
            continue
        w = n.args[0]
        if w.op != Op.LOAD:
            raise UnsupportedConstruct(
                f"mf.unpack{at(n.loc)}: the quantized matvec schedule unpacks words read "
                "straight from a tensor argument; unpack the argument itself")
        if rows_axis not in w.axes:
            raise UnsupportedConstruct(
                f"mf.unpack{at(n.loc)}: the packed tensor '{w.attr}' must have the output's "
                f"innermost axis '{rows_axis}' (one row of words per output row)")
        out[w.attr] = n.attr
    return out


def context(graph: Graph, policy: LaunchPolicy, index64: bool) -> QuantContext:
    """The context of `graph`'s quantized sum, or an error naming what the family does not
    handle."""
    reds, xsums = _the_sums(graph)
    axis = reds[0].attr[1]
    widest = max(graph.outputs, key=lambda o: len(o.axes)).axes
    outer = tuple(a for a in widest if a != axis)
    nodes = list(graph.nodes())
    inputs, scalars = used_params(graph, nodes)
    reduce.check_axes(graph, axis, outer, widest, inputs, nodes, "row")
    tvars = template_vars(graph.dtype_vars)
    names, out_names = msl_names(graph)
    if not outer:
        raise UnsupportedConstruct(f"kernel '{graph.name}': the quantized matvec schedule "
                                   "needs an output axis besides the reduced one")
    packed = _packed_inputs(reds, outer[-1])
    bits = set(packed.values())
    if len(bits) != 1:
        raise UnsupportedConstruct(f"kernel '{graph.name}': unpacks words of different "
                                   f"widths ({sorted(bits)} bits) in one kernel")
    width = bits.pop()
    words = policy.vector_width
    chunk = words * (32 // width)
    cone = [n for n in topo_order([r.args[0] for r in reds + xsums]) if n.op == Op.LOAD]
    shared = [t for t in inputs if any(n.attr == t.name for n in cone)
              and t.name not in packed and outer[-1] not in t.axes
              and t.axes and t.axes[-1] == axis]
    vw = access_width(8, {t.dtype.itemsize for t in shared} or {4})
    while chunk % vw:
        vw //= 2
    return QuantContext(graph, policy, index64, reds, axis, outer, inputs, scalars, tvars, names,
                        out_names, packed, width, words, shared, vw,
                        size_multiple(graph.tensors, axis), Uses([axis, *outer]), xsums)
