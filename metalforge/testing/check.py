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

Where the parts live: the variants in `testing.variants`, the instantiations and boundary sizes
in `testing.coverage`, the drawing of an example in `testing.strategies`, and the slack a
schedule that reorders float sums is allowed (`Schedule.reordering`) in `testing.slack`.
"""
from __future__ import annotations

import contextlib
import hashlib
import itertools
import math
import zlib
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Optional, Sequence

import torch
from hypothesis import given, reject, seed, settings
from hypothesis import strategies as st

from .. import runtime, sim
from ..errors import GatherIndexError, LaunchError
from ..graph import Graph, topo_order
from ..runtime import schedule_of
from ..runtime.indexcheck import check_deferred
from ..tolerance import Tolerance, compare, lowest_precision, magnitude, reduction_length, tolerance
from . import coverage, faults, strategies
from .coverage import Instantiation
from .gradients import gradient_problem
from .profiles import Profile
from .profiles import profile as _profile
from .slack import allowance
from .strategies import Drawn, Inputs, index_tensors
from .variants import CheckVariant, split_values, spread, variants


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
    profile:       "metalforge-ci" / "metalforge-thorough" (default:
                   $METALFORGE_HYPOTHESIS_PROFILE).
    grad:          also check a differentiable kernel's gradients against torch.autograd on
                   the reference (`testing.gradients`).

    Example: ``check(rms_norm, dtypes={"T": ["f16"]}, dims={"D": [31, 4097]})``
    """
    prof = _profile(profile)
    params = tuple(kernel.params)
    dims = dict(dims or {})
    per_param, global_families = split_values(values, params, kernel)
    compiled, refused = variants(kernel, params, dtypes, per_param)
    cap = max_variants if max_variants is not None else prof.max_variants
    chosen = spread(compiled, cap)
    report = Report(kernel.name, prof.name, [v.describe() for v in chosen],
                    [v.describe() for v in compiled if v not in chosen], refused)
    n = max_examples if max_examples is not None else prof.settings.max_examples
    budget = memory_budget if memory_budget is not None else prof.memory_budget
    run = _Run(backend, prof, Inputs(per_param, global_families, layouts, budget,
                                     _device(backend)))
    for variant in chosen:
        insts = coverage.instantiations(kernel, variant, backend)
        report.examples += _check_variant(kernel, replace(variant, grad=grad), run, dims=dims,
                                          max_examples=n, record=insts)
        report.examples += coverage.cover(kernel, variant, insts, dims, backend,
                                          _pinned_examples(insts, run))
        report.examples += _check_index_bounds(kernel, variant, run, dims=dims, max_examples=n)
        coverage.mark_alternatives(kernel, variant, insts, backend)
        report.instantiations += insts.values()
    coverage.fail_unlaunched(kernel, report.instantiations)
    return report


@dataclass(frozen=True)
class _Run:
    """How a check runs its examples: on `backend` (None: the tensors' own), under the
    hypothesis profile `prof`, with arguments drawn as `inputs` says."""
    backend: Optional[str]
    prof: Profile
    inputs: Inputs


def _pinned_examples(insts, run: _Run) -> coverage.Pinned:
    """What runs the profile's boundary examples at the sizes `dims` pins: a quarter of the
    memory budget (several rows of 8196 f32 in CI: one row hides a wrong row offset) and no dim
    drawn empty (they are there to run the kernel those sizes select, and with a profile's two
    examples a size, an empty one would leave hypothesis' simplest example alone)."""
    inputs = replace(run.inputs, budget=run.inputs.budget // 4, empty=False)
    pinned = replace(run, inputs=inputs)

    def examples(runner, variant: CheckVariant, dims: Mapping[str, Any]) -> int:
        return _check_variant(runner, variant, pinned, dims=dims,
                              max_examples=run.prof.boundary_examples, record=insts)
    return examples


# --------------------------------------------------------------------------- one variant


def _as_tuple(r) -> tuple:
    return tuple(r) if isinstance(r, (tuple, list)) else (r,)


def _device(backend) -> str:
    """Where a check's inputs live: the GPU a backend runs on, else the CPU (the simulator)."""
    return {"mps": "mps", "cuda": "cuda"}.get(backend, "cpu")


def _backend_ctx(backend):
    """The `with` block a check's calls run in: the backend asked for, else the tensors'."""
    return runtime.backend(backend) if backend else contextlib.nullcontext()


def _check_variant(kernel, variant: CheckVariant, run: _Run, *, dims, max_examples: int,
                   record=None) -> int:
    """Runs `max_examples` drawn examples of one variant (recording their launches in
    `record`); returns how many ran."""
    backend, prof, device = run.backend, run.prof, run.inputs.device
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
        ex = strategies.example(data.draw, variant.graph, variant.consts, dims, run.inputs,
                                admit=lambda sizes: _admit(kernel, variant, sizes, prof))
        model = _launch_model(data.draw, ex) if device == "cpu" else contextlib.nullcontext()
        ran[0] += 1
        if record is not None:
            with backend_ctx():
                coverage.record(record, kernel, variant, ex.args)
        with model:
            problem = _run_and_compare(kernel, variant, ex, backend_ctx)
        if problem is not None:      # one raise site: hypothesis shrinks all failures as one bug
            raise AssertionError(_report(kernel, variant, ex, backend, problem))

    _seeded(run_one, prof, kernel, variant, "examples")()
    return ran[0]


def _check_index_bounds(kernel, variant: CheckVariant, run: _Run, *, dims,
                        max_examples: int) -> int:
    """A gather's index tensor one past its axis (the size itself) and, where its type is
    signed, -1, at its first and last element, in examples drawn as the others are: the kernel
    and its reference must both raise GatherIndexError naming the value (bad input never gives
    a wrong answer; the other examples draw indices in range), unless the output they return
    is empty (a dim of size 0: nothing is gathered, so no index is read). Returns the kernel
    calls."""
    indices = index_tensors(variant.graph)
    if not indices:
        return 0
    backend, prof, ctx = run.backend, run.prof, _backend_ctx(run.backend)
    calls = [0]

    @settings(prof.settings, max_examples=max_examples)
    @given(st.data())
    def bad_index(data):
        ex = strategies.example(data.draw, variant.graph, variant.consts, dims,
                                run.inputs,
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
                for who, fn in (("the reference", kernel.reference), ("the kernel", kernel)):
                    calls[0] += who == "the kernel"
                    problem = _unrefused(who, fn, args, value, ctx)
                    if who == "the reference" and problem == f"{who} raised nothing":
                        # the graph never gathers with it (`where(t == ignore, 0, t)` where
                        # ignore_index was drawn as this value): the kernel must not refuse it
                        calls[0] += 1
                        problem = _refused_wrongly(kernel, args, ctx)
                        if problem is None:
                            break
                    if problem is not None:
                        raise AssertionError(_report(
                            kernel, variant, ex, backend, f"'{name}' with element {at} set to "
                            f"{value} (outside '{axis}', size {size}): {problem}"))

    _seeded(bad_index, prof, kernel, variant, "indices out of range")()
    return calls[0]


def _refused_wrongly(kernel, args: Mapping[str, Any], ctx) -> Optional[str]:
    """None when the kernel runs `args`, whose bad index its reference never gathers with,
    without an error; else the error (the index is clamped before the gather)."""
    try:
        with ctx:
            kernel(**args)
    except Exception as e:                                       # noqa: BLE001 - reported
        return (f"the kernel raised {type(e).__name__} where its reference gathers no bad "
                f"index (a where replaces it): {e}")
    return None


def _unrefused(who: str, fn, args: Mapping[str, Any], value: int, ctx) -> Optional[str]:
    """None when `fn` (the kernel or its reference) refuses `args` with a GatherIndexError
    naming the bad index `value`, or returns only empty outputs (nothing gathered: no index
    read, none to refuse); else what it did instead."""
    try:
        with ctx:
            got = _as_tuple(fn(**args))
            check_deferred()        # index_check="deferred": reported at this sync point
    except GatherIndexError as e:
        if f"index {value} " in str(e):
            return None
        return f"{who} raised GatherIndexError not naming {value}: {e}"
    except Exception as e:                                       # noqa: BLE001 - reported
        return f"{who} raised {type(e).__name__}: {e}"
    return None if not any(o.numel() for o in got) else f"{who} raised nothing"


def _seeded(test, prof: Profile, kernel, variant: CheckVariant, purpose: str):
    """`test` with its own hypothesis seed where the profile is derandomized: one per kernel
    name, variant and purpose, so that each kernel draws its own examples and they stay the
    same across releases of metalforge that leave the strategies alone (derandomize alone
    seeds every check from the source text of check's own test function)."""
    if not prof.settings.derandomize:
        return test
    key = f"{kernel.name} | {variant.describe()} | {purpose}".encode()
    return seed(int.from_bytes(hashlib.sha256(key).digest()[:8], "little"))(test)


def _admit(kernel, variant: CheckVariant, sizes: Mapping[str, int], prof: Profile) -> None:
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


def _launch_model(draw, ex: Drawn) -> contextlib.AbstractContextManager:
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


def _run_and_compare(kernel, variant: CheckVariant, ex: Drawn, backend_ctx) -> Optional[str]:
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
    allowed = allowance(variant.graph, ex.args, expected, getattr(kernel, "launch", None))
    for i, (g, e) in enumerate(zip(got, expected)):
        breach = compare(g, e, tol, output=i,
                         slack=allowed.slack[i] if allowed.slack else None,
                         alternatives=[m[i] for m in allowed.alternatives] or None)
        if breach is not None:
            return str(breach)
    if variant.grad:
        return gradient_problem(kernel, variant.graph, ex.args,
                                zlib.crc32("\n".join(ex.lines).encode()), backend_ctx)
    return None


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.is_floating_point():
        return bool(torch.equal(torch.nan_to_num(a, nan=0.5), torch.nan_to_num(b, nan=0.5))
                    and torch.equal(torch.isnan(a), torch.isnan(b)))
    return torch.equal(a, b)


def _tolerance(graph: Graph, ex: Drawn) -> Tolerance:
    floats = [n.dtype for n in graph.nodes()] + [o.dtype for o in graph.outputs] + \
        [t.dtype for t in graph.tensors]
    return tolerance(lowest_precision(floats),
                     reduction_length=reduction_length(graph, ex.sizes.sizes),
                     scale=magnitude(ex.args.values()))


def _report(kernel, variant: CheckVariant, ex: Drawn, backend, what: str) -> str:
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
