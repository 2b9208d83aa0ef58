"""Coverage of every kernel a variant's schedule has: each compiled instantiation (one per host
name, at 32- and 64-bit indexing), the boundary sizes of the axis that picks it, the sizes of
other axes that select a kernel (`Schedule.selecting`), and the launches `check`'s examples
made of each.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

import torch
from hypothesis.errors import Unsatisfiable

from ..runtime.backends import current_backend
from ..runtime.launcher import layered
from ..shapes import bind_shapes
from .strategies import dim_plan, round_up
from .variants import CheckVariant

# runs the profile's boundary examples of a variant (by a kernel, maybe with 64-bit launches) at
# the sizes `dims` pins, recording their launches; returns the examples run
Pinned = Callable[[Any, CheckVariant, Mapping[str, Any]], int]


@dataclass
class Instantiation:
    """One compiled kernel a variant can launch, and the launches check made of it."""
    variant: str                  # CheckVariant.describe()
    host_name: str
    index64: bool
    launches: int = 0
    sizes: list[str] = field(default_factory=list)    # distinct axis sizes launched (first 32)
    unreachable: Optional[str] = None                 # why no allowed size selects it

    def describe(self) -> str:
        what = (f"{self.launches} launch(es), sizes {'; '.join(self.sizes)}" if self.launches
                else f"never launched ({self.unreachable or 'no example selected it'})")
        return f"{self.variant} | {self.host_name}: {what}"


def fail_unlaunched(kernel, insts: list[Instantiation]) -> None:
    """An AssertionError naming every instantiation no example launched (and not unreachable)."""
    missing = [i for i in insts if not i.launches and not i.unreachable]
    if missing:
        raise AssertionError(
            f"metalforge check: kernel '{kernel.name}': {len(missing)} kernel instantiation(s) "
            f"were never launched, so nothing tested them:\n  "
            + "\n  ".join(i.describe() for i in missing)
            + "\nEvery instantiation:\n  " + "\n  ".join(i.describe() for i in insts))


def _spec(kernel, variant: CheckVariant, backend: Optional[str]):
    """The specialisation the examples' calls use: what their backend changes in the launch
    table under the kernel's own options, as the launcher layers them (the examples' sizes
    vary: no autotuned options). Without `backend` the examples are CPU tensors."""
    return layered(variant.graph, backend or current_backend([torch.empty(0)]),
                   getattr(kernel, "launch", None))


def instantiations(kernel, variant: CheckVariant, backend: Optional[str]
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


def mark_alternatives(kernel, variant: CheckVariant, insts, backend: Optional[str]) -> None:
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


def cover(kernel, variant: CheckVariant, insts, dims, backend: Optional[str], pinned: Pinned
          ) -> int:
    """Boundary examples at both index widths (`pinned` runs them); marks what no allowed size
    can select."""
    ran = 0
    plan = dim_plan(variant.graph.params)
    plain = plan.plain
    for idx64 in sorted({k[0] for k in insts}):
        runner = kernel.with_launch(index64=True) if idx64 else kernel
        s = _spec(runner, variant, backend).schedule(idx64)
        axis = _selector(s)
        if axis is None or axis not in plain:
            pins: list[Optional[int]] = [None]         # not pinnable: random sizes only
        else:
            multiple = plain[axis]           # derived dims (K/GS) need whole multiples
            sizes = sorted({round_up(b, multiple) for b in boundary_sizes(s)})
            pins = [b for b in sizes if axis not in dims or _allowed(dims[axis], b)]
            if axis in dims:            # and the first allowed size of each kernel
                pins = sorted(set(pins) | set(_one_per_kernel(s, axis, _choices(dims[axis]))))
            pins = pins or [None]
            if idx64:                   # the 64-bit kernels: one boundary size per kernel
                pins = _one_per_kernel(s, axis, pins)
        for b in pins:
            at = dict(dims) if b is None else {**dims, axis: b}
            ran += pinned(runner, variant, at)
        ran += _cover_selected(runner, variant, insts, dims, s, idx64, pinned)
        fixed = (f"dims= pins '{axis}' to {dims[axis]!r}" if axis in dims else
                 f"'{axis}' is a literal dim of size {plan.literal[axis]}"
                 if axis in plan.literal else None)
        if fixed:
            for (w, host), inst in insts.items():
                if w == idx64 and not inst.launches:
                    inst.unreachable = fixed
    return ran


def _cover_selected(runner, variant: CheckVariant, insts, dims, s, idx64: bool,
                    pinned: Pinned) -> int:
    """Examples for each kernel that sizes of another axis select (`schedule.selecting`: the
    quantized schedule's tiled kernel, by rows of x; attention's kernels, by E, heads, query
    rows and keys, two ways each; the wide elementwise kernel, by the element count, with
    whole and partial chunks), unless a launch already had those sizes. `selecting` gives a
    list of sets of pins."""
    ran = 0
    plain = dim_plan(variant.graph.params).plain
    for (w, host), inst in insts.items():
        for pins in s.selecting(host) if hasattr(s, "selecting") else []:
            pins = {a: round_up(n, plain.get(a, 1)) if isinstance(n, int) else n  # whole
                    for a, n in pins.items()}        # multiples; a batch dim's shape as it is
            allowed = _within(s, host, pins, dims)
            if allowed is None or w != idx64:
                continue
            want = {f"{a}={n}" for a, n in allowed.items()}
            if any(want <= set(seen.split(",")) for seen in inst.sizes):
                continue
            try:
                ran += pinned(runner, variant, {**dims, **allowed})
            except Unsatisfiable:
                if allowed == pins:
                    raise
                # sizes of its own choosing past the memory budget: left to the other examples
    return ran


def _within(s, host: str, pins: dict, dims) -> Optional[dict]:
    """`pins`, where `dims=` allows them; else the same with each size it does not allow
    replaced by sizes it does (each combination of their choices in turn) that still select
    `host` (all other axes at 1); None where none does. (cuda's quantized matvec takes its
    staged kernel at E = 3 where Metal's takes it at E = 7: llama_decode's rope check allows
    7, not 3.)"""
    bad = [a for a, n in pins.items() if a in dims and not _allowed(dims[a], n)]
    if not bad:
        return pins
    ones = {d.name: 1 for t in s.graph.tensors for d in t.dims}
    for combo in itertools.product(*(_choices(dims[a]) for a in bad)):
        trial = {**pins, **dict(zip(bad, combo))}
        try:
            steps = s.steps({**ones, **trial})
        except Exception:                                        # noqa: BLE001 - refused
            continue
        if any(step.host_name == host for step in steps):
            return trial
    return None


def _one_per_kernel(s, axis: str, pins: list) -> list:
    """The first size of `pins` that selects each of the schedule's kernels (all axes but
    `axis` at 1), and every size where the launcher may take another kernel instead
    (`Schedule.alternatives`: whether it does depends on the device; the same kernel in
    smaller groups adds none)."""
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
            if any(a.host_name != step.host_name for a in s.alternatives(step, sizes)):
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


def record(insts, kernel, variant: CheckVariant, args: Mapping[str, Any]) -> None:
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
