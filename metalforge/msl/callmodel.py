"""torch.mps.compile_shader's call model, shared by every backend that implements it
(metalforge.sim, metalforge.cuda): the `arg_casts` names, the Metal scalar a tensor dtype or a
cast binds as, and the checks on `threads`/`group_size` and `arg_casts` (with torch's
messages), the grid and the threadgroup a dispatch takes.
"""
from __future__ import annotations

import math
from typing import Any, Optional

import torch

CASTS = {"fp16": torch.float16, "bf16": torch.bfloat16, "int32": torch.int32,
         "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8}
# the Metal scalar a Python value bound with a cast (or by default) becomes
CAST_SCALAR = {torch.float16: "half", torch.bfloat16: "bfloat", torch.int32: "int",
               torch.int16: "short", torch.int8: "char", torch.uint8: "uchar",
               torch.float32: "float", torch.int64: "long"}
# the Metal scalar of a tensor's elements
DTYPE_SCALAR = {torch.float32: "float", torch.float16: "half", torch.bfloat16: "bfloat",
                torch.float64: "double", torch.int64: "long", torch.int32: "int",
                torch.int16: "short", torch.int8: "char", torch.uint8: "uchar",
                torch.bool: "bool", torch.uint16: "ushort", torch.uint32: "uint",
                torch.uint64: "ulong"}


def dims(v, what: str) -> list[int]:
    """`threads` / `group_size`: an int or a list of 1 to 3 non-negative ints."""
    if isinstance(v, bool) or not isinstance(v, (int, list, tuple)):
        raise RuntimeError(f"{what} must be an int or a list of 1 to 3 ints, got {v!r}")
    vals = [v] if isinstance(v, int) else list(v)
    if not 0 < len(vals) < 4 or not all(isinstance(x, int) and not isinstance(x, bool)
                                        for x in vals):
        raise RuntimeError(f"Number of {what} is undefined or has wrong dimension: {v!r}")
    if any(x < 0 for x in vals):
        raise RuntimeError(f"{what} must not be negative: {v!r}")
    return vals


def cast_dtypes(arg_casts, n: int) -> dict[int, torch.dtype]:
    """`arg_casts` (None, one name for every argument, or {index: name}) as {index: dtype}."""
    if arg_casts is None:
        return {}
    if isinstance(arg_casts, str):
        if arg_casts not in CASTS:
            raise RuntimeError(f"Unsupported cast instruction {arg_casts}")
        return {i: CASTS[arg_casts] for i in range(n)}
    if isinstance(arg_casts, dict):
        out = {}
        for k, v in arg_casts.items():
            if not isinstance(k, int) or not isinstance(v, str):
                raise RuntimeError(f"Unexpected caster arg type {type(arg_casts)}")
            if v not in CASTS:
                raise RuntimeError(f"Unsupported cast instruction {v}")
            out[k] = CASTS[v]
        return out
    raise RuntimeError(f"Unexpected caster arg type {type(arg_casts)}")


def grid_of(threads: Any, first_numel: Optional[int]) -> list[int]:
    """The dispatchThreads grid: `threads`, else the first tensor argument's numel."""
    grid = dims(threads, "threads") if threads is not None else None
    if grid is None:
        if first_numel is None:
            raise RuntimeError("Number of threads is undefined or has wrong dimension")
        grid = [first_numel]
    return grid


def group_of(group_size: Any, grid: list[int], threads: Any, mx: int) -> list[int]:
    """The threadgroup: `group_size`, or by default as many threads as allowed along the first
    axis; at most `mx` threads in all."""
    if group_size is None:
        group = [min(grid[0], mx)] if len(grid) == 1 else [mx] + [1] * (len(grid) - 1)
    else:
        group = dims(group_size, "group_size")
        if len(group) != len(grid):
            raise RuntimeError(f"group_size {group_size!r} must have as many dimensions "
                               f"as threads {threads!r}")
    if math.prod(group) > mx:
        raise ValueError(f"Threadgroup size exceeds {mx} limit")
    return group
