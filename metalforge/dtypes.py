"""The dtype table shared by every stage: DSL names, torch dtypes, MSL types, promotion."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import BindingError


@dataclass(frozen=True)
class DType:
    name: str           # DSL name: "f32", "f16", ...
    torch: torch.dtype
    msl: str            # MSL storage type
    itemsize: int
    kind: str           # "float" | "int" | "uint" | "bool"

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_int(self) -> bool:
        return self.kind in ("int", "uint")

    @property
    def compute(self) -> "DType":
        """The dtype arithmetic happens in: f16/bf16 compute in f32 (opmath)."""
        return F32 if self.is_float else self

    def __repr__(self) -> str:
        return self.name


F32 = DType("f32", torch.float32, "float", 4, "float")
F16 = DType("f16", torch.float16, "half", 2, "float")
BF16 = DType("bf16", torch.bfloat16, "bfloat", 2, "float")
I64 = DType("i64", torch.int64, "long", 8, "int")
U64 = DType("u64", torch.uint64, "ulong", 8, "uint")
I32 = DType("i32", torch.int32, "int", 4, "int")
U32 = DType("u32", torch.uint32, "uint", 4, "uint")
I16 = DType("i16", torch.int16, "short", 2, "int")
U16 = DType("u16", torch.uint16, "ushort", 2, "uint")
I8 = DType("i8", torch.int8, "char", 1, "int")
U8 = DType("u8", torch.uint8, "uchar", 1, "uint")
BOOL = DType("bool", torch.bool, "bool", 1, "bool")

# Names accepted in annotations: every dtype (i64 is also what mf.index, integer sums and
# argmax give; i64/u64 tensors hold indices and positions in torch's default integer dtype).
ALL = {d.name: d for d in (F32, F16, BF16, I64, U64, I32, U32, I16, U16, I8, U8, BOOL)}
ANNOTATION_DTYPES = dict(ALL)
BY_TORCH = {d.torch: d for d in ALL.values()}


INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def check_int64(v: int, where: str) -> int:
    """`v` if it fits the 64-bit signed integer an int scalar or Const is in the kernel (and in
    torch's arithmetic), else a BindingError naming `where` and the range."""
    if INT64_MIN <= v <= INT64_MAX:
        return v
    raise BindingError(f"{where}: {v} does not fit a 64-bit signed integer (the range of an "
                       f"int scalar or mf.Const[int] is {INT64_MIN} .. {INT64_MAX})")


def check_float(v: float | int, where: str) -> float:
    """`v` as a Python float, or a BindingError naming `where` for an int too large for one."""
    try:
        return float(v)
    except OverflowError:
        raise BindingError(f"{where}: {v} is too large for a float scalar") from None


def from_torch(dt: torch.dtype) -> DType:
    try:
        return BY_TORCH[dt]
    except KeyError:
        raise BindingError(
            f"dtype {dt} is not supported by metalforge "
            f"(supported: {', '.join(str(d.torch) for d in ALL.values())})") from None


def promote(a: DType, b: DType) -> DType:
    """torch's type promotion of two tensor dtypes."""
    return from_torch(torch.promote_types(a.torch, b.torch))
