"""Counter-based random numbers (`mf.rand`, `mf.randn`): the exact mapping, and the reference's
Philox-4x32-10 in torch int64 arithmetic.

Philox-4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as easy as 1, 2, 3",
SC'11; Random123's `philox4x32` with 10 rounds) maps a 128-bit counter (c0, c1, c2, c3) and a
64-bit key (k0, k1) to four 32-bit words. One round, with M0 = 0xD2511F53, M1 = 0xCD9E8D57:

    hi0:lo0 = M0 * c0        hi1:lo1 = M1 * c2        (32 x 32 -> 64-bit products)
    (c0, c1, c2, c3) = (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0)

and before every round but the first the key is bumped by the Weyl constants
(k0 += 0x9E3779B9, k1 += 0xBB67AE85, mod 2^32).

A draw over axes A (the node's axes, in the kernel's canonical order) gives element e, whose
row-major linear position over A is i (i = sum of pos(a) * the sizes of the axes after a), with
seed s and offset o (both 64-bit two's-complement patterns of the runtime ints):

    key     = (s & 0xffffffff, s >> 32)
    mf.rand:  counter = (lo(i // 4), hi(i // 4), lo(o), hi(o)); word w = output lane i % 4
              value   = (w >> (32 - b)) * 2^-b with b = 24 (f32), 11 (f16), 8 (bf16):
                        every value exact in its dtype, in [0, 1 - 2^-b]
    mf.randn: counter = (lo(i // 2), hi(i // 2), lo(o), hi(o)); words (a, c) = output lanes
              (2 * (i % 2), 2 * (i % 2) + 1)
              u1 = ((a >> 8) + 1) * 2^-24 in (0, 1],  u2 = (c >> 8) * 2^-24 in [0, 1)
              value = sqrt(-2 * log(u1)) * cos(6.2831855 * u2)   (Box-Muller, f32; |value|
                        <= 5.77), rounded to the draw's dtype

Four consecutive elements of a uniform draw (two of a normal one) share one Philox block, so
a schedule computing them together needs one Philox call for them. The offset is a whole
128-bit counter half of its own: (seed, offset) pairs name disjoint streams of 2^66 uniforms;
a training loop passes its step number as the offset.

Bit-identical on every backend and in the reference: the 32-bit words and every `mf.rand`
value. `mf.randn`'s u1 and u2 are bit-identical too; its log, cos and sqrt are each backend's
f32 functions, within a few ulp of each other, so normal values agree to ~1e-6 relative.
"""
from __future__ import annotations

import torch

from .dtypes import DType

M0, M1 = 0xD2511F53, 0xCD9E8D57          # the round's multipliers
W0, W1 = 0x9E3779B9, 0xBB67AE85          # the key schedule's Weyl constants
ROUNDS = 10
MASK = 0xFFFFFFFF

# the mantissa bits a uniform value keeps, by dtype: (w >> (32 - b)) * 2^-b is exact and < 1
UNIFORM_BITS = {"f32": 24, "f16": 11, "bf16": 8}


def uniform_bits(dtype: DType) -> int:
    """How many high bits of its word a uniform value of `dtype` keeps."""
    return UNIFORM_BITS[dtype.name]


def _mulhilo(m: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(hi, lo) 32-bit words of the 64-bit product m * x (x: int64 values in [0, 2^32)),
    in int64 without overflow: x split into 16-bit halves, each partial product < 2^48."""
    lo_part = m * (x & 0xFFFF)                       # < 2^48
    hi_part = m * (x >> 16)                          # < 2^48, weighs 2^16
    low = lo_part + ((hi_part & 0xFFFF) << 16)       # < 2^49
    return (hi_part >> 16) + (low >> 32), low & MASK


def philox(counter: tuple[torch.Tensor, ...], key: tuple[int, int]) -> list[torch.Tensor]:
    """Philox-4x32-10 of `counter` (four int64 tensors of 32-bit words, broadcast together)
    under `key` (two 32-bit Python ints): the four output words, int64 tensors."""
    c0, c1, c2, c3 = (c & MASK for c in counter)
    k0, k1 = key[0] & MASK, key[1] & MASK
    for r in range(ROUNDS):
        if r:
            k0, k1 = (k0 + W0) & MASK, (k1 + W1) & MASK
        hi0, lo0 = _mulhilo(M0, c0)
        hi1, lo1 = _mulhilo(M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return [c0, c1, c2, c3]


def _block(seed: int, offset: int, block: torch.Tensor) -> list[torch.Tensor]:
    """The Philox words of counter (block, offset) under key seed (64-bit patterns)."""
    o = torch.full_like(block, offset & MASK), torch.full_like(block, (offset >> 32) & MASK)
    return philox((block & MASK, block >> 32, *o), (seed & MASK, (seed >> 32) & MASK))


def _lane(words: list[torch.Tensor], lane: torch.Tensor) -> torch.Tensor:
    return torch.stack(words, -1).gather(-1, lane.unsqueeze(-1)).squeeze(-1)


def uniform(seed: int, offset: int, index: torch.Tensor, dtype: DType) -> torch.Tensor:
    """`mf.rand`'s values (float32, each exact in `dtype`) at linear positions `index` (int64,
    >= 0)."""
    w = _lane(_block(seed, offset, index >> 2), index & 3)
    b = uniform_bits(dtype)
    return (w >> (32 - b)).to(torch.float32) * 2.0 ** -b


def normal(seed: int, offset: int, index: torch.Tensor) -> torch.Tensor:
    """`mf.randn`'s values (float32, Box-Muller in f32 arithmetic) at linear positions `index`."""
    words = _block(seed, offset, index >> 1)
    pair = (index & 1) * 2
    a, c = _lane(words, pair), _lane(words, pair + 1)
    u1 = ((a >> 8) + 1).to(torch.float32) * 2.0 ** -24
    u2 = (c >> 8).to(torch.float32) * 2.0 ** -24
    r = torch.sqrt(torch.log(u1) * -2.0)
    return r * torch.cos(u2 * torch.tensor(6.2831855, dtype=torch.float32))


def to_u64(v: int) -> int:
    """A runtime int's 64-bit two's-complement pattern (the seed or offset as the kernel sees
    it)."""
    return int(v) & 0xFFFFFFFFFFFFFFFF
