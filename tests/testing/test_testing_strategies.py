"""Hypothesis strategies for kernel inputs, on declared params and plain torch (no kernels)."""
import math

import pytest
import torch
from hypothesis import find, given, settings
from hypothesis import strategies as st

from metalforge import dtypes
from metalforge.graph import AxisSpec, ConstParam, ScalarParam, TensorParam
from metalforge.shapes import bind_shapes
from metalforge.testing.strategies import EDGE_SIZES, dim_plan, scalar, sizes
from metalforge.testing.tensors import LAYOUTS, families, layouts_for, make_values, materialise
from metalforge.testing.variants import const_values


def tparam(name, *dims, dtype=dtypes.F32):
    return TensorParam(name, dtype, "T", tuple(dims), f"T[{', '.join(d.name for d in dims)}]")


D, R, K = AxisSpec("D"), AxisSpec("R"), AxisSpec("K")
K8 = AxisSpec("K/8", base="K", div=8)
B = AxisSpec("B", batch=True)
PARAMS = (tparam("x", B, R, D), tparam("w", D), tparam("q", R, K8), tparam("s", K))


class _Graph:      # the part of a Graph bind_shapes reads: a plain stand-in, no tracing
    name, loc = "probe", None

    def __init__(self, params):
        self.tensors = params


@settings(max_examples=60, deadline=None, database=None)
@given(st.data())
def test_drawn_sizes_bind_consistently_across_params(data):
    plan = dim_plan(PARAMS)
    drawn = data.draw(sizes(plan, max_elements=1 << 16, reduced=frozenset({"D"})))
    assert drawn.sizes["K"] % 8 == 0 and drawn.sizes["K/8"] == drawn.sizes["K"] // 8
    assert 0 <= len(drawn.batch["B"]) <= 3
    assert drawn.sizes["D"] >= 1                     # reduced dims are never empty
    assert math.prod(max(drawn.sizes[a], 1) for a in ("R", "D", "K", "B")) <= 1 << 16
    tensors = {p.name: torch.empty(drawn.shape(p)) for p in PARAMS}
    binding = bind_shapes(_Graph(PARAMS), tensors)   # the real shape checker accepts them
    for axis in ("R", "D", "K", "K/8", "B"):
        assert binding.sizes[axis] == drawn.sizes[axis]


@settings(max_examples=200, deadline=None, database=None)
@given(st.data())
def test_sizes_reach_the_edge_sizes(data):
    drawn = data.draw(sizes(dim_plan([tparam("x", D)]), max_elements=1 << 20))
    assert drawn.sizes["D"] in set(range(0, 9)) | set(EDGE_SIZES) | {8191, 8193, 16383, 16385,
                                                                      32769, 65535, 65537,
                                                                      262145}


def test_edge_and_large_sizes_are_all_reachable():
    seen = set()

    @settings(max_examples=400, deadline=None, database=None)
    @given(sizes(dim_plan([tparam("x", D)]), max_elements=1 << 17))
    def probe(s):
        seen.add(s.sizes["D"])

    probe()
    assert {1, 31, 32, 33} <= seen or len(seen & {31, 32, 33, 63, 65, 4097}) >= 2
    assert 0 in seen and max(seen) > 8192 and max(seen) <= 1 << 17


@settings(max_examples=40, deadline=None, database=None)
@given(st.data())
def test_pinned_dims_are_respected(data):
    plan = dim_plan(PARAMS)
    drawn = data.draw(sizes(plan, pinned={"D": 4096, "R": range(2, 5), "K": [16, 64],
                                          "B": [(2, 3), ()]}))
    assert drawn.sizes["D"] == 4096 and 2 <= drawn.sizes["R"] < 5
    assert drawn.sizes["K"] in (16, 64) and drawn.batch["B"] in ((2, 3), ())


@settings(max_examples=60, deadline=None, database=None)
@given(st.data())
def test_free_dims_leave_room_for_dims_pinned_after_them(data):
    # R and D are drawn before K is pinned: they take what of the budget the pin leaves (the
    # wide elementwise kernel's pinned element count had met free dims drawn as if K were 8:
    # a 34 GB example on a GPU, where check lifts the simulator's thread budget)
    plan = dim_plan(PARAMS)
    drawn = data.draw(sizes(plan, pinned={"K": [1 << 12, 1 << 13], "B": ()},
                            max_elements=1 << 16))
    assert math.prod(max(drawn.sizes[a], 1) for a in ("R", "D", "K")) <= 1 << 16


def one(strategy):
    """One value drawn from ``strategy`` (the simplest one hypothesis finds)."""
    return find(strategy, lambda _: True, settings=settings(database=None))


def some(strategy, n=40):
    out = []

    @settings(max_examples=n, deadline=None, database=None)
    @given(strategy)
    def collect(v):
        out.append(v)

    collect()
    return out


def test_pinning_errors_name_the_dim():
    plan = dim_plan(PARAMS)
    with pytest.raises(ValueError, match="no dim 'N'.*B"):
        one(sizes(plan, pinned={"N": 3}))
    with pytest.raises(ValueError, match="'K/8' is derived from 'K'"):
        one(sizes(plan, pinned={"K/8": 3}))
    with pytest.raises(ValueError, match="multiple of 8"):
        one(sizes(plan, pinned={"K": 12}))


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_float_families_have_their_advertised_values(dt):
    dtype = dtypes.ALL[dt]
    finfo = torch.finfo(dtype.torch)
    shape = (64, 33)
    assert families(dtype) == ("normal", "shifted", "mixed", "large", "tiny", "zeros",
                               "special")
    assert families(dtype, nonfinite=False, large=False) == ("normal", "shifted", "mixed",
                                                             "tiny", "zeros")
    signs = set()
    for seed in range(8):
        shifted = make_values(dtype, shape, "shifted", seed).double()
        assert 1 < abs(float(shifted.mean())) < 101 and torch.isfinite(shifted).all()
        signs.add(bool(shifted.mean() > 0))
    assert signs == {True, False}
    normal = make_values(dtype, shape, "normal", 1)
    assert normal.dtype == dtype.torch and normal.shape == shape
    assert 0.5 < float(normal.float().std()) < 1.5 and torch.isfinite(normal).all()
    large = make_values(dtype, shape, "large", 1).float().abs()
    assert (large >= 99).all() and torch.isfinite(large).all()
    tiny = make_values(dtype, shape, "tiny", 1).float().abs()
    assert (tiny >= finfo.tiny).all() and (tiny <= finfo.tiny * 2 ** 12).all()
    assert (make_values(dtype, shape, "zeros", 1) == 0).all()
    special = make_values(dtype, shape, "special", 1)
    assert torch.isnan(special).any() and torch.isposinf(special).any()
    assert torch.isneginf(special).any()
    mixed = make_values(dtype, shape, "mixed", 1).float().abs()
    assert (mixed == 0).any() and (mixed > 99).any() and ((mixed < 1e-3) & (mixed > 0)).any()
    assert torch.equal(make_values(dtype, shape, "normal", 7), make_values(dtype, shape,
                                                                            "normal", 7))
    assert not torch.equal(make_values(dtype, shape, "normal", 7), normal)


@pytest.mark.parametrize("dt", ["i32", "u32", "i16", "u16", "i8", "u8"])
def test_int_families_stay_in_range(dt):
    dtype = dtypes.ALL[dt]
    small = make_values(dtype, (500,), "small", 3).to(torch.int64)
    wide = make_values(dtype, (500,), "wide", 3).to(torch.int64)
    bound = 2 ** (dtype.itemsize * 4 - 1)
    assert small.abs().max() <= 6 and wide.abs().max() <= bound
    assert (wide.abs() ** 2 <= torch.iinfo(dtype.torch).max).all()   # products do not overflow
    if dtype.kind == "uint":
        assert (small >= 0).all() and (wide >= 0).all()
    else:
        assert (small < 0).any() and (wide < 0).any()
    assert (make_values(dtype, (500,), "small", 3, zeros=False) != 0).all()
    assert (make_values(dtype, (500,), "small", 3, negative=False).to(torch.int64) >= 0).all()


def test_value_ranges_and_bools():
    v = make_values(dtypes.F32, (1000,), "normal", 0, value_range=(2.0, 3.0))
    assert (v >= 2).all() and (v <= 3).all()
    b = make_values(dtypes.BOOL, (1000,), "random", 0)
    assert b.dtype == torch.bool and b.any() and not b.all()
    with pytest.raises(ValueError, match="unknown value family 'huge'"):
        make_values(dtypes.F32, (3,), "huge", 0)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layouts_keep_values_and_change_memory(layout):
    values = torch.randn(5, 7)
    t = materialise(values, layout)
    assert t.shape == values.shape
    if layout == "expanded":
        assert 0 in t.stride() and torch.equal(t, values[:1].expand(5, 7))
        return
    assert torch.equal(t, values)
    if layout == "contiguous":
        assert t.is_contiguous()
    else:
        assert not t.is_contiguous() or t.storage_offset() > 0
    if layout in ("strided", "offset"):      # storage around the elements is poisoned
        assert torch.isnan(torch.as_strided(t, (t.untyped_storage().nbytes() // 4,), (1,),
                                            0)).any()


def test_layouts_for_small_shapes():
    assert layouts_for((0, 3)) == ("contiguous",)
    assert "transposed" not in layouts_for((8,)) and "expanded" not in layouts_for((1, 1))
    assert set(layouts_for((2, 3))) == set(LAYOUTS)


def test_scalars_and_consts():
    eps = ScalarParam("eps", float, dtypes.F32, 1e-6, True)
    vals = some(scalar(eps), 50)
    assert all(isinstance(v, float) and float(torch.tensor(v, dtype=torch.float32)) == v
               for v in vals)
    assert min(some(scalar(eps, (1.0, 2.0)))) >= 1.0 and set(some(scalar(eps, 0.5))) == {0.5}
    flag = ScalarParam("flag", bool, dtypes.BOOL, None, False)
    assert set(some(scalar(flag))) == {False, True}
    causal = ConstParam("causal", bool, True, True)
    gs = ConstParam("GS", int, 64, True)
    assert const_values(causal) == [True, False] and const_values(gs) == [64]
    assert const_values(gs, [32, 64]) == [32, 64]
    with pytest.raises(TypeError, match="Const\\[int\\] values must be int"):
        const_values(gs, [True])
