"""`metalforge doctor`: check that every kernel family compiles and computes correctly on this
machine's backend, and write a report a user can send.

    metalforge doctor [FILE.py ...] [--bench] [--out report.json] [--device mps|sim|cuda]
                      [--kernels rms_norm softmax ...] [--dtype f16 ...] [--examples N]

For each kernel of the built-in suite (`doctor.suite`: every family) and of the given files,
at each dtype: the generated Metal is compiled by the backend's compiler (on a Mac,
`torch.mps.compile_shader`: Apple's own), then `check` runs every variant the kernel launches
against its reference on drawn shapes, boundary sizes included; with `--bench`, one large
call is timed against torch's op and (on a Mac) MLX's. The machine's facts come first. The
report is one JSON file and a Markdown file beside it, with no personal paths; the exit status
is 1 when anything failed. Off a Mac it runs on the simulator (or, `--device cuda`, on an NVIDIA
GPU through the cuda backend), which is how CI tests it.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Optional

import torch

from . import machine, report
from .run import Result, bench_one, check_one, dtypes_of, user_entries
from .suite import SuiteKernel, by_name

BACKEND_OF = {"mps": "mps", "cpu": "sim", "sim": "sim", "cuda": "cuda"}


def default_device() -> str:
    return "mps" if torch.backends.mps.is_available() else "sim"


class Progress:
    """A bar on a terminal, one line per step elsewhere (logs, CI)."""

    def __init__(self, total: int, stream: Any = sys.stderr) -> None:
        self.total, self.done, self.stream = total, 0, stream
        self.tty = hasattr(stream, "isatty") and stream.isatty()

    def step(self, what: str, status: str) -> None:
        self.done += 1
        if self.tty:
            n = 30 * self.done // max(1, self.total)
            self.stream.write(f"\r[{'#' * n}{'.' * (30 - n)}] {self.done}/{self.total} "
                              f"{what:<32.32} {status:<8}")
            if self.done == self.total:
                self.stream.write("\n")
        else:
            self.stream.write(f"[{self.done}/{self.total}] {what}: {status}\n")
        self.stream.flush()


def run_all(entries: list[SuiteKernel], device: str, dtypes: Optional[list[str]] = None,
        examples: int = 10, bench: bool = False, repeat: int = 20,
        progress: Optional[Progress] = None) -> list[Result]:
    """Check (and with `bench`, time) each entry at each of its dtypes on `device`."""
    backend = BACKEND_OF[device]
    torch_device = {"sim": "cpu"}.get(device, device)
    jobs = [(e, d) for e in entries for d in dtypes_of(e, dtypes)]
    progress = progress or Progress(len(jobs))
    results = []
    for e, d in jobs:
        r = check_one(e, d, backend, examples)
        if bench and e.bench is not None and not r.failed:
            try:
                r.bench = bench_one(e, d, torch_device, repeat)
            except Exception as ex:  # noqa: BLE001 - a failed timing is a finding too
                r.status, r.message = "error", f"--bench: {type(ex).__name__}: {ex}"
        results.append(r)
        progress.step(f"{e.name} {d}", r.status)
    return results


def main(args: argparse.Namespace) -> int:
    device = args.device or default_device()
    if args.bench and device == "sim":
        raise ValueError("--bench times kernels on a GPU (--device mps or cuda); the simulator "
                         "runs every thread on the CPU, so its times mean nothing")
    entries = ([] if args.files and not args.kernels else list(by_name(args.kernels)))
    entries += user_entries(args.files)
    facts = machine.facts(BACKEND_OF[device], {"sim": "cpu"}.get(device, device))
    print(machine.describe(facts))
    results = run_all(entries, device, args.dtype, args.examples, args.bench)
    options = {"device": device, "bench": args.bench, "examples": args.examples,
               "kernels": [e.name for e in entries], "dtypes": args.dtype}
    doc = report.document(facts, options, results)
    out = Path(args.out)
    md = report.write(doc, out)
    failed = [r for r in results if r.failed]
    for r in failed:
        where = f" at line {r.source_line}" if r.source_line else ""
        print(f"FAILED {r.kernel} ({r.dtype}): {r.status}{where}: "
              f"{report.scrub(r.message).splitlines()[0] if r.message else ''}")
    print(f"{len(results) - len(failed)}/{len(results)} passed; report: {out} and {md}"
          + ("; please send both files with your issue" if failed else ""))
    return 1 if failed else 0


def setup(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="*", metavar="FILE.py",
                   help="also check every kernel these files define (module CHECK dicts give "
                        "check options); only these, unless --kernels names suite kernels")
    p.add_argument("--device", choices=("mps", "sim", "cuda"), default=None,
                   help="where to run (default: mps on a Mac, else the simulator)")
    p.add_argument("--kernels", nargs="+", default=None,
                   help="only these kernels of the built-in suite")
    p.add_argument("--dtype", nargs="+", default=None, choices=("f32", "f16", "bf16"),
                   help="only these dtypes")
    p.add_argument("--examples", type=int, default=10,
                   help="random examples per compiled variant (boundary sizes come on top)")
    p.add_argument("--bench", action="store_true",
                   help="also time one large call against torch's op (and MLX's on a Mac)")
    p.add_argument("--out", default="metalforge-doctor.json",
                   help="the JSON report (the Markdown one is written beside it, .md)")


SUBCOMMAND = ("check every kernel family on this machine and write a report to send", setup,
              main)
