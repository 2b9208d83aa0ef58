"""The size rule of one exported specialisation: what a call at any sizes binds and launches,
written down as formulas of the sizes by running the launcher's own code (`derive`) on symbolic
sizes (symbolic.py).

`derive` is the one description of everything in a manifest entry that depends on the sizes:
the checks the shapes must pass (derived dims exact, 32-bit indexing enough, an empty grid only
for one output), the tensor shapes, the constants (axis sizes, element count, launch values),
the scratch buffer, and the launches: the schedule's `steps` (its variant choice, grid and
threadgroup), each `launcher.fit` to the pipeline's `max_threads(host)` (the loader then checks
each with `launcher.check_step`, as a traced call is checked). The export runs it once with
`SymInt` sizes (`tree`), and checks the result against `derive` on plain ints at the exported sizes
and at sampled ones (`verify`); where that fails or the code is not symbolic, the entry has no
rule and calls keep to the exported shapes.
"""
from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from .. import schedule as sched_mod
from ..errors import LaunchError, MetalforgeError, ShapeError
from ..graph import Graph, TensorParam
from ..runtime import launcher
from ..runtime.binding import BindingPlan, ScratchSource
from ..schedule.hardware import MAX_THREADS_PER_GROUP
from ..shapes import ShapeBinding, output_shape, size_multiple
from . import symbolic as sym
from .symbolic import NotSymbolic, SymInt

SIZE_LIMIT = 2 ** 64          # sizes are below it (the rule's conditions are traced under it)
LIMITED_PATHS = 256           # paths traced with the pipelines' limits as symbols, at most
SAMPLES = 40                 # sizes `verify` compares the formulas at, besides the exported ones
# sizes `verify` draws from: boundaries of the schedules' variants (simd rows, looped rows,
# vector widths, chunks) and odd ones
SAMPLE_SIZES = (1, 2, 3, 5, 7, 8, 31, 32, 33, 64, 100, 127, 128, 129, 255, 256, 257, 300,
                511, 512, 513, 1000, 1024, 2048, 4095, 4096, 4097, 8192, 8193, 16384, 20000)


@dataclass(frozen=True)
class Context:
    """What `derive` needs besides the sizes: the graph and its schedule at the exported index
    width."""
    graph: Graph
    schedule: sched_mod.Schedule
    plan: BindingPlan
    index64: bool
    grid: tuple[str, ...]
    groups: tuple[tuple[str, ...], ...]
    where: str

    @property
    def tensors(self) -> list[TensorParam]:
        return [p for p in self.graph.params if isinstance(p, TensorParam)]


def base_axes(graph: Graph) -> list[str]:
    """The axes whose sizes an export must be given (derived and literal dims follow)."""
    out: list[str] = []
    for t in graph.tensors:
        for d in t.dims:
            name = d.base if d.derived else d.name
            if d.size is None and name is not None and name not in out:
                out.append(name)
    return out


def param_shape(p: TensorParam, sizes: Mapping[str, Any]) -> list[Any]:
    """The storage shape of tensor parameter `p` at `sizes` (a batch dim as one flattened
    dim; a grouped dim "(G R)" as one dim of G x R)."""
    shape: list[Any] = []
    for d in p.dims:
        n = d.size if d.size is not None else sizes[d.name]
        if d.joined and shape:
            shape[-1] *= n
        else:
            shape.append(n)
    return shape


def all_sizes(graph: Graph, base: Mapping[str, Any]) -> dict[str, Any]:
    """Every axis's size (literal, base, derived) from the base axes' sizes (ints or Syms)."""
    out: dict[str, Any] = {}
    for t in graph.tensors:
        for d in t.dims:
            if d.size is not None:
                out[d.name] = d.size
    out.update(base)
    for t in graph.tensors:
        for d in t.dims:
            if d.derived and d.size is None:
                assert d.base is not None
                out[d.name] = out[d.base] * d.mul // d.div + d.add
    return out


def derive(ctx: Context, base: Mapping[str, Any], max_threads: Callable[[str], Any]
           ) -> dict[str, Any]:
    """Everything a call with these base sizes binds and launches (ints, or Syms when traced),
    or a MetalforgeError where such a call is refused or needs another export."""
    g, s = ctx.graph, ctx.schedule
    sizes = all_sizes(g, base)
    for t in ctx.tensors:
        for d in t.dims:
            if d.derived and d.size is None and (sizes[d.base or ""] * d.mul) % d.div:
                raise ShapeError(f"{ctx.where}: dim '{d.name}' of '{t.name}' needs "
                                 f"'{d.base}' * {d.mul} to be a multiple of {d.div}")
    inputs = [param_shape(p, sizes) for p in ctx.tensors]
    count = math.prod(sizes[a] for a in ctx.grid)
    if not ctx.index64 and any(sched_mod.needs_index64(sizes, n) for n in
                               [count, *(math.prod(shape) for shape in inputs)]):
        raise LaunchError(f"{ctx.where}: these sizes need 64-bit indexing; export them")
    binding = ShapeBinding(sizes, {d.name: (sizes[d.name],) for t in ctx.tensors
                                   for d in t.dims if d.batch}, ctx.groups)
    outputs = [list(output_shape(binding, o)) for o in g.outputs]
    if not count and len(outputs) > 1:
        raise ShapeError(f"{ctx.where}: an empty grid beside other outputs: the traced kernel "
                         f"computes those eagerly")
    fixed = ctx.plan.fixed(s, sizes, count)
    scratch = {a.index: sym.maximum(1, s.scratch_floats(sizes)) for a in ctx.plan.sources
               if isinstance(a, ScratchSource)}
    launches = []
    for step in (s.steps(sizes) if count else ()):
        step = launcher.fit(s, step, sizes, max_threads)
        launches.append((step.host_name, step.threads, step.group))
    return {"inputs": inputs, "outputs": outputs, "constants": fixed, "scratch": scratch,
            "launches": launches}


def symbol(host: str) -> str:
    """The name of the symbol standing for a pipeline's max_threads_per_threadgroup."""
    return f"max_threads({host})"


def tree(ctx: Context, limits: bool) -> sym.Tree:
    """`derive` as a decision tree over symbolic sizes (NotSymbolic where it cannot be).
    limits: each pipeline's max_threads_per_threadgroup a symbol too (the launcher's switch to
    another kernel where a pipeline takes fewer threads); else every pipeline is taken to
    allow MAX_THREADS_PER_GROUP, as the exported per-shape launches are (the loader refuses a
    launch over the running pipeline's limit)."""
    base = {a: SymInt(a) for a in base_axes(ctx.graph)}
    if ctx.schedule.alternative_hosts:
        raise NotSymbolic("the launcher picks among its kernels by the backend's occupancy "
                          "(alternatives), which is no formula of the sizes")
    ranges = {a: (0, SIZE_LIMIT) for a in base}
    ranges.update({symbol(i.host_name): (1, MAX_THREADS_PER_GROUP)
                   for k in ctx.schedule.kernels for i in k.instances})
    if limits:
        def limit(host: str) -> Any:
            return SymInt(symbol(host))
    else:
        def limit(host: str) -> Any:
            return MAX_THREADS_PER_GROUP
    return sym.trace(lambda: derive(ctx, base, limit), (MetalforgeError,), ranges,
                     LIMITED_PATHS if limits else sym.MAX_PATHS)


# --------------------------------------------------------------------------- JSON form

def _launches(v: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [{"host_name": h, "threads": sym.to_json(sym.value(t)),
             "group_size": sym.to_json(sym.value(g))} for h, t, g in v["launches"]]


def to_json(t: sym.Tree) -> dict[str, Any]:
    """The manifest's form of the traced tree: the refusals, then one tree per quantity (each
    keeping only the conditions it depends on), leaves {"value": expression}."""
    first = next((leaf.value for leaf in sym.leaves(t) if leaf.error is None), None)
    if first is None:
        raise NotSymbolic("every path refuses")

    def expr(get: Callable[[Mapping[str, Any]], Any]) -> Any:
        return sym.project(t, lambda v: sym.to_json(sym.value(get(v))))
    return {
        "checks": sym.refusals(t),
        "inputs": [[expr(lambda v, i=i, j=j: v["inputs"][i][j]) for j in range(len(shape))]
                   for i, shape in enumerate(first["inputs"])],
        "outputs": [[expr(lambda v, i=i, j=j: v["outputs"][i][j]) for j in range(len(shape))]
                    for i, shape in enumerate(first["outputs"])],
        "constants": {str(i): expr(lambda v, i=i: v["constants"][i])
                      for i in first["constants"]},
        "scratch": {str(i): expr(lambda v, i=i: v["scratch"][i]) for i in first["scratch"]},
        "launches": sym.project(t, _launches)}


def lines(node: Mapping[str, Any], indent: str = "") -> list[str]:
    """A tree of launches for a reader: the conditions, then each case's launches."""
    if "if" in node:
        return [f"{indent}if {sym.text(_tuple(node['if']))}:", *lines(node["then"], indent + "  "),
                f"{indent}else:", *lines(node["else"], indent + "  ")]
    out = [f"{indent}{launch['host_name']}: threads {sym.text(_tuple(launch['threads']))}, "
           f"group {sym.text(_tuple(launch['group_size']))}" for launch in node["value"]]
    return out or [f"{indent}no launch (an empty grid)"]


def _tuple(e: Any) -> Any:
    return tuple(_tuple(x) if isinstance(x, list) else x for x in e) \
        if isinstance(e, list) else e


def pick(node: Mapping[str, Any], env: Mapping[str, int]) -> Mapping[str, Any]:
    """The leaf of a tree at these symbol values."""
    while "if" in node:
        node = node["then"] if sym.evaluate(node["if"], env) else node["else"]
    return node


def resolve(rule: Mapping[str, Any], env: Mapping[str, int]) -> dict[str, Any]:
    """The manifest's rule at these symbol values (sizes, max_threads(host)), evaluated: the
    same form as `derive`'s result; raises LaunchError where a call is refused."""
    refused = pick(rule["checks"], env).get("refuse")
    if refused is not None:
        raise LaunchError(refused)

    def ev(node: Mapping[str, Any]) -> int:
        return sym.evaluate(pick(node, env)["value"], env)
    return {"inputs": [[ev(n) for n in shape] for shape in rule["inputs"]],
            "outputs": [[ev(n) for n in shape] for shape in rule["outputs"]],
            "constants": {int(i): ev(n) for i, n in rule["constants"].items()},
            "scratch": {int(i): ev(n) for i, n in rule["scratch"].items()},
            "launches": [(launch["host_name"], sym.evaluate(launch["threads"], env),
                          sym.evaluate(launch["group_size"], env))
                         for launch in pick(rule["launches"], env)["value"]]}


# --------------------------------------------------------------------------- checking

def concrete(ctx: Context, base: Mapping[str, int], max_threads: Mapping[str, int]
             ) -> Optional[dict[str, Any]]:
    """`derive` on plain ints (None where it refuses): what the rule must reproduce."""
    try:
        return derive(ctx, base, max_threads.__getitem__)
    except MetalforgeError:
        return None


def at(node: Mapping[str, Any], base: Mapping[str, int], max_threads: Mapping[str, int]
       ) -> Optional[dict[str, Any]]:
    """The rule evaluated at these sizes (None where it refuses)."""
    env = {**base, **{symbol(h): n for h, n in max_threads.items()}}
    try:
        return resolve(node, env)
    except LaunchError:
        return None


def samples(ctx: Context, exported: Mapping[str, int], n: int = SAMPLES,
            seed: int = 0) -> list[dict[str, int]]:
    """The exported sizes, then `n` drawn from SAMPLE_SIZES (multiples of what derived dims
    divide by)."""
    rng = random.Random(seed)
    axes = list(exported)
    out = [dict(exported)]
    for _ in range(n):
        pick = {}
        for a in axes:
            m = size_multiple(ctx.graph.tensors, a)
            pick[a] = rng.choice(SAMPLE_SIZES[:12] if rng.random() < 0.5 else SAMPLE_SIZES) * m
        out.append(pick)
    return out


def verify(ctx: Context, node: Mapping[str, Any], exported: Mapping[str, int],
           max_threads: Mapping[str, int]) -> Optional[str]:
    """Where the rule and `derive` disagree (a description), or None: at the exported sizes,
    at sampled sizes, and with each pipeline limited to half its threads."""
    halved = {h: max(32, n // 2) for h, n in max_threads.items()}
    for limits in (max_threads,) if "max_threads" in node else (max_threads, halved):
        for base in samples(ctx, exported):
            want, got = concrete(ctx, base, limits), at(node, base, limits)
            if want != got:
                return f"at sizes {base}: the code gives {want}, the formulas {got}"
    return None


def rule(ctx: Context, exported: Mapping[str, int], max_threads: Mapping[str, int]
         ) -> dict[str, Any]:
    """The manifest's "rule" of a specialisation (`to_json`, and "text": the launches for a
    reader) where the launch code traces to formulas that `verify` accepts, else
    {"unavailable": why}."""
    # a schedule with no other kernel for a pipeline of fewer threads: its limit changes no
    # launch (the loader's check_step refuses a group over it, as the launcher does)
    limits = type(ctx.schedule).within is not sched_mod.Schedule.within
    try:
        try:
            node = to_json(tree(ctx, limits))
        except NotSymbolic:
            if not limits:
                raise
            # too many cases with the limits as symbols: every pipeline taken to allow 1024
            node = {**to_json(tree(ctx, False)), "max_threads": MAX_THREADS_PER_GROUP}
            max_threads = {h: MAX_THREADS_PER_GROUP for h in max_threads}
    except NotSymbolic as e:
        return {"unavailable": f"the launch rule is not a formula of the sizes here ({e})"}
    wrong = verify(ctx, node, exported, max_threads)
    if wrong is not None:
        return {"unavailable": f"the traced formulas do not reproduce the launch rule ({wrong})"}
    return {**_no_paths(node), "text": lines(node["launches"])}


# a file path not inside a word or formula ("K/8"): its directories, then its name (group 1)
_PATH = re.compile(r"(?<![\w)\]])(?:[A-Za-z]:)?[/\\](?:[^\s/\\:'\"]+[/\\])*"
                   r"([^\s/\\:'\"]+)")


def _no_paths(node: Any) -> Any:
    """The rule with each file path in its messages cut to the file's name (a manifest names
    no directory of the machine it was made on)."""
    if isinstance(node, dict):
        return {k: _no_paths(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_no_paths(v) for v in node]
    if isinstance(node, str):
        return _PATH.sub(r"\1", node)
    return node


def _factors(e: Any) -> Optional[list[str]]:
    """The sizes whose product `e` is (None where it is something else)."""
    if isinstance(e, str):
        return [e]
    if isinstance(e, tuple) and e[0] == "*":
        a, b = _factors(e[1]), _factors(e[2])
        return None if a is None or b is None else a + b
    return None


def size_sources(ctx: Context, axes: list[str]) -> dict[str, list[Any]] | str:
    """Where a call's size of each base axis is read: {axis: [tensor argument, dim, [axes it
    is divided by]]}: a dim that is that axis alone, or a grouped dim "(G R)" once the other
    axes are known; else [tensor, dim, [], [mul, div, add]]: a derived dim (size * mul // div
    + add), the axis (size - add) * div // mul. The loader then checks every dim against the
    rule's shapes. Or why some axis has none."""
    sizes = all_sizes(ctx.graph, {a: SymInt(a) for a in axes})
    dims = [(p.name, i, _factors(n.e) if isinstance(n, SymInt) else None)
            for p in ctx.tensors for i, n in enumerate(param_shape(p, sizes))]
    out: dict[str, list[Any]] = {}
    grew = True
    while grew:
        grew = False
        for name, i, factors in dims:
            unknown = [f for f in factors or () if f not in out]
            if len(unknown) == 1:
                rest = list(factors or ())
                rest.remove(unknown[0])
                out[unknown[0]] = [name, i, rest]
                grew = True
    for p in ctx.tensors:                   # then a derived dim "K/8" gives K = 8 x its size
        for i, d in enumerate(d for d in p.dims if not d.joined):
            if d.derived and d.size is None and d.base in axes and d.base not in out:
                out[d.base] = [p.name, i, [], [d.mul, d.div, d.add]]
    missing = [a for a in axes if a not in out]
    if missing:
        return (f"no dim of an argument gives {', '.join(map(repr, missing))}, so a call's "
                f"sizes cannot be read off its arguments")
    return {a: out[a] for a in axes}
