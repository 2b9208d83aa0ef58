"""Gathers served from registers: a take along the axis a thread already holds in registers
reads its own slot (`i ^ c` inside its aligned block) or another lane's (simd shuffles, when one
simdgroup holds the row) instead of loading the element a second time. Checked three ways: the
graph questions (`schedule.gather`), the generated kernels' loads, and results through the
simulator against torch over row lengths that hit every path (one element, partial vectors,
rows ending mid-lane, rows longer than a simdgroup holds)."""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import metalforge as mf
from metalforge import ir, runtime
from metalforge.graph import take_sites
from metalforge.schedule import gather

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from embedding import embed  # noqa: E402
from paged_kv_gather import paged_gather  # noqa: E402
from rope import qk_norm_rope, rope, rope_interleaved, torch_rope, torch_rope_interleaved  # noqa: E402

SIMD_ROW = 32 * 4          # the longest row the simd variant holds (4 elements per lane)


# -- kernels: gathers along a reduced row, each with an index of another kind -------------------

@mf.kernel                                  # a rotation by `shift`, written as RoPE writes it
def rotate_norm(x: "T[R, D]", shift: int):
    i, n = mf.index("D"), mf.size("D")
    j = mf.where(i < n - shift, i + shift, i + shift - n)
    return (mf.take(x, axis="D", index=j) * mf.rsqrt(mf.mean(x * x, axis="D") + 1e-6)).to("T")


@mf.kernel                                  # a reversal, of a float and of an integer tensor
def reverse_scaled(x: "T[R, D]", m: "i32[R, D]"):
    j = mf.size("D") - 1 - mf.index("D")
    s = mf.sum(x, axis="D")
    return (x + m + mf.take(x, axis="D", index=j) * s + mf.take(m, axis="D", index=j)).to("T")


@mf.kernel                                  # pairs (2j, 2j + 1) swapped: the thread's own slots
def swap_pairs_norm(x: "T[R, D]"):
    partner = mf.take(x, axis="D", index=mf.index("D") ^ 1)
    return (x * mf.max(x, axis="D") + partner).to("T")


@mf.kernel                                  # elementwise: xor with a constant
def xor_lanes(x: "T[N, E]", c: mf.Const[int] = 1):
    return x * 2 + mf.take(x, axis="E", index=mf.index("E") ^ c)


def _ref_rotate_norm(x, shift):
    xd = x.double()
    inv = torch.rsqrt((xd * xd).mean(-1, keepdim=True) + 1e-6)
    return (torch.roll(xd, -shift, dims=-1) * inv).to(x.dtype)


def _ref_reverse_scaled(x, m):
    xd, md = x.double(), m.double()
    return (xd + md + xd.flip(-1) * xd.sum(-1, keepdim=True) + md.flip(-1)).to(x.dtype)


def _ref_swap_pairs_norm(x):
    xd = x.double()
    return (xd * xd.amax(-1, keepdim=True) + xd.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
            ).to(x.dtype)


TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float16: dict(rtol=2e-3, atol=2e-3)}

# -- the graph questions -------------------------------------------------------------------------


def _take(kernel, *args, **kw):
    g = kernel.graph(*args, **kw)
    return g, take_sites(g)


def test_xor_masks_and_blocks():
    x = torch.randn(2, 8)
    _, (t,) = _take(swap_pairs_norm, x)
    assert gather.xor_mask(t) == 1
    assert [gather.own_slot(t, b) for b in (1, 2, 4, 8, 6)] == [None, 1, 1, 1, 1]
    _, (t,) = _take(xor_lanes, x, c=5)
    assert gather.xor_mask(t) == 5                       # 5 < 8: blocks of 8, 16, ...
    assert [gather.own_slot(t, b) for b in (4, 8, 16, 12)] == [None, 5, 5, None]
    _, (t,) = _take(rotate_norm, x, 1)
    assert gather.xor_mask(t) is None and gather.own_slot(t, 4) is None


def test_lane_computable_indices():
    x, m = torch.randn(2, 8), torch.zeros(2, 8, dtype=torch.int32)
    _, takes = _take(reverse_scaled, x, m)
    assert all(gather.lane_computable(t, "D") for t in takes)
    _, (t,) = _take(rotate_norm, x, 3)                   # runtime scalars and sizes: fine
    assert gather.lane_computable(t, "D")

    @mf.kernel
    def by_tensor(x: "T[R, D]", ids: "i32[R, D]"):
        return mf.take(x, axis="D", index=ids) * mf.sum(x, axis="D")
    _, (t,) = _take(by_tensor, x, m)
    assert not gather.lane_computable(t, "D")            # an element of a tensor: a load

    @mf.kernel
    def by_row_value(x: "T[R, D]", ids: "i32[R]"):       # a per-row index: every lane knows it
        return mf.take(x, axis="D", index=ids + mf.index("D") * 0) * mf.sum(x, axis="D")
    _, (t,) = _take(by_row_value, x, torch.zeros(2, dtype=torch.int32))
    assert gather.lane_computable(t, "D")


# -- the generated kernels -----------------------------------------------------------------------

def _loads(stmts, buffer):
    """Every load of `buffer` in these statements (vector and scalar)."""
    out = []

    def walk(v):
        if isinstance(v, ir.Load) and v.buffer == buffer:
            out.append(v)
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            for f in dataclasses.fields(v):
                walk(getattr(v, f.name))
        elif isinstance(v, (list, tuple)):
            for e in v:
                walk(e)
    walk(stmts)
    return out


def _gathered(stmts, buffer):
    """The loads of `buffer` at a gather index: a checked one (mf_take<n>), or one proven in
    range (addressed from the element's positions: neither the element's own offset, a plain
    variable, nor from the row's start mf_row_<buffer>)."""
    return [ld for ld in _loads(stmts, buffer)
            if "mf_take" in repr(ld.index) or not (type(ld.index).__name__ == "Var"
                                                    or f"mf_row_{buffer}" in repr(ld.index))]


def _schedule(kernel, *args, **consts):
    g = kernel.graph(*args, **consts)
    names = [p.name for p in g.tensors]
    return runtime.schedule_of(g, dict(zip(names, args)))


def _qk_args(e, dtype=torch.float32):
    return (torch.randn(1, 2, 3, e, dtype=dtype), torch.randn(e, dtype=dtype),
            torch.zeros(1, 3, dtype=torch.int32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_qk_norm_rope_reads_each_row_once_in_the_simd_variant(dtype):
    s = _schedule(qk_norm_rope, *_qk_args(64, dtype))
    simd, exact, group, looped = (s.variants[v].body
                                  for v in ("simd", "simd_exact", "group", "looped"))
    full = 16 // dtype.itemsize
    for t in ("x", "w"):
        # the register load (vector path, scalar tail): nothing else reads the tensor
        assert [ld.width for ld in _loads(simd, t)] == [full, 1], t
        assert [ld.width for ld in _loads(exact, t)] == [full], t       # whole vectors only
        # a threadgroup-held or streamed row: the partner is a (cached) guarded load, in
        # both element loops (all elements in the row; the row's end)
        assert len(_gathered(group, t)) == len(_gathered(looped, t)) == 2, t
    text = qk_norm_rope.source(T="f32")
    simd_text = text.split("kernel void mf_qk_norm_rope_simd")[1].split("kernel void")[0]
    assert "simd_shuffle(float(mf_reg_x[mf_k])" in simd_text
    assert "simd_all(mf_same_slot)" in simd_text
    # rows the lanes cover exactly: the same shuffles, over blocks kept contiguous
    exact_text = text.split("kernel void mf_qk_norm_rope_simd_exact")[1].split("kernel void")[0]
    assert "simd_all(mf_same_slot)" in exact_text and "mf_stride" not in exact_text


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_interleaved_rope_reads_the_partner_from_the_loaded_vector(dtype):
    x = torch.randn(1, 2, 3, 64, dtype=dtype)
    body = _schedule(rope_interleaved, x, torch.zeros(1, 3, dtype=torch.int32)).kernel.body
    vector_path = next(st for st in body if isinstance(st, ir.If)).then
    # one 16-byte load (the int32 positions, read once per chunk, do not narrow it)
    assert [ld.width for ld in _loads(vector_path, "x")] == [16 // x.element_size()]
    # the scalar tail keeps its element load and the guarded partner load
    assert len(_loads(body, "x")) == 3
    # rotate-half: the partner is half a row away, in another thread: a guarded load
    body = _schedule(rope, x, torch.zeros(1, 3, dtype=torch.int32)).kernel.body
    assert len(_loads(next(st for st in body if isinstance(st, ir.If)).then, "x")) == 2


def test_only_row_gathers_of_held_tensors_use_registers():
    """A gather along the row of a tensor the kernel never loads along it stays a load."""
    @mf.kernel
    def only_taken(x: "T[R, D]", y: "T[R, D]"):
        return mf.take(x, axis="D", index=mf.index("D") ^ 1) * mf.sum(y, axis="D")
    x = torch.randn(2, 8)
    s = _schedule(only_taken, x, x)
    simd = s.variants["simd"].body
    assert len(_loads(simd, "x")) == len(_gathered(simd, "x")) == 2     # in both element loops
    torch.testing.assert_close(only_taken(x, x + 1), x.unflatten(-1, (-1, 2)).flip(-1)
                               .flatten(-2) * (x + 1).sum(-1, keepdim=True))


# -- results through the simulator ---------------------------------------------------------------

LENGTHS = st.one_of(st.sampled_from([1, 2, 3, 4, 5, 31, 32, 33, 63, 64, 65, 127, 128, 129,
                                     SIMD_ROW + 4, 255, 260]), st.integers(1, 300))


@settings(max_examples=30, deadline=None)
@given(d=LENGTHS, rows=st.integers(1, 3), shift=st.integers(0, 300),
       dtype=st.sampled_from([torch.float32, torch.float16]))
def test_rotation_in_a_row_kernel_matches_torch_roll(d, rows, shift, dtype):
    shift %= d + 1                                      # 0..d: the where form stays in range
    x = torch.randn(rows, d).to(dtype)
    torch.testing.assert_close(rotate_norm(x, shift), _ref_rotate_norm(x, shift % d),
                               **TOL[dtype])


@settings(max_examples=20, deadline=None)
@given(d=LENGTHS, rows=st.integers(1, 3))
def test_reversal_of_float_and_int_rows_matches_torch_flip(d, rows):
    x = torch.randn(rows, d)
    m = torch.randint(-50, 50, (rows, d), dtype=torch.int32)
    torch.testing.assert_close(reverse_scaled(x, m), _ref_reverse_scaled(x, m),
                               rtol=1e-5, atol=1e-4)


@settings(max_examples=20, deadline=None)
@given(half=st.integers(1, 150), rows=st.integers(1, 3),
       dtype=st.sampled_from([torch.float32, torch.float16]))
def test_own_slot_pairs_in_a_row_kernel_match_torch(half, rows, dtype):
    x = torch.randn(rows, 2 * half).to(dtype)
    torch.testing.assert_close(swap_pairs_norm(x), _ref_swap_pairs_norm(x), **TOL[dtype])


@pytest.mark.parametrize("d", [1, 7, 32, 33, 100, 128, 200])
def test_index_from_a_per_row_tensor_is_shuffled(d):
    """Each row rotates by its own offset (a per-row value every lane of the row knows)."""
    @mf.kernel
    def rotate_rows(x: "T[R, D]", off: "i32[R]"):
        j = (mf.index("D") + off) % mf.size("D")
        return mf.take(x, axis="D", index=j) + mf.max(x, axis="D")
    x = torch.randn(5, d)
    off = torch.tensor([0, 1, 4, d - 1, 3 * d + 2], dtype=torch.int32)
    want = torch.stack([torch.roll(r, -int(o)) for r, o in zip(x, off)]) + x.amax(-1, True)
    torch.testing.assert_close(rotate_rows(x, off), want)
    if d <= SIMD_ROW:
        assert not _gathered(_schedule(rotate_rows, x, off).variants["simd"].body, "x")


@pytest.mark.parametrize("d", [1, 3, 33, 129])
def test_own_slot_index_past_an_odd_row_raises(d):
    """i ^ 1 of the last element of an odd row is the row length: reported, as a load would."""
    with pytest.raises(mf.GatherIndexError, match=rf"'x' along 'D' \(size {d}.*index {d} "):
        swap_pairs_norm(torch.randn(2, d))


@pytest.mark.parametrize("d", [1, 5, 33, 100])
def test_shuffled_index_out_of_range_raises_and_lanes_past_the_row_do_not(d):
    @mf.kernel
    def shifted(x: "T[R, D]"):
        return mf.take(x, axis="D", index=mf.index("D") + 1) * mf.sum(x, axis="D")
    with pytest.raises(mf.GatherIndexError, match=rf"index {d} is out of range"):
        shifted(torch.randn(2, d))
    # rotate_norm's lanes past the row end compute indices past it too; nothing is reported
    rotate_norm(torch.randn(2, d), d - 1)


def test_looped_rows_keep_the_load():
    x = torch.randn(1, 4100)
    torch.testing.assert_close(rotate_norm(x, 7), _ref_rotate_norm(x, 7), **TOL[torch.float32])
    torch.testing.assert_close(swap_pairs_norm(x), _ref_swap_pairs_norm(x), **TOL[torch.float32])


@settings(max_examples=20, deadline=None)
@given(half=st.integers(1, 70), heads=st.integers(1, 3),
       dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]))
def test_rope_register_paths_match_torch(half, heads, dtype):
    e = 2 * half
    g = torch.Generator().manual_seed(e)
    x = torch.randn(2, heads, 3, e, generator=g).to(dtype)
    w = torch.randn(e, generator=g).to(dtype)
    pos = torch.randint(0, 64, (2, 3), generator=g, dtype=torch.int32)
    tol = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.float16: dict(rtol=2e-3, atol=3e-3),
           torch.bfloat16: dict(rtol=2e-2, atol=3e-2)}[dtype]
    torch.testing.assert_close(rope_interleaved(x, pos), torch_rope_interleaved(x, pos), **tol)
    normed = torch.nn.functional.rms_norm(x.float(), (e,), w.float(), eps=1e-6).to(dtype)
    torch.testing.assert_close(qk_norm_rope(x, w, pos), torch_rope(normed, pos), **tol)


@pytest.mark.parametrize("c", [0, 1, 3, 5, 7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_elementwise_xor_gathers_match_torch(c, dtype):
    """f16 moves 8-element vectors (i ^ 5 and i ^ 7 stay in them), f32 4 (they load)."""
    x = torch.randn(3, 16).to(dtype)
    torch.testing.assert_close(xor_lanes(x, c=c), x * 2 + x[:, torch.arange(16) ^ c])
    in_vector = c < (8 if dtype == torch.float16 else 4)
    # gathered loads: the scalar tail's, and the vector path's unless it reads a lane
    assert len(_gathered(_schedule(xor_lanes, x, c=c).kernel.body, "x")) == 1 + (not in_vector)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_elementwise_xor_past_the_row_raises(dtype):
    """E = 12 is whole vectors of 4, not of 8: 11 ^ 5 = 14 is past the row in either path."""
    with pytest.raises(mf.GatherIndexError, match=r"'x' along 'E' \(size 12.*index 14 "):
        xor_lanes(torch.randn(2, 12).to(dtype), c=5)


def test_traffic_counts_only_gathers_that_load():
    from metalforge.shapes import bind_shapes

    def read(kernel, *args):
        g = kernel.graph(*args)
        values = dict(zip([p.name for p in g.tensors], args))
        s = runtime.schedule_of(g, values)
        return s.traffic(bind_shapes(g, values).sizes).read
    pos = torch.zeros(1, 3, dtype=torch.int32)
    for e in (64, 6):                       # whole vectors: lanes; 6: the scalar path loads
        x = torch.randn(1, 2, 3, e)
        assert read(rope_interleaved, x, pos) == x.nbytes * (1 if e == 64 else 2) + pos.nbytes
    for e, partners in ((64, 0), (512, 1)):       # simd variant: shuffles; group: loads
        x, w, p = _qk_args(e)
        gathered = partners * (x.nbytes + w.nbytes)      # x's and w's partners, once each
        assert read(qk_norm_rope, x, w, p) == x.nbytes + w.nbytes + p.nbytes + gathered


# -- row gathers: an outer-axis gather by an index that does not move along the row -------------


@mf.kernel                                  # a lookup plus a contiguous input, by a computed index
def embed_shifted(table: "T[V, D]", ids: "i32[N]", pos: "T[N, D]", shift: int):
    row = (ids + shift * mf.index("N")) % mf.size("V")
    return mf.take(table, axis="V", index=row) + pos


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_row_gathers_read_each_chunk_of_a_row_with_one_vector_load(dtype):
    """The vector path reads a chunk's elements of the gathered row with one 16-byte load and
    checks the index once a chunk (no per-element id load or check); the table is a vector
    input, so the runtime hands the kernel an aligned one."""
    width = 16 // torch.empty(0, dtype=dtype).element_size()
    table, ids = torch.randn(50, 64, dtype=dtype), torch.zeros(7, dtype=torch.int32)
    s = _schedule(embed, table, ids)
    vector_path = next(st for st in s.kernel.body if isinstance(st, ir.If)).then
    assert [ld.width for ld in _loads(vector_path, "table")] == [width]
    assert len(_loads(vector_path, "ids")) == 1
    assert "table" in s.vector_inputs
    cache = torch.randn(9, 4, 2, 16, dtype=dtype)
    s = _schedule(paged_gather, cache, torch.zeros(2, 3, dtype=torch.int32))
    vector_path = next(st for st in s.kernel.body if isinstance(st, ir.If)).then
    assert [ld.width for ld in _loads(vector_path, "cache")] == [width]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("v,d,n", [(50, 64, 7), (13, 24, 5), (40, 37, 3), (5, 8, 1)])
def test_row_gathers_match_torch(dtype, v, d, n):
    """Whole chunks (d a multiple of the width), rows of partial chunks (the scalar path), a
    computed index and a contiguous input beside the gather; a table view whose start is not
    aligned for vector loads; an id out of range in the middle of a chunk's row raises."""
    g = torch.Generator().manual_seed(v * d + n)
    table = torch.randn(v, d, generator=g).to(dtype)
    ids = torch.randint(0, v, (n,), generator=g, dtype=torch.int32)
    pos = torch.randn(n, d, generator=g).to(dtype)
    torch.testing.assert_close(embed(table, ids), table[ids.long()])
    rows = (ids.long() + 3 * torch.arange(n)) % v
    want = (table[rows].float() + pos.float()).to(dtype)
    torch.testing.assert_close(embed_shifted(table, ids, pos, 3), want, rtol=0, atol=0)
    flat = torch.randn(v * d + 1, generator=g).to(dtype)
    view = flat[1:].view(v, d)                      # starts 1 element past an aligned address
    torch.testing.assert_close(embed(view, ids), view[ids.long()])
    bad = ids.clone()
    bad[n // 2] = v
    with pytest.raises(mf.GatherIndexError, match=rf"index {v} is out of range"):
        embed(table, bad)
