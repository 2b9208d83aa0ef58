"""The simulator's cache key (issue #15, item 3): `compute_shim_hash` covers what shapes a
compiled library (shim headers, engine, the modules that produce the C++ text) and nothing else,
so editing the binding code does not throw away every cached library."""
import re
import shutil
from pathlib import Path

import pytest

from metalforge.sim import toolchain


def _copy_tree(tmp_path: Path) -> tuple[Path, Path]:
    inc = tmp_path / "include"
    pkg = tmp_path / "metalforge"
    shutil.copytree(toolchain.INCLUDE_DIR, inc)
    for sub in ("sim", "msl"):
        (pkg / sub).mkdir(parents=True)
        for p in (toolchain.PACKAGE_DIR / sub).glob("*.py"):
            shutil.copy(p, pkg / sub / p.name)
    for name in toolchain.KEY_HEADERS:
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(toolchain.PACKAGE_DIR / name, pkg / name)
    return inc, pkg


def _append(p: Path, text: str) -> None:
    p.write_text(p.read_text() + text)


def test_key_ignores_binding_modules_and_follows_headers_and_codegen(tmp_path):
    inc, pkg = _copy_tree(tmp_path)
    base = toolchain.compute_shim_hash(inc, pkg)
    assert base == toolchain.compute_shim_hash(toolchain.INCLUDE_DIR, toolchain.PACKAGE_DIR)
    assert toolchain.shim_hash() == base

    # modules that only bind and call a compiled library: the key stays
    for name in ("sim/library.py", "msl/callmodel.py", "sim/__init__.py", "msl/__init__.py"):
        _append(pkg / name, "\n# an edit that changes nothing compiled\n")
    (pkg / "sim" / "new_helper.py").write_text("X = 1\n")
    assert toolchain.compute_shim_hash(inc, pkg) == base

    # a shim header, the engine, a new header, or a module that produces the C++ text: it moves
    keys = {base}
    for edit in (lambda: _append(inc / "mf_sim" / "math.h", "\n// edit\n"),
                 lambda: _append(inc / "mf_sim" / "engine.cpp", "\n// edit\n"),
                 lambda: (inc / "mf_sim" / "extra.h").write_text("// new\n"),
                 lambda: _append(pkg / "sim" / "rewrite.py", "\n# edit\n"),
                 lambda: _append(pkg / "sim" / "trampoline.py", "\n# edit\n"),
                 lambda: _append(pkg / "msl" / "parse.py", "\n# edit\n"),
                 lambda: _append(pkg / "msl" / "walker.py", "\n# edit\n"),
                 lambda: _append(pkg / "sim" / "spaces.py", "\n# edit\n"),
                 lambda: _append(pkg / "sim" / "compiler.py", "\n# edit\n"),
                 lambda: _append(pkg / toolchain.KEY_HEADERS[0], "\n// edit\n")):
        edit()
        k = toolchain.compute_shim_hash(inc, pkg)
        assert k not in keys
        keys.add(k)


def _imported(name: str) -> list[str]:
    """The sim/ and msl/ modules (paths under metalforge/) that module `name` imports."""
    folder = name.split("/")[0]
    text = (toolchain.PACKAGE_DIR / name).read_text()
    out = []
    for dots, mod in re.findall(r"^\s*from (\.+)([\w.]*) import", text, flags=re.M):
        parts = ([folder] if len(dots) == 1 else []) + mod.split(".")
        if parts[0] in ("sim", "msl") and len(parts) == 2:
            out.append("/".join(parts) + ".py")
    return out


def test_key_modules_cover_everything_the_compiler_imports():
    """Every sim/ or msl/ module that compiler.py imports, directly or through another, is in
    the key."""
    seen: set[str] = set()
    todo = ["sim/compiler.py"]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo += _imported(name)
    assert "msl/walker.py" in seen and "sim/toolchain.py" in seen
    assert seen <= set(toolchain.KEY_MODULES), seen - set(toolchain.KEY_MODULES)


def test_key_headers_cover_every_header_the_shim_includes_from_outside():
    """A shim header that includes a file outside the include folder by relative path (the MPP
    surface shared with the cuda shim) has that file in KEY_HEADERS, which exist."""
    outside = set()
    for p in toolchain.INCLUDE_DIR.rglob("*"):
        if not p.is_file():
            continue
        for rel in re.findall(r'^\s*#\s*include\s+"([^"]+)"', p.read_text(errors="replace"),
                              flags=re.M):
            target = (p.parent / rel).resolve()
            if target.is_file() and not target.is_relative_to(toolchain.INCLUDE_DIR):
                outside.add(target.relative_to(toolchain.PACKAGE_DIR).as_posix())
    assert outside and outside <= set(toolchain.KEY_HEADERS), outside



def test_front_check_pch_is_keyed_by_the_folder_its_prelude_includes(tmp_path, monkeypatch):
    """Two copies of the package with the same shim hash (a worktree, a second venv) must not
    share libclang's precompiled prelude: it names the shim folder it includes, and once that
    folder is gone libclang loads the PCH without an error but without the shim's declarations
    (the front-end check then let `float` -> `bfloat` through)."""
    from metalforge import cache
    from metalforge.sim import frontcheck
    if not frontcheck.available():
        pytest.skip("libclang is not installed: the simulator runs without the front-end check")
    monkeypatch.setattr(cache, "entry", lambda path, build: path)       # nothing is built
    ci, args = frontcheck._cindex(), ["-x", "cl"]
    here = frontcheck._pch(ci, args, tmp_path, "k")
    monkeypatch.setattr(frontcheck, "prelude_text",
                        lambda: '#include "/elsewhere/metalforge/sim/include/metal_stdlib"\n')
    there = frontcheck._pch(ci, args, tmp_path, "k")
    assert here != there
