"""The attention backward family (FlashAttention-2 style): the kernels of the backward graphs
`metalforge.adjoints_attention` derives from an attention kernel, recognised by the `Roles`
registered with them (`roles`): the dq kernel over query rows and the dk/dv kernel over keys:
for E up to 128 on 16x16 matrix blocks with the inputs' own half / bfloat operands where the
target multiplies them (`block_kernels`, pieces in `blocks`: tensor ops or simdgroup_matrix by
target; a step's rows staged by `staging`; `wide`: 4 simdgroups a threadgroup with their own
rows in registers, launch option grad_simdgroups = 4 at tensor-op targets), else on fp32 8x8
simdgroup matrices (`matrix`), both skipping the key blocks an index mask hides (`bounds`); simd
kernels above (`kernels`, which also holds the pieces all share); `plan` is the host side."""
from __future__ import annotations

from .plan import AttentionGradSchedule, build
from .roles import Roles, register, roles_of

__all__ = ["AttentionGradSchedule", "Roles", "build", "register", "roles_of"]
