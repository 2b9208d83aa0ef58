"""Planted faults: `check` must catch real bugs in generated MSL, with a readable report:
an off-by-one bound guard, a dropped fp32 upcast, a broadcast indexed by the wrong axis, a
missing threadgroup barrier, a wrong reduction identity, a read of threadgroup memory no
thread wrote, and attention's group-to-tile map and partial-state offsets.

Each fault is a textual edit of the generated MSL made through the runtime's test seam
(metalforge.testing.faults.planted). The kernels run on the simulator.
"""
import re

import pytest
import torch

import metalforge as mf
from metalforge import sim
from metalforge.testing import check
from metalforge.testing.faults import (
    BROADCAST_WRONG_AXIS,
    DROPPED_UPCAST,
    MISSING_BARRIER,
    OFF_BY_ONE_GUARD,
    PARTIAL_HEAD_OFFSET,
    PARTIAL_PAST_END,
    TILE_OF_GROUP,
    WRONG_IDENTITY,
    Fault,
    FaultNotPlanted,
    planted,
)


@mf.kernel
def fault_bias_scale(x: "T[R, D]", bias: "T[D]", scale: float = 0.5):
    return (x + bias) * scale


@mf.kernel
def fault_hypot(x: "T[N]", y: "T[N]"):
    return mf.sqrt(x * x + y * y)


def caught(fault, kernel, **options) -> str:
    """Run check with ``fault`` planted; return the failure report (fails if not caught)."""
    with planted(fault) as planting:
        with pytest.raises(AssertionError) as info:
            check(kernel, **options)
    assert planting.applied[fault.name] >= 1
    report = str(info.value)
    assert report.startswith(f"metalforge check: kernel '{kernel.name}'")
    assert "Example (shrunk by hypothesis)" in report and "sizes:" in report
    assert "Generated MSL for this example:" in report
    return report


def test_off_by_one_bound_guard_is_caught():
    report = caught(OFF_BY_ONE_GUARD, fault_bias_scale, dtypes={"T": "f32"})
    assert "out of bounds" in report and "mf_out" in report     # the simulator's finding
    assert "if (mf_i <= mf_numel)" in report                    # the MSL shown is what ran


def test_dropped_fp32_upcast_is_caught():
    report = caught(DROPPED_UPCAST, fault_hypot, dtypes={"T": "f16"})
    m = re.search(r"worst at index \[\d+\]: got (\S+), expected (\S+)", report)
    assert m, report
    assert re.search(r"values family '(large|mixed)'", report)   # overflow needs large values
    assert float(m.group(1)) == float("inf") and abs(float(m.group(2))) > 256
    assert "const T mf_v1 = mf_in_x * mf_in_x;" in report


def test_broadcast_indexed_by_the_wrong_axis_is_caught():
    report = caught(BROADCAST_WRONG_AXIS, fault_bias_scale, dtypes={"T": "f32"})
    assert "out of tolerance; worst at index" in report
    assert "atol=" in report and "rtol=" in report
    assert "bias[mf_i / mf_size_D]" in report
    # shrunk towards the strategies' simplest sizes (3 in every dim): a small shape
    m = re.search(r"sizes: R=(\d+), D=(\d+)", report)
    assert m and int(m.group(1)) * int(m.group(2)) <= 9, report


@mf.kernel
def fault_rowsum(x: "T[R, D]"):
    return mf.sum(x, axis="D")


@mf.kernel
def fault_rowmax(x: "T[R, D]"):
    return mf.max(x, axis="D")


def test_missing_barrier_is_caught():
    report = caught(MISSING_BARRIER, fault_rowsum, dtypes={"T": "f32"})
    # the simulator's race detector names the hazard, whatever the values and the thread order
    assert re.search(r"threadgroup memory race \((write after read|read after write)\) on "
                     r"mf_tg\d\[\d+\], threadgroup array 'mf_tg\d'", report), report
    m = re.search(r"sizes: R=\d+, D=(\d+)", report)
    assert m and int(m.group(1)) > 32, report      # needs more than one simdgroup per row
    assert "threadgroup_barrier" not in report.split("Generated MSL")[1]


def test_wrong_reduction_identity_is_caught():
    # the fault shows only on rows whose values are all negative: draw those
    report = caught(WRONG_IDENTITY, fault_rowmax, dtypes={"T": "f32"}, values={"x": (-9.0, -1.0)})
    m = re.search(r"got (\S+), expected (\S+),", report)
    assert m and float(m.group(1)) == 0.0 and float(m.group(2)) < 0, report
    assert "= 0.0f;" in report


def test_a_partial_read_past_those_written_is_caught():
    # slot nsg of the partials' threadgroup array is never written: on a GPU it holds what an
    # earlier group left. The simulator fails the read itself, in the simplest example ...
    report = caught(PARTIAL_PAST_END, fault_rowmax, dtypes={"T": "f32"}, dims={"D": (257, 2000)})
    assert re.search(r"read of threadgroup memory no thread wrote: thread \d+ \(simdgroup 0, "
                     r"lane \d+\) reads mf_tg1\[\d+\]", report), report
    assert "mf_lane <= mf_nsg ?" in report
    # ... and with its checks off, the fill wins the max (NaN, which mf.max propagates as
    # torch.amax does, or 2.7e36)
    with sim.race_detection(False):
        report = caught(PARTIAL_PAST_END, fault_rowmax, dtypes={"T": "f32"},
                        dims={"D": (257, 2000)})
    m = re.search(r"got (\S+), expected", report)
    assert m and not abs(float(m.group(1))) < 1e36, report
    assert "simulator: threadgroup memory starts as" in report
    assert "mf_lane <= mf_nsg ?" in report


@mf.kernel
def fault_attention(q: "T[B, H, S, E]", k: "T[B, H, L, E]", v: "T[B, H, L, E]", scale: float):
    s = mf.sum(q * k, axis="E") * scale
    s = mf.where(mf.index("L") <= mf.index("S") + mf.size("L") - mf.size("S"), s, -mf.inf)
    return mf.sum(mf.softmax(s, axis="L") * v, axis="L")


@pytest.mark.parametrize("fault", [TILE_OF_GROUP, PARTIAL_HEAD_OFFSET], ids=lambda f: f.name)
def test_attention_group_and_partial_offsets_are_caught(fault):
    # both show only in a call that splits its keys into blocks with several heads and tiles of
    # query rows (with one tile, or one head, the wrong place is the right one): check's
    # examples for each attention kernel include such a call
    report = caught(fault, fault_attention, dtypes={"T": "f32"})
    m = re.search(r"sizes: B=(\d+), H=(\d+), S=(\d+), E=\d+, L=(\d+)", report)
    assert m and int(m.group(2)) > 1 and int(m.group(4)) >= 128, report


def test_the_same_kernels_pass_without_faults():
    check(fault_bias_scale, dtypes={"T": ["f32", "f16"]}, max_examples=4)
    check(fault_hypot, dtypes={"T": "f16"}, values={"x": "large"}, max_examples=4)
    check(fault_rowsum, dtypes={"T": "f32"}, dims={"D": [129, 1000]}, max_examples=4)
    check(fault_rowmax, dtypes={"T": "f32"}, values={"x": "shifted"}, max_examples=4)
    check(fault_attention, dtypes={"T": "f32"}, max_examples=4)


def test_a_fault_whose_pattern_is_absent_fails_loudly():
    stale = Fault("stale", "keys on text codegen no longer emits",
                  ((r"mf_no_such_identifier", "x"),))
    with pytest.raises(FaultNotPlanted, match="does not contain") as info:
        with planted(stale):
            fault_hypot(torch.ones(3), torch.ones(3))
    assert not isinstance(info.value, AssertionError)       # cannot pass for a caught fault
    # and through check it is not turned into an ordinary failure report
    with pytest.raises(FaultNotPlanted):
        with planted(stale):
            check(fault_hypot, dtypes={"T": "f32"}, max_examples=2)


def test_a_fault_that_rewrote_nothing_fails_loudly():
    with pytest.raises(FaultNotPlanted, match="rewrote no source"):
        with planted(OFF_BY_ONE_GUARD):
            pass
