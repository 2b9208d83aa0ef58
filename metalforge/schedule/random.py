"""Lowering `mf.rand` / `mf.randn` (a RANDOM node) to one element's value: the helper calls of
codegen/helpers.metal (`mf_philox` under `mf_rand_bits` / `mf_randn`) at the element's linear
position over the draw's axes. The mapping is `metalforge.philox`'s, which the reference
implements independently in torch.
"""
from __future__ import annotations

from typing import Callable

from .. import ir
from ..graph import Node, RandomOp
from ..philox import uniform_bits

U64 = "ulong"                 # the counter's and key's 64-bit words: Philox's own types


def linear_position(axes: tuple[str, ...], position: Callable[[str], ir.Expr],
                    size: Callable[[str], ir.Expr]) -> ir.Expr:
    """The element's row-major position over `axes` (the draw's, canonical order), in ulong:
    a draw of 2^32 elements or more counts on, whatever the kernel's index width."""
    e: ir.Expr = ir.Cast(U64, position(axes[0]))
    for a in axes[1:]:
        e = e * ir.Cast(U64, size(a)) + ir.Cast(U64, position(a))
    return e


def random_value(n: Node, seed: ir.Expr, offset: ir.Expr, linear: ir.Expr
                 ) -> tuple[ir.Expr, tuple[str, ...]]:
    """(node n's value at linear position `linear`, in f32, the helpers it calls). seed and
    offset: the node's i64 arguments, taken as their 64-bit patterns."""
    args = (ir.Cast(U64, seed), ir.Cast(U64, offset), linear)
    if n.attr == RandomOp.RAND:
        # the high b bits of the element's word, times 2^-b: exact in the dtype, below 1
        b = uniform_bits(n.dtype)
        bits = ir.Call("mf_rand_bits", args) >> ir.Lit(32 - b, "uint")
        return ir.Cast("float", bits) * ir.Lit(2.0 ** -b, "float"), ("mf_philox", "mf_rand_bits")
    return ir.Call("mf_randn", args), ("mf_philox", "mf_randn")
