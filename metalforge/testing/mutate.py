"""Mutation testing of `check`: mutate a kernel's generated MSL site by site, run `check` on
each mutant, and count the mutants it kills.

Operators are generic rewrites of MSL tokens, applied at every site where they match (not a
list of planted faults): a dropped simdgroup collective (``simd_sum(x)`` -> ``x``), a dropped
barrier, ``<``/``<=``/``>``/``>=`` flipped, ``+``/``-`` and ``*``/``/`` swapped, the operands
of ``-`` and ``/`` swapped, integer constants changed by one, ``exp``/``exp2`` and
``log``/``log2`` and ``max``/``min`` swapped. A mutant is one operator at one site (line and
occurrence) of one source. Mutants the compiler rejects are stillborn and not counted.

Equivalent mutants (the same results for every valid input) are recognised by the rules in
`EQUIVALENT`, each with its argument; a report counts them apart (`MutationReport.equivalent`)
and its score leaves them out. What made others observable: the simulator checks every index
into a private or threadgroup array and every vector component, checks threadgroup memory for
races (two threads touching one element, one writing, with no barrier between them), runs a
threadgroup's threads in either order and grids exact or rounded up to whole groups (`check`
draws both per example), so a dropped barrier, a loop one past its array or a missing overhang
guard shows.

A mutant runs through the runtime's `MSL_REWRITE` seam (as `faults.planted` does): every source
equal to the mutated one is replaced by the mutant while `check` runs; other sources (other
variants, other index widths) compile unchanged.
"""
from __future__ import annotations

import functools
import importlib.util
import multiprocessing
import random
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

from hypothesis.errors import FlakyFailure

from ..errors import MetalforgeError
from ..frontend.kernel import Kernel
from ..graph import TensorParam
from ..runtime.launcher import MSL_REWRITE, render, specialisation
from ..sim import compile_shader
from .check import check
from .strategies import index_tensors

# (operator name, regex, replacement function of the match)
_SWAP = {"<": "<=", "<=": "<", ">": ">=", ">=": ">", "+": "-", "-": "+", "*": "/", "/": "*"}
_FUN = {"exp": "exp2", "exp2": "exp", "log": "log2", "log2": "log", "max": "min", "min": "max",
        "fmax": "fmin", "fmin": "fmax"}
OPERATORS: tuple[tuple[str, str, Any], ...] = (
    ("drop_simd_collective", r"\bsimd_(?:sum|max|min|prefix_\w+)\(([^()]*(?:\([^()]*\))*[^()]*)\)",
     lambda m: m.group(1)),
    ("drop_barrier", r"^\s*(?:threadgroup|simdgroup)_barrier\([^;]*\);\s*$", lambda m: ""),
    ("relational", r"(?<= )(<=|>=|<|>)(?= )", lambda m: _SWAP[m.group(1)]),
    ("arithmetic", r"(?<= )([-+*/])(?= )", lambda m: _SWAP[m.group(1)]),
    ("swap_operands", r"\b(\w+) ([-/]) (\w+)\b",
     lambda m: f"{m.group(3)} {m.group(2)} {m.group(1)}"),
    ("integer_constant", r"(?<![\w.])(\d+)(?![\w.])", lambda m: str(int(m.group(1)) + 1)),
    ("math_function", r"\b(exp2|exp|log2|log|fmax|fmin|max|min)(?=\()",
     lambda m: _FUN[m.group(1)]),
)


# `[[buffer(n)]]`-style attributes are left alone: a kernel template's parameters carry them
# twice (definition and explicit instantiation), so changing one site is not observable.
_ATTRIBUTE = re.compile(r"\[\[.*?\]\]")


@dataclass(frozen=True)
class Rule:
    """A class of equivalent mutants: `applies(mutant, kernel)`, and why they are equivalent."""
    name: str
    applies: Callable[["Mutant", Any], bool]
    argument: str


def _vector_edge(m: "Mutant", kernel: Any) -> bool:
    return m.operator == "relational" and bool(
        re.search(r"\+ \d+u <= ", m.before) and re.search(r"\+ \d+u < ", m.after))


def _division_helper(m: "Mutant", kernel: Any) -> bool:
    guarded = ("mf_r != 0 &&" in m.before or "a % b != 0 &&" in m.before
               or "I(-1) < I(0)" in m.before)
    return m.operator == "relational" and guarded


def _expression_gather_bound(m: "Mutant", kernel: Any) -> bool:
    return (m.operator == "relational" and bool(re.search(r"mf_take\d+_ok = ", m.before))
            and not index_tensors(kernel.graph(**f32_dtypes(kernel))))


def _tail_of_whole_vectors(m: "Mutant", kernel: Any) -> bool:
    """A mutant in the element-by-element tail of an elementwise kernel whose output length is
    always a multiple of its vector width (dequantize: K is a whole number of words)."""
    return kernel.name in WHOLE_VECTORS and _in_tail(m)


def _in_tail(m: "Mutant") -> bool:
    lines = m.original.splitlines()
    tail = next((i for i, line in enumerate(lines) if "// tail: scalar, guarded" in line), None)
    return tail is not None and m.line > tail + 1


def _tail_one_further(m: "Mutant", kernel: Any) -> bool:
    """The elementwise tail's loop over its chunk run one element further."""
    return (m.operator == "relational" and _in_tail(m)
            and bool(re.search(r"for \(uint mf_k = 0u; mf_k <= \d+u;", m.after)))


def _array_grown(m: "Mutant", kernel: Any) -> bool:
    """A one-dimensional array declaration's extent made one larger (`float a[4];` ->
    `float a[5];`; an inner extent of a 2-D array would move the rows a flat view reads)."""
    return m.operator == "integer_constant" and bool(
        re.fullmatch(r"\s*(?:threadgroup )?[\w<>, ]+ \w+\[\d+\];\s*", m.before))


def _report_flag(m: "Mutant", kernel: Any) -> bool:
    """The flag a gather writes to its error report, 1 made 2 (the host tests it for nonzero)."""
    return m.operator == "integer_constant" and m.before.strip() == "mf_err[0u] = 1;" \
        and m.after.strip() == "mf_err[0u] = 2;"


# Example kernels whose sizes make a code path unreachable: dequantize's output has K/8 words per
# row, so N x K is a multiple of the 8-element vector.
WHOLE_VECTORS = frozenset({"dequantize"})

EQUIVALENT: tuple[Rule, ...] = (
    Rule("vector edge", _vector_edge,
         "`start + W <= n` -> `<`: the last whole vector takes the guarded element path instead, "
         "which computes the same values"),
    Rule("division helper", _division_helper,
         "a sign test in mf_floordiv / mf_remainder under its guard (`r != 0`, `a % b != 0`, "
         "b != 0 for a defined division; `I(-1) < I(0)` and `<=` agree for signed and unsigned "
         "I): the same branch is taken"),
    Rule("in-range gather index", _expression_gather_bound,
         "the bound check of a gather whose index is an expression the kernel computes in range "
         "(RoPE's partner, a table position): the index never equals the size, so `<` and `<=` "
         "agree (gathers by index tensors are not covered: check draws their indices)"),
    Rule("tail one further", _tail_one_further,
         "the element-by-element tail's loop one element further: that element, if it exists "
         "(the loop's guard checks), is the next thread's first, computed from the same inputs "
         "and stored with the value that thread stores"),
    Rule("unreachable tail", _tail_of_whole_vectors,
         "the element-by-element tail of a kernel whose element count is always a multiple of "
         "its vector width: it never runs"),
    Rule("array grown", _array_grown,
         "a private or threadgroup array declared one element longer: every access stays where "
         "it was, and the extra element is never read (the simulator fails a read past the "
         "array's old end only when it is past the new one too)"),
    Rule("report flag", _report_flag,
         "the flag of a gather's error report set to 2 instead of 1: the launcher raises "
         "GatherIndexError for any nonzero flag (runtime/indexcheck.py, IndexErrors.check)"),
)


def equivalence(m: "Mutant", kernel: Any) -> Optional[Rule]:
    """The rule that argues `m` equivalent, if any."""
    return next((r for r in EQUIVALENT if r.applies(m, kernel)), None)


@dataclass(frozen=True)
class Mutant:
    operator: str
    line: int                # 1-based line of the source
    occurrence: int          # which match of the operator on that line
    before: str
    after: str
    source: str              # the mutated full source
    original: str            # the source it mutates

    def describe(self) -> str:
        return f"{self.operator} @ line {self.line}: `{self.before.strip()}` -> " \
               f"`{self.after.strip()}`"


def _code_lines(src: str) -> Iterator[tuple[int, str]]:
    for i, line in enumerate(src.splitlines(), 1):
        s = line.strip()
        if not s or s.startswith(("//", "#", "using ", "template", "[[")):
            continue
        yield i, line


def mutants(src: str) -> list[Mutant]:
    """Every single-site mutant of `src` (comments and preprocessor lines are left alone)."""
    lines = src.splitlines()
    out: list[Mutant] = []
    for name, pattern, repl in OPERATORS:
        rx = re.compile(pattern)
        for no, line in _code_lines(src):
            code = line.split("//", 1)[0]
            attrs = [a.span() for a in _ATTRIBUTE.finditer(code)]
            for k, m in enumerate(rx.finditer(code)):
                if any(a <= m.start() < b for a, b in attrs):
                    continue
                new = code[:m.start()] + repl(m) + code[m.end():]
                if new == code:
                    continue
                after = new + line[len(code):]
                text = "\n".join(lines[:no - 1] + [after] + lines[no:]) + "\n"
                out.append(Mutant(name, no, k, line, after, text, src))
    return out


def sample(ms: list[Mutant], n: Optional[int], seed: int = 0) -> list[Mutant]:
    """`n` mutants chosen deterministically (by `seed`), spread over the operators."""
    if n is None or len(ms) <= n:
        return list(ms)
    rng = random.Random(seed)
    by_op: dict[str, list[Mutant]] = {}
    for m in ms:
        by_op.setdefault(m.operator, []).append(m)
    for v in by_op.values():
        rng.shuffle(v)
    picked: list[Mutant] = []
    while len(picked) < n:
        for v in by_op.values():
            if v and len(picked) < n:
                picked.append(v.pop())
    return picked


@contextmanager
def applied(mutant: Mutant) -> Iterator[list[int]]:
    """Compile `mutant.source` wherever the runtime compiles `mutant.original` in the block;
    yields a one-element list counting the replacements."""
    hits = [0]

    def rewrite(src: str) -> str:
        if src == mutant.original:
            hits[0] += 1
            return mutant.source
        return src
    token = MSL_REWRITE.set(rewrite)
    try:
        yield hits
    finally:
        MSL_REWRITE.reset(token)


@dataclass
class MutationReport:
    kernel: str
    killed: list[Mutant] = field(default_factory=list)
    survived: list[Mutant] = field(default_factory=list)
    equivalent: list[tuple[Mutant, Rule]] = field(default_factory=list)   # survivors, argued
    stillborn: list[Mutant] = field(default_factory=list)     # rejected by the compiler
    total_sites: int = 0

    @property
    def score(self) -> float:
        n = len(self.killed) + len(self.survived)
        return len(self.killed) / n if n else 1.0

    def describe(self) -> str:
        lines = [f"{self.kernel}: {len(self.killed)} killed, {len(self.survived)} survived, "
                 f"{len(self.equivalent)} equivalent, {len(self.stillborn)} stillborn, of "
                 f"{self.total_sites} sites"]
        lines += [f"  survivor: {m.describe()}" for m in self.survived]
        lines += [f"  equivalent ({r.name}): {m.describe()}" for m, r in self.equivalent]
        return "\n".join(lines)


# --------------------------------------------------------------------------- the examples

@dataclass(frozen=True)
class Example:
    """A kernel of an example module (`path`, attribute `attr`; the module's `CHECK` gives its
    `check` options)."""
    kernel: Any
    path: Path
    attr: str


@functools.lru_cache(maxsize=None)
def _load(path: Path) -> Any:
    """The module at `path`, loaded once per process (a mutant worker checks many mutants of
    one module's kernels: their compiled variants stay warm)."""
    spec = importlib.util.spec_from_file_location(f"mf_mutants_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def example_kernels(folder: Path) -> dict[str, Example]:
    """Every kernel of the modules in `folder`, by kernel name."""
    out: dict[str, Example] = {}
    for path in sorted(folder.glob("*.py")):
        for name, k in vars(_load(path)).items():
            if isinstance(k, Kernel):
                out[k.name] = Example(k, path, name)
    return out


def f32_dtypes(kernel) -> dict[str, str]:
    """Every dtype variable of the kernel's parameters, as f32."""
    return {p.dtype_var: "f32" for p in kernel.params
            if isinstance(p, TensorParam) and p.dtype_var}


def f32_source(kernel) -> tuple[str, dict[str, str]]:
    """(the kernel's library with every dtype variable f32, 32-bit indexing; those dtypes)."""
    dtypes = f32_dtypes(kernel)
    spec = specialisation(kernel.graph(**dtypes), getattr(kernel, "launch", None))
    return render(spec.schedule(False)), dtypes


def gate_runs(examples: list[Example], sample_size: Optional[int], seed: int = 0,
              timeout: float = 60.0, operators: Optional[Sequence[str]] = None
              ) -> Iterator["MutationReport"]:
    """For each example: `sample_size` mutants (None: all) of its f32 library through `check`
    with its module's options, f32 only, in a worker process (`Isolated`, shared by all).
    With `operators`, only mutants of those operators (e.g. ``["drop_barrier"]``) are drawn."""
    with Isolated(timeout) as runner:
        for ex in examples:
            source, dtypes = f32_source(ex.kernel)
            chosen = None
            if operators is not None:
                chosen = sample([m for m in mutants(source) if m.operator in operators],
                                sample_size, seed)
            yield mutation_test(ex.kernel, source, sample_size=sample_size, seed=seed,
                                chosen=chosen, runner=functools.partial(runner, ex, dtypes))


def _check_mutant(kernel, options: Mapping[str, Any], mutant: "Mutant") -> tuple[bool, int]:
    """(whether check failed, how often the mutated source was compiled) with `mutant` in."""
    with applied(mutant) as hits:
        try:
            check(kernel, **dict(options))
            caught = False
        except (AssertionError, FlakyFailure, MetalforgeError):   # flaky: a race it made
            caught = True
    return caught, hits[0]


def _child(path: str, attr: str, dtypes: Mapping[str, str], mutant: "Mutant"
           ) -> tuple[bool, int]:
    """In the worker: the example module's kernel, checked with the module's options."""
    mod = _load(Path(path))
    options = {**getattr(mod, "CHECK", {}).get(attr, {}), **({"dtypes": dtypes} if dtypes else {})}
    return _check_mutant(getattr(mod, attr), options, mutant)


class Isolated:
    """Runs each mutant's check in a worker process (spawned once, replaced after a timeout):
    a mutant may loop forever (a loop bound or step changed), which the simulator, like a GPU
    without its watchdog, would never end. A mutant over `timeout` seconds counts as killed:
    the hang is what check's user would see."""

    def __init__(self, timeout: float):
        self.timeout = timeout
        self.pool: Any = None

    def __enter__(self) -> "Isolated":
        self.pool = multiprocessing.get_context("spawn").Pool(1)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.pool.terminate()

    def __call__(self, example: Example, dtypes: Mapping[str, str], mutant: "Mutant"
                 ) -> tuple[bool, int]:
        job = self.pool.apply_async(_child, (str(example.path), example.attr, dict(dtypes),
                                             mutant))
        try:
            return job.get(self.timeout)
        except multiprocessing.TimeoutError:
            self.pool.terminate()
            self.pool = multiprocessing.get_context("spawn").Pool(1)
            return True, 1


def _compiles(src: str) -> bool:
    try:
        compile_shader(src)
    except SyntaxError:
        return False
    return True


def mutation_test(kernel, source: str, *, sample_size: Optional[int] = None, seed: int = 0,
                  check_options: Optional[Mapping[str, Any]] = None,
                  chosen: Optional[list[Mutant]] = None,
                  runner: Optional[Callable[[Mutant], tuple[bool, int]]] = None
                  ) -> MutationReport:
    """Run `check(kernel, **check_options)` against single-site mutants of `source` (one of
    the kernel's generated sources, e.g. `kernel.source(...)`); a mutant is killed when check
    fails. `sample_size` mutants are drawn deterministically from all sites (None: all), or
    `chosen` ones are run; `runner` runs one mutant's check (default: in this process)."""
    run = runner or (lambda m: _check_mutant(kernel, check_options or {}, m))
    ms = mutants(source)
    rep = MutationReport(getattr(kernel, "name", str(kernel)), total_sites=len(ms))
    for m in (chosen if chosen is not None else sample(ms, sample_size, seed)):
        if not _compiles(m.source):
            rep.stillborn.append(m)
            continue
        caught, hits = run(m)
        if not hits:
            raise RuntimeError(f"mutant {m.describe()} was never compiled: the source given "
                               f"is not one that check's runs compile")
        rule = None if caught else equivalence(m, kernel)
        if rule is not None:
            rep.equivalent.append((m, rule))
        else:
            (rep.killed if caught else rep.survived).append(m)
    return rep
