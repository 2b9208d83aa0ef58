"""Compile MSL text as C++ into a shared library, with an on-disk cache.

Pipeline for one source (only on a cache miss):

1. preprocess the source alone (``$CXX -E``) with torch's include folder, so ``#include
   <c10/metal/...>`` is inlined as torch.mps.compile_shader does and macros that generate
   kernels are expanded; ``<metal_*>`` headers resolve to empty stand-ins here (the real shim
   comes in through the precompiled header in step 3);
2. parse kernel signatures (metalforge/msl/parse.py), reject explicit casts between address
   spaces (spaces.py) and what Metal's front end rejects (frontcheck.py, which also renames
   helper overloads on address spaces apart) and apply the textual rewrites (rewrite.py);
3. compile the rewritten text plus generated trampolines (trampoline.py) against the
   precompiled ``<metal_stdlib>`` shim into ``<key>.so``; the parsed signatures go to
   ``<key>.json`` next to it.

The key hashes the source, the shim headers' contents, the modules that produce the C++ text
(toolchain.py's `KEY_MODULES`), torch's version, the compiler's identity and the flags, so a
second run of the same source (any process) only loads the two files.
Cache folder: ``$METALFORGE_CACHE_DIR``, else ``~/.cache/metalforge`` (subfolder ``sim``). Every
file there (engine, precompiled header, libraries) is a checked entry of metalforge/cache.py:
written atomically under a lock, its size and hash checked before use, rebuilt when bad.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from .. import cache
from ..msl.parse import parse
from ..msl.signature import ParsedSource, Signature, SignatureParam
from ..msl.tokens import LineMap, ParseError
from .frontcheck import FrontResult, collision_errors, front_check
from .rewrite import rewrite
from .spaces import cast_errors as address_space_cast_errors
from .swizzle import rewrite_repeated_swizzles
from .toolchain import INCLUDE_DIR, cache_dir, compiler, cxx_cmd, shim_hash, torch_include
from .trampoline import cpu_trampolines, entry_symbol

SOURCE_NAME = "program_source"
# -O1 compiles in about half the time of -O2 and runs the simulator's kernels at a similar speed
# (the engine, not kernel code, dominates); see the sim section of README.md for the numbers.
OPT_LEVEL = os.environ.get("METALFORGE_SIM_OPT", "-O1")
COMMON_FLAGS = ["-fPIC", "-pthread", "-w", "-fno-strict-aliasing", "-fwrapv",
                "-ffp-contract=off", "-fno-math-errno", "-D__METAL__=1"]
# What a compile may assume of the Metal it targets (see metalforge/target.py): the language
# version (__METAL_VERSION__, 320 = Metal 3.2, 400 = Metal 4.0) and the Apple GPU family
# (MF_SIM_GPU_FAMILY: 9 = M3/M4, 10 = M5, 0 = the cuda target), which fixes the cooperative
# tensors' element layout of <MetalPerformancePrimitives/MetalPerformancePrimitives.h>.  Metal 4
# sources compile as C++20: MSL 4's `matmul2d<desc, ...>` takes a descriptor object as a
# template argument.
DEFAULT_METAL_VERSION = 320
DEFAULT_GPU_FAMILY = 9
MPP_HEADER = "MetalPerformancePrimitives/MetalPerformancePrimitives.h"
# The preprocessing stand-in for the MPP header leaves this line in the text; a source that has
# it is compiled with the real header included first (after <metal_stdlib>).
MPP_MARKER = "#pragma metalforge_sim_mpp"
# GCC gives the static locals of template and inline functions (so every kernel-scope
# `threadgroup` array of a templated kernel, which rewrite.py makes `static thread_local`)
# STB_GNU_UNIQUE binding, and the dynamic linker merges such symbols across every loaded
# library, RTLD_LOCAL or not: two libraries instantiating the same kernel template would share
# one array, sized by whichever loaded first, and a larger threadgroup of the other would write
# past it into the heap.  -fno-gnu-unique makes them ordinary weak symbols, private to their
# library (clang never emits STB_GNU_UNIQUE).
GCC_FLAGS = ["-fno-gnu-unique"]
# Every index into an array of known size (thread-private arrays, kernel-scope threadgroup
# arrays) is checked, and a bad one traps (SIGILL, reported as an out-of-bounds index): on a
# GPU such an index reads another variable or faults; here it would pass unnoticed.
GCC_FLAGS += ["-fsanitize=bounds", "-fsanitize-undefined-trap-on-error"]
CLANG_FLAGS = ["-fsanitize=array-bounds", "-fsanitize-trap=array-bounds"]
# Every load and store the compiler cannot prove thread-private calls the engine's race
# detector (include/mf_sim/race.h): -fsanitize=thread's instrumentation, without its runtime
# (the engine defines the __tsan_* functions; the link step below names no sanitizer, so none
# is linked).  Function entry/exit hooks are not needed.
GCC_FLAGS += ["-fsanitize=thread", "--param", "tsan-instrument-func-entry-exit=0"]
CLANG_FLAGS += ["-fsanitize=thread", "-fno-sanitize-thread-func-entry-exit"]


def _version_flags(metal_version: int) -> list[str]:
    std = "-std=c++20" if metal_version >= 400 else "-std=c++17"
    return [std, f"-D__METAL_VERSION__={metal_version}"]


def _flags(is_clang: bool, metal_version: int = DEFAULT_METAL_VERSION) -> list[str]:
    return COMMON_FLAGS + _version_flags(metal_version) + (CLANG_FLAGS if is_clang else GCC_FLAGS)


def _run(cmd: list[str], cwd: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)


def engine_library() -> Path:
    """Build (once per compiler and shim version) the engine shared library."""
    path, ident, _ = compiler()
    key = hashlib.sha256(f"{shim_hash()}|{ident}".encode()).hexdigest()[:16]
    target = cache_dir() / f"engine-{key}.so"

    def build(tmp: Path) -> None:
        r = _run(cxx_cmd() + ["-std=c++17", "-O2", "-fPIC", "-shared", "-pthread", "-w",
                               str(INCLUDE_DIR / "mf_sim" / "engine.cpp"), "-o", str(tmp)])
        if r.returncode != 0:
            raise RuntimeError(f"metalforge.sim: building the engine failed:\n{r.stderr}")
    return cache.entry(target, build)


def _pch(metal_version: int) -> list[str]:
    """Flags that make the compile use a precompiled <metal_stdlib> (built on first use, one
    per Metal version: the version is a macro and picks the C++ standard)."""
    path, ident, is_clang = compiler()
    flags = _flags(is_clang, metal_version)
    key = hashlib.sha256(f"{shim_hash()}|{ident}|{OPT_LEVEL}|{flags}".encode()) \
        .hexdigest()[:16]
    d = cache_dir() / f"pch-{key}"
    header = d / "metal_stdlib"
    pch = d / ("metal_stdlib.pch" if is_clang else "metal_stdlib.gch")
    d.mkdir(mode=0o700, exist_ok=True)
    cache.write_text(header, f'#include "{INCLUDE_DIR / "metal_stdlib"}"\n')

    def build(tmp: Path) -> None:
        r = _run(cxx_cmd() + flags + [OPT_LEVEL, "-x", "c++-header", str(header),
                                             "-o", str(tmp)])
        if r.returncode != 0:
            raise RuntimeError(f"metalforge.sim: precompiling <metal_stdlib> failed:\n"
                               f"{r.stderr}")
    cache.entry(pch, build)
    if is_clang:
        return ["-include-pch", str(pch), "-include", str(header)]
    return ["-include", str(header)]


def _stub_dir() -> Path:
    """Empty stand-ins for every <metal_*> header, used while preprocessing user text. Checked
    on every compile (a cache cleaned with `find -type f -empty -delete` loses them all): a
    stand-in that is missing or not an empty regular file is written again."""
    d = cache_dir() / f"stubs-{shim_hash()}"
    d.mkdir(mode=0o700, exist_ok=True)
    for p in INCLUDE_DIR.iterdir():
        if not p.is_file() or p.name.startswith("."):
            continue
        stub = d / p.name
        try:
            st = os.lstat(stub)
            if stat.S_ISREG(st.st_mode) and st.st_size == 0:
                continue
        except FileNotFoundError:
            pass
        tmp = cache.temp_name(stub)
        tmp.write_text("")
        os.replace(tmp, stub)
    _mpp_stub(d)
    return d


def _mpp_stub(d: Path) -> None:
    """The MPP header's preprocessing stand-in in stub folder `d`: its Metal 4 check (a
    #error below Metal 4.0, as Apple's header has) and the marker that brings in the real one."""
    text = (INCLUDE_DIR / "MetalPerformancePrimitives" / "stub.h").read_text()
    stub = d / MPP_HEADER
    stub.parent.mkdir(mode=0o700, exist_ok=True)
    try:
        if stub.read_text() == text:
            return
    except OSError:
        pass
    tmp = cache.temp_name(stub)
    tmp.write_text(text)
    os.replace(tmp, stub)


def _clean_message(msg: str, tmpdir: str) -> str:
    msg = msg.replace(tmpdir + os.sep, "")
    lines = msg.splitlines()
    if len(lines) > 80:
        lines = lines[:80] + [f"... ({len(lines) - 80} more lines)"]
    return "\n".join(lines)


def _first_error_line(msg: str) -> int | None:
    m = re.search(rf"{SOURCE_NAME}:(\d+):(?:\d+:)?\s*(?:fatal )?error", msg)
    return int(m.group(1)) if m else None


def _syntax_error(msg: str, source: str) -> SyntaxError:
    line = _first_error_line(msg)
    err = SyntaxError(f"failed to compile Metal source with the CPU simulator:\n{msg}")
    err.filename = SOURCE_NAME
    if line is not None:
        err.lineno = line
        lines = source.splitlines()
        if 0 < line <= len(lines):
            err.text = lines[line - 1]
    return err


def _located(text: str, errors: list[tuple[int, str]]) -> str:
    """Each (offset in the rewritten text, message) as g++ would print it, at the user's
    file:line (the text's line markers), so that _syntax_error finds the line."""
    lines = LineMap(text)
    out = []
    for offset, msg in errors:
        name, line = lines.locate(offset)
        out.append(f"{Path(name or SOURCE_NAME).name}:{line}: error: {msg}")
    return "\n".join(out)


def _kernel_from_json(d: dict) -> Signature:
    d = dict(d)
    d["params"] = [SignatureParam(**p) for p in d["params"]]
    return Signature(**d)


class _TooManyKernels(Exception):
    """Raised inside a cache build when the source has more kernels than `max_kernels`."""

    def __init__(self, kernels: list[Signature]):
        super().__init__(len(kernels))
        self.kernels = kernels


@dataclass(frozen=True)
class MetalTarget:
    """What the compiled source may assume: Metal language version and Apple GPU family (0:
    the cuda target, whose cooperative tensors lie as the cuda backend's shim lays them)."""
    metal_version: int = DEFAULT_METAL_VERSION
    gpu_family: int = DEFAULT_GPU_FAMILY

    def __post_init__(self) -> None:
        for name in ("metal_version", "gpu_family"):
            v = getattr(self, name)
            low = 0 if name == "gpu_family" else 1
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"metalforge.sim: {name} must be an int of at least {low} "
                                 f"(e.g. metal_version=400 for Metal 4.0, gpu_family=10 for M5, "
                                 f"0 for the cuda target), got {v!r}")

    def defines(self) -> list[str]:
        """The macros of the kernel's compile besides the precompiled header's."""
        return [f"-DMF_SIM_GPU_FAMILY={self.gpu_family}"]


def build(source: str, kernels: list[str] | None = None,
          max_kernels: int | None = None, *, metal_version: int = DEFAULT_METAL_VERSION,
          gpu_family: int = DEFAULT_GPU_FAMILY) -> tuple[Path | None, list[Signature]]:
    """Compile `source` (or fetch it from the cache); return the library path and kernels.

    With `kernels` (host names), only those get entry points, so only they are instantiated.
    With `max_kernels`, a source with more kernels than that is not compiled: the result is
    (None, its kernels), and the caller builds them one at a time (see library.py).
    `metal_version` (``__METAL_VERSION__``: 320 = Metal 3.2, 400 = Metal 4.0) and `gpu_family`
    (``MF_SIM_GPU_FAMILY``: 9 = M3/M4, 10 = M5) say which Metal the source is compiled for;
    both are part of the cache key."""
    target = MetalTarget(metal_version, gpu_family)
    path, ident, is_clang = compiler()
    parts = [source, shim_hash(), ident, OPT_LEVEL,
             " ".join(_flags(is_clang, metal_version) + target.defines())]
    if kernels is not None:
        parts.append("kernels:" + ",".join(kernels))
    key = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]
    d = cache_dir()
    so, meta = d / f"lib-{key}.so", d / f"lib-{key}.json"
    limit = max_kernels if kernels is None else None

    def make(tmp: list[Path]) -> None:
        built = _compile(source, tmp[0], kernels, limit, target)
        tmp[1].write_text(json.dumps({"kernels": [asdict(k) for k in built]}))
    try:
        cache.entries([so, meta], make)
    except _TooManyKernels as e:
        return None, e.kernels
    return so, [_kernel_from_json(k) for k in json.loads(meta.read_text())["kernels"]]


def preprocess(source: str, tmp: str, metal_version: int = DEFAULT_METAL_VERSION) -> str:
    """`source` preprocessed alone in folder `tmp` (torch's c10/metal headers inlined, the
    ``<metal_*>`` headers empty stand-ins, the MPP header its stand-in); a SyntaxError when the
    preprocessor fails (as it does for the MPP header below Metal 4)."""
    src = Path(tmp) / SOURCE_NAME
    src.write_text(source)
    stubs = _stub_dir()
    r = _run(cxx_cmd() + ["-E", "-x", "c++", "-D__METAL__=1"] + _version_flags(metal_version) +
             ["-I", str(stubs), "-I", torch_include(), SOURCE_NAME], cwd=tmp)
    if r.returncode != 0:
        raise _syntax_error(_clean_message(r.stderr.replace(str(stubs) + os.sep, ""), tmp),
                            source)
    return r.stdout


def checked_source(source: str, pre: str) -> tuple[str, ParsedSource]:
    """Preprocessed `pre` (of `source`) parsed and checked against Metal's front-end rules
    (spaces.py's casts, frontcheck.py): a SyntaxError naming each broken rule, else the text
    to build (address-space overloads renamed) and its parse."""
    front = front_checked(source, pre)
    assert front.parsed is not None
    return front.pre, front.parsed


def front_checked(source: str, pre: str) -> FrontResult:
    """`checked_source`'s check, with all it found (the cuda backend's text too)."""
    try:
        parsed = parse(pre)
    except ParseError as e:
        raise _syntax_error(str(e), source) from None
    front = front_check(pre, parsed)
    cast_errors = address_space_cast_errors(pre) or front.errors
    if cast_errors:
        raise _syntax_error("\n".join(cast_errors), source)
    assert front.parsed is not None
    collisions = collision_errors(front.pre, front.parsed)
    if collisions:
        raise _syntax_error(_located(front.pre, collisions), source)
    return front


def _compile(source: str, out: Path, kernels: list[str] | None,
             max_kernels: int | None, target: MetalTarget) -> list[Signature]:
    """Compile `source` into the shared library `out` (only the `kernels` named, when given);
    return its kernels. Raises _TooManyKernels past `max_kernels`, before compiling."""
    engine_library()
    pch_flags = _pch(target.metal_version)
    with tempfile.TemporaryDirectory(prefix="mfsim-") as tmp:
        pre, parsed = checked_source(source, preprocess(source, tmp, target.metal_version))
        if MPP_MARKER in pre:
            pch_flags = pch_flags + ["-include", str(INCLUDE_DIR / MPP_HEADER)]
        if max_kernels is not None and len(parsed.kernels) > max_kernels:
            raise _TooManyKernels(parsed.kernels)
        if kernels is not None:
            by_name = {k.host_name: k for k in parsed.kernels}
            parsed.kernels = [by_name[n] for n in kernels]
        text, swz_errors = rewrite_repeated_swizzles(rewrite(pre, parsed))
        if swz_errors:
            raise _syntax_error(_located(text, swz_errors), source)
        tu = text + '\n#line 1 "metalforge_sim_trampolines"\n' + cpu_trampolines(parsed.kernels)
        (Path(tmp) / "tu.cpp").write_text(tu)

        r = _run(cxx_cmd() + _flags(compiler()[2], target.metal_version) + target.defines() +
                 [OPT_LEVEL, "-c"] + pch_flags +
                 ["-I", str(INCLUDE_DIR), "-I", torch_include(), "-x", "c++", "tu.cpp",
                  "-o", "tu.o"], cwd=tmp)
        if r.returncode != 0:
            raise _syntax_error(_clean_message(r.stderr, tmp), source)
        # linked without the sanitizer flags, so that no sanitizer runtime comes in
        r = _run(cxx_cmd() + ["-shared", "-pthread", "tu.o", "-o", str(out)], cwd=tmp)
        if r.returncode != 0:
            raise RuntimeError(f"metalforge.sim: linking the kernel library failed:\n"
                               f"{_clean_message(r.stderr, tmp)}")
    return parsed.kernels


__all__ = ["build", "engine_library", "entry_symbol"]
