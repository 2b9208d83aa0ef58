"""A Metal front-end check: what Apple's compiler rejects and C++ accepts (issue #50).

The simulator compiles MSL as C++, where the address-space keywords are macros (``device`` is
nothing, ``constant`` is ``const``), so C++ cannot see a ``threadgroup`` pointer stored in a
``device`` one, a mutable program-scope variable or a ``double``.  Before the build, this module
parses the same preprocessed text with libclang (the ``libclang`` wheel: clang's semantic
analysis, no system clang needed) in "C++ for OpenCL" mode, where address spaces are real type
qualifiers with conversion and overload rules, against the full shim headers:

    device -> __global    constant -> __constant    threadgroup -> __local    thread -> __private

Apple's Metal compiler is clang-based and its address-space errors read like clang's with
Metal's names, so `check` maps the spellings back (``__local float *`` -> ``threadgroup float
*``).  For clang, a kernel-scope ``threadgroup`` array becomes a reference to one (an OpenCL
``__local`` variable must sit in an OpenCL kernel, which cannot be a template), and bfloat's
constructor from float is ``explicit`` (MSL converts float to bfloat only explicitly); renames
of helpers overloaded on address spaces only come from frontoverloads.py.  OpenCL is not Metal,
so only a chosen set of clang's diagnostics is reported (`_REPORTED`), and none that mentions
``__generic`` (OpenCL's catch-all space: what an unqualified pointer or ``this`` is there; Metal
has no such space before MSL 4.1).  Every other clang error is ignored: the C++ build that
follows reports real C++ errors, and the rest are artifacts of the model (class copies across
spaces, string literals in ``__constant``).  The rules clang does not check as Metal does are
checked on its AST (frontast.py) and on the parsed kernel signatures (`_kernel_errors`).
docs/reference/simulator.md lists what is checked and what is not.

The check runs only when a library is built (never on a cache hit).  Without libclang it is
skipped with one warning (`available`); the cuda backend does not run it.
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
import subprocess
import warnings
from dataclasses import dataclass
from pathlib import Path

from ..msl.parse import parse
from ..msl.signature import STANDARD_ATTRS, ParsedSource, Signature
from ..msl.tokens import LineMap, ParseError, attr_list, tokenize
from .frontast import ast_errors
from .frontoverloads import ENABLE, MARK, SUFFIX, instantiated_calls, mark, mark_offset, plan
from .toolchain import INCLUDE_DIR, cache_dir, cxx_cmd, shim_hash, torch_include

CHECK_NAME = "metalforge_frontcheck.cpp"

# Before the shim: OpenCL keywords that are identifiers in Metal are renamed (consistently, in
# the shim and the user's text); the shim may use variadic functions and doubles.
_BEFORE_SHIM = """\
#pragma OPENCL EXTENSION __cl_clang_variadic_functions : enable
#pragma OPENCL EXTENSION __cl_clang_function_pointers : enable
#define MF_SIM_BF16_FROM_FLOAT explicit
#define half mf_half
#define global mf_global
#define local mf_local
#define generic mf_generic
#define read_only mf_read_only
#define write_only mf_write_only
#define read_write mf_read_write
#define pipe mf_pipe
"""
# After the shim: Metal's keywords as OpenCL address spaces.
_AFTER_SHIM = """\
#undef device
#undef constant
#undef threadgroup
#undef thread
#undef kernel
#define device __global
#define constant __constant
#define threadgroup __local
#define thread __private
#define kernel __attribute__((annotate("mf_kernel")))
template <class T> T& mf_tg();
"""
_KERNEL_ATTR = '__attribute__((annotate("mf_kernel")))'
_ARGS = ["-x", "clcpp", "-cl-std=clc++2021", "-cl-no-stdinc",
         "-cl-ext=+cl_khr_fp64,+__opencl_c_fp64,+__cl_clang_variadic_functions,"
         "+__cl_clang_function_pointers",
         "-D__METAL__=1", "-D__METAL_VERSION__=320", "-fno-exceptions",
         "-Wno-everything", "-ferror-limit=0"]

# clang's spellings -> Metal's, for the messages
_SPELLINGS = [(re.compile(r"\*\s*__private\b"), "*"),        # the pointer variable's own space
              (re.compile(r"\b__global\b"), "device"), (re.compile(r"\b__constant\b"), "constant"),
              (re.compile(r"\b__local\b"), "threadgroup"), (re.compile(r"\b__private\b"), "thread"),
              (re.compile(r"\bmf_half\b"), "half")]
_SPACES = ("__global", "__constant", "__local", "__private")
# the clang errors that are reported (when they name an address space and not __generic)
_REPORTED = re.compile(
    r"^(cannot initialize a (variable|parameter|return object|member subobject) of type"
    r"|assigning .* changes address space|assigning to '.*' from incompatible type"
    r"|(C-style cast|reinterpret_cast|static_cast|const_cast|functional-style cast) from .*"
    r"(address space|is not allowed)"
    r"|binding reference of type .* changes address space"
    r"|.*(cannot bind to a value|drops '?__\w+'? qualifier)"
    r"|comparison of distinct pointer types)")
_THIS = re.compile(r"^cannot initialize object parameter of type '[^']*?\b(__\w+)\b[^']*' "
                   r"with an expression of type '((?:const )?(__\w+) [^']*)'")
_NEW = re.compile(r"^'default (new|delete)' is not supported")


class FrontCheckUnavailable(RuntimeError):
    pass


@functools.lru_cache(maxsize=1)
def _cindex():
    """clang.cindex, or FrontCheckUnavailable saying what to install."""
    try:
        import clang.cindex as ci
        ci.Index.create()
        return ci
    except Exception as e:                      # ImportError, or libclang.so not loadable
        raise FrontCheckUnavailable(
            "metalforge.sim checks Metal's front-end rules (address spaces, program-scope "
            "variables, unsupported C++) with libclang, which is not usable here "
            f"({type(e).__name__}: {e}). Install it with `pip install 'libclang>=18'`.") from None


def available() -> bool:
    """Whether the check can run; warns once (naming the package) when it cannot."""
    try:
        _cindex()
        return True
    except FrontCheckUnavailable as e:
        _warn_once(str(e))
        return False


@functools.lru_cache(maxsize=None)
def _warn_once(msg: str) -> None:
    warnings.warn(msg + " Kernels are compiled without that check.", RuntimeWarning,
                  stacklevel=4)


@functools.lru_cache(maxsize=8)
def system_includes(cxx: tuple[str, ...]) -> tuple[str, ...]:
    """The C++ compiler `cxx`'s include search folders (libstdc++'s headers, its stddef.h):
    libclang from the wheel has no headers of its own, and the shim includes a few."""
    try:
        r = subprocess.run(list(cxx) + ["-x", "c++", "-std=c++17", "-E", "-v", "-"],
                           input="", capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    lines = r.stderr.splitlines()
    try:
        a = lines.index("#include <...> search starts here:")
        b = lines.index("End of search list.")
    except ValueError:
        return ()
    return tuple(p.strip() for p in lines[a + 1:b] if os.path.isdir(p.strip()))


# ------------------------------------------------------------------------------ the text
def prelude_text() -> str:
    """The shim with Metal's keywords as OpenCL address spaces: precompiled once (`_pch`)."""
    return _BEFORE_SHIM + f'#include "{INCLUDE_DIR / "metal_stdlib"}"\n' + _AFTER_SHIM


def check_text(pre: str, parsed: ParsedSource | None = None) -> str:
    """The text libclang parses (after the prelude) for preprocessed source `pre`: Metal
    attributes blanked, ``[[kernel]]`` made the ``kernel`` mark, kernel-scope ``threadgroup``
    arrays made references (`_tg_reference`); every line keeps its number."""
    return _apply(pre, check_edits(pre, parsed))


def check_edits(pre: str, parsed: ParsedSource | None = None) -> list[tuple[int, int, str]]:
    """The edits (start, end, new text) of `pre` that make `check_text`, in order."""
    edits, before = [], ""
    for t in tokenize(pre):
        if t.kind != "attr":
            before = t.text
            continue
        names = dict(attr_list(t.text))
        if "kernel" in names and before != "template":   # not in an explicit instantiation
            edits.append((t.start, t.end, _KERNEL_ATTR))
        elif not STANDARD_ATTRS.intersection(names):
            text = pre[t.start:t.end]
            edits.append((t.start, t.end, "".join(c if c == "\n" else " " for c in text)))
    for d in (parsed.tg_decls if parsed else []):
        new = _tg_reference(pre[d.start:d.stmt_end], d.names)
        if d.stmt_end and new:
            edits.append((d.start, d.stmt_end, new))
    return _disjoint(edits)


def _disjoint(edits: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """`edits` in order, without those that overlap an earlier one."""
    out: list[tuple[int, int, str]] = []
    for e in sorted(edits):
        if not out or e[0] >= out[-1][1]:
            out.append(e)
    return out


def pre_offset(text: str, edits: list[tuple[int, int, str]], line: int, column: int) -> int:
    """The offset in `pre` of clang's (line, byte column) in `text` = `_apply(pre, edits)`;
    -1 inside an edit or outside the text."""
    starts = [0] + [m.end() for m in re.finditer("\n", text)]
    if not 0 < line <= len(starts):
        return -1
    row = text[starts[line - 1]:].encode()[:column - 1].decode(errors="ignore")
    off, shift = starts[line - 1] + len(row), 0
    for a, b, new in edits:
        if off < a + shift:
            break
        if off < a + shift + len(new):
            return -1
        shift += len(new) - (b - a)
    return off - shift


def _apply(text: str, edits: list[tuple[int, int, str]]) -> str:
    for a, b, new in reversed(edits):
        text = text[:a] + new + text[b:]
    return text


def _tg_reference(stmt: str, names: list[str]) -> str | None:
    """``threadgroup T name[N];`` as ``threadgroup T (&name)[N] = mf_tg<...>();`` (same line
    count): clang accepts a ``__local`` variable only in an OpenCL kernel, which cannot be a
    template, while a reference to one is fine anywhere and has the same type."""
    if len(names) != 1:
        return None
    m = re.match(rf"threadgroup\s+(.+?)\s*\b{names[0]}\b\s*((?:\[[^;]*\])?)\s*;$", stmt, re.S)
    if not m:
        return None
    type_, dims = " ".join(m.group(1).split()), " ".join(m.group(2).split())
    return (f"threadgroup {type_} (&{names[0]}){dims} = mf_tg<threadgroup {type_}{dims}>();"
            + "\n" * stmt.count("\n"))


def _args(cxx: tuple[str, ...]) -> list[str]:
    args = list(_ARGS)
    for d in system_includes(cxx):
        args += ["-isystem", d]
    return args


def _pch(ci, args: list[str], folder: Path, key: str) -> Path:
    """The prelude precompiled by libclang (a cache entry of metalforge/cache.py), keyed by
    `key` (the shim's hash), libclang's identity, `args` and the prelude's text, which names
    the shim's folder: a PCH that a copy of the package elsewhere built (the same shim hash)
    reads its headers from that folder, and once the folder is gone libclang loads it without
    an error and with the shim's declarations missing, which silently weakened the checks."""
    from .. import cache
    lib = Path(ci.conf.lib._name)
    prelude = prelude_text()
    ident = f"{key}|{lib}|{lib.stat().st_size}|{args}|{prelude}"
    h = hashlib.sha256(ident.encode()).hexdigest()[:16]
    header = folder / f"frontcheck-{h}.h"
    cache.write_text(header, prelude)

    def build(tmp: Path) -> None:
        tu = ci.Index.create().parse(str(header), args=args,
                                     options=ci.TranslationUnit.PARSE_INCOMPLETE)
        tu.save(str(tmp))
    return cache.entry(folder / f"frontcheck-{h}.pch", build)


def _parse(ci, text: str, args: list[str], pch_folder: Path | None, key: str):
    """(translation unit, lines before `text` in it): `text` parsed after the precompiled
    prelude, or after the prelude's text when there is no folder for the PCH or the PCH does
    not load (a shim header touched since it was built); such a PCH is removed, so the next
    build makes a new one."""
    if pch_folder is not None:
        pch = _pch(ci, args, pch_folder, key)
        try:
            tu = ci.Index.create().parse(CHECK_NAME, args=args + ["-include-pch", str(pch)],
                                         unsaved_files=[(CHECK_NAME, text)])
            if not any(d.severity >= 4 for d in tu.diagnostics):
                return tu, 0
        except ci.TranslationUnitLoadError:
            pass
        for p in (pch, pch.with_name(pch.name + ".sum")):
            p.unlink(missing_ok=True)
    head = prelude_text()
    tu = ci.Index.create().parse(CHECK_NAME, args=args, unsaved_files=[(CHECK_NAME, head + text)])
    return tu, head.count("\n")


def _is_users(file: str, skip: tuple[str, ...]) -> bool:
    """Whether text from `file` (a line-marker name) is the user's: not the shim, not a header
    from torch's include folder (c10/metal), not a compiler-internal name."""
    if not file or file.startswith("<"):
        return False
    return not any(file.startswith(s) for s in skip)


def metal_spelling(msg: str) -> str:
    """clang's OpenCL spellings in `msg` replaced by Metal's."""
    for pat, new in _SPELLINGS:
        msg = pat.sub(new, msg)
    return msg


@dataclass
class _CheckedLines:
    """Maps a line of the checked text to the user's (file, line)."""
    pre: str
    head_lines: int

    def __post_init__(self) -> None:
        self.lines = LineMap(self.pre)
        self.starts = [0] + [m.end() for m in re.finditer("\n", self.pre)]

    def locate(self, line: int) -> tuple[str, int] | None:
        k = line - self.head_lines - 1
        if not 0 <= k < len(self.starts):
            return None
        return self.lines.locate(self.starts[k])


# ------------------------------------------------------------------------------ the check
def front_check(pre: str, parsed: ParsedSource) -> FrontResult:
    """The hook of the simulator's build (compiler.py): `check` with its settings, the source
    re-parsed when overloads were renamed; nothing found when libclang is missing (warned
    once) or $METALFORGE_SIM_FRONTCHECK is 0."""
    if os.environ.get("METALFORGE_SIM_FRONTCHECK", "1") == "0" or not available():
        return FrontResult([], pre, parsed)
    try:
        r = check(pre, parsed, tuple(cxx_cmd()), (torch_include(),),
                  pch_folder=cache_dir(), key=shim_hash())
    except (_cindex().TranslationUnitLoadError, OSError) as e:
        # the checker failed, not the source: build without the check, saying so once
        _warn_once(f"metalforge.sim: libclang could not run the Metal front-end check "
                   f"({type(e).__name__}: {e}).")
        return FrontResult([], pre, parsed)
    try:
        r.parsed = parsed if r.pre == pre else parse(r.pre)
    except ParseError:                  # never expected: the renames keep the text's shape
        r.pre, r.parsed = pre, parsed
    return r


def collision_errors(pre: str, parsed: ParsedSource) -> list[tuple[int, str]]:
    """(offset, message) for each definition the parse dropped because it coincides on the
    CPU with an overload on another address space that does something else (what the check's
    renames did not keep apart): running the kept one for every call would be wrong."""
    if not parsed.space_collisions:
        return []
    ran = os.environ.get("METALFORGE_SIM_FRONTCHECK", "1") != "0" and available()
    why = ("it renames functions and member functions apart, not operators, constructors or "
           "class specialisations" if ran else
           "the Metal front-end check, which renames such overloads apart, did not run: "
           "it needs libclang (`pip install 'libclang>=18'`)")
    out = []
    for off in parsed.space_collisions:
        head = " ".join(re.split(r"[{;]", pre[off:off + 400], maxsplit=1)[0].split())[:100]
        out.append((off, f"'{head}' differs from another definition only in address spaces "
                         f"and does something else; metalforge.sim compiles address spaces "
                         f"away and cannot keep the two apart here ({why}), so it does not "
                         f"run this source: give them distinct names"))
    return out


@dataclass
class FrontResult:
    """What the check found: Metal's errors, and the source for the build (`pre` with the
    address-space overloads renamed, see frontoverloads.py) with its parse."""
    errors: list[str]
    pre: str
    parsed: ParsedSource | None
    # for the cuda backend when it differs from `pre`: also its vector swizzles named like a
    # struct field of the source marked (`vector_swizzles`)
    cuda_pre: str = ""


def check(pre: str, parsed: ParsedSource, cxx: tuple[str, ...] = ("c++",),
          skip_files: tuple[str, ...] = (), pch_folder: Path | None = None,
          key: str = "") -> FrontResult:
    """Errors (``file:line:col: error: message``) Metal's compiler would give for preprocessed
    source `pre` (with its parsed kernels) and the simulator's C++ build would not, and `pre`
    with its address-space overloads made distinct.  `skip_files`: line-marker file prefixes
    that are not checked (torch's headers); with `pch_folder`, the prelude is precompiled there
    (else parsed each time)."""
    edits = check_edits(pre, parsed)
    text = _apply(pre, edits)
    tu, head = _parse(_cindex(), text, _args(cxx), pch_folder, key)
    where = _CheckedLines(pre, head)
    skip = (str(INCLUDE_DIR),) + tuple(skip_files)
    found: dict[tuple[str, int, int, str], None] = {}
    for d in tu.diagnostics:
        msg = _reported(d)
        if msg:
            _add(found, where, skip, d.location, msg)
    for loc, msg in ast_errors(tu, CHECK_NAME, prelude_text() + text if head else text):
        _add(found, where, skip, loc, msg)
    for file, line, msg in _kernel_errors(parsed.kernels):
        found.setdefault((file, line, 0, msg))
    errors = [f"{f}:{ln}:{c}: error: {m}" if c else f"{f}:{ln}: error: {m}"
              for f, ln, c, m in sorted(found)]
    renames, split = _renamed(pre, text, edits, (tu, head),
                              lambda t: _parse(_cindex(), t, _args(cxx), pch_folder, key))
    swizzles = [(off, off + len(name), SWIZZLE_MARK + name) for line, col, name in
                (vector_swizzles(tu, CHECK_NAME) if _SWIZZLE_USE.search(pre) else [])
                for off in [pre_offset(text, edits, line - head, col)]
                if off >= 0 and pre.startswith(name, off)]
    return FrontResult(errors + split, _apply(pre, renames), None,
                       _apply(pre, sorted(renames + swizzles)) if swizzles else "")


# the cuda backend's spelling of a vector swizzle whose name is also a field of a struct of the
# source (metalforge/cuda/swizzle.py rewrites `v.mf_swz__a` as the swizzle `.a`)
SWIZZLE_MARK = "mf_swz__"
_SWIZZLE_NAME = re.compile(r"(?:[xyzw]{2,4}|[rgba]{1,4})$")
_SWIZZLE_USE = re.compile(r"(?:\.|->)\s*(?:[xyzw]{2,4}|[rgba]{1,4})\b")   # any, cheaply


def vector_swizzles(tu, file_name: str) -> list[tuple[int, int, str]]:
    """(line, column, name) of each swizzle on a vector whose name is also a field of a
    struct of the checked file (``struct P { float a; }`` and ``c.a`` on a ``float4``): the
    cuda backend's token rewrite cannot tell the two apart, clang's types can."""
    users = [c for c in tu.cursor.get_children()
             if c.location.file is not None and c.location.file.name.endswith(file_name)]
    fields = _swizzle_fields(users)
    if not fields:
        return []
    out = []
    for top in users:
        for c in top.walk_preorder():
            ref = c.referenced if c.kind.name == "MEMBER_REF_EXPR" and \
                c.spelling in fields else None
            if ref is not None and ref.location.file is not None and \
                    ref.location.file.name.startswith(str(INCLUDE_DIR)):
                out.append((c.location.line, c.location.column, c.spelling))
    return out


_DECL_SCOPES = ("NAMESPACE", "LINKAGE_SPEC", "STRUCT_DECL", "CLASS_DECL", "UNION_DECL",
                "CLASS_TEMPLATE", "CLASS_TEMPLATE_PARTIAL_SPECIALIZATION")


def _swizzle_fields(tops: list) -> set[str]:
    """Names of data members spelled like a swizzle (`a`, `rg`, `xy`), in the classes among
    `tops` and the namespaces and classes in them (function bodies are not walked)."""
    out: set[str] = set()
    stack = [c for c in tops if c.kind.name in _DECL_SCOPES]
    while stack:
        for c in stack.pop().get_children():
            if c.kind.name in _DECL_SCOPES:
                stack.append(c)
            elif c.kind.name == "FIELD_DECL" and _SWIZZLE_NAME.match(c.spelling):
                out.add(c.spelling)
    return out


def _renamed(pre: str, text: str, edits: list, parsed: tuple,
             reparse) -> tuple[list[tuple[int, int, str]], list[str]]:
    """The edits of `pre` that rename the address-space overloads (frontoverloads.py), and
    the errors for calls the build cannot make as Metal does.  `parsed`: (translation unit,
    lines before `text` in it) of `text` = `_apply(pre, edits)`; `reparse(text)` parses
    another text so."""
    tu, head = parsed
    p = plan(tu, CHECK_NAME)
    if not p.names:
        return [], []
    sites: dict[int, dict[str, list[str]]] = {}     # offset in pre -> new name -> instances
    errors: list[tuple[int, str]] = []
    decls = [(pre_offset(text, edits, r.line - head, r.column), r) for r in p.decls]
    for off, r in decls + [(pre_offset(text, edits, r.line - head, r.column), r)
                           for r in p.uses]:
        _site(sites, errors, pre, off, r.new, "")
    if p.pending and not errors:
        before = sorted(d.spelling for d in tu.diagnostics if d.severity >= 3)
        _instantiated(pre, edits, decls, (p, before), sites, errors, reparse)
    for off, picks in sites.items():
        if len(picks) > 1:
            errors.append((off, _split_message(picks, p.signatures)))
    where = LineMap(pre)
    out = [f"{f}:{ln}: error: {m}" for off, m in sorted(set(errors))
           for f, ln in [where.locate(off)]]
    if out:
        return [], out
    return sorted((off, off + len(new.rsplit(SUFFIX, 1)[0]), new)
                  for off, picks in sites.items() for new in picks), []


def _site(sites: dict, errors: list, pre: str, off: int, new: str, instance: str) -> None:
    """Record that the name at `off` of `pre` is overload `new` (in `instance`)."""
    old = new.rsplit(SUFFIX, 1)[0]
    if off < 0 or pre[off:off + len(old)] != old:
        errors.append((max(off, 0), f"metalforge.sim cannot place the overload '{old}' "
                                    f"(overloaded on address spaces) here; it does not run "
                                    f"this source (give the overloads distinct names)"))
        return
    sites.setdefault(off, {}).setdefault(new, []).append(metal_spelling(instance))


def _instantiated(pre: str, edits: list, decls: list, known: tuple, sites: dict,
                  errors: list, reparse) -> None:
    """The calls clang resolves per template instantiation, from a parse with each overload
    marked (frontoverloads.mark) after its declarations `decls` ((offset in pre, Rename)):
    added to `sites`; an error when an overload cannot be marked or the marks change what
    clang reports (`known`: the plan and the first parse's errors)."""
    p, before = known
    marks = [(at, at, mark(r.new)) for off, r in decls
             for at in [mark_offset(pre, off + len(r.old))] if at >= 0]
    all_edits = _disjoint(edits + marks + [(0, 0, ENABLE)])
    marked = {e[2].split(MARK, 1)[1].split('"')[0] for e in all_edits if MARK in e[2]}
    text2 = _apply(pre, all_edits)
    tu2, head2 = reparse(text2)
    calls, other = instantiated_calls(tu2)
    if marked != set(p.names.values()) or sorted(other) != before:
        names = ", ".join(sorted({n.rsplit(SUFFIX, 1)[0] for n in p.names.values()}))
        errors.append((decls[0][0], f"metalforge.sim could not resolve the calls that template "
                                    f"instantiations make to helpers overloaded on address "
                                    f"spaces only ({names}); it does not run this source "
                                    f"(give the overloads distinct names)"))
        return
    for c in calls:
        _site(sites, errors, pre, pre_offset(text2, all_edits, c.line - head2, c.column),
              c.new, c.instantiation)


def _split_message(picks: dict[str, list[str]], sigs: dict[str, str]) -> str:
    old = next(iter(picks)).rsplit(SUFFIX, 1)[0]
    said = "; ".join(f"{metal_spelling(sigs.get(new, new))} in "
                     + ", ".join(f"'{i}'" for i in sorted(set(ins)) if i)
                     for new, ins in sorted(picks.items()))
    return (f"the call to '{old}' picks a different overload (on address spaces) in "
            f"different template instantiations: {said}. metalforge.sim cannot run this: its "
            f"C++ build has no address spaces in types, so these instantiations are one "
            f"function there. Call the overloads from code that does not depend on the "
            f"template parameter, or give them distinct names")


def _add(found: dict, where: _CheckedLines, skip: tuple[str, ...], loc, msg: str) -> None:
    if loc.file is None or os.path.basename(loc.file.name) != CHECK_NAME:
        return
    at = where.locate(loc.line)
    if at and _is_users(at[0], skip):
        found.setdefault((at[0], at[1], loc.column, msg))


def _reported(diag) -> str | None:
    """The Metal message for clang diagnostic `diag`, or None when it is not reported."""
    if diag.severity < 3:
        return None
    msg = diag.spelling
    bf16 = _float_to_bfloat(msg, [n.spelling for n in diag.children])
    if bf16:
        return bf16
    m = _THIS.match(msg)
    if m:       # a member function called on an object in a space it is not marked for
        obj = metal_spelling(m.group(2))
        if m.group(1) == "__generic":
            return (f"'this' argument has type '{obj}', but the member function is not "
                    f"marked {metal_spelling(m.group(3))}")
        return (f"'this' argument has type '{obj}', but the member function is marked "
                f"{metal_spelling(m.group(1))}")
    if "__generic" in msg:
        return None
    if msg.startswith("no matching function for call to"):
        notes = [n.spelling for n in diag.children]
        spaces = [n for n in notes if "__generic" not in n and _crosses_spaces(n)]
        return metal_spelling(f"{msg} ({spaces[0]})") if spaces else None
    if _NEW.match(msg):
        return "'new' and 'delete' are not supported in Metal (no dynamic allocation)"
    if _REPORTED.match(msg) and _crosses_spaces(msg):
        return metal_spelling(msg)
    return None


def _float_to_bfloat(msg: str, notes: list[str]) -> str | None:
    """Metal's message for an implicit float -> bfloat conversion (the check's prelude makes
    bfloat's constructor from float explicit, so clang reports each one), else None."""
    for text in [msg] + notes:
        quoted = [re.sub(r"\b(const|__\w+)\s*", "", q).strip()
                  for q in re.findall(r"'([^']*)'", text)]
        if re.search(r"no (viable|known) conversion|cannot initialize", text) and \
                len(quoted) >= 2 and quoted[0] == "float" and quoted[1] == "bfloat":
            return ("implicit conversion from 'float' to 'bfloat' is not allowed in Metal "
                    "(write bfloat(x) or static_cast<bfloat>(x))")
    return None


def _crosses_spaces(msg: str) -> bool:
    """Whether the first two types quoted in `msg` are pointers, references or arrays (or names of
    spaces) in different named address spaces: the error is about spaces, not a conversion of
    values that the model gets wrong (class types across spaces)."""
    quoted = re.findall(r"'([^']*)'", msg)[:2]
    if not all(q in _SPACES or any(c in q for c in "*&[") for q in quoted):
        return False                    # a value conversion: not about spaces
    spaces = [{s for s in _SPACES if re.search(rf"\b{s}\b", q)} for q in quoted]
    return len(spaces) == 2 and all(spaces) and spaces[0] != spaces[1]


# ------------------------------------------------------------------------------ kernels
_GRID_ATTRS = {"thread_position_in_grid", "thread_position_in_threadgroup",
               "threadgroup_position_in_grid", "threads_per_threadgroup", "threadgroups_per_grid",
               "threads_per_grid", "dispatch_threads_per_threadgroup", "grid_origin"}
_UINTS = {"uint", "uint32_t", "unsigned int", "unsigned", "ushort", "uint16_t", "unsigned short"}
_UVECS = {f"{t}{n}" for t in ("uint", "ushort") for n in (2, 3)} | \
    {f"vec<{t}, {n}>" for t in ("uint", "ushort") for n in (2, 3)} | \
    {f"metal::vec<{t}, {n}>" for t in ("uint", "ushort") for n in (2, 3)}
# type names a position attribute is never given (so a name outside these sets and the allowed
# ones, e.g. a template parameter or an alias, is not judged)
_SCALARS = ("bool", "char", "uchar", "short", "int", "long", "ulong", "size_t", "float",
            "half", "bfloat", "int8_t", "uint8_t", "int16_t", "int32_t", "int64_t", "uint64_t")
_BUILTIN = set(_SCALARS) | {f"{t}{n}" for t in _SCALARS for n in (2, 3, 4)} | \
    {"uint4", "ushort4", "unsigned long", "long long", "unsigned long long"}
_POINTER_SPACES = ("device", "constant", "threadgroup", "object_data", "ray_data",
                   "threadgroup_imageblock")


def _kernel_errors(kernels: list[Signature]) -> list[tuple[str, int, str]]:
    """(file, line, message) for kernel parameters Metal rejects: a pointer or reference
    outside the device/constant/threadgroup spaces, a position attribute on a type it does not
    take."""
    out = []
    for k in kernels:
        for p in k.params:
            msg = _param_error(k, p)
            if msg:
                out.append(("program_source", k.line, msg))
    return out


def _param_error(k: Signature, p) -> str | None:
    if p.role == "position":
        t = " ".join(p.elem_type.split())
        ok = _UINTS | (set() if p.attr not in _GRID_ATTRS else _UVECS)
        if t in ok or t not in _BUILTIN | _UINTS | _UVECS:
            return None
        kinds = "uint or ushort" + (" (or a 2- or 3-component vector of them)"
                                    if p.attr in _GRID_ATTRS else "")
        return (f"kernel '{k.host_name}': type '{p.type_text}' is not valid for attribute "
                f"'{p.attr}' of parameter '{p.name}' (it takes {kinds})")
    if (p.is_pointer or p.is_reference) and p.address_space not in _POINTER_SPACES:
        what = "pointer" if p.is_pointer else "reference"
        space = p.address_space or "no"
        return (f"kernel '{k.host_name}': {what} parameter '{p.name}' has {space} address "
                f"space; kernel {what} arguments must be in the device, constant or threadgroup "
                f"address space")
    return None
