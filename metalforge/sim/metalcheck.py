"""The Metal front-end check of a source on its own, without a simulator build: what the cuda
backend runs on every source it compiles (metalforge/cuda/library.py), so that MSL Apple's
compiler rejects fails there too, with the simulator's SyntaxError (same lines, same messages).

The check is the simulator's (compiler.py's `checked_source`: the source preprocessed alone,
parsed, spaces.py's casts and frontcheck.py's rules) plus the repeated-swizzle writes
(swizzle.py).  A source that passes leaves a marker in the simulator's cache folder, keyed by
the source and the shim hash (which covers the check's modules), so a source is checked once
per machine: warm calls, in this process or another, read one small file.  A rejection is not
cached (it is rare and raised at once).  Helpers overloaded only on address spaces, one
function in the CUDA build as in the simulator's, are renamed apart in the source the cuda
backend compiles, as the check renames them for the simulator (`renamed_source`).

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
from pathlib import Path

from .. import cache
from ..msl.tokens import LineMap, tokenize
from .compiler import SOURCE_NAME, _located, _syntax_error, front_checked, preprocess
from .frontcheck import available
from .rewrite import rewrite
from .swizzle import rewrite_repeated_swizzles
from .toolchain import CompilerNotFound, cache_dir, compiler, shim_hash


def check_source(source: str, header: str = "", metal_version: int = 320) -> str:
    """`source` as the cuda backend should compile it: a SyntaxError (the simulator's, its
    first line replaced by `header` when given) if it breaks one of Metal's front-end rules
    that the simulator checks, else `source` with its helpers overloaded only on address
    spaces renamed apart (frontoverloads.py; usually `source` itself).  A source already
    checked on this machine costs one small read."""
    if os.environ.get("METALFORGE_SIM_FRONTCHECK", "1") == "0":
        return source
    try:
        ident = compiler()[1]
    except CompilerNotFound as e:
        _skipped(str(e))
        return source
    if not available():
        return source
    key = hashlib.sha256(f"{source}\0{shim_hash()}\0{ident}\0{metal_version}".encode()) \
        .hexdigest()[:24]

    def build(tmp) -> None:
        try:
            renamed = _check(source, metal_version)
        except SyntaxError as e:
            if header:
                e.msg = header + "\n" + e.msg.split("\n", 1)[-1]
                e.args = (e.msg,) + tuple(e.args[1:])
            raise
        tmp.write_text("" if renamed == source else renamed)     # empty: unchanged
    return cache.entry(cache_dir() / f"front-{key}.ok", build).read_text() or source


def _check(source: str, metal_version: int) -> str:
    with tempfile.TemporaryDirectory(prefix="mfcheck-") as tmp:
        pre = preprocess(source, tmp, metal_version)
    front = front_checked(source, pre)
    assert front.parsed is not None
    text, errors = rewrite_repeated_swizzles(rewrite(front.pre, front.parsed))
    if errors:
        raise _syntax_error(_located(text, errors), source)
    cuda = front.cuda_pre or front.pre          # vector swizzles named like fields marked
    return source if cuda == pre else renamed_source(source, pre, cuda)


def renamed_source(source: str, pre: str, renamed: str) -> str:
    """`source` with the renames that turned its preprocessed text `pre` into `renamed`:
    each renamed token is found on its line of `source` as the same occurrence of its name
    (`source` itself, unchanged, when a rename falls outside it or cannot be placed)."""
    a, b = tokenize(pre), tokenize(renamed)
    if len(a) != len(b):
        return source
    lines = LineMap(pre)
    seen: dict[tuple[int, str], int] = {}
    wanted: dict[tuple[int, str, int], str] = {}
    for ta, tb in zip(a, b):
        if ta.kind != "id":
            continue
        name, line = lines.locate(ta.start)
        n = seen[(line, ta.text)] = seen.get((line, ta.text), -1) + 1
        if ta.text != tb.text:
            if Path(name or SOURCE_NAME).name != SOURCE_NAME:
                return source
            wanted[(line, ta.text, n)] = tb.text
    edits, counts = [], {}
    for t in tokenize(source):
        if t.kind != "id":
            continue
        line = source.count("\n", 0, t.start) + 1
        n = counts[(line, t.text)] = counts.get((line, t.text), -1) + 1
        new = wanted.pop((line, t.text, n), None)
        if new is not None:
            edits.append((t.start, t.end, new))
    if wanted:
        return source
    for start, end, new in reversed(edits):
        source = source[:start] + new + source[end:]
    return source


@functools.lru_cache(maxsize=None)
def _skipped(why: str) -> None:
    warnings.warn(f"{why} The Metal front-end check is skipped.", RuntimeWarning, stacklevel=4)
