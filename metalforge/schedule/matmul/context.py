"""The per-call context of a contraction kernel: the graph's form, its tile (the target's
lowering), parameters and names, the axis sizes the kernel reads (in order of first use: the
parameter list binds them in this order) and the helpers it calls; and the element lowerings
that read tensors at the kernel's positions."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from ... import ir
from ...dtypes import DType
from ...graph import Graph, Node, ScalarParam, TensorParam
from ...target import get_target
from ..elementwise import input_stype, msl_names, output_stype, used_params
from ..lower import ElementLowering, compute_type, ident
from ..matrix import Tile, choose
from ..names import IDX, template_vars
from ..policy import LaunchPolicy
from ..quant.context import Uses
from .form import Contraction, held_dtype


@dataclass(frozen=True)
class MatmulContext:
    graph: Graph
    policy: LaunchPolicy
    index64: bool
    form: Contraction
    tile: Tile
    inputs: list[TensorParam]
    scalars: list[ScalarParam]
    tvars: dict[str, DType]
    names: dict[str, str]
    out_names: list[str]
    uses: Uses

    @property
    def sizes_used(self) -> list[str]:
        return self.uses.sizes

    def size(self, axis: str) -> ir.Expr:
        if axis not in self.uses.sizes:
            self.uses.sizes.append(axis)
        return ir.Var(f"mf_size_{ident(axis)}")

    def in_stype(self, t: TensorParam) -> str:
        return input_stype(t, self.tvars)

    def out_stype(self, k: int) -> str:
        return output_stype(self.graph, self.tvars, k)

    def offset(self, axes: tuple[str, ...], at: Mapping[str, ir.Expr]) -> ir.Expr:
        """The row-major element of a tensor over `axes` at positions `at`."""
        e: ir.Expr = ir.Lit(0, IDX)
        for i, a in enumerate(axes):
            e = at[a] if i == 0 else e * self.size(a) + at[a]
        return e

    def lowering(self, at: Mapping[str, ir.Expr], prefix: str) -> ElementLowering:
        """Element values at positions `at` (axis -> index expression), tensors read there."""
        def load(n: Node) -> ir.Expr:
            t = self.graph.tensor(n.attr)
            return ir.Cast(compute_type(t.dtype),
                           ir.Load(self.names[t.name], self.offset(t.axes, at)))
        return ElementLowering(self.graph, load, lambda a: at[a], self.size,
                               lambda s: self.names[s], prefix=prefix)


def context(graph: Graph, policy: LaunchPolicy, index64: bool, form: Contraction) -> MatmulContext:
    """The context of `graph`'s contraction under `policy` (its target and tile size)."""
    inputs, scalars = used_params(graph, list(graph.nodes()))
    names, out_names = msl_names(graph)
    tile = choose(get_target(policy.target), held_dtype(form.a), held_dtype(form.b),
                  policy.tile, policy.k_step, policy.stage_pad, policy.tile_simdgroups,
                  policy.tf32)
    return MatmulContext(graph, policy, index64, form, tile, inputs, scalars,
                         template_vars(graph.dtype_vars), names, out_names,
                         Uses([form.axis, form.rows, form.cols]))
