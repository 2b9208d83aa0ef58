"""The `metalforge` command line.

    metalforge show FILE.py::NAME [--dtype f16] [--emit msl|ir] [--backward] [--backend mlx]
    metalforge doctor [FILE.py ...] [--bench] [--out report.json] [--device mps|sim|cuda]
    metalforge export FILE.py::NAME [--dtype f16] [--const GS=64] --shape D=4096 ... -o out/

Each subcommand is a `_cmd_<name>(args) -> int` registered in `_SUBCOMMANDS` with its argument
setup, so further subcommands (gen-tests, ...) slot in beside `show`.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Callable, Optional

from .dtypes import ANNOTATION_DTYPES
from .runtime.mlx import show as mlx_show


class CLIError(Exception):
    pass


def load_kernel(target: str):
    """`FILE.py::NAME` → the kernel object NAME defined in FILE.py (imported, not run as
    __main__, so a script's self-check does not run)."""
    if "::" not in target:
        raise CLIError(f"expected FILE.py::NAME, got {target!r}")
    path, name = target.rsplit("::", 1)
    if not os.path.isfile(path):
        raise CLIError(f"no such file: {path}")
    mod_name = "_metalforge_cli_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(spec)
    folder = os.path.dirname(os.path.abspath(path))
    sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(folder)
    if not hasattr(module, name):
        found = sorted(k for k, v in vars(module).items() if hasattr(v, "source")
                       and hasattr(v, "reference"))
        raise CLIError(f"{path} defines no {name!r}" +
                       (f"; kernels there: {', '.join(found)}" if found else ""))
    k = getattr(module, name)
    if not hasattr(k, "source") and hasattr(k, "kernel"):     # an operator (kernel.as_op)
        k = k.kernel
    if not (hasattr(k, "source") and hasattr(k, "ir")):
        raise CLIError(f"{path}::{name} is a {type(k).__name__}, not a @metalforge.kernel")
    return k


def dtype_bindings(kernel, dtype: Optional[str]) -> dict[str, str]:
    """Bind every dtype variable of the kernel to `dtype` (default f32)."""
    tvars = list(dict.fromkeys(p.dtype_var for p in getattr(kernel, "params", ())
                               if getattr(p, "dtype_var", None)))
    if dtype is not None and not tvars:
        raise CLIError(f"kernel '{kernel.name}' has no dtype variable to bind --dtype to; its "
                       f"dtypes are fixed by its annotations")
    return {v: dtype or "f32" for v in tvars}


def _cmd_show(args) -> int:
    k = load_kernel(args.target)
    binds = dtype_bindings(k, args.dtype)
    if args.backward:
        if args.emit == "ir":
            raise CLIError("--backward prints the Metal source of the backward kernels; "
                           "leave out --emit ir")
        text = k.backward_source(**binds)
    elif args.backend == "mlx" and args.emit == "msl":      # body, header and the MLX call
        text = mlx_show(k.graph(**binds), launch=k.launch)
    else:
        text = k.ir(**binds) if args.emit == "ir" else k.source(**binds)
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0


def _setup_show(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", metavar="FILE.py::NAME", help="a kernel defined in a Python file")
    p.add_argument("--dtype", choices=sorted(ANNOTATION_DTYPES),
                   help="dtype bound to the kernel's dtype variables (default f32)")
    p.add_argument("--emit", choices=("msl", "ir"), default="msl",
                   help="print the Metal source (default) or the lowered IR")
    p.add_argument("--backward", action="store_true",
                   help="print the backward kernels metalforge derives (autograd)")
    p.add_argument("--backend", choices=("metal", "mlx"), default="metal",
                   help="metal: the MSL library (torch.mps.compile_shader, the simulator); "
                        "mlx: each kernel's body and header and the mx.fast.metal_kernel call")


_SUBCOMMANDS: dict[str, tuple[str, Callable, Callable]] = {
    "show": ("print the generated Metal source (or IR) of a kernel", _setup_show, _cmd_show),
}

# `gen-tests` is owned by metalforge.testing (the test generator); it needs no hypothesis
from .testing.gen import SUBCOMMAND as _GEN_TESTS  # noqa: E402

_SUBCOMMANDS["gen-tests"] = _GEN_TESTS


def _doctor() -> tuple[str, Callable, Callable]:
    """`doctor`, imported when run (its suite defines kernels, which needs metalforge whole)."""
    def setup(p: argparse.ArgumentParser) -> None:
        from .doctor import setup as real
        real(p)

    def run(args) -> int:
        from .doctor import main as real
        return real(args)
    return ("check every kernel family on this machine and write a report to send", setup, run)


_SUBCOMMANDS["doctor"] = _doctor()


def _sizes(items: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for it in items:
        name, _, value = it.partition("=")
        if not name or not value.isdigit():
            raise CLIError(f"--shape takes AXIS=SIZE (e.g. D=4096), got {it!r}")
        out[name] = int(value)
    return out


def _cmd_export(args) -> int:
    from .export import export
    k = load_kernel(args.target)
    binds: dict[str, object] = dict(dtype_bindings(k, args.dtype))
    for c in args.const or ():
        name, _, value = c.partition("=")
        binds[name] = int(value) if value.lstrip("-").isdigit() else value == "True"
    sizes = _sizes(args.shape or [])
    manifest = export(k, binds, sizes, Path(args.out))
    print(f"exported {k.name} to {manifest.parent} (manifest {manifest.name})")
    entry = next(e for e in json.loads(manifest.read_text())["specialisations"]
                 if e["kernel"] == k.name and all(e["sizes"].get(a) == n
                                                  for a, n in sizes.items()))
    rule = entry.get("rule", {})
    print("  runs at any sizes its rule admits (launches: the manifest's rule.text)"
          if "checks" in rule else f"  runs at these sizes only: {rule.get('unavailable')}")
    return 0


def _setup_export(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", metavar="FILE.py::NAME", help="a kernel defined in a Python file")
    p.add_argument("--dtype", choices=sorted(ANNOTATION_DTYPES),
                   help="dtype bound to the kernel's dtype variables (default f32)")
    p.add_argument("--const", nargs="*", metavar="NAME=VALUE", help="mf.Const values")
    p.add_argument("--shape", nargs="*", metavar="AXIS=SIZE",
                   help="every axis size (the manifest's rule gives other sizes where it can: "
                        "export each shape set it does not cover)")
    p.add_argument("-o", "--out", required=True, help="the export folder (created; added to)")


_SUBCOMMANDS["export"] = ("write a kernel's Metal source, build script and manifest (its "
                          "size rule as formulas)", _setup_export, _cmd_export)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="metalforge",
                                 description="metalforge: a declarative kernel DSL for Metal")
    sub = ap.add_subparsers(dest="command", required=True)
    for name, (help_, setup, _) in _SUBCOMMANDS.items():
        setup(sub.add_parser(name, help=help_, description=help_))
    return ap


def main(argv: Optional[list[str]] = None) -> int:
    args = parser().parse_args(argv)
    try:
        return _SUBCOMMANDS[args.command][2](args)
    except CLIError as e:
        print(f"metalforge {args.command}: error: {e}", file=sys.stderr)
        return 2
    except (TypeError, ValueError, SyntaxError) as e:
        print(f"metalforge {args.command}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
