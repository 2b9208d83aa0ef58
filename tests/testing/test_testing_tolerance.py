"""The tolerance policy and the comparison that reports a breach (plain torch, no kernels)."""
import math

import pytest
import torch

from metalforge.testing.tolerance import BASE, compare, lowest_precision, magnitude, tolerance


def test_base_tolerances_follow_the_design_table():
    assert tolerance("f32").rtol == pytest.approx(1e-5)
    assert tolerance("f16").rtol == pytest.approx(1e-3)
    assert tolerance("bf16").rtol == pytest.approx(1e-2)
    assert tolerance("i32").exact and tolerance(None).exact


def test_tolerance_widens_with_reduction_length_only():
    short, long = tolerance("f32", reduction_length=32), tolerance("f32", reduction_length=4096)
    assert BASE["f32"] < short.rtol < long.rtol
    # the accumulation term is f32's: the same absolute widening for f16 and f32
    widen16 = tolerance("f16", reduction_length=4096).rtol - BASE["f16"]
    widen32 = long.rtol - BASE["f32"]
    assert widen16 == pytest.approx(widen32)


def test_atol_is_relative_to_the_problem_scale():
    assert tolerance("f32", scale=1e6).atol == pytest.approx(1e6 * tolerance("f32").rtol)
    tiny = tolerance("f32", scale=0.0)
    assert 0 < tiny.atol < 1e-40            # floor: the dtype's smallest normal times rtol


def test_one_ulp_of_the_storage_type_passes_two_do_not():
    for dt in (torch.float16, torch.bfloat16):
        e = torch.tensor([1.0, 1.5, 3.0, 1000.0], dtype=dt)
        up1 = torch.nextafter(e, torch.full_like(e, math.inf))
        up2 = torch.nextafter(up1, torch.full_like(e, math.inf))
        tol = tolerance(dt, scale=0.0)
        assert compare(up1, e, tol) is None
        assert compare(up2, e, tol) is not None


def test_nan_and_inf_must_match_like_torch():
    tol = tolerance("f32")
    e = torch.tensor([math.nan, math.inf, -math.inf, 1.0])
    assert compare(e.clone(), e, tol) is None
    b = compare(torch.tensor([1.0, math.inf, -math.inf, 1.0]), e, tol)
    assert b.kind == "nan" and b.index == (0,)
    b = compare(torch.tensor([math.nan, -math.inf, -math.inf, 1.0]), e, tol)
    assert b.kind == "inf" and b.index == (1,)
    b = compare(torch.tensor([math.nan, math.inf, -math.inf, math.nan]), e, tol)
    assert b.kind == "nan" and b.index == (3,)


def test_breach_names_worst_element_index_and_tolerance():
    e = torch.zeros(3, 4)
    g = e.clone()
    g[1, 2] = 0.5
    g[2, 3] = 0.25
    b = compare(g, e, tolerance("f32"))
    assert b.index == (1, 2) and b.got == 0.5 and b.expected == 0.0
    assert b.mismatched == 2 and b.total == 12
    assert "[1, 2]" in b.message and "2 of 12" in b.message and "rtol=" in b.message


def test_integer_outputs_compare_exactly_and_shapes_dtypes_first():
    e = torch.arange(6, dtype=torch.int32)
    g = e.clone()
    g[4] += 1
    b = compare(g, e, tolerance("f32"))
    assert b.index == (4,) and "exact" in b.message
    assert compare(e.to(torch.int64), e, tolerance(None)).kind == "dtype"
    assert compare(e[:5], e, tolerance(None)).kind == "shape"
    assert compare(torch.empty(0, 3), torch.empty(0, 3), tolerance("f32")) is None


def test_lowest_precision_and_magnitude():
    assert lowest_precision(["f32", "i32", "f16"]) == "f16"
    assert lowest_precision([torch.float32, torch.bfloat16]) == "bf16"
    assert lowest_precision(["i8", "bool"]) is None
    m = magnitude([torch.tensor([1.0, -7.0, math.inf, math.nan]), 3.0, True,
                   torch.tensor([True])])
    assert m == 7.0
    assert magnitude([torch.tensor([-100], dtype=torch.int32), 2.0]) == 100.0   # ints count
    assert magnitude([torch.tensor([7], dtype=torch.uint32)]) == 7.0
    assert magnitude([torch.tensor([], dtype=torch.float16), -9]) == 9.0
