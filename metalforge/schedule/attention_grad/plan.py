"""The host side of an attention backward kernel: for E up to MAT_E the 16x16 block kernel
where the inputs are half / bfloat the target multiplies (`block_kernels`: 16 keys or query rows
a simdgroup, SGS a threadgroup; or `wide`'s, 4 simdgroups with their own rows in registers,
launch option grad_simdgroups = 4 at tensor-op targets; launch options `target`, and
`grad_fp32` to keep the fp32 kernel), else the fp32 simdgroup_matrix kernel (`matrix`: a
simdgroup per block of 8 keys or query rows of a kv head); above MAT_E the simd kernel
(`kernels`: a simdgroup per key or query row, NSG a threadgroup)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

from ... import ir
from ...graph import Graph
from ...shapes import numel
from ...target import Target, get_target
from ..base import Schedule
from ..hardware import SIMD_WIDTH
from ..policy import LaunchPolicy
from . import block_kernels, blocks, matrix, wide
from .kernels import MAX_E, NSG, Ctx, context, dkdv_kernel, dq_kernel
from .roles import Roles


@dataclass
class AttentionGradSchedule(Schedule):
    e_axis: str = ""
    matrix: Optional[ir.LoweredKernel] = None
    own: tuple[str, ...] = ()              # the kv head's axes
    blocked: tuple[str, ...] = ()          # the axes the matrix kernel takes 8 at a time
    sgs: int = 1                           # ... in that many simdgroups a threadgroup
    block: Optional[ir.LoweredKernel] = None   # the 16x16 block kernel (half / bfloat)
    block_sgs: int = blocks.SGS            # ... in that many simdgroups a threadgroup

    @property
    def kernels(self) -> tuple[ir.LoweredKernel, ...]:
        return (self.kernel,) + tuple(k for k in (self.matrix, self.block) if k is not None)

    def _uses_matrix(self, sizes: Mapping[str, int]) -> bool:
        return self.matrix is not None and sizes[self.e_axis] <= matrix.MAT_E

    def _uses_block(self, sizes: Mapping[str, int]) -> bool:
        return self.block is not None and sizes[self.e_axis] <= matrix.MAT_E

    def launch(self, sizes: Mapping[str, int]) -> tuple[int, int]:
        if self._uses_block(sizes):
            n = -(-numel(self.blocked, sizes) // (blocks.SIDE * self.block_sgs))
            return numel(self.own, sizes) * n * SIMD_WIDTH * self.block_sgs, \
                SIMD_WIDTH * self.block_sgs
        if self._uses_matrix(sizes):
            n = -(-numel(self.blocked, sizes) // (matrix.FRAG * self.sgs))
            return numel(self.own, sizes) * n * SIMD_WIDTH * self.sgs, \
                SIMD_WIDTH * self.sgs
        groups = -(-numel(self.grid_axes, sizes) // NSG)
        return groups * NSG * SIMD_WIDTH, NSG * SIMD_WIDTH

    def max_group_size(self, host_name: str) -> int:
        if self.block is not None and host_name == self.block.host_name:
            return SIMD_WIDTH * self.block_sgs
        if self.matrix is not None and host_name == self.matrix.host_name:
            return SIMD_WIDTH * self.sgs
        return NSG * SIMD_WIDTH

    def host_name(self, sizes: Mapping[str, int]) -> str:
        if sizes[self.e_axis] > MAX_E:
            raise ValueError(f"kernel '{self.graph.name}': the attention backward holds at "
                             f"most {MAX_E} elements of '{self.e_axis}' per row, got "
                             f"{sizes[self.e_axis]}")
        if self._uses_block(sizes):
            assert self.block is not None
            return self.block.host_name
        if self._uses_matrix(sizes):
            assert self.matrix is not None
            return self.matrix.host_name
        return self.kernel.host_name


def build(graph: Graph, policy: LaunchPolicy, index64: bool, roles: Roles
          ) -> AttentionGradSchedule:
    """The schedule of one attention backward graph (its `roles` registered when built)."""
    ctx = context(graph, roles, index64)
    block, block_sgs = _block(ctx, policy, roles.kind, get_target(policy.target or "apple9"))
    if roles.kind == "dq":
        kernel, mat, grid = dq_kernel(ctx), matrix.dq_kernel(ctx), roles.rows
        blocked, sgs = roles.tile, matrix.KSG
    else:
        kernel, mat, grid = dkdv_kernel(ctx), matrix.dkdv_kernel(ctx), (*roles.own, roles.key)
        blocked, sgs = (roles.key,), matrix.KSG
    return AttentionGradSchedule("attention_grad", graph, policy, kernel, tuple(grid), (),
                                 index64, e_axis=roles.e, matrix=mat, own=roles.own,
                                 blocked=blocked, sgs=sgs, block=block, block_sgs=block_sgs)


def _block(ctx: Ctx, policy: LaunchPolicy, kind: str, target: Target
           ) -> tuple[Optional[ir.LoweredKernel], int]:
    """The 16x16 block kernel of `kind` and its simdgroups a threadgroup: the wide one
    (`wide`, grad_simdgroups = 4) where it applies, else `block_kernels`' (None: grad_fp32,
    or inputs the blocks do not take)."""
    if policy.grad_fp32:
        return None, blocks.SGS
    if policy.grad_simdgroups == wide.WIDE:
        got = wide.wide_kernel(kind, ctx, target, policy.grad_step_blocks)
        if got is not None:
            return got, wide.WIDE
    return block_kernels.block_kernel(kind, ctx, target), blocks.SGS
