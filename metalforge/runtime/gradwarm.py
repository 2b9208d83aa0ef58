"""The warm path of the kernels a differentiable call runs.

A call on tensors that require grad runs its forward (or the forward that also saves its rows'
logsumexps) inside a `torch.autograd.Function`, and its backward runs the kernels
`metalforge.autodiff` derives; none of them goes through a kernel's `CallPath`, so each used to
take `runs.run`'s full path (check, bind, dispatch) on every step. `run_warm` gives each of
those graphs the warm path a kernel's calls have (`fastpath`): a `GraphPath` per (graph,
backend, the launch options the call gives, its role) keys each call as `fastpath.key_function`
does (the backend and override, every tensor's dtype, shape, strides and device, every runtime
scalar's type; the graph itself fixes the Consts), and a key whose closure is current replays
it (`Warm.hit`: the autotune cache and the compiled kernel checked on every call, as for a
kernel's own calls). The first call of a key, or one that the fast path does not serve (MLX
arrays, the `MSL_REWRITE` seam set, a tensor subclass), takes `runs.run_recorded`, whose checks
and errors are those of `runs.run`. `memo` keeps, by the same key, what a call decides from
its tensors' layout alone (the forward's saving plan, `saving.choose`). A backward's kernels
run through their paths in `gradrun.BackwardRun`; the call's own binding is kept per key in
`gradbind`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Mapping, Optional, TypeVar

from ..bounded import Bounded
from ..graph import Graph, TensorParam
from ..once import OnceMap
from .fastpath import MISS, MSL_REWRITE, WarmCache, key_function
from .grad_launch import forward_options, options_for
from .runs import run_recorded

T = TypeVar("T")
FORWARD, BACKWARD = "forward", "backward"


@dataclass(frozen=True)
class GraphPath:
    """The warm closures of one graph a differentiable call runs, under one launch.

    given: the launch options of the call (the user's, `Kernel.launch`); launch: the options
    this graph takes of them
    (`grad_launch.forward_options` for the forward, `options_for` for a backward kernel)."""
    graph: Graph
    backend: Optional[str]
    given: Optional[Mapping[str, Any]]
    launch: Optional[Mapping[str, Any]]
    names: tuple[str, ...]                  # graph.params' names, in order
    key: Callable[..., Optional[tuple[Any, ...]]]
    warm: WarmCache = field(default_factory=lambda: WarmCache(64))
    # what a call decides from its key alone (the forward: its saving plan), by (key, extra)
    memos: Bounded[tuple[Any]] = field(default_factory=lambda: Bounded(64))

    def run(self, values: Mapping[str, Any]) -> Any:
        """`runs.run(graph, values, backend, launch)`: the closure a previous call with the
        same key recorded, replayed where it is still current; else the full path, whose
        closure is kept for the key."""
        key = None
        if MSL_REWRITE.get() is None:
            args = [values.get(n) for n in self.names]
            key = self.key(args, self.backend)
            hit = None if key is None else self.warm.hits.get(key)
            if hit is not None:
                out = hit(args)
                if out is not MISS:
                    return out
        out, w = run_recorded(self.graph, values, self.backend, self.launch)
        if w is not None and key is not None:
            self.warm.put(key, w)
        return out

    @classmethod
    def of(cls, graph: Graph, backend: Optional[str], given: Optional[Mapping[str, Any]],
           role: str) -> "GraphPath":
        mine = forward_options if role == FORWARD else options_for
        kinds = ["tensor" if isinstance(p, TensorParam) else "scalar" for p in graph.params]
        return cls(graph, backend, given, mine(graph, given),
                   tuple(p.name for p in graph.params), key_function(kinds))


_paths: OnceMap[tuple[int, Optional[str], Any, str], GraphPath] = OnceMap()


def graph_path(graph: Graph, backend: Optional[str], launch: Optional[Mapping[str, Any]],
               role: str) -> GraphPath:
    """The `GraphPath` of `graph` run by a differentiable call on `backend` with the call's
    `launch` options, as its forward or as a backward kernel (`role`), made once."""
    return _paths.get_or_build(
        (id(graph), backend, launch_key(launch), role),
        lambda: GraphPath.of(graph, backend, launch, role), lambda p: p.graph is graph)


def launch_key(launch: Optional[Mapping[str, Any]]) -> Optional[tuple[tuple[str, Any], ...]]:
    """The call's launch options as a key (their contents, as `launcher.specialisation`'s)."""
    return None if not launch else tuple(sorted(launch.items()))


def run_warm(graph: Graph, values: Mapping[str, Any], backend: Optional[str],
             launch: Optional[Mapping[str, Any]], role: str) -> Any:
    """`runs.run(graph, values, backend, options)` for the options of the call's `launch` this
    graph takes (its `role`): `GraphPath.run`."""
    return graph_path(graph, backend, launch, role).run(values)


def memo(graph: Graph, values: Mapping[str, Any], backend: Optional[str],
         launch: Optional[Mapping[str, Any]], extra: Hashable, build: Callable[[], T]) -> T:
    """`build()`, kept per the warm key of a call of forward `graph` on `values` and `extra`
    (what else it depends on): for what a differentiable call decides from its tensors'
    dtypes, shapes, strides and device, its scalars' types, the backend and the launch alone
    (`saving.choose`'s plan, which binds the shapes to find it). A call that has no key (MLX
    arrays, a tensor subclass) builds every time."""
    path = graph_path(graph, backend, launch, FORWARD)
    key = path.key([values.get(n) for n in path.names], backend)
    if key is None:
        return build()
    got = path.memos.find((key, extra))
    if got is None:
        got = (build(),)
        path.memos.put((key, extra), got)
    value: T = got[0]
    return value
