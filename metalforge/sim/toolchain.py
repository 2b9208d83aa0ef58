"""The simulator's C++ toolchain: which compiler ($CXX), torch's include folder, the cache
folder and the shim hash (what a compiled library depends on besides its source, compiler and
flags).  The build (compiler.py) and the Metal front-end check (frontcheck.py) both use these;
neither imports the other's module for them.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from .. import cache
from ..errors import MetalforgeError

INCLUDE_DIR = Path(__file__).resolve().parent / "include"
PACKAGE_DIR = Path(__file__).resolve().parent.parent     # metalforge/
FORMAT_VERSION = "1"


class CompilerNotFound(MetalforgeError, RuntimeError):
    pass


def cache_dir() -> Path:
    return cache.subdir("sim")


_cxx_cache: dict[str, tuple[str, str, bool]] = {}


def compiler() -> tuple[str, str, bool]:
    """(path, identity, is_clang) of $CXX, else c++."""
    name = os.environ.get("CXX") or "c++"
    if name in _cxx_cache:
        return _cxx_cache[name]
    parts = name.split()
    path = shutil.which(parts[0])
    if path is None:
        unset = "$CXX" if os.environ.get("CXX") else "c++, since $CXX is unset"
        raise CompilerNotFound(
            f"metalforge.sim needs a C++17 compiler to run Metal kernels on the CPU, and "
            f"'{parts[0]}' was not found ({unset}). "
            f"Install one (e.g. `apt-get install g++` or `apt-get install clang`) or set $CXX.")
    real = os.path.realpath(path)
    st = os.stat(real)
    ident = f"{real}:{st.st_size}:{int(st.st_mtime)}"
    is_clang = "clang" in os.path.basename(real) or "clang" in parts[0]
    if not is_clang and "g++" not in real and "gcc" not in real:
        out = subprocess.run([path, "--version"], capture_output=True, text=True).stdout
        is_clang = "clang" in out.lower()
    _cxx_cache[name] = (path, ident, is_clang)
    return _cxx_cache[name]


def cxx_cmd() -> list[str]:
    """The command that runs $CXX (else c++), with the words $CXX adds after the program."""
    name = os.environ.get("CXX") or "c++"
    parts = name.split()
    return [compiler()[0]] + parts[1:]


def torch_include() -> str:
    import torch
    return str(Path(torch.__file__).resolve().parent / "include")


# The modules whose text shapes what is compiled, as paths under metalforge/: the pipeline and
# flags (sim/compiler.py, sim/toolchain.py), the signatures that become trampolines and the
# .json next to each library (msl/: tokens, walker, signature, scalars, parse), the textual pass
# (sim/rewrite.py, msl/blanks.py), the address-space cast check (sim/spaces.py: it decides what
# compiles), the front-end check (sim/front*.py), the swizzle pass and the generated entry
# points (sim/trampoline.py).  Keep every sim/ and msl/ module that compiler.py imports
# (directly or through these) in this list; tests/sim/test_sim_cache_key.py checks that.  The
# binding and call model (sim/library.py, msl/callmodel.py) only use a library, so editing them
# leaves the cache valid.
KEY_MODULES = ("sim/compiler.py", "sim/toolchain.py", "sim/rewrite.py", "sim/spaces.py",
               "sim/trampoline.py", "sim/frontcheck.py", "sim/frontast.py",
               "sim/frontoverloads.py", "sim/swizzle.py", "msl/tokens.py", "msl/walker.py",
               "msl/signature.py", "msl/scalars.py", "msl/parse.py", "msl/blanks.py")


# Headers outside the shim's include folder that its headers include (by relative path):
# the Metal 4 tensor-ops surface the cuda shim shares (MetalPerformancePrimitives.h).
KEY_HEADERS = ("cuda/include/MetalPerformancePrimitives/mf_surface.h",)


def compute_shim_hash(include_dir: Path = INCLUDE_DIR, package_dir: Path = PACKAGE_DIR,
                      modules: tuple[str, ...] = KEY_MODULES + KEY_HEADERS) -> str:
    """Hash of everything besides the source, compiler and flags that a compiled library depends
    on: every file under the shim's include folder (names and contents, engine.cpp included),
    the `modules` (and KEY_HEADERS) under `package_dir` (paths and contents) and torch's
    version (its c10/metal headers are inlined)."""
    import torch
    h = hashlib.sha256(FORMAT_VERSION.encode())
    for p in sorted(include_dir.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(include_dir)).encode() + b"\0")
            h.update(hashlib.sha256(p.read_bytes()).digest())
    for name in modules:
        h.update(name.encode() + b"\0")
        h.update(hashlib.sha256((package_dir / name).read_bytes()).digest())
    h.update(torch.__version__.encode())
    return h.hexdigest()[:16]


_shim_hash: str | None = None


def shim_hash() -> str:
    """`compute_shim_hash()` of this installation, computed once per process."""
    global _shim_hash
    if _shim_hash is None:
        _shim_hash = compute_shim_hash()
    return _shim_hash
