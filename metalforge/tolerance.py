"""The tolerance policy: how close a kernel's output must be to its reference.

An element passes when

    |got - expected| <= atol + rtol * |expected|          (NaN == NaN; ±inf must match exactly)

with, for the lowest-precision float dtype ``d`` the kernel touches and ``n`` the summed length
of its accumulating reductions (sum / mean / prod; max, min, argmax and argmin are exact):

    rtol = BASE[d] + ACCUMULATION * sqrt(n)
    atol = rtol * max(scale, TINY[d])

``BASE`` covers rounding the stored result (f32 1e-5, f16 1e-3, bf16 1e-2: one unit in the last
place of the storage type, plus transcendental-function differences). ``ACCUMULATION * sqrt(n)``
is the f32 accumulation error of a reduction summed in a different order than torch sums it
(f16/bf16 accumulate in f32, so this term does not depend on the storage dtype). ``scale`` is the
magnitude of the numbers involved (the largest finite |value| fed to the kernel, or fed to its
reductions when that is known), so ``atol`` is relative to the problem, not to 1: tiny inputs are
compared tightly, large ones are not failed for cancellation both sides suffer.

Ill-conditioned outputs: a sum's rounding error can be amplified by what follows it (LayerNorm
of a constant row: x - mean(x) is pure rounding, multiplied by rsqrt(var + eps), ~316 for
eps = 1e-5), and any fp32 evaluation, torch's included, is then that far off. `check`
measures this per element (`testing.slack.reduction_slack`: how far the reference's outputs
move when every float sum is off by ACCUMULATION * sqrt(n) * sum(|terms|), either way, and,
where a later reduction compares a sum's elements (attention's scores), with a sign of its own
per element) and passes it to `compare` as ``slack``, added to the allowed difference; where
the reference is NaN or ±inf and such a moved reference is not, or the other way round (the
residue times an infinite weight, or 0/0 with eps = 0), the kernel may give what the moved
one gives (``alternatives``).

Integer and bool outputs must be equal. Shapes and dtypes must be equal.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Optional

import torch

from .dtypes import ALL, DType
from .graph import Op, ReduceOp, ScanOp

BASE = {"f32": 1e-5, "f16": 1e-3, "bf16": 1e-2}
TINY = {"f32": torch.finfo(torch.float32).tiny, "f16": torch.finfo(torch.float16).tiny,
        "bf16": torch.finfo(torch.bfloat16).tiny}
ACCUMULATION = 4 * torch.finfo(torch.float32).eps     # per sqrt(element) of a summed reduction
_PRECISION_ORDER = ("bf16", "f16", "f32")              # lowest precision first
ACCUMULATING = (ReduceOp.SUM, ReduceOp.PROD)        # mean is traced as sum / size
ACCUMULATING_SCANS = (ScanOp.CUMSUM, ScanOp.CUMPROD, ScanOp.LOGCUMSUMEXP, ScanOp.SEGSUM)


@dataclass(frozen=True)
class Tolerance:
    dtype: str                  # the float dtype whose rounding it allows for ("exact" for ints)
    atol: float
    rtol: float
    reduction_length: int = 0
    scale: float = 1.0

    @property
    def exact(self) -> bool:
        return self.dtype == "exact"

    def describe(self) -> str:
        if self.exact:
            return "exact equality (integer/bool output)"
        return (f"atol={self.atol:.3g}, rtol={self.rtol:.3g} "
                f"(dtype {self.dtype}, reduction length {self.reduction_length}, "
                f"scale {self.scale:.3g})")


def tolerance(dtype: str | DType | torch.dtype | None, *, reduction_length: int = 0,
              scale: float = 1.0) -> Tolerance:
    """The tolerance for results computed at float ``dtype`` (None or an int dtype: exact)."""
    name = _name(dtype)
    if name not in BASE:
        return Tolerance("exact", 0.0, 0.0, reduction_length, scale)
    if reduction_length < 0:
        raise ValueError(f"reduction_length must be >= 0, got {reduction_length}")
    if not math.isfinite(scale) or scale < 0:
        raise ValueError(f"scale must be a finite non-negative number, got {scale}")
    rtol = BASE[name] + ACCUMULATION * math.sqrt(reduction_length)
    atol = rtol * max(scale, TINY[name])
    return Tolerance(name, atol, rtol, reduction_length, scale)


def lowest_precision(dtypes: Iterable[str | DType | torch.dtype]) -> Optional[str]:
    """The lowest-precision float dtype among ``dtypes`` (None when none is a float)."""
    names = {_name(d) for d in dtypes}
    for name in _PRECISION_ORDER:
        if name in names:
            return name
    return None


def reduction_length(graph, sizes: dict[str, int]) -> int:
    """Summed length of the accumulating reductions of ``graph`` (``sizes``: axis -> size)."""
    total = 0
    for node in graph.reductions():
        kind, axis = node.attr
        if kind in ACCUMULATING:
            total += int(sizes.get(axis, 0))
    for node in graph.nodes():          # scans that accumulate: as long as their axis
        if node.op == Op.SCAN and node.attr[0] in ACCUMULATING_SCANS:
            total += int(sizes.get(node.attr[1], 0))
    return total


def magnitude(values: Iterable) -> float:
    """The largest finite |value| over tensors and Python numbers (ints count: they feed float
    math too; bools do not). 0 if there is none."""
    best = 0.0
    for v in values:
        if isinstance(v, torch.Tensor):
            if v.dtype == torch.bool or v.numel() == 0:
                continue
            a = v.detach().to(torch.float64).abs()
            a = a[torch.isfinite(a)]
            if a.numel():
                best = max(best, float(a.max()))
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            best = max(best, abs(float(v)))
    return best


# --------------------------------------------------------------------------- comparison


@dataclass(frozen=True)
class Breach:
    """Why an output is not close enough: the worst element and how many elements fail."""
    output: int                 # which output (0 for a single result)
    kind: str                   # "shape" | "dtype" | "nan" | "inf" | "value"
    message: str
    index: Optional[tuple[int, ...]] = None
    got: Optional[float] = None
    expected: Optional[float] = None
    mismatched: int = 0
    total: int = 0

    def __str__(self) -> str:
        return self.message


def compare(got: torch.Tensor, expected: torch.Tensor, tol: Tolerance,
            output: int = 0, slack: Optional[torch.Tensor] = None,
            alternatives: Optional[Iterable[torch.Tensor]] = None) -> Optional[Breach]:
    """None when ``got`` matches ``expected`` under ``tol``, else the `Breach`. ``slack``: an
    extra allowed difference per element (the output's sensitivity to reduction rounding).
    ``alternatives``: the reference with its sums off by their allowed rounding; where the
    reference is NaN or ±inf and one of them is not, or the other way round, ``got`` may match
    that one instead (LayerNorm of a constant row: x - mean(x) is 0 or a rounding residue, so
    with an infinite weight the output is NaN or ±inf, and with eps = 0 it is 0/0 = NaN or
    ±w + b, depending on the last bit of the mean)."""
    label = f"output {output}"
    if tuple(got.shape) != tuple(expected.shape):
        return Breach(output, "shape", f"{label}: shape {tuple(got.shape)}, expected "
                      f"{tuple(expected.shape)}")
    if got.dtype != expected.dtype:
        return Breach(output, "dtype", f"{label}: dtype {got.dtype}, expected {expected.dtype}")
    total = expected.numel()
    if total == 0:
        return None
    g = got.detach().cpu()
    e = expected.detach().cpu()
    exact = tol.exact or not e.is_floating_point()
    m = _exact_mismatch(g, e) if exact else _float_mismatch(g, e, tol, slack, alternatives)
    mismatched = int(m.bad.sum())
    if mismatched == 0:
        return None
    flat = int(torch.argmax(m.score.reshape(-1)))
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), e.shape))
    gv = _item(g.reshape(-1)[flat])
    ev = _item(e.reshape(-1)[flat])
    if exact:
        kind, detail = "value", f"got {gv!r}, expected {ev!r} (exact equality required)"
    else:
        kind, detail = _worst_detail(m, flat, gv, ev, tol, slack)
    extra = float(slack.reshape(-1)[flat]) if slack is not None else 0.0
    message = (f"{label}: {mismatched} of {total} elements out of tolerance; worst at index "
               f"{list(index)}: {detail}; tolerance {tol.describe()}"
               + (f" + sensitivity to reduction rounding {extra:.3g}" if slack is not None and
                  not exact else ""))
    return Breach(output, kind, message, index, gv, ev, mismatched, total)


@dataclass
class _Mismatch:
    """Which elements are out of tolerance (`bad`), how badly (`score`: the worst is the
    largest; NaN/inf mismatches score inf) and, for floats, which are NaN/inf mismatches."""
    bad: torch.Tensor
    score: torch.Tensor
    nan_bad: Optional[torch.Tensor] = None
    inf_bad: Optional[torch.Tensor] = None


def _exact_mismatch(g: torch.Tensor, e: torch.Tensor) -> _Mismatch:
    bad = g != e
    return _Mismatch(bad, bad.to(torch.float64))


def _float_mismatch(g: torch.Tensor, e: torch.Tensor, tol: Tolerance,
                    slack: Optional[torch.Tensor],
                    alternatives: Optional[Iterable[torch.Tensor]]) -> _Mismatch:
    g = g.to(torch.float64)
    e = e.to(torch.float64)
    gn, en = torch.isnan(g), torch.isnan(e)
    gi, ei = torch.isinf(g), torch.isinf(e)
    nan_bad = gn != en
    inf_bad = (gi | ei) & ~(gn | en) & (g != e)
    for a in alternatives or ():
        # where the exact reference is NaN/inf but one with its sums off by their allowed
        # rounding is not (or the other way round), got may be what that one gives
        a = a.detach().cpu().to(torch.float64).reshape(e.shape)
        af = torch.isfinite(a)
        same = (gn & torch.isnan(a)) | (gi & (g == a)) | \
            (torch.isfinite(g) & af & ((g - a).abs() <= tol.atol + tol.rtol * a.abs()))
        nan_bad = nan_bad & ~same
        inf_bad = inf_bad & ~same
    finite = ~(gn | en | gi | ei)
    allowed = tol.atol + tol.rtol * e.abs()
    if slack is not None:
        allowed = allowed + slack.detach().cpu().to(torch.float64).reshape(e.shape)
    diff = torch.where(finite, (g - e).abs(), torch.zeros_like(g))
    bad = nan_bad | inf_bad | (finite & (diff > allowed))
    # worst element: NaN/inf mismatches first, then the largest diff / allowed ratio
    score = torch.where(nan_bad | inf_bad, torch.full_like(g, math.inf),
                        diff / allowed.clamp_min(1e-300))
    score = torch.where(bad, score, torch.full_like(g, -1.0))
    return _Mismatch(bad, score, nan_bad, inf_bad)


def _worst_detail(m: _Mismatch, flat: int, gv: float, ev: float, tol: Tolerance,
                  slack: Optional[torch.Tensor]) -> tuple[str, str]:
    """(kind, text) of the worst float element: "nan", "inf" or "value" with its |diff|."""
    assert m.nan_bad is not None and m.inf_bad is not None
    kind = ("nan" if bool(m.nan_bad.reshape(-1)[flat])
            else "inf" if bool(m.inf_bad.reshape(-1)[flat]) else "value")
    if kind != "value":
        return kind, f"got {gv!r}, expected {ev!r} ({'NaN' if kind == 'nan' else 'inf'} mismatch)"
    extra = float(slack.reshape(-1)[flat]) if slack is not None else 0.0
    allowed = tol.atol + tol.rtol * abs(ev) + extra if math.isfinite(ev) else math.nan
    return kind, f"got {gv!r}, expected {ev!r}, |diff| {abs(gv - ev):.6g} > allowed {allowed:.6g}"


def _item(x: torch.Tensor):
    v = x.item()
    return float(v) if isinstance(v, float) else v


def _name(dtype) -> Optional[str]:
    if dtype is None:
        return None
    if isinstance(dtype, DType):
        return dtype.name
    if isinstance(dtype, torch.dtype):
        for d in ALL.values():
            if d.torch == dtype:
                return d.name
        return str(dtype)
    return str(dtype)
