"""Binding a kernel's named dims to the sizes of real tensors.

`bind_shapes` checks every tensor argument against its annotation (rank, named dims consistent
across arguments, derived dims, batch dims) and returns every axis's size. The runtime wrapper,
the reference evaluator and `Kernel.source(sizes=...)` all read sizes from here, so a shape
mistake gets the same message whichever path finds it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

import torch

from .errors import ShapeError, kernel_at
from .graph import AxisSpec, Graph, Output, TensorParam


@dataclass(frozen=True)
class ShapeBinding:
    sizes: dict[str, int]                 # every axis (plain, derived, batch) -> size
    batch: dict[str, tuple[int, ...]]     # batch axis name -> the leading shape it flattens
    groups: tuple[tuple[str, ...], ...] = ()   # grouped dims "(G R)": axes of one storage dim


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


def base_multiple(spec: AxisSpec) -> int:
    """What every size of a derived dim's base must be a multiple of for the dim to bind (K/64:
    64; N*2/4: 2)."""
    return spec.div // math.gcd(spec.mul, spec.div)


def size_multiple(tensors: Iterable[TensorParam], axis: str) -> int:
    """What every size of `axis` is a multiple of once shapes bind (`bind_shapes` refuses
    the rest): the least common multiple over the derived dims based on it, 1 if none."""
    return math.lcm(1, *(base_multiple(d) for t in tensors for d in t.dims
                         if d.derived and d.base == axis))


def _describe(spec: AxisSpec) -> str:
    if not spec.derived:
        return spec.name
    return f"(size({spec.base}) * {spec.mul}) / {spec.div} + {spec.add}"


def bind_shapes(graph: Graph, tensors: Mapping[str, torch.Tensor]) -> ShapeBinding:
    """Every axis's size, read off `tensors` and checked against the annotations: each tensor's
    rank, batch and storage dims in parameter order, then grouped dims, then derived dims."""
    b = _Binder(kernel_at(graph.name, graph.loc))
    for p in graph.tensors:
        if p.name not in tensors:
            raise ShapeError(f"{b.where}: no tensor given for argument '{p.name}'")
        b.bind_tensor(p, tuple(int(s) for s in tensors[p.name].shape))
    for names, p, size in b.grouped:
        _bind_group(b.where, names, p, size, b.sizes, b.seen_by, b.fix)
    for spec, arg, size in b.derived:
        b.bind_derived(spec, arg, size)
    groups = tuple(dict.fromkeys(names for names, _, _ in b.grouped))
    return ShapeBinding(sizes=b.sizes, batch=b.batch, groups=groups)


@dataclass
class _Binder:
    """The state of one `bind_shapes`: the sizes bound so far, which argument bound each (for
    messages), and the grouped and derived dims left for after every tensor is read."""
    where: str
    sizes: dict[str, int] = field(default_factory=dict)
    seen_by: dict[str, str] = field(default_factory=dict)          # axis -> argument that fixed it
    batch: dict[str, tuple[int, ...]] = field(default_factory=dict)
    batch_by: dict[str, str] = field(default_factory=dict)
    derived: list[tuple[AxisSpec, str, int]] = field(default_factory=list)   # (spec, arg, size)
    grouped: list[tuple[tuple[str, ...], TensorParam, int]] = field(
        default_factory=list)                                       # (axes, argument, size)
    shape: tuple[int, ...] = ()                                     # the tensor being read

    def fix(self, axis: str, size: int, arg: str, ann: str) -> None:
        """Bind `axis` to `size`, or check it against the size another argument gave it."""
        if axis in self.sizes and self.sizes[axis] != size:
            raise ShapeError(
                f"{self.where}: dim '{axis}' is {self.sizes[axis]} in argument "
                f"'{self.seen_by[axis]}' but {size} in argument '{arg}' (annotated \"{ann}\"); "
                f"every argument must agree on the size of '{axis}'")
        if axis not in self.sizes:
            self.sizes[axis] = size
            self.seen_by[axis] = arg

    def bind_tensor(self, p: TensorParam, shape: tuple[int, ...]) -> None:
        """One tensor argument: its rank, its batch dims, then each storage dim."""
        has_batch = bool(p.dims) and p.dims[0].batch
        fixed = p.storage[1:] if has_batch else p.storage
        self.check_rank(p, shape, len(fixed), has_batch)
        lead = shape[:len(shape) - len(fixed)]
        self.shape = shape
        if has_batch:
            self.bind_batch(p, lead)
        for axes, size in zip(fixed, shape[len(lead):]):
            self.bind_storage_dim(p, axes, size)

    def check_rank(self, p: TensorParam, shape: tuple[int, ...], fixed: int,
                   has_batch: bool) -> None:
        if (len(shape) < fixed) if has_batch else (len(shape) != fixed):
            need = f"at least {fixed}" if has_batch else f"exactly {fixed}"
            raise ShapeError(
                f"{self.where}: argument '{p.name}' is annotated \"{p.annotation}\" and needs "
                f"{need} dim(s), got a tensor of shape {tuple(shape)} ({len(shape)} dim(s))")

    def bind_batch(self, p: TensorParam, lead: tuple[int, ...]) -> None:
        """The leading dims a batch dim `*B` flattens: the same in every argument sharing it."""
        b = p.dims[0].name
        if b in self.batch and self.batch[b] != lead:
            raise ShapeError(
                f"{self.where}: batch dims '*{b}' are {self.batch[b]} in argument "
                f"'{self.batch_by[b]}' but {lead} in argument '{p.name}' (annotated "
                f"\"{p.annotation}\"); arguments sharing '*{b}' need the same leading shape")
        self.batch[b] = lead
        self.batch_by.setdefault(b, p.name)
        self.fix(b, math.prod(lead), p.name, p.annotation)

    def bind_storage_dim(self, p: TensorParam, axes: tuple[AxisSpec, ...], size: int) -> None:
        """One storage dim: a plain or derived axis now, a grouped dim "(G R)" later."""
        if len(axes) > 1:
            self.grouped.append((tuple(a.name for a in axes), p, size))
            return
        spec = axes[0]
        if spec.size is not None and size != spec.size:
            dim = len(self.shape) - len(p.storage) + p.storage.index(axes)
            what = "" if spec.anonymous else f" '{spec.name}'"
            raise ShapeError(
                f"{self.where}: argument '{p.name}' is annotated \"{p.annotation}\": its dim "
                f"{dim} is the literal{what} {spec.size}, but the tensor has shape "
                f"{self.shape} (size {size} there)")
        self.fix(spec.name, size, p.name, p.annotation)
        if spec.derived:
            self.derived.append((spec, p.name, size))

    def bind_derived(self, spec: AxisSpec, arg: str, size: int) -> None:
        """A derived dim: checked against its base where the base is bound, else the base is
        solved from it."""
        assert spec.base is not None
        if spec.base in self.sizes:
            self.check_derived(spec, arg, size)
            return
        base = solve_base(spec, size)
        if base is None:
            raise ShapeError(
                f"{self.where}: dim '{spec.name}' of argument '{arg}' is {size}, which no whole "
                f"size of '{spec.base}' gives ('{spec.name}' = {_describe(spec)})")
        self.sizes[spec.base] = base
        self.seen_by[spec.base] = arg

    def check_derived(self, spec: AxisSpec, arg: str, size: int) -> None:
        assert spec.base is not None
        base, by = self.sizes[spec.base], self.seen_by[spec.base]
        want = derived_size(spec, base)
        if want is None:
            raise ShapeError(
                f"{self.where}: dim '{spec.name}' of argument '{arg}' needs size({spec.base}) * "
                f"{spec.mul} to be divisible by {spec.div}, but '{spec.base}' is "
                f"{base} (from argument '{by}')")
        if want != size:
            raise ShapeError(
                f"{self.where}: dim '{spec.name}' of argument '{arg}' must be {want} because "
                f"'{spec.base}' is {base} (from argument '{by}'), got {size}")


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
    known = numel((n for n in names if n not in free), sizes)
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


def numel(axes: Iterable[str], sizes: Mapping[str, int]) -> int:
    """The product of the sizes of `axes` (1 for none): the elements a grid over them covers.
    The one place the package multiplies axis sizes."""
    return math.prod(sizes[a] for a in axes)


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
