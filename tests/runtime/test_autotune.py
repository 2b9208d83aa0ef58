"""mf.autotune: every candidate of every example kernel is checked through the simulator, a
wrong candidate is reported with its configuration, the winner is cached per (device, kernel,
dtypes, shape bucket) and used automatically, and a damaged cache file only warns."""
import importlib
import io
import json
import math
from pathlib import Path

import pytest
import torch

import metalforge as mf
from metalforge.autotuner import CandidateMismatch, median_time
from metalforge.graph import ConstParam, ScalarParam, TensorParam
from metalforge.runtime import backends, launcher
from metalforge.schedule import family
from metalforge.schedule.policy import LaunchError
from metalforge.testing import load_module
from metalforge.testing.check import index_tensors
from metalforge.tuning import CacheWarning, TuneCache, grid
from metalforge.tuning import cache as cache_mod

autotune_mod = importlib.import_module("metalforge.autotuner")
SMALL_GRID = 1 << 19                # the elementwise table's (every full config names it)
EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.py"))


@pytest.fixture
def tune_file(tmp_path, monkeypatch):
    """A private autotune cache file (the simulator's compile cache is left where it is)."""
    path = tmp_path / "tuning" / "autotune.json"
    monkeypatch.setattr(cache_mod, "cache_path", lambda: path)
    monkeypatch.setattr(cache_mod, "_CACHES", {})
    return path


def example_args(kernel, sizes=None) -> list:
    """Arguments for every tensor and runtime scalar (Consts keep their defaults): odd sizes,
    so vector paths, tails and partial groups all run; `sizes` fixes some dims. An example
    module's CHECK options for the kernel bound the rest: the low end of a pinned dim's range,
    an integer tensor's value range (a paged cache needs block numbers below its size)."""
    opts = getattr(kernel, "check_options", {})
    pinned = {d: v[0] if isinstance(v, tuple) else v for d, v in opts.get("dims", {}).items()
              if isinstance(v, (tuple, int))}
    ranges = {n: v for n, v in opts.get("values", {}).items() if isinstance(v, tuple)}
    sizes = {"E": 64, **pinned, **(sizes or {})}   # E: RoPE heads (even, at least rot_dims)
    fresh = iter([37, 5, 3, 11, 7, 13, 9, 6, 4, 8, 10, 12])
    gen = torch.Generator().manual_seed(0)
    group = {}                                   # bases of derived dims: whole K/8, K/64
    for p in kernel.params:
        for d in getattr(p, "dims", ()):
            if d.derived:
                group[d.base] = math.lcm(group.get(d.base, 1), d.div)
    args = []
    for p in kernel.params:
        if isinstance(p, ConstParam):
            break
        if isinstance(p, ScalarParam):
            args.append(p.default if p.has_default else p.pytype(1))
            continue
        assert isinstance(p, TensorParam)
        shape: list[int] = []
        for d in p.dims:
            if d.batch:
                shape += [2, 3]
            elif d.size is not None:                  # a literal dim ("T[C, 4]")
                shape.append(d.size)
            elif d.derived:
                base = sizes.setdefault(d.base, group[d.base] * next(fresh))
                shape.append(base * d.mul // d.div + d.add)
            else:
                if d.name not in sizes:
                    sizes[d.name] = next(fresh) if d.name not in ("G", "R") else 2
                if d.joined:                          # "(G R)": one dim of G * R
                    shape[-1] *= sizes[d.name]
                else:
                    shape.append(sizes[d.name])
        dt = p.dtype.torch if p.dtype is not None else torch.float32
        if dt.is_floating_point:
            args.append(torch.randn(shape, generator=gen).to(dt) * 2)
        else:
            hi = 2 if p.name in index_tensors(kernel.graph(T="f32")) else 100   # valid ids
            lo, hi = (ranges[p.name][0], ranges[p.name][1] + 1) if p.name in ranges else (0, hi)
            args.append(torch.randint(lo, hi, shape, generator=gen).to(dt))
    return args


def example_kernels():
    out = []
    for path in EXAMPLES:
        module = load_module(path)
        for name, k in vars(module).items():
            if isinstance(k, mf.Kernel):
                k.check_options = getattr(module, "CHECK", {}).get(name, {})
                out.append(pytest.param(k, id=f"{path.stem}.{name}"))
    return out


# reduced-axis lengths that reach each variant of a family's schedule (short rows held by one
# simdgroup, rows in registers, looped rows; columns split over several threads)
LONGER = {"row": (700, 5000), "column": (300,)}
# Examples of the attention and quantized families: a family's examples split its grid, each
# taking every n-th candidate (n: the family's examples here) from its own offset, so that
# together they reach every candidate exactly once (CI time: these sweeps took 300 s of the
# suite; at every third candidate 330 s; at every fourth, where some candidates ran on two
# examples, 190 s)
SAMPLED = {"attention": ("sliding_window_softcap.window_softcap",
                         "padded_attention.padded_attention", "llama_decode.decode_attention",
                         "llama_decode.paged_decode_attention", "attention.attention",
                         "paged_attention.paged_attention"),
           "quant": ("llama_decode.q_rope", "llama_decode.kv_rope", "llama_decode.qlinear_add",
                     "llama_decode.gate_up", "q4_matvec.q4_matvec")}


def sampled(name: str, candidates: list) -> list | None:
    """The share of `candidates` example `name` tries, when its family's grid is split."""
    for names in SAMPLED.values():
        if name in names:
            return candidates[names.index(name)::len(names)]
    return None


def test_the_sampled_examples_together_reach_every_candidate():
    for fam, names in SAMPLED.items():
        every = grid(fam)
        shares = [sampled(n, every) for n in names]
        assert sorted(map(str, sum(shares, []))) == sorted(map(str, every)), fam


@pytest.mark.parametrize("kernel", example_kernels())
def test_every_candidate_of_every_example_is_correct(kernel, tune_file, monkeypatch, request):
    compiled = []
    real = backends._compile
    monkeypatch.setattr(backends, "_compile", lambda b, s: compiled.append(s) or real(b, s))
    graph = kernel.graph(*example_args(kernel))
    fam = family(graph)
    shapes = [{}] + [{n.attr[1]: size} for n in graph.reductions()[:1]
                     for size in LONGER.get(fam, ())]
    name = request.node.callspec.id
    share = sampled(name, grid(fam))
    assert share is None or name in SAMPLED[fam]          # it shares its own family's grid
    every = grid(fam) if share is None else share
    for sizes in shapes:
        r = mf.autotune(kernel, *example_args(kernel, sizes), progress=False,  # raises if wrong
                        candidates=share)
        assert [t.status for t in r.trials] == ["ok"] * len(r.trials)
        assert len(r.trials) >= len(every) and r.default in [t.launch for t in r.trials]
        # on the simulator nothing is timed or cached, and the default is kept
        assert not r.timed and r.best == r.default and r.saved_to is None
        assert "not meaningful" in r.note and not tune_file.exists()
    # only options that change the generated code compile a new kernel (each once); attention
    # sizes its threadgroup merge by the simdgroups per group
    code_keys = {tuple((k, v) for k, v in t.launch.items()
                       if k != "threads_per_group" or fam == "attention") for t in r.trials}
    assert len(compiled) <= len(code_keys)


@mf.kernel
def axpb(x: "T[R, D]", w: "T[D]", b: float = 1.0):
    return x * w + b


def test_a_wrong_candidate_is_reported_with_its_config(tune_file):
    def corrupt_vec2(src: str) -> str:       # planted bug: only in the 2-wide vector kernel
        if "vec<T, 2>" not in src:
            return src
        return src.replace("mf_out_v[mf_k] = T(", "mf_out_v[mf_k] = T(1.0f + ")

    token = launcher.MSL_REWRITE.set(corrupt_vec2)
    try:
        with pytest.raises(CandidateMismatch) as e:
            mf.autotune(axpb, torch.randn(3, 40), torch.randn(40), progress=False,
                        candidates=[{"vector_width": 2}, {"vector_width": 4,
                                                          "threads_per_group": 64}])
    finally:
        launcher.MSL_REWRITE.reset(token)
    msg = str(e.value)
    assert "kernel 'axpb'" in msg and "1 launch configuration(s)" in msg
    assert "metalforge bug" in msg
    assert ("threads_per_group=256, vector_width=2, vectors_per_thread=1, "
            f"small_grid={SMALL_GRID}: output 0:") in msg
    assert "vector_width=4" not in msg


def test_candidates_are_checked_before_anything_runs(tune_file, monkeypatch):
    compiled = []
    monkeypatch.setattr(backends, "_compile", lambda b, s: compiled.append(s))
    x, w = torch.randn(2, 8), torch.randn(8)
    with pytest.raises(LaunchError, match=r"mf.autotune\(axpb\) candidate 1: "
                                          r"threads_per_group=4096 exceeds"):
        mf.autotune(axpb, x, w, candidates=[{"threads_per_group": 64},
                                            {"threads_per_group": 4096}])
    with pytest.raises(LaunchError, match=r"candidate 0: index64 is chosen from the sizes"):
        mf.autotune(axpb, x, w, candidates=[{"index64": True}])
    with pytest.raises(LaunchError, match="candidates must be a list of launch-option dicts"):
        mf.autotune(axpb, x, w, candidates={"threads_per_group": 64})
    assert compiled == []


def test_explicit_candidates_pinned_options_and_no_repeats(tune_file):
    x, w = torch.randn(3, 21), torch.randn(21)
    r = mf.autotune(axpb, x, w, candidates=[{"threads_per_group": 256}, {"vector_width": 1},
                                            {"threads_per_group": 256, "vector_width": 8}],
                    progress=False)
    assert [t.launch for t in r.trials] == [
        {"threads_per_group": 256, "vector_width": 8, "vectors_per_thread": 1,
         "small_grid": SMALL_GRID},
        {"threads_per_group": 256, "vector_width": 1, "vectors_per_thread": 1,
         "small_grid": SMALL_GRID}]
    pinned = mf.kernel(axpb.fn, name="axpb_scalar", launch={"vector_width": 1})
    r = mf.autotune(pinned, x, w, progress=False)
    assert {t.launch["vector_width"] for t in r.trials} == {1}
    assert len(r.trials) == len(grid("elementwise", {"vector_width": 1})) == 12


def test_the_default_candidate_is_what_a_call_runs(tune_file, monkeypatch):
    """Options a candidate leaves out come from the table with the backend's changes
    (BACKEND_POLICIES, as for a call): the default trial is the backend's default, and a
    candidate may ask for the table's value back."""
    from metalforge.schedule import policy
    monkeypatch.setitem(policy.BACKEND_POLICIES, "sim", {"elementwise": {"vector_width": 2}})
    x, w = torch.randn(3, 21), torch.randn(21)
    r = mf.autotune(axpb, x, w, candidates=[{"vector_width": 8}], progress=False)
    assert [t.launch["vector_width"] for t in r.trials] == [2, 8]


# --------------------------------------------------------------------------- the cache


def fake_timer(monkeypatch, times):
    """Time candidates on the simulator as if on a GPU: the bare launch runs, the time is
    scripted (in trial order), so which one wins is known."""
    it = iter(times)

    def timer(backend, warmup, repeats):
        def time_it(call):
            call()
            return next(it)
        return time_it

    monkeypatch.setattr(autotune_mod, "_timer", timer)


def test_winner_is_cached_and_used_automatically(tune_file, monkeypatch):
    x, w = torch.randn(3, 1000), torch.randn(1000)
    fake_timer(monkeypatch, [1.0e-3, 0.9e-3, 0.4e-3, 0.7e-3])
    r = mf.autotune(axpb, x, w, progress=False,
                    candidates=[{"threads_per_group": 128},
                                {"threads_per_group": 512, "vectors_per_thread": 2},
                                {"threads_per_group": 64}])
    best = {"threads_per_group": 512, "vector_width": 8, "vectors_per_thread": 2,
            "small_grid": SMALL_GRID}
    assert r.timed and r.best == best and r.speedup == pytest.approx(2.5)
    assert r.saved_to == tune_file
    key = cache_mod.key_for(axpb.graph(x, w), "sim", {"R": 3, "D": 1000})
    assert key == r.key and key.text == (f"metalforge-sim | axpb@{key.graph_hash} | T=f32 | "
                                         "R:4,D:1024")
    # a fresh reader of the file sees the entry
    data = json.loads(tune_file.read_text())
    assert data["version"] == 1 and data["entries"][key.text]["launch"] == best
    assert TuneCache(tune_file).get(key)["time_ms"] == pytest.approx(0.4)

    # a fresh process (nothing in memory) uses it on plain calls, under explicit overrides
    cache_mod._CACHES.clear()
    launches = []
    real = launcher.bind

    def spy(call):
        launches.append(dict(call.spec.launch or {}))
        return real(call)

    monkeypatch.setattr(launcher, "bind", spy)
    torch.testing.assert_close(axpb(x, w), x * w + 1)
    torch.testing.assert_close(axpb(torch.randn(4, 600), torch.ones(600), 0.0).shape,
                               torch.Size([4, 600]))                   # same bucket
    axpb.with_launch(threads_per_group=64)(x, w)                       # call site wins
    axpb(torch.randn(3, 1025), torch.randn(1025))                      # D bucket 2048: not tuned
    axpb(x.half(), w.half())                                           # other dtypes: not tuned
    assert launches == [best, best, {**best, "threads_per_group": 64}, {}, {}]


def test_same_kernel_and_dispatch_is_timed_once(tune_file, monkeypatch):
    # 19 threads in all: groups of 256 and of 512 threads are both one group of 19
    fake_timer(monkeypatch, [3e-3, 2e-3])
    r = mf.autotune(axpb, torch.randn(3, 50), torch.randn(50), progress=False,
                    candidates=[{"threads_per_group": 512, "vectors_per_thread": 2},
                                {"threads_per_group": 256, "vectors_per_thread": 2}])
    assert [t.seconds for t in r.trials] == [3e-3, 2e-3, 2e-3]
    assert r.best == {"threads_per_group": 512, "vector_width": 8, "vectors_per_thread": 2,
                      "small_grid": SMALL_GRID}


def test_candidates_the_pipeline_refuses_are_skipped(tune_file, monkeypatch):
    real = launcher.kernel_object

    class Limited:                    # a pipeline that allows at most 128 threads per group
        def __init__(self, k):
            self.k, self.max_threads_per_threadgroup = k, 128
            self.static_thread_group_memory_length = 0

        def __call__(self, *a, **kw):
            return self.k(*a, **kw)

    monkeypatch.setattr(launcher, "kernel_object", lambda *a: Limited(real(*a)))
    fake_timer(monkeypatch, [1e-3])
    x, w = torch.randn(4, 500), torch.randn(500)
    k = mf.kernel(axpb.fn, name="axpb")          # fresh traces: nothing compiled yet
    r = mf.autotune(k, x, w, candidates=[{"threads_per_group": 128}], progress=False)
    assert [t.status for t in r.trials] == ["skipped", "ok"]
    assert "max_threads_per_threadgroup=128" in r.trials[0].detail
    assert r.best["threads_per_group"] == 128 and r.speedup is None
    with pytest.raises(LaunchError, match=r"no launch configuration can run here:\n"
                                          r"  threads_per_group=256.*max_threads"):
        mf.autotune(k, x, w, candidates=[{"threads_per_group": 512}], progress=False)


def test_keys_separate_const_variants_and_devices():
    @mf.kernel
    def powk(x: "T[N]", k: mf.Const[int] = 2):
        return x ** k

    x = torch.randn(10)
    k2, k3 = (cache_mod.key_for(powk.graph(x, k=k), "sim", {"N": 10}) for k in (2, 3))
    assert k2.graph_hash != k3.graph_hash and k2.shape == k3.shape == "N:16"
    assert cache_mod.key_for(powk.graph(x), "sim", {"N": 10}) == k2      # stable per graph
    assert k2.device == "metalforge-sim"
    # the hash is of what the kernel computes, not of the Kernel object
    again = mf.kernel(powk.fn, name="powk")
    assert cache_mod.key_for(again.graph(x), "sim", {"N": 10}) == k2


def test_corrupt_cache_file_warns_and_is_replaced(tune_file, monkeypatch):
    tune_file.parent.mkdir(parents=True)
    tune_file.write_text("{not json")
    x, w = torch.randn(2, 900), torch.randn(900)
    with pytest.warns(CacheWarning, match=r"autotune cache .*autotune\.json is not valid JSON"):
        torch.testing.assert_close(axpb(x, w), x * w + 1)
    torch.testing.assert_close(axpb(x, w), x * w + 1)          # read once: no second warning
    fake_timer(monkeypatch, [2e-3, 1e-3])
    mf.autotune(axpb, x, w, candidates=[{"threads_per_group": 64}], progress=False)
    data = json.loads(tune_file.read_text())
    assert [e["launch"] for e in data["entries"].values()] == [
        {"threads_per_group": 64, "vector_width": 8, "vectors_per_thread": 1,
         "small_grid": SMALL_GRID}]


@pytest.mark.parametrize("content, match", [
    ('{"version": 99, "entries": {}}', "has version 99; this metalforge reads version 1"),
    ('[1, 2]', 'does not hold an object with an "entries" object'),
])
def test_unreadable_cache_versions_warn(tune_file, content, match):
    tune_file.parent.mkdir(parents=True)
    tune_file.write_text(content)
    with pytest.warns(CacheWarning, match=match):
        assert TuneCache(tune_file).entries == {}


def test_stale_entry_is_ignored_with_a_warning(tune_file):
    x, w = torch.randn(2, 9), torch.randn(9)
    key = cache_mod.key_for(axpb.graph(x, w), "sim", {"R": 2, "D": 9})
    cache_mod.default_cache().put(key, {"launch": {"rows_per_group": 4}})
    with pytest.warns(CacheWarning, match=r"ignoring the autotune cache entry .*axpb.*"
                                          r"rows_per_group do not apply"):
        torch.testing.assert_close(axpb(x, w), x * w + 1)


def test_cache_location(monkeypatch, tmp_path):
    monkeypatch.setenv("METALFORGE_CACHE_DIR", str(tmp_path))
    assert cache_mod.cache_path() == tmp_path / "autotune.json"
    monkeypatch.delenv("METALFORGE_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_mod.cache_path() == tmp_path / "home" / ".cache" / "metalforge" / "autotune.json"


def test_buckets():
    assert [cache_mod.bucket(n) for n in (0, 1, 2, 3, 4, 5, 4096, 4097)] == \
        [0, 1, 2, 4, 4, 8, 4096, 8192]


# --------------------------------------------------------------------------- timing, progress


def test_median_time_batches_launches_between_syncs():
    events = []
    ticks = iter([0.0, 1e-5] + [x for i in range(5) for x in (1.0, 1.0 + (i + 1) * 1e-3)])
    t = median_time(lambda: events.append("call"), lambda: events.append("sync"),
                    warmup=2, repeats=5, clock=lambda: next(ticks), min_sample=2e-4)
    # warm-up 2, one calibration call (1e-5 s) → 20 calls per sample, 5 samples
    assert events.count("call") == 2 + 1 + 20 * 5
    assert events[:4] == ["call", "call", "sync", "call"]
    assert t == pytest.approx(3e-3 / 20)                        # the median sample


def test_progress_line_and_summary(capsys, tune_file):
    buf = io.StringIO()
    bar = autotune_mod._Progress("autotune k", 4, True, stream=buf, tty=True)
    bar.step(1, "threads_per_group=64")
    bar.step(4, "done")
    bar.close("autotune k: 4/4 candidates correct")
    out = buf.getvalue()
    assert out.startswith("\rautotune k [#####...............] 1/4 threads_per_group=64")
    assert "\rautotune k [####################] 4/4 done" in out
    assert out.endswith("\n") and out.split("\r")[-1].rstrip() == \
        "autotune k: 4/4 candidates correct"
    mf.autotune(axpb, torch.randn(2, 5), torch.randn(5), candidates=[])
    err = capsys.readouterr().err
    assert err == ("autotune axpb: 1/1 candidates correct; timings on 'sim' are not "
                   "meaningful; keeping the default\n")
