"""The simulator's cache key (issue #15, item 3): `compute_shim_hash` covers what shapes a
compiled library (shim headers, engine, the modules that produce the C++ text) and nothing else,
so editing the binding code does not throw away every cached library."""
import re
import shutil
from pathlib import Path

from metalforge.sim import compiler


def _copy_tree(tmp_path: Path) -> tuple[Path, Path]:
    inc = tmp_path / "include"
    sim = tmp_path / "sim"
    shutil.copytree(compiler.INCLUDE_DIR, inc)
    sim.mkdir()
    for p in compiler.SIM_DIR.glob("*.py"):
        shutil.copy(p, sim / p.name)
    return inc, sim


def _append(p: Path, text: str) -> None:
    p.write_text(p.read_text() + text)


def test_key_ignores_binding_modules_and_follows_headers_and_codegen(tmp_path):
    inc, sim = _copy_tree(tmp_path)
    base = compiler.compute_shim_hash(inc, sim)
    assert base == compiler.compute_shim_hash(compiler.INCLUDE_DIR, compiler.SIM_DIR)
    assert compiler.shim_hash() == base

    # modules that only bind and call a compiled library: the key stays
    for name in ("library.py", "callmodel.py", "__init__.py"):
        _append(sim / name, "\n# an edit that changes nothing compiled\n")
    (sim / "new_helper.py").write_text("X = 1\n")
    assert compiler.compute_shim_hash(inc, sim) == base

    # a shim header, the engine, a new header, or a module that produces the C++ text: it moves
    keys = {base}
    for edit in (lambda: _append(inc / "mf_sim" / "math.h", "\n// edit\n"),
                 lambda: _append(inc / "mf_sim" / "engine.cpp", "\n// edit\n"),
                 lambda: (inc / "mf_sim" / "extra.h").write_text("// new\n"),
                 lambda: _append(sim / "rewrite.py", "\n# edit\n"),
                 lambda: _append(sim / "trampoline.py", "\n# edit\n"),
                 lambda: _append(sim / "parse.py", "\n# edit\n"),
                 lambda: _append(sim / "spaces.py", "\n# edit\n"),
                 lambda: _append(sim / "compiler.py", "\n# edit\n")):
        edit()
        k = compiler.compute_shim_hash(inc, sim)
        assert k not in keys
        keys.add(k)


def test_key_modules_cover_everything_the_compiler_imports():
    """Every sim module that compiler.py imports, directly or through another, is in the key."""
    seen: set[str] = set()
    todo = ["compiler.py"]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        text = (compiler.SIM_DIR / name).read_text()
        for mod in re.findall(r"^\s*from \.(\w+) import", text, flags=re.M):
            todo.append(mod + ".py")
    assert seen <= set(compiler.KEY_MODULES), seen - set(compiler.KEY_MODULES)
