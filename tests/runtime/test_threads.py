"""First calls from many threads and processes at once, on a cold cache (issue #48).

Threads calling a fresh kernel together used to build the same library twice, the second
replacing the first, and a call then looked its kernel up in the library that replaced its own
(`KeyError: 'sm0_f32_simd_exact'` from fastpath.record). Every in-process cache is now built once
per key (other threads wait for the first build) and published whole.

The windows those races need are made wide here by slowing one build step down (a sleep before
the real step): the code path is the real one, the timing is what a slow machine gives.
Kernels run in the simulator, in a fresh cache folder, and every result is compared with the
kernel's reference.
"""
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

import metalforge as mf
from metalforge import autodiff, cache
from metalforge.frontend.kernel import Kernel
from metalforge.runtime import backends, launcher
from metalforge.tuning import cache as tuning_cache

ROOT = Path(__file__).resolve().parents[2]
THREADS = 8
# one row length per thread: every row-reduction variant (simd, simd_exact, group, looped)
ROWS = (7, 32, 257, 9000, 33, 64, 1000, 128)
PAUSE = 0.05


def softmax_rows(x: "T[R, D]"):
    e = mf.exp(x - mf.max(x, axis="D"))
    return e / mf.sum(e, axis="D")


@pytest.fixture
def cold(tmp_path, monkeypatch):
    """A fresh cache folder, and no compiled library or autotune cache in the process."""
    monkeypatch.setenv("METALFORGE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tuning_cache, "_CACHES", {})
    backends.clear_caches()
    yield tmp_path
    backends.clear_caches()


def slowed(monkeypatch, owner, name: str, seen: dict[str, list]) -> None:
    """`owner.name` recording its calls' arguments in `seen[name]` and pausing before the real
    step."""
    real = getattr(owner, name)

    def slow(*args, **kwargs):
        seen.setdefault(name, []).append(args)
        time.sleep(PAUSE)
        return real(*args, **kwargs)
    monkeypatch.setattr(owner, name, slow)


def together(work, n: int = THREADS) -> list[BaseException]:
    """Run work(i) in n threads released at once; the exceptions they raised."""
    start, errors = threading.Barrier(n), []

    def run(i: int) -> None:
        try:
            start.wait()
            work(i)
        except BaseException as e:                # noqa: BLE001 - reported by the caller
            errors.append(e)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def slow_pipeline(monkeypatch) -> dict[str, list]:
    """Every build step of a first call slowed down and recorded."""
    seen: dict[str, list] = {}
    slowed(monkeypatch, Kernel, "_trace", seen)
    slowed(monkeypatch, launcher, "plan", seen)
    slowed(monkeypatch, launcher, "render", seen)
    slowed(monkeypatch, launcher, "compile", seen)
    slowed(monkeypatch, backends, "_compile", seen)
    return seen


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])   # sim, and cuda if here


@pytest.mark.parametrize("device", DEVICES)
def test_first_calls_from_threads_all_succeed(cold, monkeypatch, device):
    slow_pipeline(monkeypatch)
    sm = mf.kernel(softmax_rows)
    xs = [torch.randn(3, d, device=device) for d in ROWS]
    sm.graph(xs[0])             # traced (nothing planned or compiled): the threads share it

    def call(i: int) -> None:
        for _ in range(2):                        # the cold call, then the warm one
            torch.testing.assert_close(sm(xs[i]), sm.reference(xs[i]))
    errors = together(call)
    assert not errors, repr(errors[0])


def test_each_build_step_runs_once_per_key(cold, monkeypatch):
    seen = slow_pipeline(monkeypatch)
    sm = mf.kernel(softmax_rows)
    xs = [torch.randn(3, d) for d in ROWS]
    errors = together(lambda i: torch.testing.assert_close(sm(xs[i]), sm.reference(xs[i])))
    assert not errors, repr(errors[0])
    counts = {name: len(calls) for name, calls in seen.items()}
    compiled = [args[3] for args in seen["compile"]]          # (schedule, source, backend, host)
    assert counts == {"_trace": 1, "plan": 1, "render": 1, "_compile": 1,
                      "compile": len(compiled)}
    assert len(set(compiled)) == len(compiled) >= 4           # each variant compiled once
    (lib,) = sm.variants(compiled=True)                       # one library holds them all
    assert set(compiled) <= set(lib["host_names"])


def test_specialisations_are_made_once(cold, monkeypatch):
    made = []
    real = launcher.Specialisation.of.__func__

    def slow_of(cls, graph, launch):
        made.append(graph)
        time.sleep(PAUSE)
        return real(cls, graph, launch)
    monkeypatch.setattr(launcher.Specialisation, "of", classmethod(slow_of))
    graph = mf.kernel(softmax_rows).graph(torch.randn(2, 8))
    got: list = []
    assert not together(lambda i: got.append(launcher.specialisation(graph, None)))
    assert len(made) == 1 and all(s is got[0] for s in got)


def test_the_autotune_cache_is_one_object_read_once(cold, monkeypatch):
    seen: dict[str, list] = {}
    slowed(monkeypatch, tuning_cache, "cache_path", seen)
    slowed(monkeypatch, tuning_cache.TuneCache, "_read", seen)
    got: list = []
    assert not together(lambda i: got.append(tuning_cache.default_cache()))
    assert all(c is got[0] for c in got)
    entries: list = []
    assert not together(lambda i: entries.append(got[0].entries))
    assert len(seen["_read"]) == 1 and all(e is entries[0] for e in entries)


def test_a_failed_autotune_write_replaces_the_entries(cold, monkeypatch):
    """The warm path notices a new autotune entry by the entries object changing: one kept
    for this process only (the file could not be written) must change it too."""
    c = tuning_cache.default_cache()
    before = c.entries

    def refuse(key, entry):
        raise OSError("read-only")
    monkeypatch.setattr(c, "_write", refuse)
    key = tuning_cache.TuneKey("dev", "k", "0" * 16, "T=f32", "D:8")
    with pytest.warns(cache.CacheWarning):
        c.put(key, {"launch": {"threads_per_group": 32}})
    assert c.entries is not before and c.get(key) == {"launch": {"threads_per_group": 32}}


def test_backward_graphs_are_derived_once(cold, monkeypatch):
    seen: dict[str, list] = {}
    slowed(monkeypatch, autodiff, "derive", seen)
    graph = mf.kernel(softmax_rows).graph(torch.randn(2, 8))
    got: list = []
    assert not together(lambda i: got.append(autodiff.backward_of(graph)))
    assert len(seen["derive"]) == 1 and all(b is got[0] for b in got)


def test_cuda_modules_are_compiled_once_per_device(monkeypatch):
    """Without a GPU: the module is a stand-in that counts how often it is built."""
    from metalforge.cuda import library as cuda_library
    built = []

    class Module:
        def __init__(self, text, entries, device, one_d=True, metal_version=None):
            built.append(device)
            time.sleep(PAUSE)
    monkeypatch.setattr(cuda_library, "_Module", Module)
    sm = mf.kernel(softmax_rows)
    lib = cuda_library.compile_shader(sm.source(torch.randn(2, 8)))
    got: list = []
    assert not together(lambda i: got.append(lib.module(0)))
    assert built == [0] and all(m is got[0] for m in got)


def test_mlx_kernel_objects_are_made_once(monkeypatch):
    pytest.importorskip("mlx.core")
    from metalforge.runtime import mlx as mfx
    seen: dict[str, list] = {}
    slowed(monkeypatch, mfx, "translate", seen)
    graph = mf.kernel(softmax_rows).graph(torch.randn(2, 8))
    s = launcher.specialisation(graph, None).schedule(False)
    got: list = []
    assert not together(lambda i: got.append(mfx.built(s, s.kernel.host_name)))
    assert len(seen["translate"]) == 1 and all(g[1] is got[0][1] for g in got)


def test_an_operator_is_registered_once(monkeypatch):
    from metalforge import torch_ops
    seen: dict[str, list] = {}
    slowed(monkeypatch, torch_ops, "KernelOp", seen)
    sm = mf.kernel(softmax_rows)
    got: list = []
    assert not together(lambda i: got.append(sm.as_op("mf_test_threads::softmax_rows")))
    assert len(seen["KernelOp"]) == 1 and all(op is got[0] for op in got)
    x = torch.randn(3, 40)
    torch.testing.assert_close(got[0](x), sm.reference(x))


def test_a_failed_build_is_tried_again_and_waiters_get_one_value():
    from metalforge.once import OnceMap
    m: OnceMap = OnceMap()
    calls = []

    def build():
        calls.append(1)
        time.sleep(PAUSE)
        if len(calls) == 1:
            raise ValueError("the first build fails")
        return object()
    got: list = []
    errors = together(lambda i: got.append(m.get_or_build("k", build)))
    assert [type(e) for e in errors] == [ValueError] and len(calls) == 2
    assert len(got) == THREADS - 1 and all(v is got[0] for v in got)
    assert m == {"k": got[0]} and not m._building        # no lock left behind


# --------------------------------------------------------------------------- processes

SCRIPT = textwrap.dedent("""
    import sys, threading, time, warnings
    warnings.simplefilter("always")
    import torch, metalforge as mf
    from metalforge.runtime import launcher

    real = launcher.render
    def slow(s):                          # a wider window for the races of issue #48
        time.sleep(0.05)
        return real(s)
    launcher.render = slow

    @mf.kernel
    def softmax_rows(x: "T[R, D]"):
        e = mf.exp(x - mf.max(x, axis="D"))
        return e / mf.sum(e, axis="D")

    rows = [int(d) for d in sys.argv[1:]]
    start, ok, failed = threading.Barrier(len(rows)), [], []
    def run(d):
        try:
            start.wait()
            x = torch.randn(3, d)
            for _ in range(2):
                torch.testing.assert_close(softmax_rows(x), softmax_rows.reference(x))
            ok.append(d)
        except BaseException as e:
            failed.append(repr(e))
    with warnings.catch_warnings(record=True) as got:
        ts = [threading.Thread(target=run, args=(d,)) for d in rows]
        for t in ts: t.start()
        for t in ts: t.join()
    for w in got:
        print("WARNING", w.category.__name__, w.message)
    for f in failed:
        print("FAILED", f)
    print("OK", len(ok))
""")


def processes(cache_dir: Path, n: int, rows: tuple[int, ...]) -> list[str]:
    """Run the script in n processes at once on one cache folder; their outputs."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), METALFORGE_CACHE_DIR=str(cache_dir))
    ps = [subprocess.Popen([sys.executable, "-c", SCRIPT, *map(str, rows)], env=env, cwd=ROOT,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
          for _ in range(n)]
    return [p.communicate(timeout=300)[0] for p in ps]


def test_processes_of_threads_on_one_cold_cache(tmp_path):
    rows = ROWS[:4]
    for out in processes(tmp_path, 3, rows):
        assert f"OK {len(rows)}" in out and "WARNING" not in out, out
    for e in entries(tmp_path):
        assert cache.problem(e) is None, e


@pytest.mark.filterwarnings("ignore::metalforge.cache.CacheWarning")
def test_threads_after_the_cached_libraries_are_emptied(cold, monkeypatch):
    xs = [torch.randn(3, d) for d in ROWS]
    sm = mf.kernel(softmax_rows)
    for x in xs[:4]:
        torch.testing.assert_close(sm(x), sm.reference(x))
    libraries = [e for e in entries(cold) if e.name.startswith("lib-")]
    assert libraries
    for e in libraries:             # emptied: a new empty file (the old one stays mapped here)
        e.unlink()
        e.write_bytes(b"")
    backends.clear_caches()
    slowed(monkeypatch, launcher, "render", {})
    sm = mf.kernel(softmax_rows)                  # nothing of it in the process
    errors = together(lambda i: torch.testing.assert_close(sm(xs[i]), sm.reference(xs[i])))
    assert not errors, repr(errors[0])
    for e in entries(cold):
        assert cache.problem(e) is None, e


def entries(d: Path) -> list[Path]:
    """The cache entries under d (not their records, locks or temporaries)."""
    return sorted(p for p in d.rglob("*") if p.is_file() and not p.name.startswith(".")
                  and p.suffix not in (".sum", ".lock")
                  and not any(q.name.startswith("stubs-") for q in p.parents))
