"""Where a gather's element already is: the register and shuffle paths of `mf.take`.

A schedule that holds a tensor's elements along an axis in registers can serve a gather along
that axis without a second global read when it can tell where the gathered element sits:

- **in the thread's own block** (`own_slot`): the index is `mf.index(axis) ^ c` and the thread
  holds an aligned block of `block` consecutive positions, with `block` a multiple of the power
  of two above c: XOR with c only flips bits below it, so position p of the block gathers
  p ^ c of the same block, and slot k of the block reads slot k ^ c (interleaved RoPE: `i ^ 1`
  on vectors of an even width);
- **in another lane of the simdgroup** (`lane_computable`): the index is computed from
  positions, sizes, scalars and per-row values only (no tensor element along the axis), so a
  lane can compute the index for any of its slots, and a simdgroup holding a whole row can
  fetch the element from the lane that holds it (`simd_shuffle`; rotate-half RoPE's
  `where(i < half, i + half, i - half)`).

Everything else stays a guarded global load. These are pure questions about the graph; the
schedules (`rows/`, `elementwise.py`) decide what their layout makes of them.
"""
from __future__ import annotations

from typing import Optional

from ..graph import BinaryOp, Node, Op

# the element values a lane-computable index may be built from (besides values without the axis)
_POSITION_OPS = frozenset({Op.INDEX, Op.SIZE, Op.CONST, Op.SCALAR, Op.CAST, Op.UNARY, Op.BINARY,
                           Op.WHERE})
# compute types a simd_shuffle moves (32-bit; 64-bit values and bools stay loads)
SHUFFLE_TYPES = frozenset({"float", "int", "uint"})


def xor_mask(n: Node) -> Optional[int]:
    """c when gather `n` (a TAKE node) reads position `mf.index(axis) ^ c` along its own axis,
    c a non-negative integer constant; None for any other index."""
    assert n.op == Op.TAKE, n
    axis = n.attr[1]
    idx = n.args[0]
    if idx.op == Op.INDEX and idx.attr == axis:
        return 0
    if not (idx.op == Op.BINARY and idx.attr == BinaryOp.XOR):
        return None
    for a, b in (idx.args, idx.args[::-1]):
        if (a.op == Op.INDEX and a.attr == axis and b.op == Op.CONST
                and isinstance(b.attr, int) and not isinstance(b.attr, bool) and b.attr >= 0):
            return b.attr
    return None


def own_slot(n: Node, block: int) -> Optional[int]:
    """The mask c when gather `n` provably stays inside every aligned block of `block`
    positions along its axis (`xor_mask` c, and `block` a multiple of the smallest power of two
    above c): slot k of a block gathers slot k ^ c of the same block. None otherwise."""
    c = xor_mask(n)
    if c is None:
        return None
    span = 1 << c.bit_length()            # p ^ c changes only the bits below this power of two
    return c if block % span == 0 else None


def lane_computable(n: Node, axis: str) -> bool:
    """Whether gather `n`'s index, along `axis`, is computed from positions, sizes, scalars,
    constants and values without `axis` only: no element of a tensor along the axis (a load,
    another gather, an unpacked word, a reduction), so a thread can compute it for a position
    other than its own element's."""
    stack, seen = [n.args[0]], set()
    while stack:
        m = stack.pop()
        if id(m) in seen or axis not in m.axes:        # a per-row value: computed once per row
            continue
        seen.add(id(m))
        if m.op not in _POSITION_OPS:
            return False
        stack.extend(m.args)
    return True
