"""Damaged cache states that used to break every call (issue #48): each one now gives one
`CacheWarning` at most, and the call runs and is right.

- a relative $METALFORGE_CACHE_DIR (the compilers run in other folders);
- a cache folder cleaned with `find -type f -empty -delete` (the header stand-ins are empty);
- no home folder (HOME unset, no passwd entry): the private temporary cache;
- the private temporary cache is removed when the process exits;
- autotune.json holding binary garbage, or entries whose values this version refuses.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import metalforge as mf
from metalforge import cache
from metalforge.runtime import backends
from metalforge.tuning import CacheWarning
from metalforge.tuning import cache as tune_mod

ROOT = Path(__file__).resolve().parents[2]


def silu_kernel(c: float = 1.0):
    """A fresh elementwise kernel (a new graph, so nothing of it is cached in the process);
    `c` changes its source, so a new library is compiled."""
    @mf.kernel
    def silu(x: "T[N]"):
        return x / (c + mf.exp(-x))
    return silu


def check_silu(c: float = 1.0) -> None:
    x = torch.randn(64)
    torch.testing.assert_close(silu_kernel(c)(x), x / (c + torch.exp(-x)))


@pytest.fixture
def fresh(monkeypatch):
    """No compiled library or checked entry remembered in the process (put back after)."""
    backends.clear_caches()
    cache._valid.clear()
    yield
    backends.clear_caches()
    cache._valid.clear()


def cache_warnings(got) -> list[str]:
    return [str(w.message) for w in got if issubclass(w.category, CacheWarning)]


# --------------------------------------------------------------------------- the cache folder

def test_relative_cache_dir_is_made_absolute_once(tmp_path, monkeypatch, fresh):
    """A relative folder is resolved at first use: the compilers, which run in temporary
    folders, find what is in it, and a later chdir does not move it."""
    name = f"rel-cache-{tmp_path.name}"           # resolved once per process: a unique text
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("METALFORGE_CACHE_DIR", name)
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        check_silu(1.0)
        (tmp_path / "elsewhere").mkdir()
        monkeypatch.chdir(tmp_path / "elsewhere")
        check_silu(2.0)
    assert cache_warnings(got) == []
    assert list((tmp_path / name / "sim").glob("lib-*.so"))
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_emptied_files_are_rebuilt(tmp_path, monkeypatch, fresh):
    """`find -type f -empty -delete` after a first build (it removes the empty header
    stand-ins and the lock files): the next compile writes them again."""
    monkeypatch.setenv("METALFORGE_CACHE_DIR", str(tmp_path))
    check_silu(1.0)
    emptied = [p for p in tmp_path.rglob("*") if p.is_file() and p.stat().st_size == 0]
    for p in emptied:
        p.unlink()
    stubs = next((tmp_path / "sim").glob("stubs-*"))
    assert (stubs / "metal_stdlib") in emptied
    backends.clear_caches()
    cache._valid.clear()
    check_silu(3.0)                       # a new library: preprocessed with the stand-ins
    check_silu(1.0)
    assert (stubs / "metal_stdlib").is_file()


def test_a_non_empty_stand_in_is_rewritten(tmp_path, monkeypatch, fresh):
    monkeypatch.setenv("METALFORGE_CACHE_DIR", str(tmp_path))
    check_silu(1.0)
    stub = next((tmp_path / "sim").glob("stubs-*")) / "metal_stdlib"
    stub.write_text("#error not a stand-in\n")
    backends.clear_caches()
    check_silu(4.0)
    assert stub.read_text() == ""


# --------------------------------------------------------------------------- subprocesses

SCRIPT = textwrap.dedent("""
    import sys, warnings
    if sys.argv[1] == "no-home":               # HOME is unset and the user has no passwd entry
        import pwd
        def getpwuid(uid):
            raise KeyError(f"getpwuid(): uid not found: {uid}")
        pwd.getpwuid = getpwuid
    warnings.simplefilter("always")
    import torch, metalforge as mf

    @mf.kernel
    def silu(x: "T[N]"):
        return x / (1 + mf.exp(-x))

    x = torch.randn(64)
    with warnings.catch_warnings(record=True) as got:
        torch.testing.assert_close(silu(x), x * torch.sigmoid(x))
        torch.testing.assert_close(silu(x), x * torch.sigmoid(x))
    for w in got:
        print("WARNING", w.category.__name__, w.message)
    print("OK")
""")

PRIVATE = re.compile(r"using the private temporary folder (\S+) for this process")


def run_script(mode: str, env: dict) -> tuple[str, Path]:
    """Run SCRIPT; return its output and the private temporary folder its warning named (the
    test removes that folder if the script left it behind)."""
    p = subprocess.run([sys.executable, "-c", SCRIPT, mode], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    out = p.stdout + p.stderr
    m = PRIVATE.search(out)
    assert m, out
    return out, Path(m.group(1))


def test_no_home_folder_uses_the_private_cache(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("HOME", "METALFORGE_CACHE_DIR")}
    env["PYTHONPATH"] = str(ROOT)
    out, private = run_script("no-home", env)
    try:
        assert "OK" in out and out.count("WARNING") == 1, out
        assert "WARNING CacheWarning" in out and "no home folder" in out, out
        assert not private.exists()
    finally:
        shutil.rmtree(private, ignore_errors=True)


def test_private_cache_is_removed_at_exit(tmp_path):
    blocker = tmp_path / "a-file"                # the cache folder cannot be created under it
    blocker.write_text("")
    env = dict(os.environ, PYTHONPATH=str(ROOT), METALFORGE_CACHE_DIR=str(blocker / "cache"))
    out, private = run_script("unwritable", env)
    try:
        assert "OK" in out and out.count("WARNING CacheWarning") == 1, out
        assert "cannot be created" in out
        assert not private.exists(), f"{private} left behind"
    finally:
        shutil.rmtree(private, ignore_errors=True)


def test_exit_hook_leaves_a_folder_it_did_not_create(tmp_path):
    """The exit hook of a private folder removes it only in the process that created it (a
    forked child inherits the hook)."""
    d = tmp_path / "private"
    d.mkdir()
    cache._remove(d, os.getpid() + 1)
    assert d.is_dir()
    cache._remove(d, os.getpid())
    assert not d.exists()
    cache._remove(d, os.getpid())                 # already gone: nothing happens


# --------------------------------------------------------------------------- autotune.json

@pytest.fixture
def tune_file(tmp_path, monkeypatch):
    path = tmp_path / "tuning" / "autotune.json"
    path.parent.mkdir()
    monkeypatch.setattr(tune_mod, "cache_path", lambda: path)
    monkeypatch.setattr(tune_mod, "_CACHES", {})
    return path


@mf.kernel
def rms(x: "T[R, D]"):
    return x * mf.rsqrt(mf.mean(x * x, axis="D") + 1e-6)


def rms_ref(x):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6)


def calls_warn_once(f, x, ref, match: str) -> None:
    """Two calls of `f(x)`, both right, with one CacheWarning between them, matching `match`."""
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        torch.testing.assert_close(f(x), ref(x))
        torch.testing.assert_close(f(x), ref(x))
    msgs = cache_warnings(got)
    assert len(msgs) == 1 and re.search(match, msgs[0]), msgs


def test_binary_garbage_in_autotune_json(tune_file):
    tune_file.write_bytes(bytes(range(128, 256)) + b"\x00garbage\xff")
    x = torch.randn(4, 64)
    calls_warn_once(rms, x, rms_ref, r"autotune cache .*autotune\.json is not valid JSON")


@pytest.mark.parametrize("launch, why", [
    ({"threads_per_group": 96}, "looped_limit"),
    ({"rows_per_group": 0}, "rows_per_group must be a positive int, got 0"),
    ({"vector_width": 3}, "vector_width must be 1, 2, 4 or 8, got 3"),
])
def test_autotune_entry_with_refused_values(tune_file, launch, why):
    x = torch.randn(4, 64)
    key = tune_mod.key_for(rms.graph(x), "sim", {"R": 4, "D": 64})
    tune_file.write_text(json.dumps({"version": 1, "entries": {key.text: {"launch": launch}}}))
    calls_warn_once(rms, x, rms_ref, rf"ignoring the autotune cache entry '{re.escape(key.text)}'"
                                     rf" in {re.escape(str(tune_file))}: its values are refused"
                                     rf": .*{why}")


def test_autotune_entry_refused_under_explicit_options(tune_file):
    """An entry that is valid alone but not under the call's explicit options is dropped (the
    error would have blamed options the user never passed); the explicit options run."""
    x = torch.randn(4, 64)
    key = tune_mod.key_for(rms.graph(x), "sim", {"R": 4, "D": 64})
    tuned = {"threads_per_group": 64, "looped_limit": 512}
    tune_file.write_text(json.dumps({"version": 1, "entries": {key.text: {"launch": tuned}}}))
    calls_warn_once(rms.with_launch(looped_limit=1024), x, rms_ref,
                    r"its values are refused: .*looped_limit=1024.* \(under the explicit "
                    r"launch options \{'looped_limit': 1024\}\)")


def test_autotune_entry_that_is_not_an_object(tune_file):
    tune_file.write_text(json.dumps({"version": 1, "entries": {"some | key": 5}}))
    x = torch.randn(4, 64)
    calls_warn_once(rms, x, rms_ref, r"ignoring 1 entry of the autotune cache .*autotune\.json "
                                     r"that are not .*'some \| key'")
