"""One-launch column reductions (launch={"one_launch": True}, schedule/column_ticket.py): the
last threadgroup of each column block merges the chunks' partials, so a chunked call is one
launch. Run on the simulator (threadgroups on several OS threads, real atomics and fences,
threadgroup-memory races detected) against torch computed directly, and bit for bit against
the two-launch (combine) merge."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import metalforge as mf
from metalforge import runtime
from metalforge.runtime.counters import COUNTERS
from metalforge.shapes import bind_shapes

from ..cuda_host import assert_host_syntax

NAN, INF = math.nan, math.inf


def _stats(x):
    m = mf.max(x, axis="R")
    return (mf.sum(x, axis="R"), m, mf.argmax(x, axis="R"),
            m + mf.log(mf.sum(mf.exp(x - m), axis="R")))          # with an online pair


# chunk_rows 16: chunks of whole steps of the group (8 slices x 4 rows = 32 rows) at small sizes
@mf.kernel(name="col_ticket", launch={"chunk_rows": 16, "one_launch": True})
def one(x: "T[R, D]"):
    return _stats(x)


@mf.kernel(name="col_ticket", launch={"chunk_rows": 16})
def two(x: "T[R, D]"):
    return _stats(x)


def plan(kernel, x):
    """(variant, chunks, launches, counter words) of the call kernel(x)."""
    g = kernel.graph(x)
    s = runtime.schedule_of(g, {"x": x}, launch=kernel.launch)
    sizes = bind_shapes(g, {"x": x}).sizes
    return s.variant(sizes), s.chunks(sizes), len(s.steps(sizes)), s.counter_words(sizes)


def same(a, b):
    assert torch.equal(a.nan_to_num(), b.nan_to_num()) and torch.equal(a.isnan(), b.isnan())


def against_torch(got, x):
    s, mx, amax, lse = got
    xd = x.double()
    nan = x.isnan().any(0)
    assert torch.equal(mx.isnan(), nan) and torch.equal(mx[~nan], x.amax(0)[~nan])
    assert torch.equal(amax, x.argmax(0))
    tol = dict(rtol=1e-5, atol=1e-5 * max(1, x.shape[0] / 10), equal_nan=True)
    torch.testing.assert_close(s, xd.sum(0).float(), **tol)
    m = xd.amax(0)                                   # the kernel's formula (inf - inf: NaN)
    torch.testing.assert_close(lse, (m + (xd - m).exp().sum(0).log()).float(), **tol)


def words_zero(x):
    """Every counter word the calls on x's device may have used is back at zero."""
    for key, buf in COUNTERS._buffers.items():
        if key[0] == str(x.device):
            assert not buf.any(), key


@pytest.mark.parametrize("d", (7, 8, 33, 65), ids=("split", "wide", "split2", "wide2"))
def test_one_launch_merges_like_the_combine_launch(d):
    """Reduced lengths at the chunking's boundaries (one chunk; a partial last chunk of one
    row; 41 chunks: the merge's whole steps of 4 chunks, then single ones), column blocks
    with one live column (33: split; 65: wide, whose block of 64 columns is merged 32 at a
    time): torch's values, argmax's first index across chunks, NaN propagation, and the same
    bits as the two-launch merge and as a second call; one launch; the counters back at 0."""
    seen = set()
    for r in (32, 33, 41 * 32 - 5):
        x = torch.randn(r, d, generator=torch.Generator().manual_seed(r))
        x[[r // 3, r - 1], 1] = 4.0                  # argmax tied across chunks: the first
        x[r - 1, min(2, d - 1)] = NAN                # NaN in the partial last chunk
        if d > 4:
            x[[3, r // 2], 4] = torch.tensor([INF, -INF])
        got = one(x)
        variant, chunks, launches, words = plan(one, x)
        seen.add((variant, chunks > 1))
        assert launches == 1 and words == (-(-d // (32 * (2 if variant == "wide" else 1)))
                                           if chunks > 1 else words)
        assert plan(two, x)[2] == (2 if chunks > 1 else 1)
        against_torch(got, x)
        assert int(got[2][1]) == r // 3
        for a, b, c in zip(got, two(x), one(x)):
            same(a, b)
            same(a, c)
        words_zero(x)
    assert {v for v, _ in seen} == {"wide" if d % 2 == 0 else "split"} and (True in
                                                                           {c for _, c in seen})


@settings(max_examples=12, deadline=None, derandomize=True)
@given(r=st.sampled_from([17, 31, 32, 33, 63, 64, 65, 97, 160, 161]),
       d=st.sampled_from([1, 2, 3, 31, 32, 34, 63, 64, 66]))
def test_one_launch_shapes_at_the_chunk_and_block_boundaries(r, d):
    """Shapes around one / two / several chunks and around whole column blocks (32 columns,
    64 for the wide kernel): the one-launch call equals the two-launch one bit for bit (f32:
    the f16 kernels differ only in the wide kernel's 4 columns a thread, not compiled here)."""
    x = torch.randn(r, d)
    for a, b in zip(one(x), two(x)):
        same(a, b)
    words_zero(x)


def test_counters_are_kept_zeroed_and_shared_per_stream():
    """The runtime's counter buffer: made zeroed, grown (zeroed) where a call needs more words,
    one per device and stream; clear_caches drops it."""
    COUNTERS.clear()
    a = COUNTERS.words(torch.device("cpu"), 3)
    assert a.dtype == torch.int32 and a.numel() >= 3 and not a.any()
    assert COUNTERS.words(torch.device("cpu"), 3) is a
    b = COUNTERS.words(torch.device("cpu"), a.numel() + 1)
    assert b.numel() > a.numel() and not b.any()
    runtime.clear_caches()
    assert COUNTERS._buffers == {}


def test_one_launch_msl_and_its_cuda_translation(tmp_path):
    """The generated kernel stores and reads partials through coherent(device) memory, fences
    at device scope before and after the ticket, and puts the word back; the cuda translation
    passes the host syntax check; the combine kernel is not built, and options are checked."""
    from metalforge.cuda import translate
    src = one.source(T="f16")
    assert "kernel void mf_col_ticket_combine" not in src
    for piece in ("mf_coherent_store(mf_scratch", "mf_coherent_load(mf_scratch",
                  "mf_tk[0u] = mf_ticket(mf_counter + mf_block)", "mf_device_fence();",
                  "mf_ticket_reset(mf_counter + mf_block)", "thread_scope_device",
                  "coherent(device) device float*"):
        assert piece in src, piece
    assert "mf_coherent" not in two.source(T="f16")
    assert_host_syntax(translate(src).text, tmp_path)
    with pytest.raises(mf.LaunchError, match="one_launch must be True or False"):
        one.with_launch(one_launch=1)(torch.randn(40, 3))
