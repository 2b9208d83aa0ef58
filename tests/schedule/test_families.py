"""Family recognition (schedule/families.py): the ordered table of patterns, one match per
graph object, the form handed to the builder."""
import gc
from dataclasses import replace

import pytest

import metalforge as mf
from metalforge import schedule
from metalforge.graph import BinaryOp, Op, ReduceOp, UnaryOp
from metalforge.schedule import attention, families


@mf.kernel
def scale(x: "T[N]", k: float):
    return x * k


@mf.kernel
def row_sum(x: "T[R, D]"):
    return mf.sum(x, axis="D")


@mf.kernel
def col_sum(x: "T[R, D]"):
    return mf.sum(x, axis="R")


@mf.kernel
def qmv(wq: "u32[N, K/8]", s: "T[N, K/GS]", b: "T[N, K/GS]", x: "T[M, K]",
        GS: mf.Const[int] = 64) -> "T[M, N]":
    return mf.sum((mf.unpack(wq, bits=4) * s + b) * x, axis="K")


@mf.kernel
def attend(q: "T[S, E]", k: "T[L, E]", v: "T[L, E]"):
    p = mf.softmax(mf.sum(q * k, axis="E"), axis="L")
    return mf.sum(p * v, axis="L")


@mf.kernel
def running_sum(x: "T[R, D]"):
    return mf.cumsum(x, axis="D")


@mf.kernel
def two_axes(x: "T[R, D]"):
    return mf.sum(x, axis="D") + mf.sum(x, axis="R")


@pytest.mark.parametrize("kernel, fam", [(scale, "elementwise"), (row_sum, "row"),
                                         (col_sum, "column"), (qmv, "quant"),
                                         (attend, "attention"), (running_sum, "scan")])
def test_each_family_is_recognised(kernel, fam):
    g = kernel.graph(T="f32")
    m = schedule.recognise(g)
    assert m.family == schedule.family(g) == fam
    # the column before the quant pattern: the quantized sum transposed (dx of a matvec)
    assert [p.family for p in schedule.PATTERNS] == ["scatter", "scan", "column", "quant",
                                                     "attention_grad", "attention", "matmul",
                                                     "multiaxis", "row", "column",
                                                     "elementwise"]
    assert schedule.plan(g).family == fam


def test_a_graph_is_matched_once(monkeypatch):
    g = replace(attend.graph(T="f32"))              # a graph object not matched yet
    calls = []
    real = attention.match
    monkeypatch.setattr(attention, "match", lambda graph: calls.append(graph) or real(graph))
    m = schedule.recognise(g)
    assert isinstance(m.form, attention.Form) and m.form.key == "L" and m.form.e == "E"
    for index64 in (False, True):
        schedule.plan(g, index64=index64)
    assert schedule.family(g) == "attention" and schedule.recognise(g) is m
    assert calls == [g]                              # the builder took the matched form


def test_the_match_goes_with_its_graph():
    g = replace(row_sum.graph(T="f32"))             # the kernel keeps its own trace alive
    assert schedule.recognise(g).form == "D"
    key = id(g)
    assert key in families._MATCHES
    del g
    gc.collect()
    assert key not in families._MATCHES


def test_unsupported_reductions_name_the_construct():
    with pytest.raises(mf.UnsupportedConstruct, match="several axes"):
        schedule.recognise(two_axes.graph(T="f32"))


def test_op_kinds_are_enums_that_read_as_their_names():
    g = attend.graph(T="f32")
    kinds = {type(n.attr[0]) if n.op == Op.REDUCE else type(n.attr) for n in g.nodes()
             if n.op in (Op.UNARY, Op.BINARY, Op.REDUCE)}
    assert kinds == {UnaryOp, BinaryOp, ReduceOp}
    assert ReduceOp.SUM == "sum" and {"exp": 1}[UnaryOp.EXP] == 1
    assert f"{BinaryOp.MUL}" == str(BinaryOp.MUL) == "mul" and repr(ReduceOp.MAX) == "'max'"
