"""How far a correct kernel may stray from its reference where its schedule reorders float sums.

The schedule says what its kernels evaluate differently (`Schedule.reordering`: the float sums
they accumulate in their own order, the ones whose elements a later reduction compares, the
keys a mask hides that they never read); this module turns that into torch tensors `compare`
takes (`metalforge.tolerance`): the references moved by the allowed accumulation error, the
per-element slack they span, and the reference without the unread keys.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import torch

from ..graph import Graph, Op, ReduceOp, ScalarParam
from ..reference import evaluate
from ..runtime import schedule_of
from ..schedule.base import Schedule
from ..schedule.reordering import Reordering
from ..shapes import bind_shapes
from ..tolerance import ACCUMULATION

# Sign patterns of the mixed moved references: two elements of different values get opposite
# signs in at least one of them with probability 1 - 2^-MIXED_PATTERNS.
MIXED_PATTERNS = 6


@dataclass(frozen=True)
class Allowance:
    """What `compare` allows one example beyond the tolerance: a slack per output (None: none)
    and other references the kernel may match instead."""
    slack: Optional[list[torch.Tensor]] = None
    alternatives: list[tuple] = field(default_factory=list)


def schedule_for(graph: Graph, values: Mapping[str, Any],
                 launch: Optional[Mapping[str, Any]] = None) -> Optional[Schedule]:
    """The schedule a call with these arguments uses (`launch`: the kernel's own launch
    options; their backend's layer from the tensors); None when it refuses them."""
    try:
        return schedule_of(graph, values, launch=launch)
    except Exception:                                            # noqa: BLE001 - refused
        return None


def allowance(graph: Graph, values: Mapping[str, Any], expected: Sequence[torch.Tensor],
              launch: Optional[Mapping[str, Any]] = None) -> Allowance:
    """The slack and alternative references for one example of `graph` (`values`: the
    arguments by name; `expected`: the reference's outputs; `launch`: the kernel's own launch
    options), from what its schedule reorders."""
    s = schedule_for(graph, values, launch)
    reordered = s.reordering() if s is not None else None
    if reordered is None:
        return Allowance()
    moved = moved_references(graph, values, reordered)
    unread = unread_keys_reference(graph, values, s)
    rounded = rounded_reference(graph, values, s)
    return Allowance(slack(expected, moved),
                     moved + [r for r in (unread, rounded) if r is not None])


def rounded_reference(graph: Graph, values: Mapping[str, Any], s: Schedule) -> Optional[tuple]:
    """The reference with the values the schedule's kernels round to a narrower type rounded
    alike (`Schedule.rounded_operands`): attention's weights P as the half operands of P V,
    where a weight under half's smallest subnormal becomes 0 and, against an infinite value,
    makes NaN (FlashAttention's kernels do the same). The reference rounds the normalised
    weights, the kernels the unnormalised ones against a running maximum, which are never
    smaller: every weight the kernels lose this one loses too. None where nothing is rounded."""
    sizes = bind_shapes(graph, {t.name: values[t.name] for t in graph.tensors}).sizes
    rounded = s.rounded_operands(sizes)
    return _as_tuple(evaluate(graph, values, rounded=rounded)) if rounded else None


def reduction_slack(graph: Graph, values: Mapping[str, Any],
                    expected: Sequence[torch.Tensor]) -> Optional[list[torch.Tensor]]:
    """Per output element, how far the reference moves when every float sum of ``graph`` is
    off by the accumulation error the tolerance allows (ACCUMULATION * sqrt(n) * sum(|terms|)),
    all up or all down: the output's sensitivity to reduction rounding, which any fp32
    evaluation (the kernel's, torch's) may show. None when the graph has no float sums.
    ``values``: the arguments by name; ``expected``: the reference's outputs."""
    moved = moved_references(graph, values)
    return slack(expected, moved) if moved else None


def unread_keys_reference(graph: Graph, values: Mapping[str, Any],
                          s: Optional[Schedule] = None) -> Optional[tuple]:
    """Attention whose mask bounds the keys on their indices (causal, a sliding window): the
    reference with the keys a query row cannot see left out of its sums over the keys, for
    rows that see some key. The kernels never read those keys (a tile reads the union of its
    rows' keys), so a NaN or ±inf planted there reaches such a row as the reference's zero
    weight times it (NaN, as torch's math path gives) or not at all. None for other graphs
    (those whose schedule, `s` or the one these values select, skips no key)."""
    s = s if s is not None else schedule_for(graph, values)
    reordered = s.reordering() if s is not None else None
    axis = reordered.skipped_keys if reordered is not None else None
    if s is None or axis is None:
        return None
    sizes = bind_shapes(graph, {t.name: values[t.name] for t in graph.tensors}).sizes
    scalars = {p.name: values[p.name] for p in graph.params if isinstance(p, ScalarParam)}
    visible_keys = getattr(s, "visible_keys")

    def adjust(n, x, r):
        if n.attr[0] != ReduceOp.SUM or n.attr[1] != axis or not n.dtype.is_float:
            return r
        axes = n.args[0].axes
        seen = visible_keys(sizes, scalars, axes)
        if seen is None:
            return r
        dim = axes.index(axis)
        keep = (seen | ~seen.any(dim, keepdim=True)).to(x.device)
        try:
            kept = torch.where(keep, x, torch.zeros((), dtype=x.dtype, device=x.device))
        except RuntimeError:                    # a fused product's slice: left as it is
            return r
        return kept.sum(dim).to(r.dtype)

    return _as_tuple(evaluate(graph, values, adjust=adjust))


def moved_references(graph: Graph, values: Mapping[str, Any],
                     reordered: Optional[Reordering] = None) -> Optional[list[tuple]]:
    """The reference's outputs with every float sum off by its allowed accumulation error: all
    up, all down, and (`MIXED_PATTERNS` more) with the sums whose elements a later reduction
    combines (attention's scores, which the softmax compares) each element up or down by its own
    sign. A uniform shift of the scores moves no softmax; rounding that differs between two
    near-tied keys does. ``reordered``: what the schedule reorders (default: asked of the
    schedule these values select); None when it reorders no float sum."""
    if reordered is None:
        s = schedule_for(graph, values)
        reordered = s.reordering() if s is not None else None
    if reordered is None:
        return None
    sums, combined = reordered.sums, reordered.combined

    def bound(n, x):
        if n.op == Op.SCATTER:              # x: (sum of |terms|, count) per output element
            return ACCUMULATION * x[1].sqrt() * x[0]
        dim = n.args[0].axes.index(n.attr[1])
        terms = torch.nan_to_num(x.abs(), nan=0.0, posinf=0.0)
        return ACCUMULATION * math.sqrt(x.shape[dim]) * terms.sum(dim)

    def moved(sign: float):
        def adjust(n, x, r):
            return r + sign * bound(n, x) if n in sums else r
        return _as_tuple(evaluate(graph, values, adjust=adjust))

    def mixed(bit: int):
        def adjust(n, x, r):
            return r + _value_signs(r, bit) * bound(n, x) if n in combined else r
        return _as_tuple(evaluate(graph, values, adjust=adjust))

    return [moved(1.0), moved(-1.0)] + [mixed(b) for b in range(MIXED_PATTERNS if combined else 0)]


def _value_signs(r: torch.Tensor, bit: int) -> torch.Tensor:
    """+-1 per element from bit `bit` of a hash of its value's bits: the same for an element
    however the evaluation slices its sum (`reference.FUSED_ELEMENTS`), different for two
    different values in about half of the bits."""
    bits = r.detach().to(torch.float32).contiguous().view(torch.int32).to(torch.int64)
    h = ((bits & 0xFFFFFFFF) * 0x5BD1E995) & 0xFFFFFFFF       # < 2^63: no int64 overflow
    return 1.0 - 2.0 * ((h >> (16 + bit)) & 1).to(r.dtype)


def slack(expected: Sequence[torch.Tensor], moved: list[tuple]) -> list[torch.Tensor]:
    """Per output, each element's largest distance from the reference to a moved reference
    (float64; 0 for integer outputs and where the distance is NaN or infinite)."""
    out: list[torch.Tensor] = []
    for e, *ms in zip(expected, *moved):
        if not e.is_floating_point():
            out.append(torch.zeros(e.shape, dtype=torch.float64))
            continue
        ed = e.detach().cpu().to(torch.float64)
        d = torch.zeros_like(ed)
        for m in ms:
            d = torch.maximum(d, (m.detach().cpu().to(torch.float64) - ed).abs())
        out.append(torch.nan_to_num(d, nan=0.0, posinf=0.0))
    return out


def _as_tuple(r) -> tuple:
    return tuple(r) if isinstance(r, (tuple, list)) else (r,)
