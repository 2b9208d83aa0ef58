"""A tensor argument built from what a strategy drew: values from a family and a seed, and a
memory layout.

Tensor data is not drawn element by element: `metalforge.testing.strategies` draws a value
family and a seed, and `make_values` builds the tensor from them with torch's generator (fast,
shrinkable, reproducible from a report alone); `materialise` lays it out in memory as a drawn
layout (transposed, strided, offset, expanded), poisoning the storage around it.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import torch

from ..dtypes import DType

# --------------------------------------------------------------------------- values

FLOAT_FAMILIES = ("normal", "shifted", "mixed", "large", "tiny", "zeros", "special")
INT_FAMILIES = ("small", "wide", "zeros")
BOOL_FAMILIES = ("random", "true", "false")
NONFINITE_FAMILIES = ("special",)
# An example either has no ±inf/NaN input, or has some and pairs them only with moderate values:
# inf times a value that underflowed in f32 but not in float64 (0 * inf = NaN vs ±inf) is a
# precision artefact, not a kernel bug, and must not fail a check.
MODERATE_FAMILIES = ("normal", "zeros", "special")


def families(dtype: DType, *, nonfinite: bool = True, large: bool = True,
             zeros: bool = True) -> tuple[str, ...]:
    """The value families drawn for ``dtype`` (``nonfinite``: ±inf/NaN where the op is defined on
    them; ``large``: magnitudes that overflow conversions; ``zeros``: divisors may be 0)."""
    if dtype.kind == "bool":
        return BOOL_FAMILIES
    if dtype.is_int:
        extra = ("bits",) if dtype.kind == "uint" else ()     # packed words: every bit set
        return tuple(f for f in INT_FAMILIES + extra if (zeros or f != "zeros"))
    return tuple(f for f in FLOAT_FAMILIES
                 if (nonfinite or f not in NONFINITE_FAMILIES) and (large or f != "large"))


def _large_range(dtype: DType) -> tuple[float, float]:
    if dtype.name == "f16":
        return 1e2, 6e4
    return 1e2, 1e12


def make_values(dtype: DType, shape: Sequence[int], family: str, seed: int, *,
                value_range: Optional[tuple[float, float]] = None, zeros: bool = True,
                negative: bool = True) -> torch.Tensor:
    """A CPU tensor of ``dtype``/``shape`` whose values come from ``family`` (or, when given,
    uniform in ``value_range``), deterministic in ``seed``.

    Float families: normal (N(0,1)), shifted (N(0,1) + c, |c| in 2..100 with a random sign: one
    sign throughout, a mean far from 0 — what naive variances and wrong max/min identities get
    wrong), mixed (each element normal, large, tiny or zero), large
    (|x| log-uniform in 1e2..6e4 for f16, 1e2..1e12 otherwise), tiny (|x| log-uniform from the
    dtype's smallest normal up 2**12 times), zeros (±0), special (normal with ±inf and NaN
    sprinkled in). Int families: small (-3..3, 0..6 unsigned), wide (± 2**(bits/2 - 1), so
    products do not overflow), zeros, and for unsigned types bits (uniform over every value:
    packed words with all their fields). Bool: random, true, false. ``zeros=False`` keeps int values
    away from 0 (divisors); ``negative=False`` keeps them >= 0 (shift amounts).
    """
    g = torch.Generator().manual_seed(int(seed))
    shape = tuple(int(s) for s in shape)
    n = math.prod(shape)
    if value_range is not None:
        lo, hi = value_range
        if dtype.is_float:
            v = torch.rand(n, generator=g, dtype=torch.float64) * (hi - lo) + lo
        else:
            v = torch.randint(int(lo), int(hi) + 1, (n,), generator=g, dtype=torch.int64)
        return v.to(dtype.torch).reshape(shape)
    if dtype.kind == "bool":
        return _bools(shape, family, g)
    if dtype.is_int:
        v = _ints(dtype, n, family, g, zeros=zeros, negative=negative)
    else:                       # floats: built in float64, rounded once to the storage dtype
        v = _floats(dtype, n, family, g)
    return v.to(dtype.torch).reshape(shape)


def _bools(shape: tuple[int, ...], family: str, g: torch.Generator) -> torch.Tensor:
    if family == "true":
        return torch.ones(shape, dtype=torch.bool)
    if family == "false":
        return torch.zeros(shape, dtype=torch.bool)
    return (torch.rand(math.prod(shape), generator=g) < 0.5).reshape(shape)


def _ints(dtype: DType, n: int, family: str, g: torch.Generator, *, zeros: bool,
          negative: bool) -> torch.Tensor:
    """``n`` int64 values of an integer family (`make_values`)."""
    bits = dtype.itemsize * 8
    unsigned = dtype.kind == "uint" or not negative
    if family == "zeros":
        v = torch.zeros(n, dtype=torch.int64)
    elif family == "bits":
        v = torch.randint(0, 2 ** bits, (n,), generator=g, dtype=torch.int64)
    else:
        hi = 6 if family == "small" else 2 ** (bits // 2 - 1)
        lo = 0 if unsigned else -hi if family == "wide" else -3
        if family == "small" and not unsigned:
            hi = 3
        v = torch.randint(lo, hi + 1, (n,), generator=g, dtype=torch.int64)
    if not zeros:
        v = torch.where(v == 0, torch.ones_like(v), v)
    return v


def _floats(dtype: DType, n: int, family: str, g: torch.Generator) -> torch.Tensor:
    """``n`` float64 values of a float family (`make_values`)."""
    sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).to(torch.float64)

    def loguniform(lo: float, hi: float) -> torch.Tensor:
        u = torch.rand(n, generator=g, dtype=torch.float64)
        return torch.exp(math.log(lo) + u * (math.log(hi) - math.log(lo)))

    tiny = float(torch.finfo(dtype.torch).tiny)
    if family == "normal":
        v = torch.randn(n, generator=g, dtype=torch.float64)
    elif family == "shifted":
        c = (2 + 98 * torch.rand(1, generator=g, dtype=torch.float64)) * \
            (1 if torch.rand(1, generator=g).item() < 0.5 else -1)
        v = torch.randn(n, generator=g, dtype=torch.float64) + c
    elif family == "large":
        v = sign * loguniform(*_large_range(dtype))
    elif family == "tiny":
        v = sign * loguniform(tiny, tiny * 2 ** 12)
    elif family == "zeros":
        v = sign * 0.0
    elif family == "mixed":
        pick = torch.randint(0, 4, (n,), generator=g)
        normal = torch.randn(n, generator=g, dtype=torch.float64)
        v = torch.stack([normal, sign * loguniform(*_large_range(dtype)),
                         sign * loguniform(tiny, tiny * 2 ** 12), sign * 0.0])
        v = v.gather(0, pick.unsqueeze(0)).squeeze(0)
    elif family == "special":
        v = torch.randn(n, generator=g, dtype=torch.float64)
        pick = torch.randint(0, 10, (n,), generator=g)
        v = torch.where(pick == 0, math.nan, v)
        v = torch.where(pick == 1, math.inf, v)
        v = torch.where(pick == 2, -math.inf, v)
    else:
        raise ValueError(f"unknown value family '{family}' for {dtype.name} (families: "
                         f"{', '.join(families(dtype))})")
    return v


# --------------------------------------------------------------------------- layouts

LAYOUTS = ("contiguous", "transposed", "strided", "offset", "expanded")
# elements of storage offset for the "offset" layout (breaks 16-byte alignment)
OFFSET = 3


def layouts_for(shape: Sequence[int]) -> tuple[str, ...]:
    """The layouts that make sense for a tensor of ``shape``."""
    if math.prod(shape) == 0 or len(shape) == 0:
        return ("contiguous",)
    out = ["contiguous", "strided", "offset"]
    if len(shape) >= 2:
        out.insert(1, "transposed")
    if any(s > 1 for s in shape):
        out.append("expanded")
    return tuple(out)


def _poison(dtype: torch.dtype) -> Any:
    if dtype.is_floating_point:
        return math.nan
    if dtype == torch.bool:
        return True
    return torch.iinfo(dtype).max


def materialise(values: torch.Tensor, layout: str, *, device: str | torch.device = "cpu"
                ) -> torch.Tensor:
    """``values`` laid out in memory as ``layout`` (same logical values except "expanded", which
    repeats the first slice along the first dim longer than 1). Storage around and between the
    elements is filled with NaN / max-int so a kernel reading the wrong element shows it.
    """
    shape = tuple(values.shape)
    v = values.to(device)
    if layout == "contiguous" or math.prod(shape) == 0:
        return v.contiguous()
    if layout == "transposed":
        return v.transpose(-1, -2).contiguous().transpose(-1, -2)
    if layout == "strided":
        base = torch.full(shape[:-1] + (2 * shape[-1],), _poison(v.dtype), dtype=v.dtype,
                          device=v.device)
        base[..., ::2] = v
        return base[..., ::2]
    if layout == "offset":
        flat = torch.full((v.numel() + OFFSET,), _poison(v.dtype), dtype=v.dtype,
                          device=v.device)
        flat[OFFSET:] = v.reshape(-1)
        return flat[OFFSET:].view(shape)
    if layout == "expanded":
        dim = next(i for i, s in enumerate(shape) if s > 1)
        return v.narrow(dim, 0, 1).expand(shape)
    raise ValueError(f"unknown layout '{layout}' (layouts: {', '.join(LAYOUTS)})")


def describe_layout(t: torch.Tensor, layout: str) -> str:
    return f"{layout} (strides {tuple(t.stride())}, storage offset {t.storage_offset()})"
