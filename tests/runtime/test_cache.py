"""The on-disk caches under threads, concurrent processes and corruption (metalforge/cache.py).

Every case runs real kernels through the simulator in a fresh cache folder and compares with
torch. The cold-cache cases run in subprocesses, so that nothing (engine, libraries) is already
loaded: they are what a new user's first run does.
"""
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch

from metalforge import cache
from metalforge.runtime import backends
from metalforge.sim import compiler
from metalforge.tuning import TuneCache, TuneKey

ROOT = Path(__file__).resolve().parents[2]

# One script for the subprocess cases: call a kernel from N threads, check every result, print
# how many succeeded and every warning.
SCRIPT = textwrap.dedent("""
    import sys, threading, warnings
    warnings.simplefilter("always")
    import torch, metalforge as mf

    @mf.kernel
    def axpb(x: "T[*B, D]", a: float, b: float):
        return x * a + b

    n = int(sys.argv[1])
    ok = []
    def run(i):
        x = torch.randn(3, 37 + i % 2)
        torch.testing.assert_close(axpb(x, 2.0, 1.0), x * 2 + 1)
        ok.append(i)
    with warnings.catch_warnings(record=True) as got:
        ts = [threading.Thread(target=run, args=(i,)) for i in range(n)]
        for t in ts: t.start()
        for t in ts: t.join()
    for w in got:
        print("WARNING", w.category.__name__, w.message)
    print("OK", len(ok))
""")


def run_script(cache_dir, threads=1):
    env = dict(os.environ, PYTHONPATH=str(ROOT), METALFORGE_CACHE_DIR=str(cache_dir))
    return subprocess.Popen([sys.executable, "-c", SCRIPT, str(threads)], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(p, threads=1):
    out, _ = p.communicate(timeout=300)
    assert p.returncode == 0 and f"OK {threads}" in out, out
    return out


def entries(d):
    """Every cache entry file (not records, locks, temporaries or header stand-ins) under d."""
    return sorted(p for p in Path(d).rglob("*") if p.is_file() and not p.name.startswith(".")
                  and p.suffix not in (".sum", ".lock")
                  and not any(q.name.startswith("stubs-") for q in p.parents))


# --------------------------------------------------------------------------- races

def test_eight_threads_on_a_cold_cache(tmp_path):
    out = finish(run_script(tmp_path / "new", threads=8), threads=8)
    assert (tmp_path / "new").stat().st_mode & 0o077 == 0         # created user-only
    assert "WARNING" not in out
    assert not [p for p in Path(tmp_path).rglob(".*.tmp")]      # no temporaries left behind
    for e in entries(tmp_path):                                  # everything written is valid
        assert cache.problem(e) is None, e


def test_warm_cache_loads_without_rebuilding(warm, tmp_path):
    d = copy_of(warm, tmp_path)
    before = {p: p.stat().st_mtime_ns for p in entries(d)}
    assert "WARNING" not in finish(run_script(d))
    assert {p: p.stat().st_mtime_ns for p in entries(d)} == before


def test_several_processes_on_a_cold_cache(tmp_path):
    ps = [run_script(tmp_path, threads=2) for _ in range(3)]
    for p in ps:
        assert "WARNING" not in finish(p, threads=2)
    for e in entries(tmp_path):
        assert cache.problem(e) is None, e


def test_one_compile_per_source_across_threads(tmp_path, monkeypatch):
    monkeypatch.setenv("METALFORGE_CACHE_DIR", str(tmp_path))
    calls = []
    real = backends._compile

    def counting(name, source):
        calls.append(source)
        return real(name, source)
    monkeypatch.setattr(backends, "_compile", counting)
    backends.clear_caches()
    src = "kernel void k(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) " \
          "{ y[i] = 3.0f * i; }"
    got = []
    ts = [threading.Thread(target=lambda: got.append(backends.kernel_object("sim", src, "k")))
          for _ in range(6)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(calls) == 1 and len(got) == 6 and all(g is got[0] for g in got)
    y = torch.empty(40)
    got[0](y)
    torch.testing.assert_close(y, 3.0 * torch.arange(40.0))


# --------------------------------------------------------------------------- corruption

@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """A cache folder after one run (copy it before damaging it)."""
    d = tmp_path_factory.mktemp("warm")
    finish(run_script(d))
    return d


def copy_of(warm, tmp_path):
    d = tmp_path / "cache"
    d.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(warm, d)
    return d


def _kinds(d):
    """The cache's entries by kind: compiled library + its metadata, engine, PCH + header."""
    sim = Path(d) / "sim"
    return {"library": next(sim.glob("lib-*.so")), "metadata": next(sim.glob("lib-*.json")),
            "engine": next(sim.glob("engine-*.so")), "pch": next(sim.glob("pch-*/*.gch")),
            "pch-header": next(p for p in sim.glob("pch-*/metal_stdlib"))}


DAMAGE = {
    "truncated": lambda b: b[: len(b) // 2],
    "zero-length": lambda b: b"",
    "garbage": lambda b: bytes((x * 7 + 13) % 256 for x in range(len(b))),   # same size
}


def test_damaged_entries_are_rebuilt_with_a_warning(warm, tmp_path):
    """Every kind of entry truncated, emptied or overwritten with garbage (one copy of the cache
    per damage, run at once): each is rebuilt with one warning naming it, and results are right."""
    runs = []
    for damage in sorted(DAMAGE):
        d = copy_of(warm, tmp_path / damage)
        kinds = _kinds(d)
        for path in kinds.values():
            path.write_bytes(DAMAGE[damage](path.read_bytes()))
        runs.append((damage, kinds, run_script(d)))
    for damage, kinds, p in runs:
        out = finish(p)                       # and the kernel's result is right (finish checks)
        for kind, path in kinds.items():      # one warning per entry, naming it; then it is good
            assert out.count(f"cache entry {path} ") == 1, (damage, kind, out)
            assert cache.problem(path) is None, (damage, kind)


def test_missing_record_means_rebuild(tmp_path, monkeypatch):
    """An entry without its size/hash record (a writer killed between the two) is not used."""
    monkeypatch.setenv("METALFORGE_CACHE_DIR", str(tmp_path))
    target = tmp_path / "entry.bin"
    cache.entry(target, lambda t: t.write_bytes(b"abc"))
    target.with_name("entry.bin.sum").unlink()
    cache._valid.clear()
    with pytest.warns(cache.CacheWarning, match="no valid size/hash record"):
        cache.entry(target, lambda t: t.write_bytes(b"xyz"))
    assert target.read_bytes() == b"xyz" and cache.problem(target) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another user")
def test_entry_of_another_user_is_never_loaded(warm, tmp_path):
    d = copy_of(warm, tmp_path)
    lib = _kinds(d)["library"]
    os.chown(lib, 65534, 65534)
    out = finish(run_script(d))
    assert f"cache entry {lib} belongs to another user" in out
    assert lib.stat().st_uid == os.geteuid()


# --------------------------------------------------------------------------- the folder

def test_cache_folder_is_user_only(warm):
    for d in [warm / "sim", *(warm / "sim").glob("pch-*")]:
        assert d.stat().st_mode & 0o077 == 0, d


def test_folder_that_cannot_be_created_falls_back_to_a_private_one(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = finish(run_script(blocker / "cache"))
    assert out.count("WARNING CacheWarning") == 1 and "cannot be created" in out, out
    assert "private temporary folder" in out


def test_read_only_folder_falls_back_to_a_private_one(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() == 0:          # root writes through permissions: make the folder immutable
        if subprocess.run(["chattr", "+i", str(ro)], capture_output=True).returncode != 0:
            pytest.skip("running as root and chattr +i is not available here")
        undo = ["chattr", "-i", str(ro)]
    else:
        os.chmod(ro, 0o555)
        undo = ["chmod", "755", str(ro)]
    try:
        out = finish(run_script(ro))
    finally:
        subprocess.run(undo, check=True)
    assert out.count("WARNING CacheWarning") == 1 and "is not writable" in out, out
    assert list(ro.iterdir()) == []


# --------------------------------------------------------------------------- autotune JSON

TUNE_SCRIPT = textwrap.dedent("""
    import sys
    from metalforge.tuning import TuneCache, TuneKey
    c = TuneCache(sys.argv[1])
    for i in range(int(sys.argv[3])):
        c.put(TuneKey("dev", "k" + sys.argv[2], "0" * 16, "T=f32", f"D:{i}"),
              {"launch": {"threads_per_group": 64}, "time_ms": 1.0})
""")


def test_autotune_json_written_by_two_processes_at_once(tmp_path):
    path = tmp_path / "autotune.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    ps = [subprocess.Popen([sys.executable, "-c", TUNE_SCRIPT, str(path), str(w), "25"],
                           env=env, stderr=subprocess.PIPE, text=True) for w in range(2)]
    for p in ps:
        assert p.wait(timeout=120) == 0, p.stderr.read()
    data = json.loads(path.read_text())
    assert len(data["entries"]) == 50               # nobody's entries were lost
    assert not list(tmp_path.glob(".*.tmp"))


def test_autotune_json_written_by_threads_at_once(tmp_path):
    path = tmp_path / "autotune.json"

    def write(w):
        c = TuneCache(path)
        for i in range(10):
            c.put(TuneKey("dev", f"k{w}", "0" * 16, "T=f32", f"D:{i}"),
                  {"launch": {"threads_per_group": 64}, "time_ms": 1.0})
    ts = [threading.Thread(target=write, args=(w,)) for w in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(TuneCache(path).entries) == 40


def test_sim_cache_dir_is_the_shared_root(tmp_path, monkeypatch):
    monkeypatch.setenv("METALFORGE_CACHE_DIR", str(tmp_path))
    assert compiler.cache_dir() == tmp_path / "sim"
