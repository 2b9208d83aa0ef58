"""Tracing `mf.rand` / `mf.randn`: the checks at the user's line and the RANDOM node.

The draw's axes are said explicitly, by name (`mf.rand(seed, "R", "D")`) or as another value's
(`mf.rand(seed, like=x)`): a node's value is defined by its own axes, so a draw never takes
the axes of whatever it is later combined with, and `mf.rand(seed, "D")` in a [R, D] kernel is
one row of numbers shared by every row (broadcast by name, as any [D] value is). The axes are
kept in the kernel's canonical order, which fixes the row-major linear position each element's
counter is built from (`metalforge.philox`).
"""
from __future__ import annotations

from typing import Any

from ..dtypes import BF16, BOOL, F16, F32, I64
from ..graph import Node, Op, RandomOp
from .tracer import Sym, Trace

RANDOM_DTYPES = (F32, F16, BF16)
_I64_RANGE = (-(1 << 63), 1 << 63)


def random(tr: Trace, kind: RandomOp, seed: Any, axes: tuple[Any, ...], like: Any,
           offset: Any, dtype: Any) -> Sym:
    """The RANDOM node of `mf.rand` / `mf.randn` (see their docstrings)."""
    fn = f"mf.{kind}"
    s = _integer(tr, seed, "seed", fn)
    o = _integer(tr, offset, "offset", fn)
    names = _draw_axes(tr, axes, like, fn)
    dt = tr.resolve_dtype(dtype)
    if dt not in RANDOM_DTYPES:
        raise tr.error(f"{fn}: dtype={dt} is not supported; random numbers are f32 (the "
                       "default), f16 or bf16")
    return tr.sym(tr.node(Op.RANDOM, (s, o), dt, names, attr=kind))


def _integer(tr: Trace, v: Any, what: str, fn: str) -> Node:
    """The seed or offset as an i64 node: a Python int or a zero-dim integer kernel value
    (a runtime `int` argument, an mf.Const[int], arithmetic on them)."""
    hint = (f"pass a Python int or a runtime `int` argument of the kernel (e.g. "
            f"`{what}: int`), so changing it needs no recompile")
    if isinstance(v, bool) or (not isinstance(v, Sym) and not isinstance(v, int)):
        raise tr.error(f"{fn}: {what} must be an integer, got {type(v).__name__} {v!r}; {hint}")
    if isinstance(v, int) and not _I64_RANGE[0] <= v < _I64_RANGE[1]:
        raise tr.error(f"{fn}: {what}={v} does not fit in 64 bits (signed); the Philox key and "
                       "counter take the 64-bit two's-complement pattern of an int in "
                       "[-2**63, 2**63)")
    n = tr.as_node(v, f"the {what}")
    if n.dtype.is_float or n.dtype is BOOL:
        raise tr.error(f"{fn}: {what} must be an integer, got a {n.dtype} value; {hint}")
    if n.axes:
        raise tr.error(f"{fn}: {what} must be one integer for the whole draw, got a value over "
                       f"axes {list(n.axes)}; {hint}")
    return tr.cast(n, I64)


def _draw_axes(tr: Trace, axes: tuple[Any, ...], like: Any, fn: str) -> tuple[str, ...]:
    """The draw's axes in canonical order: the names given, or those of `like`."""
    if like is not None and axes:
        raise tr.error(f"{fn}: give the draw's axes either by name or as like=x, not both")
    if like is not None:
        if not isinstance(like, Sym):
            raise tr.error(f"{fn}: like= takes a kernel value whose axes the draw takes, got "
                           f"{like!r}")
        names = like.axes
    else:
        for a in axes:
            if isinstance(a, Sym):
                raise tr.error(f"{fn}: to draw over a value's axes write {fn}(seed, like=x); "
                               "positional arguments after the seed are axis names")
        names = tuple(tr.check_axis(a, fn) for a in axes)
        if len(set(names)) != len(names):
            raise tr.error(f"{fn}: axis names {list(names)} repeat an axis")
    if not names:
        raise tr.error(f"{fn}: say which axes the draw varies over: {fn}(seed, \"R\", \"D\") "
                       f"or {fn}(seed, like=x); one number per element of those axes")
    return tuple(sorted(names, key=tr.order.__getitem__))
