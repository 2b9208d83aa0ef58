"""Which of a forward's launch options each kernel of its backward takes: the user tuned the
forward (`kernel.with_launch(...)`), and its backward kernels are of other families."""
from __future__ import annotations

from typing import Any, Mapping, Optional

from .. import schedule
from ..graph import Graph
from ..schedule.policy import FOR_BACKWARD, TUNABLE


def options_for(k: Graph, launch: Optional[Mapping[str, Any]]) -> Optional[Mapping[str, Any]]:
    """The options of a forward's `launch` that backward kernel `k`'s family takes (None when
    none: a row kernel of the backward takes no `key_splits` of an attention forward)."""
    if not launch:
        return launch
    allowed = TUNABLE[schedule.family(k)]
    return {key: v for key, v in launch.items() if key in allowed} or None


def forward_options(k: Graph, launch: Optional[Mapping[str, Any]]
                    ) -> Optional[Mapping[str, Any]]:
    """`launch` without the options meant for the backward's kernels only
    (`policy.FOR_BACKWARD`: `grad_fp32` of attention) for forward kernel `k`; any other option
    reaches it, so that a wrong one is refused as on a call without grad."""
    if not launch:
        return launch
    skip = FOR_BACKWARD.get(schedule.family(k), ())
    return {key: v for key, v in launch.items() if key not in skip} or None
