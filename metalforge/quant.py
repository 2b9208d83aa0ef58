"""Affine group quantization of weights in MLX's layout, on torch tensors.

`quantize(w)` gives the same packed words, scales and biases as MLX's `mx.quantize(w)` (its CPU
implementation), bit for bit; `dequantize` gives what `mx.dequantize` gives. Everything is plain
torch arithmetic, so it runs on any device. (MLX's Metal and CUDA quantize kernels differ from
its CPU one: they round half away from zero and start the group max at 0, so ties and
all-negative groups can get other codes there.)

The layout (MLX "affine" mode):
- The last dim K is cut into groups of `group_size` consecutive values; each group has one scale
  and one bias, stored in w's dtype: `scales`, `biases` have shape `[..., K / group_size]`.
- Each value becomes an integer code q in [0, 2**bits - 1] with value ~= q * scale + bias.
- Codes are packed into uint32 words, `[..., K * bits / 32]`, as one little-endian bit stream per
  row: code k occupies bits [k * bits, (k + 1) * bits) of the row, word j holding bits
  [32 j, 32 j + 32), lowest bits first. For bits 2, 4, 8 a word holds 32 / bits whole codes; for
  3, 5 and 6 codes straddle word boundaries, and `pack_layout(bits)` codes fill a whole number of
  words.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from .errors import BindingError, QuantizationError, ShapeError, UnsupportedConstruct

SUPPORTED_BITS = (2, 3, 4, 5, 6, 8)
SUPPORTED_GROUP_SIZES = (32, 64, 128)
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

_EPS = 1e-7          # smallest |scale| MLX uses (as a float32), e.g. for constant groups
_WORD_MASK = 0xFFFFFFFF


def pack_layout(bits: int) -> tuple[int, int]:
    """(codes, words): the smallest run of codes that fills whole uint32 words at `bits` bits.

    Example: ``quant.pack_layout(3) == (32, 3)``"""
    _check_bits(bits)
    codes = 32 // math.gcd(32, bits)
    return codes, codes * bits // 32


def quantize(w: torch.Tensor, group_size: int = 64,
             bits: int = 4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize `w` [..., K] in groups of `group_size` along K to `bits`-bit codes.

    Returns (wq: uint32 [..., K*bits/32], scales: [..., K/group_size], biases: same), scales and
    biases in w's dtype (f32, f16 or bf16), bit-identical to `mx.quantize(w, group_size, bits)`.
    The arithmetic is float32 whatever w's dtype; scales and biases are rounded to w's dtype
    only when stored (codes are computed with the float32 scale, as MLX does).

    Example: ``wq, scales, biases = quant.quantize(linear.weight, group_size=64, bits=4)``
    """
    _check_group_size(group_size)
    _check_bits(bits)
    _check_float("w", w)
    if w.dim() == 0 or w.shape[-1] % group_size:
        raise ShapeError(f"quantize: w's last dim must be a multiple of group_size={group_size}, "
                         f"but w has shape {tuple(w.shape)}")
    lead, k = tuple(w.shape[:-1]), w.shape[-1]
    rows, groups = math.prod(lead), k // group_size
    x = w.detach().reshape(rows * groups, group_size).to(torch.float32)

    w_max = x.amax(dim=1, keepdim=True)
    w_min = x.amin(dim=1, keepdim=True)
    n_bins = float((1 << bits) - 1)
    eps = torch.tensor(_EPS, dtype=torch.float32, device=x.device)
    scale = torch.maximum((w_max - w_min) / n_bins, eps)
    _check_finite_groups(w_max, w_min, scale, lead, k, group_size)

    # The value of larger magnitude (the "edge"; the max on a tie) is represented exactly: it
    # gets code 0 and becomes the bias, and the scale is adjusted so that 0.0 lies on the grid
    # (at code -q0). The scale is negative when the edge is the max.
    neg_edge = w_min.abs() > w_max.abs()
    scale = torch.where(neg_edge, scale, -scale)
    edge = torch.where(neg_edge, w_min, w_max)
    q0 = torch.round(edge / scale)                       # round half to even, like rint
    at_zero = q0 == 0                                    # only if |edge| < 5e-8 (scale = eps)
    scale = torch.where(at_zero, scale, edge / q0)
    bias = torch.where(at_zero, torch.zeros_like(edge), edge)

    codes = torch.clamp(torch.round((x - bias) / scale), 0.0, n_bins).to(torch.int64)
    wq = _pack_words(codes.reshape(rows, k), bits)
    return (wq.reshape(*lead, k * bits // 32),
            scale.to(w.dtype).reshape(*lead, groups),
            bias.to(w.dtype).reshape(*lead, groups))


def dequantize(wq: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor,
               group_size: int = 64, bits: int = 4) -> torch.Tensor:
    """`code * scale + bias` per value: [..., K] in the scales' dtype, as `mx.dequantize` gives.

    wq: uint32 [..., K*bits/32]; scales, biases: [..., K/group_size], one float dtype. The
    product and the sum are each rounded to that dtype (no fused multiply-add), like MLX.

    Example: ``w_hat = quant.dequantize(wq, scales, biases, group_size=64, bits=4)``
    """
    _check_group_size(group_size)
    _check_bits(bits)
    _check_words("dequantize", wq, bits)
    _check_float("scales", scales)
    _check_float("biases", biases)
    if biases.dtype != scales.dtype:
        raise BindingError(f"dequantize: biases must have the scales' dtype {scales.dtype}, "
                           f"got {biases.dtype}")
    k = wq.shape[-1] * 32 // bits
    expected = (*wq.shape[:-1], k // group_size)
    for name, t in (("scales", scales), ("biases", biases)):
        if tuple(t.shape) != expected:
            raise ShapeError(
                f"dequantize: {name} must have shape {expected} for wq of shape "
                f"{tuple(wq.shape)} ({k} values per row at bits={bits}) and "
                f"group_size={group_size}, got {tuple(t.shape)}")
    codes = unpack(wq, bits).to(scales.dtype)
    w = codes.reshape(*expected, group_size) * scales.unsqueeze(-1) + biases.unsqueeze(-1)
    return w.reshape(*wq.shape[:-1], k)


def unpack(wq: torch.Tensor, bits: int) -> torch.Tensor:
    """The integer codes in packed words: uint32 [..., W] -> int32 [..., W*32/bits] in
    [0, 2**bits). Code k is bits [k*bits, (k+1)*bits) of the row's little-endian bit stream.

    Example: ``codes = quant.unpack(wq, bits=4)``"""
    _check_bits(bits)
    _check_words("unpack", wq, bits)
    per_pack, words_per_pack = pack_layout(bits)
    lead, n_words = tuple(wq.shape[:-1]), wq.shape[-1]
    words = wq.to(torch.int64).reshape(math.prod(lead), n_words // words_per_pack,
                                       words_per_pack)
    mask = (1 << bits) - 1
    codes = []
    for i in range(per_pack):
        word, shift = divmod(i * bits, 32)
        code = words[..., word] >> shift
        if shift + bits > 32:                            # the high bits are in the next word
            code = code | (words[..., word + 1] << (32 - shift))
        codes.append((code & mask).to(torch.int32))
    return torch.stack(codes, dim=-1).reshape(*lead, n_words * 32 // bits)


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """The inverse of `unpack`: integer codes [..., K] in [0, 2**bits) -> uint32
    [..., K*bits/32].

    Example: ``wq = quant.pack(codes, bits=4)``"""
    _check_bits(bits)
    _check_tensor("pack: codes", codes)
    if codes.dtype.is_floating_point or codes.dtype.is_complex or codes.dtype == torch.bool:
        raise BindingError(f"pack: codes must be an integer tensor, got {codes.dtype}")
    per_pack, _ = pack_layout(bits)
    if codes.dim() == 0 or codes.shape[-1] % per_pack:
        raise ShapeError(f"pack: codes' last dim must be a multiple of {per_pack} at bits={bits} "
                         f"(so that the codes fill whole uint32 words), but codes have shape "
                         f"{tuple(codes.shape)}")
    c = codes.to(torch.int64)
    if c.numel() and (int(c.min()) < 0 or int(c.max()) >= 1 << bits):
        raise QuantizationError(f"pack: codes must lie in [0, {(1 << bits) - 1}] at bits={bits}, "
                                f"got values in [{int(c.min())}, {int(c.max())}]")
    lead, k = tuple(codes.shape[:-1]), codes.shape[-1]
    return _pack_words(c.reshape(math.prod(lead), k), bits).reshape(*lead, k * bits // 32)


def _pack_words(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """int64 codes [R, K] (valid, K a multiple of the pack) -> uint32 words [R, K*bits/32]."""
    per_pack, words_per_pack = pack_layout(bits)
    rows, k = codes.shape
    c = codes.reshape(rows, k // per_pack, per_pack)
    words = torch.zeros(rows, k // per_pack, words_per_pack, dtype=torch.int64,
                        device=codes.device)
    for i in range(per_pack):
        word, shift = divmod(i * bits, 32)
        bits_at = c[..., i] << shift                     # < 2**40: exact in int64
        if shift + bits > 32:                            # the high bits go to the next word
            words[..., word] |= bits_at & _WORD_MASK
            words[..., word + 1] |= bits_at >> 32
        else:
            words[..., word] |= bits_at
    return words.reshape(rows, k * bits // 32).to(torch.uint32)


def _check_bits(bits: int) -> None:
    if isinstance(bits, bool) or bits not in SUPPORTED_BITS:
        raise UnsupportedConstruct(
            f"bits={bits!r} is not supported; MLX's affine quantization supports "
            f"bits in {SUPPORTED_BITS}")


def _check_group_size(group_size: int) -> None:
    if isinstance(group_size, bool) or group_size not in SUPPORTED_GROUP_SIZES:
        raise UnsupportedConstruct(
            f"group_size={group_size!r} is not supported; MLX's affine quantization "
            f"supports group_size in {SUPPORTED_GROUP_SIZES}")


def _check_tensor(what: str, t: Any) -> None:
    """`what` (the function and argument) is a torch.Tensor."""
    if not isinstance(t, torch.Tensor):
        raise BindingError(f"{what} must be a torch.Tensor, got {type(t).__name__}")


def _check_float(name: str, t: torch.Tensor) -> None:
    _check_tensor(name, t)
    if t.dtype not in FLOAT_DTYPES:
        raise BindingError(f"{name} must be float32, float16 or bfloat16 (what MLX quantizes), "
                           f"got {t.dtype}")


def _check_words(fn: str, wq: torch.Tensor, bits: int) -> None:
    _check_tensor(f"{fn}: wq", wq)
    if wq.dtype != torch.uint32:
        raise BindingError(f"{fn}: wq must hold packed words as torch.uint32, got {wq.dtype}")
    _, words_per_pack = pack_layout(bits)
    if wq.dim() == 0 or wq.shape[-1] % words_per_pack:
        raise ShapeError(f"{fn}: wq's last dim must be a multiple of {words_per_pack} words at "
                         f"bits={bits} (codes straddle words in runs of {words_per_pack}), but "
                         f"wq has shape {tuple(wq.shape)}")


def _check_finite_groups(w_max: torch.Tensor, w_min: torch.Tensor, scale: torch.Tensor,
                         lead: tuple[int, ...], k: int, group_size: int) -> None:
    """Refuse NaN/inf weights and groups whose range overflows float32 (MLX would store an
    infinite scale and dequantize them to NaN)."""
    bad = ~(torch.isfinite(w_max) & torch.isfinite(w_min) & torch.isfinite(scale))
    if not bool(bad.any()):
        return
    g = int(bad.flatten().nonzero()[0])
    row, group = divmod(g, k // group_size)
    index = [str(int(i)) for i in torch.unravel_index(torch.tensor(row), lead)] if lead else []
    index.append(f"{group * group_size}:{(group + 1) * group_size}")
    finite = bool(torch.isfinite(w_max.flatten()[g]) & torch.isfinite(w_min.flatten()[g]))
    what = "spans a range (max - min) that overflows float32" if finite else "holds NaN or inf"
    raise QuantizationError(
        f"quantize: w[{', '.join(index)}] (a group of {group_size} values) {what}; "
        f"only finite weights with max - min < 3.4e38 per group can be quantized")
