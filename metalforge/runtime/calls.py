"""The call path: how a kernel's call enters the runtime, the one way.

`CallPath` (one per kernel object and launch overrides) maps a call's arguments to parameter
order without `inspect.Signature.bind` and keys it (`fastpath.key_function`); a key whose
closure is current replays it. A call by position (trailing defaults left out or not) goes
through `fast` alone (`fastpath.fast_function`: key, lookup, currency and replay in generated
code), which `Kernel.__call__` tries first. Otherwise the kernel binds and traces the call
(its `bind` argument: the frontend's checks) and `call` runs it: beside the path, autograd
(`autograd.call_differentiable`) for tensors that require grad; then `runs.run_recorded`,
whose closure is kept for the key.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping, Optional, Sequence

import torch

from ..bounded import Bounded
from ..graph import Graph
from . import outputs
from .autograd import call_differentiable
from .fastpath import MISS, MSL_REWRITE, WarmCache, fast_function, key_function
from .gradbind import GradBinding
from .into import Into, out_key
from .mlx import is_array
from .runs import run, run_into, run_recorded

_NO_DEFAULT = inspect.Parameter.empty
Bind = Callable[[tuple[Any, ...], Mapping[str, Any]], tuple[Graph, Mapping[str, Any]]]


class CallPath:
    """One kernel's calls under one `launch`: the warm closures by key, and the way in.

    signature: the kernel function's; kinds: each parameter's kind ("tensor", "scalar",
    "const"), in order."""

    def __init__(self, signature: inspect.Signature, kinds: Sequence[str],
                 backend: Optional[str], launch: Optional[Mapping[str, Any]],
                 inplace: outputs.Inplace = ()) -> None:
        sig = list(signature.parameters.values())
        self.signature, self.kinds = signature, tuple(kinds)
        self.backend, self.launch, self.inplace = backend, launch, inplace
        self._out_keyword = "out" not in signature.parameters   # else out= is that parameter
        self._call_params = tuple((p.name, p.default, p.kind is not p.POSITIONAL_ONLY)
                                  for p in sig)
        self._key_of = key_function(self.kinds)
        self._max_positional = sum(p.kind is not p.KEYWORD_ONLY for p in sig)
        self._completions = tuple(
            tuple(p.default for p in sig[n:])
            if all(p.default is not _NO_DEFAULT for p in sig[n:]) else None
            for n in range(self._max_positional + 1))
        self.warm = WarmCache()
        # the traced graphs of calls whose tensors require grad, by key (`gradbind`)
        self._grad = GradBinding(self.kinds, [p.name for p in sig], backend)
        # calls with every parameter given by position take the shortest way to a replay
        # (the others: `_warm_key`); a kernel with in-place outputs never (`_into`)
        plain = all(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in sig)
        self._arity = len(sig) if plain and not inplace else -1
        # such a call's whole warm path, key to replay, in one function (MISS: not served)
        self.fast: Callable[[tuple[Any, ...]], Any] = (
            fast_function(self.kinds, backend, self.warm.hits.get,
                          {n: t for n, t in enumerate(self._completions)
                           if t and n < len(sig)}) if self._arity >= 0 else _never)
        self.warm_into: Bounded[Into] = Bounded(256)      # calls writing into given outs
        position = {p.name: i for i, p in enumerate(sig)}
        self._inplace_at = tuple((i, position[n]) for i, n in inplace)

    def relaunched(self, launch: Optional[Mapping[str, Any]]) -> CallPath:
        """The path of the same kernel under other launch overrides (its own closures)."""
        return CallPath(self.signature, self.kinds, self.backend, launch, self.inplace)

    def __call__(self, bind: Bind, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        if not kwargs:                                  # every argument given by position
            out = self.fast(args)
            if out is not MISS:
                return out
        if self.inplace or ("out" in kwargs and self._out_keyword):
            return self._into(bind, args, kwargs)
        rewrite = MSL_REWRITE.get() is not None
        hit = self._warm_key(args, kwargs) if not rewrite else None
        if hit is not None:
            w = self.warm.get(hit[0])
            if w is not None and w.current():
                return w.replay(hit[1])
        if hit is None and not rewrite:     # tensors that require grad: the graph by key
            graph, values = self._grad.bound(bind, args, kwargs, self._arguments(args, kwargs))
        else:
            graph, values = bind(args, kwargs)
        return call(graph, values, self.backend, self.launch,
                    None if hit is None else (self.warm, hit[0]))

    def _into(self, bind: Bind, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        """A call that writes its outputs into given tensors (`out=`, declared in-place
        outputs). Warm, `into.Into` replays it (the key adds the outs' layouts; where they
        start and what they overlap is checked on every call); else the full path."""
        rest = dict(kwargs)
        out = rest.pop("out", None) if self._out_keyword else None
        hit = self._warm_key(args, rest) if MSL_REWRITE.get() is None else None
        okey = out_key(out) if hit is not None else None
        key = None if hit is None or okey is None else (hit[0], okey)
        if key is not None and hit is not None:
            w = self.warm_into.get(key)
            if w is not None and w.current():
                return w.replay(hit[1], out, self._inplace_at)
        graph, values = bind(args, rest)
        outs = outputs.given(graph, values, out, self.inplace, is_array)
        if outs is None:
            return call(graph, values, self.backend, self.launch)
        outputs.refuse_grad(graph, values, outs)
        result, w = run_into(graph, values, self.backend, self.launch, outs)
        if w is not None and key is not None:
            self.warm_into.put(key, w)
        return result

    def _warm_key(self, args: tuple[Any, ...],
                  kwargs: Mapping[str, Any]) -> Optional[tuple[Any, Sequence[Any]]]:
        """(key, argument values in parameter order) for the warm-call fast path, or None
        when this call must take the full path: arguments it cannot map without
        `inspect.Signature.bind` (whose errors the full path reports), a non-Tensor (or Tensor
        subclass) where a tensor goes, a tensor that requires grad while grad mode is on.

        The key (`fastpath.key_function`) holds everything a checked call's launch depends on:
        the kernel's backend and the `with mf.backend(...)` override; each tensor's dtype,
        shape, strides and device; each runtime scalar's Python type; each Const's type and
        value. The launch overrides are this path's, the autotune entry is checked by
        `Warm.current`."""
        values = self._arguments(args, kwargs)
        if values is None:
            return None
        key = self._key_of(values, self.backend)
        return None if key is None else (key, values)

    def _arguments(self, args: tuple[Any, ...],
                   kwargs: Mapping[str, Any]) -> Optional[Sequence[Any]]:
        """Every argument in parameter order (defaults filled in), or None where that takes
        `inspect.Signature.bind` (`_warm_values`)."""
        if not kwargs and len(args) <= self._max_positional:
            tail = self._completions[len(args)]
            return None if tail is None else args + tail if tail else args
        return self._warm_values(args, kwargs)

    def _warm_values(self, args: tuple[Any, ...],
                     kwargs: Mapping[str, Any]) -> Optional[list[Any]]:
        """Every argument in parameter order (defaults filled in), or None for anything
        unusual (too many, unknown, duplicated or missing arguments)."""
        if len(args) > self._max_positional:
            return None
        values = list(args)
        used = 0
        for name, default, by_keyword in self._call_params[len(args):]:
            if by_keyword and name in kwargs:
                values.append(kwargs[name])
                used += 1
            elif default is not _NO_DEFAULT:
                values.append(default)
            else:
                return None
        return values if used == len(kwargs) else None


def _never(args: tuple[Any, ...]) -> Any:
    """The fast path of a kernel whose calls never take it (keyword-only parameters, in-place
    outputs)."""
    return MISS


def call(graph: Graph, values: Mapping[str, Any], backend: Optional[str] = None,
         launch: Optional[Mapping[str, Any]] = None,
         warm: Optional[tuple[WarmCache, Any]] = None) -> Any:
    """Run one checked call of a kernel: through autograd when a tensor requires grad (and
    grad mode is on), else `runs.run`; with `warm` (cache, key), the call's closure is kept
    under the key."""
    if torch.is_grad_enabled() and any(isinstance(v, torch.Tensor) and v.requires_grad
                                       for v in values.values()):
        return call_differentiable(graph, values, backend, launch)
    if warm is None:
        return run(graph, values, backend, launch)
    out, w = run_recorded(graph, values, backend, launch)
    if w is not None:
        warm[0].put(warm[1], w)
    return out
