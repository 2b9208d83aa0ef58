"""Planted faults: test-only rewrites of generated MSL, to prove `check` catches real bugs.

A `Fault` is a textual edit keyed on a known shape of the generated MSL (a regular expression
and its replacement). ``with planted(fault): ...`` makes the runtime rewrite every MSL source
it compiles inside the block, through one seam: ``metalforge.runtime.launcher.MSL_REWRITE`` (a
ContextVar holding a text -> text function, unset outside this context manager; while it is
set the runtime builds launchers afresh instead of reusing cached ones).

Planting fails loudly rather than silently testing nothing:
  * rewriting a source the fault's pattern does not match raises `FaultNotPlanted` (so a
    codegen change that renames what the fault keys on breaks the fault test, not hides it);
  * leaving the block without the fault having rewritten any source raises `FaultNotPlanted`.
`FaultNotPlanted` is not an AssertionError, so it cannot pass for a caught fault.
"""
from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

from ..runtime.launcher import MSL_REWRITE  # the seam, with the runtime that compiles


class FaultNotPlanted(RuntimeError):
    """A planted fault found nothing to rewrite: the test it belongs to would be vacuous."""


@dataclass(frozen=True)
class Fault:
    """A named bug: regex edits of the MSL text, each of which must match at least once."""
    name: str
    description: str
    edits: tuple[tuple[str, str], ...]       # (regex on the MSL text, re.sub replacement)

    def apply(self, src: str) -> str:
        for pattern, replacement in self.edits:
            new, n = re.subn(pattern, replacement, src, flags=re.MULTILINE)
            if n == 0:
                raise FaultNotPlanted(
                    f"planted fault '{self.name}' ({self.description}) keys on the MSL pattern "
                    f"/{pattern}/, which this generated source does not contain; the code "
                    f"generator changed shape, so update the fault in "
                    f"metalforge/testing/faults.py.\n--- source ---\n{src}")
            src = new
        return src


# --------------------------------------------------------------------------- the catalogue
# Each fault is keyed on a shape the elementwise code generator emits (metalforge/codegen/msl.py
# via metalforge/schedule/elementwise.py): the guarded scalar tail `if (mf_i < mf_numel)`, loads
# widened to f32 as `const float mf_x = float(...)`, and a broadcast operand indexed by the
# position along its own axis, `w[mf_i % mf_size_D]` (vector path: `w + mf_start % mf_size_D`).

OFF_BY_ONE_GUARD = Fault(
    "off_by_one_guard", "the tail's bound guard lets one element past the end through",
    ((r"\bif \(mf_i < mf_numel\)", "if (mf_i <= mf_numel)"),))

DROPPED_UPCAST = Fault(
    "dropped_fp32_upcast", "f16/bf16 loads and arithmetic stay in the storage type T",
    ((r"^(\s+)const float (mf_\w+) = float\(", r"\1const T \2 = T("),
     (r"^(\s+)const float (mf_v\d+) = ", r"\1const T \2 = ")))

BROADCAST_WRONG_AXIS = Fault(
    "broadcast_wrong_axis", "a broadcast operand is indexed by the outer axis's position "
    "instead of its own",
    ((r"\b(\w+)\[mf_i % (mf_size_\w+)\]", r"\1[mf_i / \2]"),
     (r"\((\w+) \+ mf_start % (mf_size_\w+)\)", r"(\1 + mf_start / \2)")))

# Reductions (metalforge/schedule/rows/): partials cross simdgroups through threadgroup memory
# after `threadgroup_barrier(mem_flags::mem_threadgroup);`; a max starts from `-INFINITY`.

MISSING_BARRIER = Fault(
    "missing_barrier", "the threadgroup barrier between writing and reading the simdgroup "
    "partials is gone",
    ((r"^\s*threadgroup_barrier\(mem_flags::mem_threadgroup\);\n", ""),))

WRONG_IDENTITY = Fault(
    "wrong_reduction_identity", "a max reduction starts from 0 instead of -inf",
    ((r"\bfloat (mf_acc\d+) = -INFINITY;", r"float \1 = 0.0f;"),))

PARTIAL_PAST_END = Fault(
    "partial_past_end", "the combine across simdgroups reads one partial past those written "
    "(threadgroup memory no thread wrote)",
    ((r"\bmf_lane < mf_nsg \?", "mf_lane <= mf_nsg ?"),))

# Attention (metalforge/schedule/attention/): a decode or prefill group finds its tile of query
# rows and its key block from its index, and a split call's partial states sit at the row's
# position (head and query) times the blocks, plus the block.

TILE_OF_GROUP = Fault(
    "tile_of_group", "a group's tile of query rows is taken from its index times the key "
    "blocks instead of divided by them",
    ((r"(mf_tile = uint\(.* - 1u - )mf_index_t\(mf_group / mf_splits\)",
      r"\1mf_index_t(mf_group * mf_splits)"),))

PARTIAL_HEAD_OFFSET = Fault(
    "partial_head_offset", "a split call's partial states are placed by the head's position "
    "subtracted from the batch's offset instead of added to it",
    ((r"(mf_partial = \(+mf_pos_B \* mf_size_H) \+ mf_pos_H", r"\1 - mf_pos_H"),))

CATALOGUE = (OFF_BY_ONE_GUARD, DROPPED_UPCAST, BROADCAST_WRONG_AXIS, MISSING_BARRIER,
             WRONG_IDENTITY, PARTIAL_PAST_END, TILE_OF_GROUP, PARTIAL_HEAD_OFFSET)


@dataclass
class Planting:
    """The faults of one ``planted`` block and how many sources each rewrote."""
    faults: tuple[Fault, ...]
    applied: dict[str, int] = field(default_factory=dict)

    def rewrite(self, src: str) -> str:
        for f in self.faults:
            src = f.apply(src)
            self.applied[f.name] = self.applied.get(f.name, 0) + 1
        return src

    def preview(self, src: str) -> str:
        """``src`` as the planted faults rewrite it, without counting (for reports)."""
        for f in self.faults:
            try:
                src = f.apply(src)
            except FaultNotPlanted:
                pass
        return src


@contextmanager
def planted(*faults: Fault) -> Iterator[Planting]:
    """Rewrite every MSL source compiled inside the block with ``faults`` (in order)."""
    planting = Planting(tuple(faults))
    token = MSL_REWRITE.set(planting.rewrite)
    try:
        yield planting
    finally:
        MSL_REWRITE.reset(token)
    missing = [f.name for f in faults if not planting.applied.get(f.name)]
    if missing:
        raise FaultNotPlanted(
            f"planted fault(s) {', '.join(missing)} rewrote no source: nothing was compiled "
            f"inside the `planted` block (was the kernel already compiled and cached?)")


def preview(src: str) -> str:
    """``src`` as the faults planted right now would rewrite it (unchanged when none are)."""
    fn = MSL_REWRITE.get()
    owner = getattr(fn, "__self__", None)
    return owner.preview(src) if isinstance(owner, Planting) else src
