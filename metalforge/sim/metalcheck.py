"""The Metal front-end check of a source on its own, without a simulator build: what the cuda
backend runs on every source it compiles (metalforge/cuda/library.py), so that MSL Apple's
compiler rejects fails there too, with the simulator's SyntaxError (same lines, same messages).

The check is the simulator's (compiler.py's `checked_source`: the source preprocessed alone,
parsed, spaces.py's casts and frontcheck.py's rules) plus the repeated-swizzle writes
(swizzle.py).  A source that passes leaves a marker in the simulator's cache folder, keyed by
the source and the shim hash (which covers the check's modules), so a source is checked once
per machine: warm calls, in this process or another, read one small file.  A rejection is not
cached (it is rare and raised at once).

Needs what the check needs, a C++ preprocessor ($CXX, else c++) and libclang; without either
the check is skipped with one RuntimeWarning (the kernel is still compiled by NVRTC, which
catches plain C++ errors). ``METALFORGE_SIM_FRONTCHECK=0`` turns it off, as for the simulator.
"""
from __future__ import annotations

import functools
import hashlib
import os
import tempfile
import warnings

from .. import cache
from .compiler import _located, _syntax_error, checked_source, preprocess
from .frontcheck import available
from .rewrite import rewrite
from .swizzle import rewrite_repeated_swizzles
from .toolchain import CompilerNotFound, cache_dir, compiler, shim_hash


def check_source(source: str, header: str = "") -> None:
    """Raise the simulator's SyntaxError (its first line replaced by `header` when given) if
    `source` breaks one of Metal's front-end rules that the simulator checks; return at once
    for a source already checked on this machine."""
    if os.environ.get("METALFORGE_SIM_FRONTCHECK", "1") == "0":
        return
    try:
        ident = compiler()[1]
    except CompilerNotFound as e:
        _skipped(str(e))
        return
    if not available():
        return
    key = hashlib.sha256(f"{source}\0{shim_hash()}\0{ident}".encode()).hexdigest()[:24]

    def build(tmp) -> None:
        try:
            _check(source)
        except SyntaxError as e:
            if header:
                e.msg = header + "\n" + e.msg.split("\n", 1)[-1]
                e.args = (e.msg,) + tuple(e.args[1:])
            raise
        tmp.write_text("ok\n")
    cache.entry(cache_dir() / f"front-{key}.ok", build)


def _check(source: str) -> None:
    with tempfile.TemporaryDirectory(prefix="mfcheck-") as tmp:
        pre, parsed = checked_source(source, preprocess(source, tmp))
    text, errors = rewrite_repeated_swizzles(rewrite(pre, parsed))
    if errors:
        raise _syntax_error(_located(text, errors), source)


@functools.lru_cache(maxsize=None)
def _skipped(why: str) -> None:
    warnings.warn(f"{why} The Metal front-end check is skipped.", RuntimeWarning, stacklevel=4)
