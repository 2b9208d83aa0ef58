"""u64 arithmetic on int64 tensors: what the reference needs where torch has no uint64 math.

The reference holds every integer as int64; a u64 value is held as its bit pattern (2**64 - 1
is -1). Addition, subtraction, multiplication, the bitwise ops, left shifts and conversions to
narrower integers are the same on the pattern. What depends on the sign is here: ordering
(comparisons, maximum/minimum, max/min/argmax/argmin reductions), logical right shifts, unsigned
division and remainder, and conversion to a float. Each function takes and gives int64 tensors
(bool for comparisons), as the kernel's `ulong` arithmetic does.
"""
from __future__ import annotations

from typing import Callable

import torch

_SIGN = -(1 << 63)
_TWO64 = float(1 << 64)


def ordered(t: torch.Tensor) -> torch.Tensor:
    """A pattern whose signed order is the unsigned order of `t` (the sign bit flipped)."""
    return torch.bitwise_xor(t, torch.tensor(_SIGN, dtype=torch.int64, device=t.device))


def compare(op: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
            a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """An ordering comparison (or eq/ne) of u64 patterns."""
    return op(ordered(a), ordered(b))


def extreme(op: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
            a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """maximum/minimum of u64 patterns."""
    return ordered(op(ordered(a), ordered(b)))


def reduce_extreme(fn: Callable[..., torch.Tensor], x: torch.Tensor, dim: int,
                   index: bool) -> torch.Tensor:
    """amax/amin (index=False: a u64 pattern) or argmax/argmin (index=True) along `dim`."""
    r = fn(ordered(x), dim=dim)
    return r if index else ordered(r)


def shift_right(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a >> b, logical: 0 for a shift by 64 or more (as the kernel's mf_shr gives)."""
    b = b.to(torch.int64)
    ok = (b >= 0) & (b < 64)
    s = torch.where(ok, b, torch.zeros_like(b))
    # the bits the arithmetic shift copied from the sign: cleared by a mask of 64 - s ones
    mask = torch.bitwise_left_shift(torch.ones_like(s), 64 - s) - 1
    r = torch.bitwise_and(torch.bitwise_right_shift(a, s), torch.where(s == 0, -1, mask))
    return torch.where(ok, r, torch.zeros_like(r))


def to_float(a: torch.Tensor, dt: torch.dtype) -> torch.Tensor:
    """The value a u64 pattern stands for, as a float tensor of dtype `dt`."""
    f = a.to(torch.float64)
    return torch.where(a < 0, f + _TWO64, f).to(dt)


def divmod_(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(a // b, a % b) of u64 patterns (b != 0): the quotient of a >> 1 by b, doubled, is
    within one of the true quotient (Hacker's Delight 9-3); a divisor of 2**63 or more gives
    0 or 1."""
    big = b < 0
    safe = torch.where(big, torch.ones_like(b), b)
    q = torch.bitwise_left_shift(
        torch.div(shift_right(a, torch.ones_like(a)), safe, rounding_mode="floor"), 1)
    r = a - q * safe
    fix = compare(torch.ge, r, safe)
    q, r = torch.where(fix, q + 1, q), torch.where(fix, r - safe, r)
    q_big = compare(torch.ge, a, b).to(torch.int64)
    return torch.where(big, q_big, q), torch.where(big, a - q_big * b, r)
