"""The contraction family's host side: its grid (one threadgroup per tile of outputs of each
batch position) and the sizes `check` tries."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping, cast

from ...errors import LaunchError
from ...graph import Graph
from ...shapes import numel
from ..base import Schedule
from ..elementwise import ParamSource, kernel_params
from ..hardware import MAX_THREADGROUP_BYTES
from ..matrix import BK, Tile, helpers
from ..policy import LaunchPolicy
from .context import context
from .form import Contraction
from .kernel import kernel, vectored


@dataclass
class MatmulSchedule(Schedule):
    axis: str = "K"                      # the summed axis (check's boundary sizes pin it)
    rows: str = "M"
    cols: str = "N"
    batch: tuple[str, ...] = ()
    tile: Tile = Tile(64, 64, 2, 2, "float", "simdgroup_matrix")

    @property
    def thresholds(self) -> tuple[int, ...]:
        """Sizes of K where a kernel's steps change: one step, two."""
        return (BK, 2 * BK)

    def groups(self, sizes: Mapping[str, int]) -> int:
        t = self.tile
        return (numel(self.batch, sizes) * -(-sizes[self.rows] // t.bm)
                * -(-sizes[self.cols] // t.bn))

    def launch(self, sizes: Mapping[str, int]) -> tuple[int, int]:
        return self.groups(sizes) * self.tile.threads, self.tile.threads

    def max_group_size(self, host_name: str) -> int:
        return self.tile.threads


def build(graph: Graph, policy: LaunchPolicy, index64: bool, form: Contraction) -> MatmulSchedule:
    """The contraction schedule of `graph` (`form`: as `form.match` found it)."""
    ctx = context(graph, policy, index64, form)
    t = ctx.tile
    if t.threadgroup_bytes > MAX_THREADGROUP_BYTES:
        raise LaunchError(
            f"the staged tiles need {t.threadgroup_bytes} bytes of "
            f"threadgroup memory (tile={policy.tile}, k_step={policy.k_step}, stage_pad="
            f"{t.pad}, {t.operand} operands), over the {MAX_THREADGROUP_BYTES}-byte limit: "
            f"give a smaller tile or k_step=32")
    k = kernel(ctx)
    params = kernel_params(cast(ParamSource, ctx))
    k = replace(k, params=params, helpers=(*helpers(ctx.tile),
                                           *sorted(ctx.uses.helpers)))
    vectors = tuple(n.attr for n in (form.a, form.b) if vectored(ctx, n))
    out = replace(policy, threads_per_group=t.threads, threadgroup_bytes=t.threadgroup_bytes,
                  uses_simd=True, vector_width=t.vec if vectors else 1)
    return MatmulSchedule("matmul", graph, out, k, form.out_axes, vectors, index64,
                          axis=form.axis, rows=form.rows, cols=form.cols, batch=form.batch,
                          tile=t)
