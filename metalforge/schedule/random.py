"""Lowering `mf.rand` / `mf.randn` (a RANDOM node) to one element's value: the helper calls of
codegen/helpers.metal (`mf_philox` under `mf_rand_bits` / `mf_randn`) at the element's linear
position over the draw's axes. The mapping is `metalforge.philox`'s, which the reference
implements independently in torch.

Element i of a uniform draw is word i % 4 of Philox block i / 4 (of a normal draw, words
2 (i % 2) and 2 (i % 2) + 1 of block i / 2). Where a schedule computes consecutive elements
together as the lanes of a chunk (the elementwise vector path), each lane's block is spelled
`(start >> 2) + (k >> 2)` from the chunk's aligned start, so once the lane loop is unrolled the
lanes of one block call Philox with the same arguments and the compiler computes it once for
them (one Philox per 4 uniforms, not per element).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from .. import ir
from ..graph import Node, RandomOp
from ..philox import uniform_bits

U64 = "ulong"                 # the counter's and key's 64-bit words: Philox's own types
PER_BLOCK = {RandomOp.RAND: 4, RandomOp.RANDN: 2}     # elements drawn from one Philox block


@dataclass(frozen=True)
class DrawPosition:
    """Where an element lies in its draw. linear: its row-major position over the draw's axes
    (ulong). Where a schedule computes `width` consecutive positions together: `start`, the
    chunk's first (a multiple of width), and `lane`, this element's (a uint in [0, width))."""
    linear: ir.Expr
    start: Optional[ir.Expr] = None
    lane: Optional[ir.Expr] = None
    width: int = 1


def linear_position(axes: tuple[str, ...], position: Callable[[str], ir.Expr],
                    size: Callable[[str], ir.Expr]) -> DrawPosition:
    """The element's row-major position over `axes` (the draw's, canonical order), in ulong:
    a draw of 2^32 elements or more counts on, whatever the kernel's index width."""
    e: ir.Expr = ir.Cast(U64, position(axes[0]))
    for a in axes[1:]:
        e = e * ir.Cast(U64, size(a)) + ir.Cast(U64, position(a))
    return DrawPosition(e)


def block_and_word(n: Node, at: DrawPosition) -> tuple[ir.Expr, ir.Expr]:
    """(the Philox block of the element, ulong; which of its words, uint: 0..3 for a uniform
    draw, 0..1, the pair, for a normal one)."""
    per = PER_BLOCK[n.attr]
    shift, mask = per.bit_length() - 1, per - 1
    if at.start is not None and at.lane is not None and at.width % per == 0:
        blk = (ir.Cast(U64, at.start) >> ir.Lit(shift, U64)) + \
            ir.Cast(U64, at.lane >> ir.Lit(shift, "uint"))
        return blk, at.lane & ir.Lit(mask, "uint")
    return (at.linear >> ir.Lit(shift, U64),
            ir.Cast("uint", at.linear & ir.Lit(mask, U64)))


def random_value(n: Node, seed: ir.Expr, offset: ir.Expr, at: DrawPosition
                 ) -> tuple[ir.Expr, tuple[str, ...]]:
    """(node n's value at `at`, in f32, the helpers it calls). seed and offset: the node's i64
    arguments, taken as their 64-bit patterns."""
    blk, word = block_and_word(n, at)
    args = (ir.Cast(U64, seed), ir.Cast(U64, offset), blk, word)
    if n.attr == RandomOp.RAND:
        # the high b bits of the element's word, times 2^-b: exact in the dtype, below 1
        b = uniform_bits(n.dtype)
        bits = ir.Call("mf_rand_bits", args) >> ir.Lit(32 - b, "uint")
        return ir.Cast("float", bits) * ir.Lit(2.0 ** -b, "float"), ("mf_philox", "mf_rand_bits")
    return ir.Call("mf_randn", args), ("mf_philox", "mf_randn")
