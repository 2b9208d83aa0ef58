"""Running the doctor's checks: for each kernel and dtype, compile its Metal through the
backend's compiler (an error is reported with the source line it names), then `check` every
variant it launches against the reference, and with `bench` time one large call against
torch's (and MLX's) own op."""
from __future__ import annotations

import importlib.util
import os
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

import torch

from ..dtypes import ALL as DTYPES
from ..runtime import backends
from ..testing import check
from .suite import SuiteKernel

_LINE = re.compile(r"(?:program_source|<source>|\.metal|input\.metal):(\d+):(\d+)")


@dataclass
class Result:
    """One kernel at one dtype: status "ok", "compile" (the backend's compiler refused the
    source), "mismatch" (check found an example where it disagrees with the reference),
    "coverage" (a kernel instantiation no example launched) or "error" (anything else
    raised)."""
    kernel: str
    family: str
    dtype: str
    status: str = "ok"
    seconds: float = 0.0
    examples: int = 0
    instantiations: list[str] = field(default_factory=list)
    message: str = ""
    source_line: str = ""
    bench: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.status != "ok"


def _bindings(kernel: Any, dtype: str) -> dict[str, str]:
    tvars = dict.fromkeys(p.dtype_var for p in kernel.params if getattr(p, "dtype_var", None))
    return {v: dtype for v in tvars}


def _where(message: str, source: str, lineno: Optional[int]) -> str:
    """The source line a compiler message points at ("LINE: text"), or ''."""
    if lineno is None:
        m = _LINE.search(message)
        lineno = int(m.group(1)) if m else None
    lines = source.splitlines()
    if lineno is None or not 1 <= lineno <= len(lines):
        return ""
    return f"{lineno}: {lines[lineno - 1].strip()}"


def _compile(entry: SuiteKernel, dtype: str, backend: str, res: Result) -> bool:
    source = entry.kernel.source(**_bindings(entry.kernel, dtype))
    try:
        backends.library(backend, source)
    except Exception as e:  # noqa: BLE001 - any refusal of the compiler is the finding
        res.status, res.message = "compile", f"{type(e).__name__}: {e}"
        res.source_line = _where(str(e), source, getattr(e, "lineno", None))
        return False
    return True


def check_one(entry: SuiteKernel, dtype: str, backend: str, examples: int) -> Result:
    """Compile, then check, one kernel at one dtype."""
    res = Result(entry.name, entry.family, dtype)
    t0 = time.perf_counter()
    if _compile(entry, dtype, backend, res):
        binds = _bindings(entry.kernel, dtype)
        try:
            report = check(entry.kernel, dtypes={v: [d] for v, d in binds.items()} or None,
                           backend=backend, max_examples=examples, **entry.check)
            res.examples = report.examples
            res.instantiations = [i.describe() for i in report.instantiations]
        except AssertionError as e:
            untested = "were never launched" in str(e)
            res.status, res.message = "coverage" if untested else "mismatch", str(e)
        except Exception as e:  # noqa: BLE001 - reported, the run goes on
            res.status, res.message = "error", f"{type(e).__name__}: {e}"
    res.seconds = time.perf_counter() - t0
    return res


# --------------------------------------------------------------------------- timing

def sync(device: str) -> None:
    if device == "mps":
        torch.mps.synchronize()
    elif device == "cuda":
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], device: str, repeat: int, warmup: int = 3) -> float:
    """Median seconds of one synchronised call (bench/'s rule off CUDA graphs)."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _mlx_time(entry: SuiteKernel, args: tuple, repeat: int) -> Optional[float]:
    """MLX's op on the same values (converted once), timed with mx.eval; None without MLX."""
    assert entry.bench is not None and entry.bench.mlx_op is not None
    try:
        import mlx.core as mx
    except ImportError:
        return None
    arrays = [mx.array(a.float().cpu().numpy()).astype(_mx_dtype(mx, a.dtype))
              if isinstance(a, torch.Tensor) else a for a in args]
    op = entry.bench.mlx_op

    def run() -> None:
        mx.eval(op(mx, *arrays))
    return timed(run, "cpu", repeat)


def _mx_dtype(mx: Any, dt: torch.dtype) -> Any:
    return {torch.float16: mx.float16, torch.bfloat16: mx.bfloat16}.get(dt, mx.float32)


def bench_one(entry: SuiteKernel, dtype: str, device: str, repeat: int) -> dict[str, Any]:
    """Ours, torch's op and MLX's op (MLX on a Mac only) on one large call, in µs, and the
    largest difference between ours and torch's result."""
    b = entry.bench
    assert b is not None
    args = b.make(DTYPES[dtype].torch, device)
    out: dict[str, Any] = {"ours_us": 1e6 * timed(lambda: entry.kernel(*args), device, repeat)}
    if b.torch_op is not None:
        out["torch_us"] = 1e6 * timed(lambda: b.torch_op(*args), device, repeat)
        diff = (entry.kernel(*args).float() - b.torch_op(*args).float()).abs().max()
        out["max_abs_diff_vs_torch"] = float(diff)
    if b.mlx_op is not None and device == "mps":
        t = _mlx_time(entry, args, repeat)
        if t is not None:
            out["mlx_us"] = 1e6 * t
    return out


# --------------------------------------------------------------------------- user files

def user_entries(paths: Iterable[str]) -> list[SuiteKernel]:
    """Every kernel defined in each file (its module-level CHECK dict gives check options)."""
    import metalforge as mf
    out: list[SuiteKernel] = []
    for path in paths:
        if not os.path.isfile(path):
            raise ValueError(f"no such file: {path}")
        stem = os.path.splitext(os.path.basename(path))[0]
        spec = importlib.util.spec_from_file_location(f"_metalforge_doctor_{stem}", path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        opts = getattr(mod, "CHECK", {})
        found = [SuiteKernel(f"{stem}.{n}", k, "user", dict(opts.get(n, {})))
                 for n, k in sorted(vars(mod).items()) if isinstance(k, mf.Kernel)]
        if not found:
            raise ValueError(f"{path} defines no @metalforge.kernel")
        out += found
    return out


def dtypes_of(entry: SuiteKernel, wanted: Optional[list[str]]) -> list[str]:
    """The dtypes to check an entry at: its own (one 'f32' pass for a kernel without dtype
    variables), narrowed to `wanted`."""
    if not _bindings(entry.kernel, "f32"):
        return ["fixed"] if not wanted else []
    return [d for d in entry.dtypes if not wanted or d in wanted]
