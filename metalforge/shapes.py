"""Binding a kernel's named dims to the sizes of real tensors.

`bind_shapes` checks every tensor argument against its annotation (rank, named dims consistent
across arguments, derived dims, batch dims) and returns every axis's size. The runtime wrapper,
the reference evaluator and `Kernel.source(sizes=...)` all read sizes from here, so a shape
mistake gets the same message whichever path finds it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

from .errors import ShapeError
from .graph import AxisSpec, Graph, Output, TensorParam


@dataclass(frozen=True)
class ShapeBinding:
    sizes: dict[str, int]                 # every axis (plain, derived, batch) -> size
    batch: dict[str, tuple[int, ...]]     # batch axis name -> the leading shape it flattens
    groups: tuple[tuple[str, ...], ...] = ()   # grouped dims "(G R)": axes of one storage dim


def _where(graph: Graph) -> str:
    if graph.loc:
        return f"kernel '{graph.name}' ({graph.loc[0]}:{graph.loc[1]})"
    return f"kernel '{graph.name}'"


def derived_size(spec: AxisSpec, base_size: int) -> int | None:
    """size(spec) from size(base), or None when the division is not exact."""
    num = base_size * spec.mul
    if num % spec.div:
        return None
    return num // spec.div + spec.add


def solve_base(spec: AxisSpec, size: int) -> int | None:
    """size(base) from size(spec) (the inverse of `derived_size`), or None if no integer fits."""
    num = (size - spec.add) * spec.div
    if num % spec.mul or num < 0:
        return None
    return num // spec.mul


def _describe(spec: AxisSpec) -> str:
    if not spec.derived:
        return spec.name
    return f"(size({spec.base}) * {spec.mul}) / {spec.div} + {spec.add}"


def bind_shapes(graph: Graph, tensors: Mapping[str, torch.Tensor]) -> ShapeBinding:
    where = _where(graph)
    sizes: dict[str, int] = {}
    seen_by: dict[str, str] = {}                  # axis -> argument that fixed its size
    batch: dict[str, tuple[int, ...]] = {}
    batch_by: dict[str, str] = {}
    derived: list[tuple[AxisSpec, str, int]] = []   # (spec, argument, size)
    grouped: list[tuple[tuple[str, ...], TensorParam, int]] = []   # (axes, argument, size)

    def fix(axis: str, size: int, arg: str, ann: str) -> None:
        if axis in sizes and sizes[axis] != size:
            raise ShapeError(
                f"{where}: dim '{axis}' is {sizes[axis]} in argument '{seen_by[axis]}' but "
                f"{size} in argument '{arg}' (annotated \"{ann}\"); every argument must agree "
                f"on the size of '{axis}'")
        if axis not in sizes:
            sizes[axis] = size
            seen_by[axis] = arg

    for p in graph.tensors:
        if p.name not in tensors:
            raise ShapeError(f"{where}: no tensor given for argument '{p.name}'")
        t = tensors[p.name]
        shape = tuple(int(s) for s in t.shape)
        has_batch = bool(p.dims) and p.dims[0].batch
        fixed = p.storage[1:] if has_batch else p.storage
        if (len(shape) < len(fixed)) if has_batch else (len(shape) != len(fixed)):
            need = f"at least {len(fixed)}" if has_batch else f"exactly {len(fixed)}"
            raise ShapeError(
                f"{where}: argument '{p.name}' is annotated \"{p.annotation}\" and needs {need} "
                f"dim(s), got a tensor of shape {tuple(shape)} ({len(shape)} dim(s))")
        lead = shape[:len(shape) - len(fixed)]
        if has_batch:
            b = p.dims[0].name
            if b in batch and batch[b] != lead:
                raise ShapeError(
                    f"{where}: batch dims '*{b}' are {batch[b]} in argument '{batch_by[b]}' but "
                    f"{lead} in argument '{p.name}' (annotated \"{p.annotation}\"); arguments "
                    f"sharing '*{b}' need the same leading shape")
            batch[b] = lead
            batch_by.setdefault(b, p.name)
            fix(b, math.prod(lead), p.name, p.annotation)
        for axes, size in zip(fixed, shape[len(lead):]):
            if len(axes) > 1:
                grouped.append((tuple(a.name for a in axes), p, size))
                continue
            spec = axes[0]
            fix(spec.name, size, p.name, p.annotation)
            if spec.derived:
                derived.append((spec, p.name, size))
    for names, p, size in grouped:
        _bind_group(where, names, p, size, sizes, seen_by, fix)

    # derived dims: check against the base where the base is bound, else solve the base
    for spec, arg, size in derived:
        if spec.base in sizes:
            want = derived_size(spec, sizes[spec.base])
            if want is None:
                raise ShapeError(
                    f"{where}: dim '{spec.name}' of argument '{arg}' needs size({spec.base}) * "
                    f"{spec.mul} to be divisible by {spec.div}, but '{spec.base}' is "
                    f"{sizes[spec.base]} (from argument '{seen_by[spec.base]}')")
            if want != size:
                raise ShapeError(
                    f"{where}: dim '{spec.name}' of argument '{arg}' must be {want} because "
                    f"'{spec.base}' is {sizes[spec.base]} (from argument "
                    f"'{seen_by[spec.base]}'), got {size}")
        else:
            base = solve_base(spec, size)
            if base is None:
                raise ShapeError(
                    f"{where}: dim '{spec.name}' of argument '{arg}' is {size}, which no whole "
                    f"size of '{spec.base}' gives ('{spec.name}' = {_describe(spec)})")
            sizes[spec.base] = base
            seen_by[spec.base] = arg
    groups = tuple(dict.fromkeys(names for names, _, _ in grouped))
    return ShapeBinding(sizes=sizes, batch=batch, groups=groups)


def _bind_group(where: str, names: tuple[str, ...], p: TensorParam, size: int,
                sizes: dict[str, int], seen_by: dict[str, str], fix) -> None:
    """Sizes of a grouped dim's axes: all but one are bound by other arguments (G by k in
    attention's q "(G R)"); the free one is the storage size divided by their product."""
    free = [n for n in names if n not in sizes]
    group = "(" + " ".join(names) + ")"
    if len(free) > 1:
        raise ShapeError(
            f"{where}: the grouped dim {group} of argument '{p.name}' (annotated "
            f"\"{p.annotation}\") has size {size}, but {', '.join(repr(n) for n in free)} are "
            f"not bound by any other argument; all axes of a grouped dim but one need a size "
            f"from another argument (e.g. G from k's \"T[B, G, L, E]\")")
    known = math.prod(sizes[n] for n in names if n not in free)
    bound = "; ".join(f"'{n}' = {sizes[n]} from argument '{seen_by[n]}'"
                      for n in names if n not in free)
    if free and known == 0 == size:     # empty either way: the free axis is empty too
        fix(free[0], 0, p.name, p.annotation)
    elif free:
        if known == 0 or size % known:
            raise ShapeError(
                f"{where}: the grouped dim {group} of argument '{p.name}' (annotated "
                f"\"{p.annotation}\") has size {size}, which is not a multiple of {known} "
                f"({bound}); e.g. query heads must be a multiple of key/value heads")
        fix(free[0], size // known, p.name, p.annotation)
    elif known != size:
        raise ShapeError(
            f"{where}: the grouped dim {group} of argument '{p.name}' (annotated "
            f"\"{p.annotation}\") has size {size}, but its axes give {known} ({bound})")


def flat_shape(binding: ShapeBinding, param: TensorParam) -> tuple[int, ...]:
    """The shape the kernel sees: leading batch dims flattened into one."""
    return tuple(binding.sizes[d.name] for d in param.dims)


def output_shape(binding: ShapeBinding, out: Output) -> tuple[int, ...]:
    """The shape of an output tensor as the caller gets it: batch dims re-expanded, the axes of
    a grouped dim (G then R, adjacent) laid out as that one dim again."""
    return tuple(lay_out(out.axes, binding.groups, binding.batch, binding.sizes.__getitem__))


def lay_out(axes: tuple[str, ...], groups: tuple[tuple[str, ...], ...],
            batch: Mapping[str, tuple[Any, ...]], size: Callable[[str], Any]) -> list[Any]:
    """The storage shape of `axes`: each batch axis as its leading shape, the axes of each
    grouped dim as the product of their sizes, every other axis as `size(axis)` (sizes may be
    symbolic: torch's fake shapes)."""
    shape: list[Any] = []
    i = 0
    while i < len(axes):
        group = next((g for g in groups if axes[i:i + len(g)] == g), None)
        if group:
            shape.append(math.prod(size(a) for a in group))
            i += len(group)
            continue
        if axes[i] in batch:
            shape.extend(batch[axes[i]])
        else:
            shape.append(size(axes[i]))
        i += 1
    return shape
