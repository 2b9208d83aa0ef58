"""The kernels `metalforge doctor` checks: one or more of every family metalforge schedules
(elementwise, row and column reductions, argmax, gathers, attention, packed int4), each with
the `check` options that keep its draws meaningful and, for `--bench`, the inputs of one large
call and torch's (and MLX's) own op for the same work.

The suite ships inside the package (a user with only `pip install metalforge` runs it); files
of the user's own kernels can be added on the command line.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F

import metalforge as mf
from metalforge.quant import quantize

Args = tuple[Any, ...]


@dataclass(frozen=True)
class Bench:
    """One timed call: `make(dtype, device)` builds its arguments; `torch_op(*args)` and
    `mlx_op(mx, *arrays)` do the same work with torch's and MLX's own ops (None: no such op)."""
    make: Callable[[torch.dtype, str], Args]
    torch_op: Optional[Callable[..., Any]] = None
    mlx_op: Optional[Callable[..., Any]] = None


@dataclass(frozen=True)
class SuiteKernel:
    name: str
    kernel: Any
    family: str
    check: dict[str, Any] = field(default_factory=dict)
    dtypes: tuple[str, ...] = ("f32", "f16", "bf16")
    bench: Optional[Bench] = None


@mf.kernel
def silu(x: "T[*B, D]"):
    return x * mf.sigmoid(x)


@mf.kernel
def swiglu(gate: "T[*B, D]", up: "T[*B, D]"):
    return gate * mf.sigmoid(gate) * up


@mf.kernel
def rms_norm(x: "T[*B, D]", w: "T[D]", eps: float = 1e-6):
    return x * mf.rsqrt(mf.mean(x * x, axis="D") + eps) * w


@mf.kernel
def layer_norm(x: "T[*B, D]", w: "T[D]", b: "T[D]", eps: float = 1e-5):
    mu = mf.mean(x, axis="D")
    var = mf.mean((x - mu) * (x - mu), axis="D")
    return (x - mu) * mf.rsqrt(var + eps) * w + b


@mf.kernel
def softmax(x: "T[*B, D]"):
    return mf.softmax(x, axis="D")


@mf.kernel
def column_sum(x: "T[R, D]"):
    return mf.sum(x, axis="R")


@mf.kernel
def row_argmax(x: "T[R, D]"):
    return mf.argmax(x, axis="D")


@mf.kernel
def rope(x: "T[B, H, S, E]", pos: "i32[B, S]", base: float = 10000.0):
    i, half = mf.index("E"), mf.size("E") // 2
    partner = mf.take(x, axis="E", index=mf.where(i < half, i + half, i - half))
    theta = pos * base ** (-2.0 * (i % half) / mf.size("E"))
    out = x * mf.cos(theta) + mf.where(i < half, -partner, partner) * mf.sin(theta)
    return out.to("T")


@mf.kernel
def attention(q: "T[B, (G R), S, E]", k: "T[B, G, L, E]", v: "T[B, G, L, E]",
              scale: float):
    s = mf.sum(q * k, axis="E") * scale
    s = mf.where(mf.index("L") <= mf.index("S") + mf.size("L") - mf.size("S"), s, -mf.inf)
    return mf.sum(mf.softmax(s, axis="L") * v, axis="L")


@mf.kernel
def q4_matvec(wq: "u32[N, K/8]", scales: "T[N, K/GS]", biases: "T[N, K/GS]",
              x: "T[M, K]", GS: mf.Const[int] = 64) -> "T[M, N]":
    return mf.sum((mf.unpack(wq, bits=4) * scales + biases) * x, axis="K")


def _rows(rows: int, cols: int, n: int = 1) -> Callable[[torch.dtype, str], Args]:
    def make(dtype: torch.dtype, device: str) -> Args:
        xs = tuple(torch.randn(rows, cols, dtype=dtype, device=device) for _ in range(n))
        return xs
    return make


def _norm(rows: int, cols: int, bias: bool) -> Callable[[torch.dtype, str], Args]:
    def make(dtype: torch.dtype, device: str) -> Args:
        x = torch.randn(rows, cols, dtype=dtype, device=device)
        w = torch.randn(cols, dtype=dtype, device=device)
        return (x, w, torch.randn(cols, dtype=dtype, device=device)) if bias else (x, w)
    return make


def _decode(dtype: torch.dtype, device: str) -> Args:
    q = torch.randn(1, 32, 1, 128, dtype=dtype, device=device)
    k, v = (torch.randn(1, 8, 4096, 128, dtype=dtype, device=device) for _ in range(2))
    return q, k, v, 128 ** -0.5


def _q4(dtype: torch.dtype, device: str) -> Args:
    w = torch.randn(4096, 4096, dtype=dtype, device=device)
    wq, s, b = quantize(w, group_size=64, bits=4)
    return wq, s, b, torch.randn(1, 4096, dtype=dtype, device=device)


def _sdpa(q, k, v, scale):
    return F.scaled_dot_product_attention(q, k, v, scale=scale, is_causal=False, enable_gqa=True)


SUITE: tuple[SuiteKernel, ...] = (
    SuiteKernel("silu", silu, "elementwise",
          bench=Bench(_rows(4096, 4096), F.silu, lambda mx, x: x * mx.sigmoid(x))),
    SuiteKernel("swiglu", swiglu, "elementwise",
          bench=Bench(_rows(4096, 4096, 2), lambda g, u: F.silu(g) * u)),
    SuiteKernel("rms_norm", rms_norm, "row",
          bench=Bench(_norm(4096, 4096, False),
                      lambda x, w: F.rms_norm(x, (x.shape[-1],), w, eps=1e-6),
                      lambda mx, x, w: mx.fast.rms_norm(x, w, 1e-6))),
    SuiteKernel("layer_norm", layer_norm, "row",
          bench=Bench(_norm(4096, 4096, True),
                      lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b),
                      lambda mx, x, w, b: mx.fast.layer_norm(x, w, b, 1e-5))),
    SuiteKernel("softmax", softmax, "row",
          bench=Bench(_rows(4096, 4096), lambda x: torch.softmax(x, -1),
                      lambda mx, x: mx.softmax(x, axis=-1))),
    SuiteKernel("column_sum", column_sum, "column",
          bench=Bench(_rows(4096, 4096), lambda x: x.sum(0))),
    SuiteKernel("row_argmax", row_argmax, "row"),
    SuiteKernel("rope", rope, "gather", check={"values": {"pos": (0, 16), "base": (100.0, 1e5)},
                                          "dims": {"E": [2, 8, 34, 64]}}),
    SuiteKernel("attention", attention, "attention",
          bench=Bench(_decode, lambda q, k, v, s: _sdpa(q, k, v, s))),
    SuiteKernel("q4_matvec", q4_matvec, "quant", dtypes=("f32", "f16"),
          bench=Bench(_q4)),
)


def by_name(names: Optional[list[str]]) -> tuple[SuiteKernel, ...]:
    """The suite's entries named (all of them for None); an unknown name is a ValueError that
    lists the suite."""
    if not names:
        return SUITE
    known = {e.name: e for e in SUITE}
    bad = [n for n in names if n not in known]
    if bad:
        raise ValueError(f"no kernel {', '.join(map(repr, bad))} in the doctor's suite; it has: "
                         f"{', '.join(known)}")
    return tuple(known[n] for n in names)
