"""The host side of an attention backward kernel: a simdgroup per row of its grid (query rows
for dq, keys of each kv head for dk/dv), NSG rows a threadgroup."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from ...graph import Graph
from ...shapes import numel
from ..base import Schedule
from ..hardware import SIMD_WIDTH
from ..policy import LaunchPolicy
from .kernels import MAX_E, NSG, context, dkdv_kernel, dq_kernel
from .roles import Roles


@dataclass
class AttentionGradSchedule(Schedule):
    e_axis: str = ""

    def launch(self, sizes: Mapping[str, int]) -> tuple[int, int]:
        groups = -(-numel(self.grid_axes, sizes) // NSG)
        return groups * NSG * SIMD_WIDTH, NSG * SIMD_WIDTH

    def max_group_size(self, host_name: str) -> int:
        return NSG * SIMD_WIDTH

    def host_name(self, sizes: Mapping[str, int]) -> str:
        if sizes[self.e_axis] > MAX_E:
            raise ValueError(f"kernel '{self.graph.name}': the attention backward holds at "
                             f"most {MAX_E} elements of '{self.e_axis}' per row, got "
                             f"{sizes[self.e_axis]}")
        return self.kernel.host_name


def build(graph: Graph, policy: LaunchPolicy, index64: bool, roles: Roles
          ) -> AttentionGradSchedule:
    """The schedule of one attention backward graph (its `roles` registered when built)."""
    ctx = context(graph, roles, index64)
    if roles.kind == "dq":
        kernel, grid = dq_kernel(ctx), roles.rows
    else:
        kernel, grid = dkdv_kernel(ctx), (*roles.own, roles.key)
    return AttentionGradSchedule("attention_grad", graph, policy, kernel, tuple(grid), (),
                                 index64, e_axis=roles.e)
