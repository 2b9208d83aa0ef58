"""`check(kernel)`: property-based test of a kernel against its reference.

For each compiled variant of the kernel (a dtype for each dtype variable x a value for each
`mf.Const`), hypothesis draws sizes for every named dim, values from several families, memory
layouts and runtime scalars; the kernel runs on the chosen backend and its outputs are compared
with ``kernel.reference`` under the policy of `metalforge.tolerance`. The first failure
is shrunk and raised as an AssertionError whose message holds the example, the breach and the
generated MSL.

Coverage: each variant compiles to several kernel instantiations (one per ``host_name``: the
schedule's size variants, e.g. simd/group/looped rows or column/split, at 32- and 64-bit
indexing). After the random examples, `check` runs boundary sizes of the axis that picks the
instantiation (1, 31, 32, 33 and each threshold t, t+1, t+vector width of the launch policy), at
both index widths (64-bit through ``launch={"index64": True}``, so small tensors reach those
kernels), a fixed number of examples each. The report lists every instantiation with its launch
count and sizes; one that no example launched fails the check, unless no size allowed by
``dims=`` selects it (then the report says so).
"""
from __future__ import annotations

import contextlib
import hashlib
import itertools
import math
import zlib
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Optional, Sequence

import torch
from hypothesis import given, reject, seed, settings, strategies as st

from .. import dtypes as _dtypes
from ..graph import ConstParam, Graph, Node, ScalarParam, TensorParam, take_sites, topo_order
from . import faults, strategies as S
from .gradients import gradient_problem
from .profiles import Profile, profile as _profile
from ..tolerance import ACCUMULATION, Tolerance, compare, lowest_precision, magnitude, \
    reduction_length, tolerance
from .. import runtime, sim
from ..errors import BindingError, GatherIndexError, LaunchError, TraceError, \
    UnsupportedConstruct
from ..reference import evaluate
from ..runtime import schedule_of
from ..runtime.backends import current_backend
from ..runtime.launcher import layered
from ..shapes import bind_shapes

_PREFERRED = ("f32", "f16", "bf16", "i32", "u32", "i16", "u16", "i8", "u8", "bool")


@dataclass(frozen=True)
class Variant:
    """One compiled specialisation: dtype-variable bindings and Const values."""
    dtypes: dict[str, str]
    consts: dict[str, Any]
    graph: Graph
    grad: bool = False          # also compare gradients (check's grad=)

    def describe(self) -> str:
        parts = [f"{k}={v}" for k, v in self.dtypes.items()]
        parts += [f"{k}={v!r}" for k, v in self.consts.items()]
        return ", ".join(parts) or "(single variant)"


@dataclass
class Instantiation:
    """One compiled kernel a variant can launch, and the launches check made of it."""
    variant: str                  # Variant.describe()
    host_name: str
    index64: bool
    launches: int = 0
    sizes: list[str] = field(default_factory=list)    # distinct axis sizes launched (first 32)
    unreachable: Optional[str] = None                 # why no allowed size selects it

    def describe(self) -> str:
        what = (f"{self.launches} launch(es), sizes {'; '.join(self.sizes)}" if self.launches
                else f"never launched ({self.unreachable or 'no example selected it'})")
        return f"{self.variant} | {self.host_name}: {what}"


@dataclass
class Report:
    """What a passing check did (returned by `check`)."""
    kernel: str
    profile: str
    variants: list[str] = field(default_factory=list)
    skipped_variants: list[str] = field(default_factory=list)
    refused_variants: list[str] = field(default_factory=list)   # "T=i32: <the error>"
    examples: int = 0
    instantiations: list[Instantiation] = field(default_factory=list)

    def coverage(self) -> str:
        """One line per instantiation of the checked variants: launches and sizes."""
        return "\n".join(i.describe() for i in self.instantiations)


def check(kernel, *, dims: Optional[Mapping[str, Any]] = None,
          dtypes: Optional[Mapping[str, Sequence[str] | str]] = None,
          values: Optional[Mapping[str, Any] | str | Sequence[str]] = None,
          max_examples: Optional[int] = None, backend: Optional[str] = None,
          layouts: bool = True, memory_budget: Optional[int] = None,
          max_variants: Optional[int] = None, profile: Optional[str] = None,
          grad: bool = False) -> Report:
    """Test ``kernel`` against ``kernel.reference`` on inputs hypothesis draws.

    dims:          pin sizes: ``{"D": 4096}``, ``{"D": range(1, 65)}``, ``{"D": (1, 64)}``
                   (inclusive), ``{"D": [31, 4097]}``; batch dims by leading shape
                   ``{"B": (2, 3)}`` or ``{"B": [(), (4,)]}``.
    dtypes:        restrict dtype variables: ``{"T": ["f16", "bf16"]}`` (or ``"f16"``).
    values:        per parameter: a tensor's value families (``"normal"``, ``["tiny", "zeros"]``)
                   or a ``(lo, hi)`` range; a scalar's value, list, ``(lo, hi)`` or a hypothesis
                   strategy; a Const's value or list of values. A plain family name or list
                   applies to every float tensor.
    max_examples:  examples per compiled variant (default: the profile's).
    backend:       "sim", "mps" or "cuda" (default: the tensors' device: CPU tensors -> sim;
                   MPS tensors when ``backend="mps"``, CUDA tensors when ``backend="cuda"``).
    layouts:       also draw non-contiguous, offset and expanded inputs.
    memory_budget: bytes the inputs and outputs of one example may take (default: profile's).
    max_variants:  compiled variants tried (default: the profile's; None in the thorough one).
    profile:       "metalforge-ci" / "metalforge-thorough" (default: $METALFORGE_HYPOTHESIS_PROFILE).
    grad:          also check a differentiable kernel's gradients against torch.autograd on
                   the reference (`testing.gradients`).

    Example: ``check(rms_norm, dtypes={"T": ["f16"]}, dims={"D": [31, 4097]})``
    """
    prof = _profile(profile)
    params = tuple(kernel.params)
    dims = dict(dims or {})
    per_param, global_families = _split_values(values, params, kernel)
    variants, refused = _variants(kernel, params, dtypes, per_param)
    cap = max_variants if max_variants is not None else prof.max_variants
    chosen = _spread(variants, cap)
    report = Report(kernel.name, prof.name, [v.describe() for v in chosen],
                    [v.describe() for v in variants if v not in chosen], refused)
    n = max_examples if max_examples is not None else prof.settings.max_examples
    budget = memory_budget if memory_budget is not None else prof.memory_budget
    common = dict(per_param=per_param, global_families=global_families, backend=backend,
                  layouts=layouts, budget=budget, prof=prof)
    for variant in chosen:
        insts = _instantiations(kernel, variant, backend)
        report.examples += _check_variant(kernel, replace(variant, grad=grad), dims=dims, max_examples=n,
                                          record=insts, **common)
        report.examples += _cover(kernel, variant, insts, dims, **common)
        report.examples += _check_index_bounds(kernel, variant, dims=dims, max_examples=n,
                                                **common)
        _mark_alternatives(kernel, variant, insts, backend)
        report.instantiations += insts.values()
    _fail_unlaunched(kernel, report)
    return report


def _fail_unlaunched(kernel, report: Report) -> None:
    """An AssertionError naming every instantiation no example launched (and not unreachable)."""
    missing = [i for i in report.instantiations if not i.launches and not i.unreachable]
    if missing:
        raise AssertionError(
            f"metalforge check: kernel '{kernel.name}': {len(missing)} kernel instantiation(s) "
            f"were never launched, so nothing tested them:\n  "
            + "\n  ".join(i.describe() for i in missing)
            + "\nEvery instantiation:\n  " + report.coverage().replace("\n", "\n  "))


# --------------------------------------------------------------------------- coverage

def _spec(kernel, variant: Variant, backend: Optional[str]):
    """The specialisation the examples' calls use: what their backend changes in the launch
    table under the kernel's own options, as the launcher layers them (the examples' sizes
    vary: no autotuned options). Without `backend` the examples are CPU tensors."""
    return layered(variant.graph, backend or current_backend([torch.empty(0)]),
                   getattr(kernel, "launch", None))


def _instantiations(kernel, variant: Variant, backend: Optional[str]
                    ) -> dict[tuple[bool, str], Instantiation]:
    """Every kernel the variant can launch: each host name at each index width."""
    out: dict[tuple[bool, str], Instantiation] = {}
    spec = _spec(kernel, variant, backend)
    for idx64 in (False, True):
        s = spec.schedule(idx64)
        for k in s.kernels:
            if not any(i.host_name == k.host_name for i in out.values()):
                out[(s.index64, k.host_name)] = Instantiation(variant.describe(), k.host_name,
                                                              s.index64)
    return out


def _mark_alternatives(kernel, variant: Variant, insts, backend: Optional[str]) -> None:
    """A kernel that only the launcher's per-device choice takes (`Schedule.alternatives`: the
    staged rows where the backend fits twice the groups a core) is unreachable, not a failure,
    when no example's launch took it (the simulator reports no occupancy: never)."""
    spec = _spec(kernel, variant, backend)
    for (idx64, host), inst in insts.items():
        if not inst.launches and host in spec.schedule(idx64).alternative_hosts:
            inst.unreachable = ("taken only where the backend fits at least twice as many of "
                                "its threadgroups a core as the kernel it replaces; no "
                                "example's launch did here")


def _selector(schedule) -> Optional[str]:
    """The axis whose size picks the instantiation (a reduction's axis; else the innermost)."""
    return getattr(schedule, "axis", None) or (schedule.grid_axes[-1]
                                                if schedule.grid_axes else None)


def boundary_sizes(schedule) -> list[int]:
    """Sizes at each threshold of a schedule: 1, 31, 32, 33 (a simdgroup, and a multiple of
    the vector width or not) and, for reductions, each size threshold of the launch policy (the
    simd-row limit 32 * simd_reads_per_thread, the group-row limit) as t, t + 1 and t + vector
    width (at least t + 3: t + 1 is one more than a multiple of every power-of-two step, such
    as the column kernel's 8 slices, and would leave their tails untried); for row reductions
    also each row length where the lanes per row double (R 2^k, R 2^k + 1, R =
    simd_reads_per_thread, and R 2^k + vector width: whole vectors with the last lane short,
    the simd kernel's vector loads, which no other boundary size reaches) and the staged
    kernel's shortest row."""
    p = schedule.policy
    out = {1, 31, 32, 33}
    if hasattr(schedule, "thresholds"):                 # a family that knows its own
        for t in schedule.thresholds:
            out |= {t - 1, t, t + 1}
    elif schedule.family != "elementwise":
        past = max(3, p.vector_width)
        for t in (32 * p.simd_reads_per_thread, getattr(schedule, "group_limit", p.looped_limit)):
            out |= {t, t + 1, t + past}
    if hasattr(schedule, "lanes_per_row"):              # rows sharing a simdgroup: each
        for k in range(5):                              # lanes-per-row step: t, t + 1 and
            t = p.simd_reads_per_thread << k            # t + vector width
            out |= {t, t + 1, t + p.vector_width}
        out |= set(schedule.staged_rows)                # the staged kernel's shortest row
    return sorted(out)


def _cover(kernel, variant: Variant, insts, dims, *, prof: Profile, **common) -> int:
    """Boundary examples at both index widths; marks what no allowed size can select."""
    ran = 0
    plain = S.dim_plan(variant.graph.params).plain
    for idx64 in sorted({k[0] for k in insts}):
        runner = kernel.with_launch(index64=True) if idx64 else kernel
        s = _spec(runner, variant, common.get("backend")).schedule(idx64)
        axis = _selector(s)
        if axis is None or axis not in plain:
            pins: list[Optional[int]] = [None]         # not pinnable: random sizes only
        else:
            multiple = plain[axis]           # derived dims (K/GS) need whole multiples
            sizes = sorted({S._round_up(b, multiple) for b in boundary_sizes(s)})
            pins = [b for b in sizes if axis not in dims or _allowed(dims[axis], b)]
            if axis in dims:            # and the first allowed size of each kernel
                pins = sorted(set(pins) | set(_one_per_kernel(s, axis, _choices(dims[axis]))))
            pins = pins or [None]
            if idx64:                   # the 64-bit kernels: one boundary size per kernel
                pins = _one_per_kernel(s, axis, pins)
        for b in pins:
            pinned = dict(dims) if b is None else {**dims, axis: b}
            ran += _pinned_examples(runner, variant, pinned, insts, prof, common)
        ran += _cover_selected(runner, variant, insts, dims, s, idx64, prof=prof, **common)
        if axis in dims:
            for (w, host), inst in insts.items():
                if w == idx64 and not inst.launches:
                    inst.unreachable = f"dims= pins '{axis}' to {dims[axis]!r}"
    return ran


def _cover_selected(runner, variant: Variant, insts, dims, s, idx64: bool, *, prof: Profile,
                    **common) -> int:
    """Examples for each kernel that sizes of another axis select (`schedule.selecting`: the
    quantized schedule's tiled kernel, by rows of x; attention's kernels, by E, heads, query
    rows and keys, two ways each; the wide elementwise kernel, by the element count, with
    whole and partial chunks), unless a launch already had those sizes. `selecting` gives a
    list of sets of pins."""
    ran = 0
    plain = S.dim_plan(variant.graph.params).plain
    for (w, host), inst in insts.items():
        for pins in s.selecting(host) if hasattr(s, "selecting") else []:
            pins = {a: S._round_up(n, plain.get(a, 1)) if isinstance(n, int) else n  # whole
                    for a, n in pins.items()}        # multiples; a batch dim's shape as it is
            want = {f"{a}={n}" for a, n in pins.items()}
            if w != idx64 or any(want <= set(seen.split(",")) for seen in inst.sizes) \
                    or any(a in dims and not _allowed(dims[a], n) for a, n in pins.items()):
                continue
            ran += _pinned_examples(runner, variant, {**dims, **pins}, insts, prof, common)
    return ran


def _pinned_examples(runner, variant: Variant, dims, insts, prof: Profile, common) -> int:
    """The profile's boundary examples at sizes `dims` pins: a quarter of the memory budget
    (several rows of 8196 f32 in CI: one row hides a wrong row offset) and no dim drawn empty
    (they are there to run the kernel those sizes select, and with a profile's two examples a
    size, an empty one would leave hypothesis' simplest example alone)."""
    return _check_variant(runner, variant, dims=dims, max_examples=prof.boundary_examples,
                          record=insts, prof=prof, empty=False,
                          **{**common, "budget": common["budget"] // 4})


def _one_per_kernel(s, axis: str, pins: list) -> list:
    """The first size of `pins` that selects each of the schedule's kernels (all axes but
    `axis` at 1), and every size where the launcher may take another kernel instead
    (`Schedule.alternatives`: whether it does depends on the device)."""
    firsts: dict[str, int] = {}
    maybe: set[int] = set()
    ones = {d.name: 1 for t in s.graph.tensors for d in t.dims}
    for b in pins:
        sizes = {**ones, axis: b}
        try:
            steps = s.steps(sizes)
        except Exception:                                        # noqa: BLE001 - refused
            continue
        for step in steps:
            firsts.setdefault(step.host_name, b)
            if s.alternatives(step, sizes):
                maybe.add(b)
    return sorted(set(firsts.values()) | maybe) or pins[:1]


def _choices(pin) -> list[int]:
    """The sizes a `dims=` pin allows (a range or (lo, hi): its ends)."""
    if isinstance(pin, int):
        return [pin]
    if isinstance(pin, range):
        return [pin[0], pin[-1]] if len(pin) else []
    if isinstance(pin, tuple) and len(pin) == 2 and all(isinstance(v, int) for v in pin):
        return list(pin)
    return [v for v in pin if isinstance(v, int)] if isinstance(pin, list) else []


def _allowed(pin, size: int) -> bool:
    if isinstance(pin, int):
        return pin == size
    if isinstance(pin, range):
        return size in pin
    if isinstance(pin, tuple) and len(pin) == 2 and all(isinstance(v, int) for v in pin):
        return pin[0] <= size <= pin[1]
    return isinstance(pin, list) and size in pin


def _record(insts, kernel, variant: Variant, args: Mapping[str, Any]) -> None:
    """Count the launches `args` make: the instantiations the launcher runs for them (its
    choices on the compiled kernels included: a register-bound pipeline's fallback, the staged
    rows where the backend fits twice the groups a core)."""
    graph = variant.graph
    try:
        sizes = bind_shapes(graph, {t.name: args[t.name] for t in graph.tensors}).sizes
        hosts = [plan[0] for plan in kernel.launches(**args)]
    except Exception:                                            # noqa: BLE001 - refused
        return                                  # the run reports it (or expects the refusal)
    by_host = {host: inst for (_, host), inst in insts.items()}
    for host in hosts:                                   # several: attention's merge
        inst = by_host.get(host)
        if inst is not None:
            inst.launches += 1
            text = ",".join(f"{a}={n}" for a, n in sizes.items())
            if text not in inst.sizes and len(inst.sizes) < 32:
                inst.sizes.append(text)


# --------------------------------------------------------------------------- variants


def _split_values(values, params, kernel):
    if values is None:
        return {}, None
    if isinstance(values, str):
        return {}, [values]
    if isinstance(values, (list, tuple)) and all(isinstance(v, str) for v in values):
        return {}, list(values)
    if not isinstance(values, Mapping):
        raise TypeError(f"check({kernel.name}): values= must be a mapping from parameter name "
                        f"to families/ranges/values, or family name(s); got {values!r}")
    names = {p.name for p in params}
    for k in values:
        if k not in names:
            raise ValueError(f"check({kernel.name}): values= names '{k}', which is not a "
                             f"parameter (parameters: {', '.join(sorted(names))})")
    return dict(values), None


def _dtype_vars(params) -> dict[str, list[TensorParam]]:
    out: dict[str, list[TensorParam]] = {}
    for p in params:
        if isinstance(p, TensorParam) and p.dtype_var:
            out.setdefault(p.dtype_var, []).append(p)
    return out


def _variants(kernel, params, dtypes, per_param) -> tuple[list[Variant], list[str]]:
    """The variants that trace and lower, and those the schedules refuse with a clear error
    before any launch (e.g. integer sums): "T=i32: <error>". Refusing is the kernel's
    documented behaviour, not a wrong answer, so these are left out (and reported)."""
    dvars = _dtype_vars(params)
    dtypes = dict(dtypes or {})
    for k in dtypes:
        if k not in dvars:
            raise ValueError(f"check({kernel.name}): dtypes= names '{k}', which is not a dtype "
                             f"variable of the kernel (its variables: "
                             f"{', '.join(dvars) or 'none'})")
    choices: list[list[str]] = []
    for var in dvars:
        want = dtypes.get(var)
        if want is None:
            cands = list(_PREFERRED)
        else:
            cands = [want] if isinstance(want, str) else list(want)
            for c in cands:
                if c not in _dtypes.ANNOTATION_DTYPES:
                    raise ValueError(f"check({kernel.name}): dtypes['{var}'] has unknown dtype "
                                     f"'{c}' (known: {', '.join(_dtypes.ANNOTATION_DTYPES)})")
        choices.append(cands)
    consts = [p for p in params if isinstance(p, ConstParam)]
    const_choices = [S.const_values(p, per_param.get(p.name)) for p in consts]
    out: list[Variant] = []
    errors: list[str] = []
    refused: list[str] = []
    for combo in itertools.product(*choices):
        dt = dict(zip(dvars, combo))
        for cvals in itertools.product(*const_choices):
            cs = {p.name: v for p, v in zip(consts, cvals)}
            try:
                graph = kernel.graph(**dt, **cs)        # bindings only: trace, no tensors
            except (BindingError, TraceError) as e:     # this dtype is not accepted
                if str(e) not in errors:
                    errors.append(str(e))
                continue
            v = Variant(dt, cs, graph)
            try:
                schedule_of(graph, launch=getattr(kernel, "launch", None))
            except UnsupportedConstruct as e:
                refused.append(f"{v.describe()}: {e}")
                continue
            out.append(v)
    if not out:
        raise ValueError(f"check({kernel.name}): no dtype/Const combination traces and lowers; "
                         f"the errors were:\n" + "\n".join((errors + refused)[:5]))
    return out, refused


def _spread(variants: list[Variant], cap: Optional[int]) -> list[Variant]:
    """At most ``cap`` variants, chosen greedily to cover the most dtype and Const values:
    each pick is the (earliest) variant adding the most values not yet covered."""
    if cap is None or len(variants) <= cap:
        return variants

    def values(v: Variant) -> set:
        return set(v.dtypes.items()) | {(k, repr(x)) for k, x in v.consts.items()}

    chosen: list[Variant] = []
    seen: set = set()
    while len(chosen) < cap:
        rest = [v for v in variants if v not in chosen]
        best = max(rest, key=lambda v: (len(values(v) - seen), -variants.index(v)))
        chosen.append(best)
        seen |= values(best)
    return sorted(chosen, key=variants.index)


# --------------------------------------------------------------------------- one variant


@dataclass
class _Drawn:
    """One example: the arguments and how each was made (for the report)."""
    args: dict[str, Any]
    lines: list[str]
    sizes: S.Sizes


def _graph_limits(graph: Graph) -> dict[str, bool]:
    """Which value families the ops of ``graph`` are defined on. A sum of unpacked words (the
    quantized schedule) assumes finite inputs: its per-group algebra s * sum(q x) + b * sum(x)
    turns an infinite bias or activation into ±inf where the element-by-element sum gives NaN
    (docs/reference/quantization.md)."""
    float_to_int = int_div = shifts = int_pow = False
    quantized = any(n.op == "unpack" for r in graph.reductions() for n in topo_order([r]))
    for n in graph.nodes():
        if n.op == "cast" and n.args and n.args[0].dtype.is_float and not n.dtype.is_float:
            float_to_int = True
        if n.op == "binary" and n.attr in ("floordiv", "mod") and not n.dtype.is_float:
            int_div = True
        if n.op == "binary" and n.attr in ("shl", "shr"):
            shifts = True
        if n.op == "binary" and n.attr == "pow" and not n.dtype.is_float:
            int_pow = True
    return {"nonfinite": not (float_to_int or quantized), "large": not float_to_int,
            "zeros": not int_div, "negative": not (shifts or int_pow)}


def index_tensors(graph: Graph) -> dict[str, str]:
    """{integer tensor: the axis it indexes} for gathers whose index is a tensor argument (as
    loaded, or converted): check draws their values in range (a separate test draws bad ones)."""
    out: dict[str, str] = {}
    for n in take_sites(graph):
        idx = n.args[0]
        while idx.op == "cast" and not idx.dtype.is_float:
            idx = idx.args[0]
        if idx.op == "load":
            out[idx.attr] = n.attr[1]
    return out


def _draw_example(draw, variant: Variant, params, *, dims, per_param, global_families,
                  layouts: bool, budget: int, device, empty: bool = True,
                  admit: Callable[[Mapping[str, int]], None] = lambda sizes: None) -> _Drawn:
    graph = variant.graph
    plan = S.dim_plan(params)
    reduced = frozenset(n.attr[1] for n in graph.reductions())
    reduced |= frozenset(plan.derived[a].base for a in reduced if a in plan.derived)
    indices = index_tensors(graph)               # gathered axes: never empty, valid indices
    reduced |= frozenset(indices.values())
    itemsize = max([t.dtype.itemsize for t in graph.tensors] + [4])
    max_elements = max(1, budget // ((plan.tensors + len(graph.outputs)) * itemsize))
    sizes = draw(S.sizes(plan, pinned=dims, max_elements=max_elements, reduced=reduced,
                         empty=empty), label="sizes")
    admit(sizes.sizes)                           # may reject the example before its values
    limits = _graph_limits(graph)
    nonfinite = limits["nonfinite"] and draw(st.booleans(), label="inf/NaN inputs")
    args: dict[str, Any] = {}
    lines = [f"sizes: {sizes.describe()}"]
    for p in params:
        if isinstance(p, TensorParam):
            spec = per_param.get(p.name)
            if p.name in indices and spec is None:
                spec = (0, sizes.sizes[indices[p.name]] - 1)    # in range along the axis
            args[p.name], line = _draw_tensor(draw, graph.param(p.name).dtype, p, sizes, spec,
                                              global_families, nonfinite, limits, layouts,
                                              device)
            lines.append(line)
        elif isinstance(p, ScalarParam):
            v = draw(S.scalar(p, per_param.get(p.name)), label=p.name)
            args[p.name] = v
            lines.append(f"{p.name} = {v!r} ({p.pytype.__name__}, runtime scalar)")
        elif isinstance(p, ConstParam):
            args[p.name] = variant.consts[p.name]
    return _Drawn(args, lines, sizes)


def _families(dtype, name: str, spec, global_families, nonfinite: bool, limits
              ) -> tuple[str, ...]:
    """The value families tensor `name` may take (what `values=` asks, else all allowed)."""
    allowed = S.families(dtype, nonfinite=nonfinite, large=limits["large"],
                         zeros=limits["zeros"])
    if nonfinite and dtype.is_float:
        allowed = tuple(f for f in allowed if f in S.MODERATE_FAMILIES)
    want = spec if spec is not None else (global_families if dtype.is_float else None)
    if isinstance(want, str):
        want = [want]
    if want is None:
        return allowed
    bad = [f for f in want if f not in S.families(dtype)]
    if bad:
        raise ValueError(f"values['{name}']: unknown family {', '.join(bad)} for {dtype.name} "
                         f"(families: {', '.join(S.families(dtype))})")
    return tuple(want)


def _draw_tensor(draw, dtype, p: TensorParam, sizes, spec, global_families, nonfinite: bool,
                 limits, layouts: bool, device) -> tuple[torch.Tensor, str]:
    """One tensor argument and its line of the example's description."""
    shape = sizes.shape(p)
    rng = spec if isinstance(spec, tuple) and len(spec) == 2 else None
    fams = ("range",) if rng else _families(dtype, p.name, spec, global_families, nonfinite,
                                             limits)
    family = draw(st.sampled_from(_weighted(fams)), label=f"{p.name} family")
    seed = draw(st.integers(0, 2 ** 16), label=f"{p.name} seed")
    vals = S.make_values(dtype, shape, family, seed, value_range=rng,
                         zeros=limits["zeros"], negative=limits["negative"])
    layout = draw(st.sampled_from(S.layouts_for(shape)), label=f"{p.name} layout") \
        if layouts else "contiguous"
    t = S.materialise(vals, layout, device=device)
    what = f"range {rng}" if rng else f"family '{family}'"
    return t, (f"{p.name}: {dtype.name}{list(shape)} (annotation \"{p.annotation}\"), values "
               f"{what} seed {seed}, layout {S.describe_layout(t, layout)}")


def _weighted(fams: tuple[str, ...]) -> tuple[str, ...]:
    """The families to draw from, all-zero tensors a third as often as each other family (a
    zero input hides most of what the kernel computes from it)."""
    return tuple(f for f in fams for _ in range(1 if f == "zeros" or len(fams) == 1 else 3))


def _as_tuple(r) -> tuple:
    return tuple(r) if isinstance(r, (tuple, list)) else (r,)


def _device(backend) -> str:
    """Where a check's inputs live: the GPU a backend runs on, else the CPU (the simulator)."""
    return {"mps": "mps", "cuda": "cuda"}.get(backend, "cpu")


def _backend_ctx(backend):
    """The `with` block a check's calls run in: the backend asked for, else the tensors'."""
    return runtime.backend(backend) if backend else contextlib.nullcontext()


def _check_variant(kernel, variant: Variant, *, dims, per_param, global_families,
                   max_examples: int, backend, layouts: bool, budget: int,
                   prof: Profile, record=None, empty: bool = True) -> int:
    device = _device(backend)
    if device != "cpu":     # the thread and work budgets are the simulator's (it runs every
        # thread): on cuda the wide elementwise kernel's pinned examples take 2^18 threads and
        # a few more
        prof = replace(prof, launch_budget=1 << 62, work_budget=1 << 62)
    ran = [0]

    def backend_ctx():
        return _backend_ctx(backend)

    @settings(prof.settings, max_examples=max_examples)
    @given(st.data())
    def run_one(data):
        ex = _draw_example(data.draw, variant, variant.graph.params, dims=dims,
                           per_param=per_param, global_families=global_families,
                           layouts=layouts, budget=budget, device=device, empty=empty,
                           admit=lambda sizes: _admit(kernel, variant, sizes, prof))
        model = _launch_model(data.draw, ex) if device == "cpu" else contextlib.nullcontext()
        ran[0] += 1
        if record is not None:
            with backend_ctx():
                _record(record, kernel, variant, ex.args)
        with model:
            problem = _run_and_compare(kernel, variant, ex, backend_ctx)
        if problem is not None:      # one raise site: hypothesis shrinks all failures as one bug
            raise AssertionError(_report(kernel, variant, ex, backend, problem))

    _seeded(run_one, prof, kernel, variant, "examples")()
    return ran[0]


def _check_index_bounds(kernel, variant: Variant, *, dims, max_examples: int, per_param,
                        global_families, backend, layouts: bool, budget: int,
                        prof: Profile) -> int:
    """A gather's index tensor one past its axis (the size itself) and, where its type is
    signed, -1, at its first and last element, in examples drawn as the others are: the kernel
    and its reference must both raise GatherIndexError naming the value (bad input never gives
    a wrong answer; the other examples draw indices in range), unless the output they return
    is empty (a dim of size 0: nothing is gathered, so no index is read). Returns the kernel
    calls."""
    indices = index_tensors(variant.graph)
    if not indices:
        return 0
    device, ctx = _device(backend), _backend_ctx(backend)
    calls = [0]

    @settings(prof.settings, max_examples=max_examples)
    @given(st.data())
    def bad_index(data):
        ex = _draw_example(data.draw, variant, variant.graph.params, dims=dims,
                           per_param=per_param, global_families=global_families,
                           layouts=layouts, budget=budget, device=device,
                           admit=lambda sizes: _admit(kernel, variant, sizes, prof))
        for name, axis in indices.items():
            t, size = ex.args[name], ex.sizes.sizes[axis]
            if t.numel() == 0:
                continue
            info = torch.iinfo(t.dtype)
            bad = [v for v in (size, -1) if info.min <= v <= info.max]
            for value, at in itertools.product(bad, sorted({0, t.numel() - 1})):
                args = dict(ex.args, **{name: t.contiguous().clone()})
                args[name].view(-1)[at] = value
                for who, fn in (("the kernel", kernel), ("the reference", kernel.reference)):
                    calls[0] += who == "the kernel"
                    try:
                        with ctx:
                            got = _as_tuple(fn(**args))
                    except GatherIndexError as e:
                        if f"index {value} " in str(e):
                            continue
                        problem = f"{who} raised GatherIndexError not naming {value}: {e}"
                    except Exception as e:                       # noqa: BLE001 - reported
                        problem = f"{who} raised {type(e).__name__}: {e}"
                    else:
                        if not any(o.numel() for o in got):      # nothing gathered: no index
                            continue                             # read, none to refuse
                        problem = f"{who} raised nothing"
                    raise AssertionError(_report(
                        kernel, variant, ex, backend, f"'{name}' with element {at} set to "
                        f"{value} (outside '{axis}', size {size}): {problem}"))

    _seeded(bad_index, prof, kernel, variant, "indices out of range")()
    return calls[0]


def _seeded(test, prof: Profile, kernel, variant: Variant, purpose: str):
    """`test` with its own hypothesis seed where the profile is derandomized: one per kernel
    name, variant and purpose, so that each kernel draws its own examples and they stay the
    same across releases of metalforge that leave the strategies alone (derandomize alone
    seeds every check from the source text of check's own test function)."""
    if not prof.settings.derandomize:
        return test
    key = f"{kernel.name} | {variant.describe()} | {purpose}".encode()
    return seed(int.from_bytes(hashlib.sha256(key).digest()[:8], "little"))(test)


def _admit(kernel, variant: Variant, sizes: Mapping[str, int], prof: Profile) -> None:
    """Reject (hypothesis) sizes the schedule refuses before launch (a documented limit, such
    as attention's E over 256), or whose launches run more than the profile's thread budget or
    whose axis sizes multiply to more than its work budget (the simulator runs every thread and
    every iteration; `_check_variant` lifts both on a GPU)."""
    if _iterations(variant.graph, sizes) > prof.work_budget:
        reject()
    try:
        s = schedule_of(variant.graph, sizes=sizes, launch=getattr(kernel, "launch", None))
        steps = s.steps(sizes)
    except LaunchError:
        reject()
    except Exception:                                            # noqa: BLE001 - the call
        return                                                   # reports it
    if sum(step.threads for step in steps) > prof.launch_budget:
        reject()


def _iterations(graph: Graph, sizes: Mapping[str, int]) -> int:
    """The product of the sizes of the axes the kernel iterates over: those of the graph's
    values (a batch axis counts as the product of its leading shape). A derived axis such as
    'K/8' repeats its base's iterations, and a gather's source axis (a paged cache's rows) is
    only indexed: both are left out."""
    axes = {a for n in topo_order([o.node for o in graph.outputs]) for a in n.axes}
    return math.prod(size for name, size in sizes.items() if name in axes and "/" not in name)


_FILLS = {"nan": "NaN (bytes 0xFF)", "high": "2.7e36 (65504 in half)",
          "low": "-2.7e36 (-65504 in half)"}


def _launch_model(draw, ex: _Drawn) -> contextlib.AbstractContextManager:
    """How the simulator runs this example's launches (each is what some GPU does): each
    threadgroup's threads in order or last first (a missing barrier shows in one of them), on
    the exact grid (Metal's dispatchThreads) or rounded up to whole threadgroups (the cuda
    backend: a missing guard on the overhang shows), and which of NaN and large positive and
    negative values threadgroup memory starts as in the first group (the groups take them in
    turn: a read before any thread wrote shows in a sum, a max or a min; a GPU leaves whatever
    an earlier group wrote)."""
    order = "reverse" if draw(st.booleans(), label="threads last first") else "forward"
    whole = draw(st.booleans(), label="grid rounded up to whole threadgroups")
    fill = draw(st.sampled_from(sim.library.TG_FILLS), label="first group's threadgroup fill")
    if order == "reverse":
        ex.lines.append("simulator: each threadgroup's threads run last first")
    if whole:
        ex.lines.append("simulator: the grid is rounded up to whole threadgroups (as on CUDA)")
    fills, i = sim.library.TG_FILLS, sim.library.TG_FILLS.index(fill)
    turn = fills[i:] + fills[:i]
    ex.lines.append("simulator: threadgroup memory starts as "
                    f"{', '.join(_FILLS[f] for f in turn)} in groups 0, 1, 2 (and so on in turn)")
    return _simulated(order, whole, fill)


@contextlib.contextmanager
def _simulated(order: str, whole: bool, fill: str):
    with sim.thread_order(order), sim.whole_groups(whole), sim.threadgroup_fill(fill):
        yield


def _run_and_compare(kernel, variant: Variant, ex: _Drawn, backend_ctx) -> Optional[str]:
    """None when the kernel matches its reference on ``ex``, else what went wrong."""
    before = {k: v.clone() for k, v in ex.args.items() if isinstance(v, torch.Tensor)}
    try:
        with backend_ctx():
            got = _as_tuple(kernel(**ex.args))
    except faults.FaultNotPlanted:
        raise
    except Exception as e:                                       # noqa: BLE001 - reported
        return f"the kernel raised {type(e).__name__}: {e}"
    for k, v in before.items():
        if not _same(ex.args[k], v):
            return f"the kernel modified its input '{k}'"
    try:
        expected = _as_tuple(kernel.reference(**ex.args))
    except Exception as e:                                       # noqa: BLE001 - reported
        return (f"the reference raised {type(e).__name__}: {e} (restrict the inputs with "
                f"dims=/values= if this input is outside the op's domain)")
    if len(got) != len(expected):
        return f"the kernel returned {len(got)} output(s), the reference {len(expected)}"
    tol = _tolerance(variant.graph, ex)
    moved = moved_references(variant.graph, ex.args)
    slack = _slack(expected, moved) if moved else None
    others = (moved or []) + [r for r in [unread_keys_reference(variant.graph, ex.args)] if r]
    for i, (g, e) in enumerate(zip(got, expected)):
        breach = compare(g, e, tol, output=i, slack=slack[i] if slack else None,
                         alternatives=[m[i] for m in others] or None)
        if breach is not None:
            return str(breach)
    if variant.grad:
        return gradient_problem(kernel, variant.graph, ex.args,
                                zlib.crc32("\n".join(ex.lines).encode()), backend_ctx)
    return None


def reduction_slack(graph: Graph, values: Mapping[str, Any],
                    expected: Sequence[torch.Tensor]) -> Optional[list[torch.Tensor]]:
    """Per output element, how far the reference moves when every float sum of ``graph`` is
    off by the accumulation error the tolerance allows (ACCUMULATION * sqrt(n) * sum(|terms|)),
    all up or all down: the output's sensitivity to reduction rounding, which any fp32
    evaluation (the kernel's, torch's) may show. None when the graph has no float sums.
    ``values``: the arguments by name; ``expected``: the reference's outputs."""
    moved = moved_references(graph, values)
    return _slack(expected, moved) if moved else None


def unread_keys_reference(graph: Graph, values: Mapping[str, Any]) -> Optional[tuple]:
    """Attention whose mask bounds the keys on their indices (causal, a sliding window): the
    reference with the keys a query row cannot see left out of its sums over the keys, for
    rows that see some key. The kernels never read those keys (a tile reads the union of its
    rows' keys), so a NaN or ±inf planted there reaches such a row as the reference's zero
    weight times it (NaN, as torch's math path gives) or not at all. None for other graphs."""
    try:
        sizes = bind_shapes(graph, {t.name: values[t.name] for t in graph.tensors}).sizes
        s = schedule_of(graph, sizes=sizes)
    except Exception:                                            # noqa: BLE001 - refused
        return None
    if not getattr(s, "bounds", None):
        return None
    scalars = {p.name: values[p.name] for p in graph.params if isinstance(p, ScalarParam)}

    def adjust(n, x, r):
        if n.attr[0] != "sum" or n.attr[1] != s.axis or not n.dtype.is_float:
            return r
        axes = n.args[0].axes
        seen = s.visible_keys(sizes, scalars, axes)
        if seen is None:
            return r
        dim = axes.index(s.axis)
        keep = (seen | ~seen.any(dim, keepdim=True)).to(x.device)
        try:
            kept = torch.where(keep, x, torch.zeros((), dtype=x.dtype, device=x.device))
        except RuntimeError:                    # a fused product's slice: left as it is
            return r
        return kept.sum(dim).to(r.dtype)

    return _as_tuple(evaluate(graph, values, adjust=adjust))


def moved_references(graph: Graph, values: Mapping[str, Any]) -> Optional[list[tuple]]:
    """The reference's outputs with every float sum off by its allowed accumulation error: all
    up, all down, and (`MIXED_PATTERNS` more) with the sums whose elements a later reduction
    combines (attention's scores, which the softmax compares) each element up or down by its own
    sign. A uniform shift of the scores moves no softmax; rounding that differs between two
    near-tied keys does (None when the graph has no float sums)."""
    sums = [n for n in graph.reductions() if n.attr[0] == "sum" and n.dtype.is_float]
    if not sums:
        return None
    combined = _combined_again(graph, sums)

    def bound(n, x):
        dim = n.args[0].axes.index(n.attr[1])
        terms = torch.nan_to_num(x.abs(), nan=0.0, posinf=0.0)
        return ACCUMULATION * math.sqrt(x.shape[dim]) * terms.sum(dim)

    def moved(sign: float):
        def adjust(n, x, r):
            return r + sign * bound(n, x) if n in sums else r
        return _as_tuple(evaluate(graph, values, adjust=adjust))

    def mixed(bit: int):
        def adjust(n, x, r):
            return r + _value_signs(r, bit) * bound(n, x) if n in combined else r
        return _as_tuple(evaluate(graph, values, adjust=adjust))

    return [moved(1.0), moved(-1.0)] + [mixed(b) for b in range(MIXED_PATTERNS if combined else 0)]


# Sign patterns of the mixed moved references: two elements of different values get opposite
# signs in at least one of them with probability 1 - 2^-MIXED_PATTERNS.
MIXED_PATTERNS = 6


def _combined_again(graph: Graph, sums: list[Node]) -> set[Node]:
    """The sums some later reduction combines several elements of (one over an axis the sum
    keeps)."""
    return {n for m in graph.reductions() for n in topo_order(m.args)
            if n in sums and m.attr[1] in n.axes}


def _value_signs(r: torch.Tensor, bit: int) -> torch.Tensor:
    """+-1 per element from bit `bit` of a hash of its value's bits: the same for an element
    however the evaluation slices its sum (`reference.FUSED_ELEMENTS`), different for two
    different values in about half of the bits."""
    bits = r.detach().to(torch.float32).contiguous().view(torch.int32).to(torch.int64)
    h = ((bits & 0xFFFFFFFF) * 0x5BD1E995) & 0xFFFFFFFF       # < 2^63: no int64 overflow
    return 1.0 - 2.0 * ((h >> (16 + bit)) & 1).to(r.dtype)


def _slack(expected: Sequence[torch.Tensor], moved: list[tuple]) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for e, *ms in zip(expected, *moved):
        if not e.is_floating_point():
            out.append(torch.zeros(e.shape, dtype=torch.float64))
            continue
        ed = e.detach().cpu().to(torch.float64)
        d = torch.zeros_like(ed)
        for m in ms:
            d = torch.maximum(d, (m.detach().cpu().to(torch.float64) - ed).abs())
        out.append(torch.nan_to_num(d, nan=0.0, posinf=0.0))
    return out


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.is_floating_point():
        return bool(torch.equal(torch.nan_to_num(a, nan=0.5), torch.nan_to_num(b, nan=0.5))
                    and torch.equal(torch.isnan(a), torch.isnan(b)))
    return torch.equal(a, b)


def _tolerance(graph: Graph, ex: _Drawn) -> Tolerance:
    floats = [n.dtype for n in graph.nodes()] + [o.dtype for o in graph.outputs] + \
        [t.dtype for t in graph.tensors]
    return tolerance(lowest_precision(floats),
                     reduction_length=reduction_length(graph, ex.sizes.sizes),
                     scale=magnitude(ex.args.values()))


def _report(kernel, variant: Variant, ex: _Drawn, backend, what: str) -> str:
    loc = getattr(kernel, "loc", None)
    where = f" ({loc[0]}:{loc[1]})" if loc else ""
    try:
        src = faults.preview(kernel.source(**ex.args))
    except Exception as e:                                        # noqa: BLE001 - reported
        src = f"(kernel.source failed: {type(e).__name__}: {e})"
    lines = [f"metalforge check: kernel '{kernel.name}'{where} does not match its reference.",
             f"  {what}",
             "",
             f"Example (shrunk by hypothesis), variant {variant.describe()}, backend "
             f"{backend or 'by device'}:"]
    lines += [f"  {ln}" for ln in ex.lines]
    lines += ["", "Generated MSL for this example:", src.rstrip(), ""]
    return "\n".join(lines)
