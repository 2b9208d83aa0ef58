"""What every multiaxis kernel shares: the reduction context over the flattened axes, and how
an element at flattened position mf_f of the thread's row is addressed in each tensor.

A row is one element of the outer axes (`mf_row`, row-major over them); mf_f runs over the
reduced axes flattened row-major in the form's order. A tensor whose axes end with the reduced
axes in that order holds the row's elements as one contiguous run: its element is at
`mf_base_<t> + mf_f`. Elsewhere (an axis of the run missing, as group norm's weight w[G, C]
lacks H and W; the run split by an outer axis, as batch-norm statistics over (N, H, W) of
x[N, C, H, W]) each reduced axis's position is mf_f's digit, (mf_f / span of the later reduced
axes) % size, declared once per element (`mf_p_<axis>`), times the tensor's stride.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

from ... import ir
from ...graph import Graph, Node, Op
from .. import reduce
from ..base import IDX
from ..elementwise import msl_names, used_params
from ..lower import ElementLowering, compute_type, ident
from ..names import template_vars
from ..policy import LaunchPolicy
from .form import AxesForm


@dataclass(frozen=True, eq=False)
class MultiContext(reduce.ReductionContext):
    """A reduction context whose `axis` is the flattened name of `reduced` ("(C H W)"):
    element values are those with any reduced axis."""
    reduced: tuple[str, ...] = ()

    def elem(self, n: Node) -> bool:
        return any(a in n.axes for a in self.reduced)

    @property
    def flat(self) -> ir.Expr:
        """Elements of a row: the product of the reduced axes' sizes."""
        return self.span(self.reduced)


def multi_context(graph: Graph, form: AxesForm, policy: LaunchPolicy, index64: bool
                  ) -> MultiContext:
    """The context of the (collapsed) graph's kernels."""
    nodes = list(graph.nodes())
    inputs, scalars = used_params(graph, nodes)
    names, out_names = msl_names(graph)
    return MultiContext(graph, policy, index64, form.flat, "row", form.outer,
                        frozenset(form.outer) | frozenset(form.reduced), tuple(nodes), inputs,
                        scalars, template_vars(graph.dtype_vars), names, out_names, [], set(),
                        reduced=form.reduced)


def vector_width(ctx: MultiContext) -> int:
    """Elements a thread of the vector walk takes at once (policy.vector_width, at most 4; 1:
    no vector walk): where every element tensor and output holds the row as one contiguous
    run, or (inputs) lacks the innermost reduced axis, so that its element is the same for
    the vector's elements wherever that axis is a multiple of the width (group norm's w[G, C]),
    and no index expression reads a reduced axis."""
    vw = min(ctx.policy.vector_width, 4)
    red = ctx.reduced
    if vw == 1 or any(n.op == Op.INDEX and n.attr in red for n in ctx.nodes):
        return 1

    def run(axes: Sequence[str]) -> bool:
        return tuple(axes[-len(red):]) == red
    for t in ctx.inputs:
        if any(a in red for a in t.axes) and not run(t.axes) and red[-1] in t.axes:
            return 1
    for o in ctx.graph.outputs:
        if any(a in red for a in o.axes) and not run(o.axes):
            return 1
    return vw


@dataclass(eq=False)
class Walk:
    """One kernel being built: its context, its fresh collector, the reduced axes whose
    digit of mf_f the current loop body reads (`digits`, declared at the body's top), and the
    elements the vector walk takes at once (`vector_width`; 1: none)."""
    ctx: MultiContext
    parts: reduce.VariantParts
    digits: list[str] = field(default_factory=list)
    vector: int = 1

    def vec_ok(self) -> list[ir.Stmt]:
        """mf_vec_ok: whether this call takes the vector walk (the innermost reduced axis a
        multiple of the width: every run, chunk and uniform element then lines up)."""
        if self.vector == 1:
            return []
        inner = self.ctx.size(self.ctx.reduced[-1])
        return [ir.Comment(f"{self.vector} elements a thread at once where the innermost reduced "
                           f"axis is a multiple of {self.vector}"),
                ir.Decl("mf_vec_ok", "bool", (inner % ir.Lit(self.vector, IDX)).eq(
                    ir.Lit(0, IDX)))]

    def vector_loads(self, tensors: Sequence[str], vw: int) -> list[ir.Stmt]:
        """The vector walk's loads at mf_f: a vector of each tensor holding the row as a run
        (mf_wide_<t>), one element of the others (mf_one_<t>)."""
        out: list[ir.Stmt] = []
        for name in tensors:
            t = self.ctx.graph.tensor(name)
            if not any(a in self.ctx.reduced for a in t.axes):
                continue
            msl, st = self.ctx.names[name], self.ctx.in_stype(t)
            at = self.at(msl, t.axes)
            if self.run(t.axes):
                out.append(ir.Decl(f"mf_wide_{msl}", ir.vector_type(st, vw),
                                   ir.Load(msl, at, vw, st)))
            else:
                out.append(ir.Decl(f"mf_one_{msl}", compute_type(t.dtype),
                                   ir.Cast(compute_type(t.dtype), ir.Load(msl, at))))
        return out

    # -- addresses ---------------------------------------------------------------------
    def stride(self, axes: Sequence[str], axis: str) -> ir.Expr:
        after = axes[list(axes).index(axis) + 1:]
        return self.ctx.span(after) if after else ir.Lit(1, IDX)

    def base(self, name: str, axes: Sequence[str]) -> ir.Var:
        """mf_base_<name>: the offset of the row's element at reduced positions 0 (declared
        once in the preamble)."""
        var = f"mf_base_{name}"
        if var not in self.parts.pre_names:
            e: ir.Expr = ir.Lit(0, IDX)
            for a in axes:
                if a in self.ctx.outer:
                    term = self.ctx.position(a, self.parts) * self.stride(axes, a)
                    e = term if isinstance(e, ir.Lit) else e + term
            self.parts.pre.append(ir.Decl(var, IDX, e))
            self.parts.pre_names.add(var)
        return ir.Var(var)

    def run(self, axes: Sequence[str]) -> bool:
        """Whether the tensor holds a row's elements as one contiguous run."""
        k = len(self.ctx.reduced)
        return tuple(axes[-k:]) == self.ctx.reduced if len(axes) >= k else False

    def digit(self, axis: str) -> ir.Var:
        """The element's position along reduced `axis` (mf_p_<axis>, declared at the top of
        the loop body: `take_digits`)."""
        if axis not in self.digits:
            self.digits.append(axis)
        return ir.Var(f"mf_p_{ident(axis)}")

    def take_digits(self) -> list[ir.Stmt]:
        """The declarations of the digits the body read, outer to inner; then forgotten."""
        red = self.ctx.reduced
        out: list[ir.Stmt] = []
        for k, a in enumerate(red):
            if a not in self.digits:
                continue
            e: ir.Expr = ir.Var("mf_f")
            if red[k + 1:]:
                e = e / self.ctx.span(red[k + 1:])
            if k > 0:
                e = e % self.ctx.size(a)
            out.append(ir.Decl(f"mf_p_{ident(a)}", IDX, e))
        self.digits.clear()
        return out

    def at(self, name: str, axes: Sequence[str]) -> ir.Expr:
        """The offset of the element at mf_f of the row in a tensor/output with `axes`."""
        b = self.base(name, axes)
        if not any(a in self.ctx.reduced for a in axes):
            return b
        if self.run(axes):
            return b + ir.Var("mf_f")
        e: ir.Expr = b
        for a in axes:
            if a in self.ctx.reduced:
                st = self.stride(axes, a)
                e = e + (self.digit(a) if isinstance(st, ir.Lit) else self.digit(a) * st)
        return e

    # -- values --------------------------------------------------------------------------
    def row_load(self, n: Node) -> ir.Expr:
        """A tensor value without the reduced axes, at the row."""
        t = self.ctx.graph.tensor(n.attr)
        return ir.Cast(compute_type(t.dtype), ir.Load(self.ctx.names[t.name],
                                                      self.base(self.ctx.names[t.name], t.axes)))

    def element_lowering(self, lane: Optional[int] = None) -> ElementLowering:
        """Lowering of element values at mf_f (the vector walk: at mf_f + `lane`, from the
        vector loads), with the row values computed so far."""
        def load(n: Node) -> ir.Expr:
            t = self.ctx.graph.tensor(n.attr)
            name = self.ctx.names[t.name]
            if lane is None:
                return ir.Cast(compute_type(t.dtype), ir.Load(name, self.at(name, t.axes)))
            if self.run(t.axes):
                return ir.Cast(compute_type(t.dtype),
                               ir.Lane(ir.Var(f"mf_wide_{name}"), ir.Lit(lane, "uint")))
            return ir.Var(f"mf_one_{name}")

        def position(axis: str) -> ir.Expr:
            if axis in self.ctx.reduced:
                return self.digit(axis)
            return self.ctx.position(axis, self.parts)
        el = ElementLowering(self.ctx.graph, load, position, self.ctx.size,
                             lambda s: self.ctx.names[s])
        el.values.update(self.parts.row_values.values)
        return el


def walk_parts(ctx: MultiContext, name: str) -> Walk:
    """A fresh `Walk` for kernel variant `name`."""
    holder: list[Walk] = []
    parts = reduce.variant_parts(ctx, name, lambda p, n: holder[0].row_load(n))
    holder.append(Walk(ctx, parts, vector=vector_width(ctx)))
    return holder[0]
