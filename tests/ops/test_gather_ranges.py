"""Static ranges of gather indices (metalforge/schedule/ranges.py) and what they buy: proven
gathers keep no run-time check, their kernels no report and their calls no read-back; unproven
ones are checked at the call or, with index_check="deferred", at the next synchronisation."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import metalforge as mf
from metalforge import runtime
from metalforge.graph import take_sites
from metalforge.runtime import indexcheck
from metalforge.schedule.ranges import in_range

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from paged_attention import paged_attention, torch_paged_attention  # noqa: E402
from paged_kv_gather import paged_gather  # noqa: E402
from rope import (  # noqa: E402
    qk_norm_rope,
    rope,
    rope_cached,
    rope_interleaved,
    rope_partial,
    torch_rope,  # noqa: E402
)


def _proven(fn, *args) -> list[bool]:
    g = fn.graph(*args) if args else fn.graph(T="f32")
    return [in_range(g, n) for n in take_sites(g)]


def _along_e(index):
    """A kernel gathering x: [R, E] along E at index(i, E) (i = mf.index("E"))."""
    @mf.kernel
    def k(x: "T[R, E]"):
        return mf.take(x, axis="E", index=index(mf.index("E"), mf.size("E")))
    return k


def _along_half(index):
    """A kernel gathering t: [R, E/2] (E even) at index(i, E) over x's [R, E]."""
    @mf.kernel
    def k(x: "T[R, E]", t: "T[R, E/2]"):
        return x + mf.take(t, axis="E/2", index=index(mf.index("E"), mf.size("E")))
    return k


# --------------------------------------------------------------------------- the analysis

def test_examples_rope_partners_and_tables_are_proven():
    """RoPE's partner where(i < half, i + half, i - half) with half = size(E) // 2 (E may be
    odd: the half rounds down, and still i + half <= 2 half - 1 < E); the cos/sin tables over
    E/2 at i % half (the E/2 dim makes E even, so half = size(E/2) >= 1); qk_norm_rope's two
    partners. Interleaved i ^ 1 is not (on an odd E the last i ^ 1 is E), nor rope_partial's
    i + rot_dims/2 (E may be under rot_dims), nor a block table's entries."""
    assert _proven(rope) == [True]
    assert _proven(rope_cached) == [True, True, True]
    assert _proven(qk_norm_rope) == [True, True]
    assert _proven(rope_interleaved) == [False]
    assert _proven(rope_partial) == [False]
    assert _proven(paged_gather) == [False]
    assert _proven(paged_attention) == [False, False]


@pytest.mark.parametrize("index,proven", [
    (lambda i, n: i, True),
    (lambda i, n: n - 1 - i, True),                         # a reversal
    (lambda i, n: mf.minimum(i + 3, n - 1), True),
    (lambda i, n: mf.clamp(i - 2, 0, n - 1), True),
    (lambda i, n: mf.where(i + 1 < n, i + 1, 0), True),     # a guarded neighbour
    (lambda i, n: mf.where(i >= 1, i - 1, n - 1), True),    # rotation by one
    (lambda i, n: (i + n - 1) % n, True),                   # n >= 1: i is a position of E
    (lambda i, n: i // 2 + n // 2 - n // 2, True),
    (lambda i, n: mf.where((i >= 2) & (i < n), i - 2, i), True),
    (lambda i, n: i + 1, False),                            # past the end at i = n - 1
    (lambda i, n: n - i, False),                            # n at i = 0
    (lambda i, n: i - 1, False),
    (lambda i, n: i ^ 1, False),                            # n when n is odd
    (lambda i, n: mf.where(i > n // 2, i + n // 2, i - n // 2), False),  # does not guard
    (lambda i, n: mf.where(i < n // 2, i - n // 2, i + n // 2), False),  # swapped branches
    (lambda i, n: mf.where(i + 1 < n, i + 2, 0), False),
    (lambda i, n: (i + n) // 2 + n // 2, False),
    (lambda i, n: i * 2, False),
    (lambda i, n: (i * (1 << 40)) * (1 << 30), False),      # would wrap in 64 bits
    (lambda i, n: (i + n // 2).to(mf.i32), False),          # narrowing: may wrap
])
def test_expressions_along_their_axis(index, proven):
    assert _proven(_along_e(index)) == [proven]


@pytest.mark.parametrize("index,proven", [
    (lambda i, n: i // 2, True),               # E even: i // 2 <= E/2 - 1
    (lambda i, n: i % (n // 2), True),         # E >= 2: the divisor is >= 1
    (lambda i, n: i >> 1, True),
    (lambda i, n: i & 3, False),               # 3 may be past E/2 - 1 (E = 2)
    (lambda i, n: i, False),                   # E/2 < E
    (lambda i, n: (i + 1) // 2, False),        # E/2 at i = E - 1
])
def test_expressions_along_a_derived_axis(index, proven):
    assert _proven(_along_half(index)) == [proven]


def test_division_by_a_size_that_may_be_zero_stays_unproven():
    """F is nothing the element iterates: it may be 0, and i % 0 has no value."""
    @mf.kernel
    def k(x: "T[R, E]", t: "T[R, F]"):
        return x + mf.take(t, axis="F", index=mf.index("E") % mf.size("F"))

    @mf.kernel
    def guarded(x: "T[R, E]", t: "T[R, F]"):
        f = mf.size("F")
        return x + mf.take(t, axis="F", index=mf.where(f >= 1, mf.index("E") % mf.maximum(f, 1),
                                                         0))
    assert _proven(k) == [False]
    assert _proven(guarded) == [False]          # f < 1 branch reads 0, which F = 0 lacks


def test_positions_under_a_reduction_say_nothing_of_the_axis():
    """mf.index("K") inside a sum over K does not make K non-empty: size(K) - 1 stays
    unproven (it is -1 for K = 0)."""
    @mf.kernel
    def last(x: "T[R, K]", y: "T[R]"):
        s = mf.sum(mf.index("K"), axis="K")
        n = mf.size("K")
        return y + mf.take(x, axis="K", index=mf.where(s > 0, n - 1, n - 1))
    assert _proven(last) == [False]


def test_derived_dims_relate_axes():
    """x: [R, F*2] gathered at 2 * mf.index("F") + 1 (pairs). A runtime scalar clamped to
    [0, size - 1] is in range only where the axis is not empty: along E, which no position of
    the index says is non-empty, size(E) may be 0 and clamp(s, 0, -1) is -1."""
    @mf.kernel
    def pairs(x: "T[R, F*2]", y: "T[R, F]"):
        return y + mf.take(x, axis="F*2", index=mf.index("F") * 2 + 1)

    @mf.kernel
    def at(x: "T[R, E]", s: int):
        return mf.take(x, axis="E", index=mf.clamp(s, 0, mf.size("E") - 1))

    @mf.kernel
    def at_f(x: "T[R, F, E]", y: "T[R, F]", s: int):    # mf.index("F"): F >= 1
        return mf.take(x, axis="F", index=mf.clamp(s + mf.index("F") * 0, 0, mf.size("F") - 1))

    @mf.kernel
    def unclamped(x: "T[R, F, E]", y: "T[R, F]", s: int):
        return mf.take(x, axis="F", index=mf.minimum(s + mf.index("F") * 0, mf.size("F") - 1))
    assert _proven(pairs) == [True]
    assert _proven(at) == [False]
    assert _proven(at_f) == [True]
    assert _proven(unclamped) == [False]        # s may be negative


# random index expressions: wherever the analysis proves one in range, torch (the kernel's
# reference) evaluates it in range for every size of E from 1 to 9 (even sizes along E/2)
_LEAF = st.sampled_from(["i", "n", "h", "0", "1", "2", "3", "-1"])
_BIN = ["+", "-", "*c", "//c", "%c", "%n", "//n", "%h", "min", "max", "^c", "&c", "where<",
        "where>="]


def _tree(depth: int):
    if depth == 0:
        return _LEAF
    sub = _tree(depth - 1)
    return st.one_of(_LEAF, st.tuples(st.sampled_from(_BIN), sub, sub, sub, sub,
                                      st.integers(1, 4)))


def _build(t, i, n):
    if isinstance(t, str):
        return {"i": i, "n": n, "h": n // 2}.get(t, int(t) if t not in "inh" else None)
    op, a, b, c, d, k = t
    x, y = _build(a, i, n), _build(b, i, n)
    if op in ("+", "-"):
        return x + y if op == "+" else x - y
    if op == "*c":
        return x * k
    if op in ("//c", "%c", "^c", "&c"):
        return {"//c": lambda: x // k, "%c": lambda: x % k, "^c": lambda: x ^ k,
                "&c": lambda: x & k}[op]()
    if op in ("%n", "//n", "%h"):
        return x % n if op == "%n" else x // n if op == "//n" else x % (n // 2)
    if op in ("min", "max"):
        return (mf.minimum if op == "min" else mf.maximum)(x, y)
    cond = x < y if op == "where<" else x >= y
    return mf.where(cond, _build(c, i, n), _build(d, i, n))


def _as_index(t, wrap, i, n):
    """The expression, bare or guarded the ways users keep an index in range (a where on
    its own value, a clamp, a modulo), so that some random expressions are proven."""
    v = _build(t, i, n)
    v = v if not isinstance(v, int) else mf.size("E") * 0 + v
    if wrap == "where":
        return mf.where((v >= 0) & (v < n // 2), v, i // 2)
    if wrap == "clamp":
        return mf.clamp(v, 0, n // 2 - 1)
    return v % (n // 2) if wrap == "mod" else v


@settings(max_examples=150, deadline=None)
@given(_tree(3), st.sampled_from(["bare", "where", "clamp", "mod"]), st.booleans())
def test_what_is_proven_is_in_range_for_every_size(t, wrap, half):
    k = (_along_half if half else _along_e)(lambda i, n: _as_index(t, wrap, i, n))
    if not all(_proven(k)):
        return
    for e in range(2 if half else 1, 10, 2 if half else 1):
        args = (torch.zeros(1, e),) + ((torch.zeros(1, e // 2),) if half else ())
        try:
            k.reference(*args)      # raises GatherIndexError on an index out of range
        except RuntimeError as e:   # torch evaluates every branch: a discarded one (or a
            if "ZeroDivisionError" not in str(e):    # condition) may divide by 0
                raise


# --------------------------------------------------------------------------- the kernels

def _rope_args(e=6, dtype=torch.float32):
    g = torch.Generator().manual_seed(e)
    return (torch.randn(2, 3, 5, e, generator=g).to(dtype),
            torch.randint(0, 32, (2, 5), generator=g, dtype=torch.int32))


def test_proven_rope_has_no_check_no_report_and_no_read_back(monkeypatch):
    """The MSL has no check and no report argument; the call (full path, then the warm
    replay) neither allocates a report nor reads one, and still matches torch, odd E too."""
    x, pos = _rope_args(6)
    src = rope.source(x, pos)
    assert "mf_err" not in src and "mf_take" not in src
    s = runtime.schedule_of(rope.graph(x, pos), {"x": x, "pos": pos})
    assert not any(p.binds == ("error",) for p in s.kernel.params)

    def no_read(*args, **kwargs):
        raise AssertionError("a proven gather's call touched an index report")
    for name in ("buffer", "check"):
        monkeypatch.setattr(indexcheck.IndexErrors, name, no_read)
    monkeypatch.setattr(indexcheck.DeferredReports, "check", no_read)
    monkeypatch.setattr(indexcheck.DeferredReports, "bind", no_read)
    for e in (6, 7):                # 7: odd head dim, the partner index is still in range
        x, pos = _rope_args(e)
        for _ in range(2):          # checked, then the warm replay
            got = rope(x, pos)
        if e % 2 == 0:
            torch.testing.assert_close(got, torch_rope(x, pos), rtol=1e-5, atol=2e-3)


def _paged(dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 16, generator=gen).to(dtype)
    k_cache, v_cache = (torch.randn(160, 2, 16, generator=gen).to(dtype) for _ in range(2))
    table = torch.randperm(10, generator=gen)[:6].reshape(2, 3).to(torch.int32)
    return q, k_cache, v_cache, table, torch.tensor([40, 5], dtype=torch.int32)


def test_paged_attention_checks_its_block_table_at_the_call_or_deferred():
    """The block table is a tensor: unproven, so the kernel keeps its check. Checked (the
    default): the call raises. Deferred: the call returns, and mf.check_deferred raises with
    the same words; a checked call of another kernel is a synchronisation point too."""
    args = list(_paged())
    good = paged_attention(*args, 0.125)
    want = torch_paged_attention(*(a.double() if a.is_floating_point() else a for a in args),
                                 0.125).float()
    torch.testing.assert_close(good, want, rtol=1e-4, atol=1e-5)
    args[3] = args[3].clone()
    args[3][1, 2] = 10                                  # one block past the cache
    msg = r"'[kv]_cache' along 'N' \(size 160.*index 1[67]\d "
    with pytest.raises(mf.GatherIndexError, match=msg):
        paged_attention(*args, 0.125)
    deferred = paged_attention.with_launch(index_check="deferred")
    indexcheck.DEFERRED.check()                        # nothing pending from other tests
    for _ in range(2):                                 # full path, then the warm replay
        deferred(*args, 0.125)                         # no read-back: no error here
    with pytest.raises(mf.GatherIndexError, match=msg + r".*deferred index check"):
        mf.check_deferred()
    mf.check_deferred()                                # reported once, then clean
    deferred(*args, 0.125)
    table = torch.randint(0, 2, (1, 3), dtype=torch.int32)
    cache = torch.randn(2, 4, 1, 8)
    with pytest.raises(mf.GatherIndexError, match=msg):    # the next checked call
        paged_gather(cache, table)
    torch.testing.assert_close(paged_gather(cache, table), cache[table.long()])
    deferred(*args, 0.125)
    with pytest.raises(mf.GatherIndexError, match=msg):
        mf.synchronize()


def test_index_check_option_is_validated():
    with pytest.raises(mf.LaunchError, match="index_check must be one of 'checked', "
                                             "'deferred', got 'off'"):
        paged_gather.with_launch(index_check="off")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_deferred_check_inside_a_cuda_graph():
    """Captured: the persistent report is bound without a fill kernel, nothing is read; a
    replay that reads out of range is reported at mf.synchronize."""
    cache = torch.randn(64, 16, 2, 64, device="cuda")
    table = torch.randint(0, 64, (3, 5), dtype=torch.int32, device="cuda")
    deferred = paged_gather.with_launch(index_check="deferred")
    g, s = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        deferred(cache, table)                          # warm-up: makes the report
        with torch.cuda.graph(g, stream=s):
            out = deferred(cache, table)
    torch.cuda.current_stream().wait_stream(s)
    g.replay()
    mf.synchronize()
    torch.testing.assert_close(out, cache[table.long()])
    table[2, 4] = 64
    g.replay()
    with pytest.raises(mf.GatherIndexError, match="index 64 "):
        mf.synchronize()
    table[2, 4] = 0
    g.replay()
    mf.synchronize()                                    # clean again


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_proven_and_deferred_calls_copy_nothing_to_the_host():
    """Profiled on CUDA: a proven RoPE call and a deferred paged gather neither copy to the
    host nor read a scalar back; a checked paged gather does (so the test can fail)."""
    x = torch.randn(1, 32, 1, 128, dtype=torch.float16, device="cuda")
    pos = torch.zeros(1, 1, dtype=torch.int32, device="cuda")
    cache = torch.randn(64, 16, 2, 64, dtype=torch.float16, device="cuda")
    table = torch.randint(0, 64, (3, 5), dtype=torch.int32, device="cuda")
    deferred = paged_gather.with_launch(index_check="deferred")

    def read_backs(fn) -> list[str]:
        fn()                                        # compiled, warm
        torch.cuda.synchronize()
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=acts) as prof:
            fn()
        torch.cuda.synchronize()
        return [e.name for e in prof.events()
                if "DtoH" in e.name or "_local_scalar_dense" in e.name]
    assert read_backs(lambda: rope(x, pos)) == []
    assert read_backs(lambda: deferred(cache, table)) == []
    assert read_backs(lambda: paged_gather(cache, table))      # checked: reads its report
    mf.synchronize()


def test_a_kernel_checks_only_its_unproven_gathers():
    """A reversal (proven, no check) beside ids from a tensor (checked, reported by its own
    number and words); the result still matches torch."""
    @mf.kernel
    def mixed(x: "T[R, E]", ids: "i32[R, E]"):
        i = mf.index("E")
        return mf.take(x, axis="E", index=mf.size("E") - 1 - i) + mf.take(x, axis="E", index=ids)
    src = mixed.source(T="f32")
    assert src.count("index proven in range") and "report it (gather 1, from 'x')" in src
    assert "report it (gather 0" not in src
    x = torch.randn(3, 5)
    ids = torch.randint(0, 5, (3, 5), dtype=torch.int32)
    torch.testing.assert_close(mixed(x, ids), x.flip(1) + x.gather(1, ids.long()))
    ids[2, 4] = 5
    with pytest.raises(mf.GatherIndexError, match=r"along 'E' \(size 5.*index 5 "):
        mixed(x, ids)
