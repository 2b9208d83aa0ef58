"""bench/floors.py's bandwidth parts (rows, elementwise, columns): the text edits of the
generated source, the cases, and the table each mode's process prints.

Edits (each applies to every kernel of the library the cuda backend compiles, so to the
variant a shape launches whichever it is; each stops with its name when the text it rewrites
is gone or a form it does not know is left):

- no math (rows; `identity` for elementwise): each per-element value (`const float mf_vN =
  ...;`) becomes the plain sum of the inputs and per-row values it depends on (loads, the
  reductions' results, the per-row scalars): no exp, log, division, rsqrt or multiply per
  element, every load still reaching its store through the same phases. A value that depends
  on one input only is that input (silu: the identity). The reductions fold as generated (the
  online softmax's exp per element, compensated sums): "reductions kept".
- folds as adds (rows, after no math; columns alone): every fold of an element (or of a
  partial) into an accumulator (fmax, compensated sum, the online softmax's add, a chunk's
  online add, the column max's NaN-keeping compare) becomes one float add, so each loaded
  element still feeds something and is not dropped as dead: "reductions removed" down to one
  add per element. The simdgroup and threadgroup combines and the partial merges stay.
- one row per chunk (columns): every chunk of the reduced axis reads its first row only (the
  one-thread-per-column kernel: row 0); the grid, the scratch partials and the second launch
  stay: the fixed cost of the launches, a copy of one row per chunk.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
for p in (HERE, HERE.parent / "examples"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

VALUE = re.compile(r"^(\s*)const float (mf_v\d+) = (.*);$", re.M)
READS = re.compile(r"mf_keep\d+\[mf_k\]|\bmf_(?:in_\w+|acc\d+|r\d+|v\d+)\b")
MATH = re.compile(r"exp\(|log\(|sqrt\(|tanh\(|\bmf_v\d+ = .*[*/]")
_ACC = r"^(\s*)(mf_acc\d+) = "
FOLDS = (re.compile(_ACC + r"fmax\(\2, (.+)\);$", re.M),
         re.compile(_ACC + r"mf_maximum\(\2, (.+)\);$", re.M),
         re.compile(_ACC + r"mf_sum_add\(mf_cmp\d+, \2, (.+)\);$", re.M),
         re.compile(_ACC + r"mf_online_add\(mf_acc\d+, mf_cmp\d+, \2, (.+)\);$", re.M),
         re.compile(_ACC + r"\2 > (.+) \|\| \2 != \2 \? \2 : \3;$", re.M))
CHUNK = re.compile(_ACC + r"mf_online_add_chunk\(mf_acc\d+, mf_cmp\d+, \2, (mf_on\d+), (\d+)u\);$",
                   re.M)
FOLD_LEFT = re.compile(r"mf_online_add\(|mf_online_add_chunk\(|mf_sum_add\(|mf_maximum\(|"
                       r"fmax\(mf_acc|\|\| mf_acc\d+ != mf_acc")
CHUNK_END = "const uint mf_k1 = mf_k0 + min(uint(mf_size_R) - mf_k0, mf_chunk_rows);"
COLUMN_LOOP = "for (uint mf_i = 0u; mf_i < uint(mf_size_R); ++mf_i) {"


def _stop(what: str, why: str) -> None:
    raise SystemExit(f"bench/floors.py: edit '{what}': {why}; the generated text changed, "
                     "update the edit (bench/floors_bw.py)")


def bodies(src: str) -> list[str]:
    """The text of each kernel function of a library (its definition, not the
    instantiations)."""
    out = []
    for m in re.finditer(r"^kernel void \w+\(", src, re.M):
        end = src.find("\n}\n", m.start())
        out.append(src[m.start():end if end >= 0 else len(src)])
    return out


def no_math(src: str) -> str:
    """Each per-element value: the sum of the inputs and per-row values it depends on."""
    deps: dict[str, list[str]] = {}

    def plain(m: re.Match) -> str:
        indent, name, expr = m.groups()
        base: list[str] = []
        for read in READS.findall(expr):
            for b in deps.get(read, [read]):
                if b not in base:
                    base.append(b)
        deps[name] = base
        return f"{indent}const float {name} = {' + '.join(base) or '0.0f'};"

    out, n = VALUE.subn(plain, src)
    if n == 0:
        _stop("no math", "no per-element value (const float mf_vN = ...;) in the library")
    for body in bodies(out):
        left = [ln for ln in body.splitlines()
                if MATH.search(ln) and not re.match(r"\s*(//|const float mf_r\d+ = )", ln)
                and "mf_online" not in ln and "mf_sum_add" not in ln]
        if left:
            _stop("no math", f"per-element math left outside mf_vN: {left[0].strip()[:60]!r}")
    return out


def folds_as_adds(src: str) -> str:
    """Each fold into an accumulator: one float add."""
    out, n = CHUNK.subn(lambda m: f"{m[1]}for (uint mf_q = 0u; mf_q < {m[4]}u; ++mf_q) "
                                  f"{{ {m[2]} = {m[2]} + {m[3]}[mf_q]; }}", src)
    for fold in FOLDS:
        out, k = fold.subn(lambda m: f"{m[1]}{m[2]} = {m[2]} + {m[3]};", out)
        n += k
    if n == 0:
        _stop("folds as adds", "no fold of an element into an accumulator in the library")
    for body in bodies(out):
        left = FOLD_LEFT.search(body)
        if left:
            line = body[body.rfind("\n", 0, left.start()) + 1:].split("\n", 1)[0]
            _stop("folds as adds", f"a fold of a form it does not know: {line.strip()[:60]!r}")
    return out


def one_row(src: str) -> str:
    """Every chunk of a column reduction's reduced axis: its first row only."""
    if CHUNK_END not in src or COLUMN_LOOP not in src:
        _stop("one row per chunk", "a chunk's end or the per-column loop is gone")
    return (src.replace(CHUNK_END, "const uint mf_k1 = mf_k0 + 1u;")
            .replace(COLUMN_LOOP, COLUMN_LOOP.replace("uint(mf_size_R)", "1u")))


EDITS = {"no math": [no_math], "no math, folds as adds": [no_math, folds_as_adds],
         "identity": [no_math], "folds as adds": [folds_as_adds],
         "one row per chunk": [one_row]}
PARTS = {"rows": ["as generated", "no math", "no math, folds as adds"],
         "elementwise": ["as generated", "identity"],
         "columns": ["as generated", "folds as adds", "one row per chunk"]}


def cases(part: str, device: str):
    """(op, dtype name, shape, kernel, args, torch eager) of a part, tensors on `device`
    ("meta": shapes only, for checking the edits)."""
    from column_sum import column_sum
    from layer_norm import layer_norm
    from log_softmax import log_softmax
    from reductions import column_max, softmax_t
    from rms_norm import rms_norm
    from silu import silu
    from softmax import softmax

    def t(*shape, dtype):
        return torch.randn(*shape, dtype=dtype, device=device)
    dt = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}
    if part == "rows":
        for rows, cols in ((64, 65536), (2048, 16384)):
            for d in ("f16", "f32"):
                x, w, b = t(rows, cols, dtype=dt[d]), t(cols, dtype=dt[d]), t(cols, dtype=dt[d])
                spec = f"{rows}x{cols}"
                yield "softmax", d, spec, softmax, (x,), lambda x=x: torch.softmax(x, -1)
                yield "softmax_t", d, spec, softmax_t, (x, 0.7), \
                    lambda x=x: torch.softmax(x / 0.7, -1)
                yield "log_softmax", d, spec, log_softmax, (x,), \
                    lambda x=x: torch.log_softmax(x, -1)
                yield "layer_norm", d, spec, layer_norm, (x, w, b), \
                    lambda x=x, w=w, b=b, c=cols: F.layer_norm(x, (c,), w, b)
                yield "rms_norm", d, spec, rms_norm, (x, w), \
                    lambda x=x, w=w, c=cols: F.rms_norm(x, (c,), w, eps=1e-6)
    elif part == "elementwise":
        for d in ("f16", "bf16", "f32"):
            x = t(8192, 8192, dtype=dt[d])
            yield "silu", d, "8192x8192", silu, (x,), lambda x=x: F.silu(x)
    else:
        for rows, cols in ((4096, 128), (4096, 4096)):
            for d in ("f16", "f32"):
                x = t(rows, cols, dtype=dt[d])
                spec = f"{rows}x{cols}"
                yield "column_sum", d, spec, column_sum, (x,), lambda x=x: x.sum(0)
                yield "column_max", d, spec, column_max, (x,), lambda x=x: x.amax(0)


def cuda_source(kernel, args) -> str:
    """The library the cuda backend compiles for the call `kernel(*args)` (its launch table:
    BACKEND_POLICIES["cuda"], the autotune cache, the kernel's own launch options), without
    a GPU: `args` may be meta tensors."""
    from metalforge import schedule as sched_mod
    from metalforge.runtime import launcher
    g = kernel.graph(*args)
    tensors = {p.name: a for p, a in zip(g.params, args) if isinstance(a, torch.Tensor)}
    binding, count = launcher.shaped(launcher.specialisation(g, kernel.launch), tensors)
    spec = launcher.layered(g, "cuda", kernel.launch, binding.sizes)
    largest = max([count] + [t.numel() for t in tensors.values()])
    return spec.library(sched_mod.needs_index64(binding.sizes, largest), "cuda").source


def check(part: str) -> list[str]:
    """Every edit of the part applied to the source each case compiles on cuda (no GPU, no
    compile): one line per case; raises SystemExit naming an edit whose text is gone."""
    lines = []
    for name, d, spec, kernel, args, _ in cases(part, "meta"):
        src = cuda_source(kernel, args)
        for mode in PARTS[part][1:]:
            edited = src
            for edit in EDITS[mode]:
                edited = edit(edited)
            changed = sum(a != b for a, b in zip(bodies(src), bodies(edited)))
            if changed == 0:
                _stop(mode, f"{name} {d} {spec}: no kernel changed")
            lines.append(f"{part:<11} {name:<11} {d:>4} {spec:>10}  {mode:<24} "
                         f"{changed}/{len(bodies(src))} kernels edited")
    return lines


HEADER = (f"{'op':<11} {'dtype':>5} {'shape':>10} {'kernel':<24} {'variant':>8} {'ours us':>8} "
          f"{'torch us':>8} {'compile us':>10} {'copy us':>8} {'%copy':>6} {'vs eager':>8} "
          f"{'vs compile':>10}")


def run(part: str, mode: str, repeat: int, compile_: bool, store: str | None) -> None:
    """Time each case of the part with this mode's edits installed (floors.install): ours,
    torch eager, torch.compile (timed in the "as generated" process and kept in `store` for
    the edited modes' ratios), copy_ of the schedule's bytes for the launched variant."""
    from common import compile_time, copy_time, launched_variant, plan, ratio, timeit, us
    kept = json.loads(Path(store).read_text()) if store and Path(store).exists() else {}
    for name, d, spec, kernel, args, eager in cases(part, "cuda"):
        s, sizes = plan(kernel, args)
        variant = launched_variant(s, kernel, args) if getattr(s, "variants", None) else "-"
        nbytes = (s.traffic(sizes, variant) if variant != "-" else s.traffic(sizes)).total
        ours = timeit(lambda: kernel(*args), "cuda", repeat)
        theirs = timeit(eager, "cuda", repeat)
        key = f"{name} {d} {spec}"
        if mode == "as generated":
            kept[key] = compile_time(eager, "cuda", repeat, compile_)
        comp = kept.get(key)
        copy = copy_time(nbytes, "cuda", repeat)
        print(f"{name:<11} {d:>5} {spec:>10} {mode:<24} {variant:>8} {ours * 1e6:>8.1f} "
              f"{theirs * 1e6:>8.1f} {us(comp, 10)} {copy * 1e6:>8.1f} "
              f"{100 * copy / ours:>5.0f}% {ratio(theirs, ours, 8)} {ratio(comp, ours, 10)}",
              flush=True)
    if store and mode == "as generated":
        Path(store).write_text(json.dumps(kept))
