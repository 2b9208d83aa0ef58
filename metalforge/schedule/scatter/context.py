"""What every scatter kernel shares: names, sizes, positions, the values' lowering, the
output's offset, the index check and the one parameter list.

The kernels of a scatter schedule are compiled as one library and bound by one argument plan,
so they share `params`: the tensors the values and index read, the output, the scalars, the
f32 accumulator (f16/bf16 outputs), the sorted index (deterministic mode), the error report,
the output's element count, the source elements' count and the axis sizes any kernel reads.
"""
from __future__ import annotations

from functools import partial
from typing import Callable

from ... import ir
from ...dtypes import DType
from ...graph import Graph, Node, TensorParam, take_sites, topo_order
from ..base import IDX
from ..elementwise import (
    add_param,
    add_scalars,
    index_cast,
    input_stype,
    msl_names,
    output_stype,
    used_params,
    with_sizes,
)
from ..lower import ElementLowering, compute_type, ident
from ..names import template_vars
from .form import ScatterForm

Position = Callable[[str], ir.Expr]


class ScatterContext:
    """One scatter schedule's kernels being built: what the graph fixes, and the sizes and
    helpers the bodies use (collected while they are built, read by `params`)."""

    def __init__(self, graph: Graph, form: ScatterForm, index64: bool):
        self.graph, self.form, self.index64 = graph, form, index64
        self.names, out_names = msl_names(graph)
        self.out = out_names[0]
        # deterministic mode reads the index through its sorted keys and order only
        read = [form.values] if form.deterministic else [form.values, form.index]
        self.inputs, self.scalars = used_params(graph, topo_order(read))
        self.sizes_used: list[str] = []
        self.helpers: set[str] = set()
        self.site = len(take_sites(graph))          # the scatter's number in error reports

    # -- names and types --------------------------------------------------------------
    def size(self, axis: str) -> ir.Expr:
        if axis not in self.sizes_used:
            self.sizes_used.append(axis)
        return ir.Var(f"mf_size_{ident(axis)}")

    def in_stype(self, t: TensorParam) -> str:
        return input_stype(t, _tvars(self.graph))

    def out_stype(self) -> str:
        return output_stype(self.graph, _tvars(self.graph), 0)

    @property
    def acc_type(self) -> str:
        """The type sums are added in: f32 for floats, the output's type for integers."""
        return compute_type(self.form.dtype)

    @property
    def target(self) -> str:
        """The buffer the atomic adds go to: the f32 accumulator, or the output itself."""
        return "mf_scratch" if self.form.accumulator else self.out

    # -- positions and offsets --------------------------------------------------------
    def unflatten(self, axes: tuple[str, ...], flat: ir.Expr, prefix: str
                  ) -> tuple[list[ir.Stmt], dict[str, ir.Expr]]:
        """The position along each of `axes` of element `flat` of a row-major walk over
        them: (declarations, axis -> its variable)."""
        decls: list[ir.Stmt] = []
        pos: dict[str, ir.Expr] = {}
        for k, a in enumerate(axes):
            e = flat
            inner = axes[k + 1:]
            if inner:
                span: ir.Expr = self.size(inner[0])
                for b in inner[1:]:
                    span = span * self.size(b)
                e = flat / span
            e = e % self.size(a) if k > 0 else e
            name = f"{prefix}_{ident(a)}"
            decls.append(ir.Decl(name, IDX, e))
            pos[a] = ir.Var(name)
        return decls, pos

    def positioned(self, pos: dict[str, ir.Expr]) -> Position:
        """Position along an axis: a walked one, or a derived K/d of one (k / d)."""
        def position(axis: str) -> ir.Expr:
            if axis in pos:
                return pos[axis]
            spec = self.graph.axis_spec(axis)
            assert spec.base is not None and spec.base in pos, axis
            return pos[spec.base] / ir.Lit(spec.div, IDX)
        return position

    def offset(self, axes: tuple[str, ...], position: Position) -> ir.Expr:
        """Row-major offset of an element of a tensor over `axes` (storage order)."""
        e: ir.Expr = ir.Lit(0, IDX)
        for j, a in enumerate(axes):
            e = position(a) if j == 0 else e * self.size(a) + position(a)
        return e

    def lowering(self, position: Position, prefix: str = "mf_v") -> ElementLowering:
        """The values' lowering at the positions `position` gives (loads and gathers read
        their tensors there)."""
        def load(n: Node) -> ir.Expr:
            t = self.graph.tensor(n.attr)
            return ir.Cast(compute_type(t.dtype),
                           ir.Load(self.names[t.name], self.offset(t.axes, position)))

        def take(n: Node, at_: ir.Expr) -> ir.Expr:
            name, axis = n.attr
            t = self.graph.tensor(name)
            pos = self.positioned({a: (at_ if a == axis else position(a)) for a in t.axes})
            return ir.Cast(compute_type(t.dtype),
                           ir.Load(self.names[name], self.offset(t.axes, pos)))
        return ElementLowering(self.graph, load, position, self.size, lambda s: self.names[s],
                               prefix=prefix, take=take)

    def report(self, value: ir.Expr) -> list[ir.Stmt]:
        """Record index `value` (a long) as out of range in mf_err."""
        return [
            ir.Comment(f"index out of range: report it (scatter along '{self.form.axis}')"),
            ir.Store("mf_err", ir.Lit(0, "uint"), ir.Lit(1, "int")),
            ir.Store("mf_err", ir.Lit(1, "uint"), ir.Lit(self.site, "int")),
            ir.Store("mf_err", ir.Lit(2, "uint"), ir.Cast("int", value)),
            ir.Store("mf_err", ir.Lit(3, "uint"), ir.Cast("int", value >> ir.Lit(32, "long")))]

    # -- the parameter list -----------------------------------------------------------
    def params(self) -> tuple[ir.Argument, ...]:
        ps: list[ir.Argument] = []
        add = partial(add_param, ps)
        for t in self.inputs:
            add(self.names[t.name], "buffer", self.in_stype(t), ("input", t.name))
        add(self.out, "buffer", self.out_stype(), ("output", 0), writable=True)
        add_scalars(ps, self.names, self.scalars)
        if self.form.accumulator:
            add("mf_scratch", "buffer", "float", ("scratch",), writable=True)
        if self.form.deterministic:
            src = sorted_tensor(self.form)
            add("mf_keys", "buffer", "long", ("sorted", src, "keys"))
            add("mf_order", "buffer", "long", ("sorted", src, "order"))
        add("mf_err", "buffer", "int", ("error",), writable=True)
        add("mf_numel", "scalar", IDX, ("numel",), cast=index_cast(self.index64))
        add("mf_count", "scalar", IDX, ("launch", "sources"), cast=index_cast(self.index64))
        return with_sizes(ps, self.graph.name, self.sizes_used, self.index64)


def sorted_tensor(form: ScatterForm) -> str:
    """The tensor argument deterministic mode sorts: the index under its (widening) casts."""
    n = form.index
    while n.args:
        n = n.args[0]
    return str(n.attr)


def _tvars(graph: Graph) -> dict[str, DType]:
    return template_vars(graph.dtype_vars)
