"""The attention backward family (FlashAttention-2 style): the kernels of the backward graphs
`metalforge.adjoints_attention` derives from an attention kernel, recognised by the `Roles`
registered with them (`roles`), built by `kernels` (the dq kernel over query rows, which also
writes the rows' lse and delta, and the dk/dv kernel over keys), launched by `plan`."""
from __future__ import annotations

from .plan import AttentionGradSchedule, build
from .roles import Roles, register, roles_of

__all__ = ["AttentionGradSchedule", "Roles", "build", "register", "roles_of"]
