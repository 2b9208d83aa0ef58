"""The annotation type language: valid forms, and invalid ones with the caret at the right
character, the parameter and the user's file:line in the message."""
import os
import re

import pytest
import torch

import metalforge as mf
from metalforge import dtypes
from metalforge.frontend.annotations import (
    grammar_text,
    parse_annotation,
    resolve_dim,
    resolve_dims,
)
from metalforge.graph import AxisSpec

HERE = os.path.abspath(__file__)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))


def axes(text, consts=None):
    a = parse_annotation(text)
    return a, tuple(resolve_dim(d, consts or {}, text) for d in a.dims)


def test_grammar_file_is_shipped_and_linked():
    top = os.path.join(ROOT, "grammar", "metalforge.lark")
    assert os.path.islink(top) and not os.path.isabs(os.readlink(top))
    with open(top) as f:
        assert f.read() == grammar_text()


@pytest.mark.parametrize("name", sorted(dtypes.ANNOTATION_DTYPES))
def test_every_dtype_name(name):
    a, dims = axes(f"{name}[N]")
    assert a.dtype is dtypes.ANNOTATION_DTYPES[name] and a.dtype_var is None
    assert dims == (AxisSpec("N"),)


def test_dtype_variables_and_plain_dims():
    a, dims = axes("T[R, D]")
    assert a.dtype is None and a.dtype_var == "T"
    assert [d.name for d in dims] == ["R", "D"]
    a, _ = axes("Acc_2[ R ,D , ]")       # spaces and a trailing comma are fine
    assert a.dtype_var == "Acc_2" and [d.name for d in a.dims] == ["R", "D"]
    a, dims = axes("f32[]")
    assert dims == ()


def test_derived_dims_normalise():
    _, dims = axes("u32[N, K/8]")
    assert dims[1] == AxisSpec("K/8", base="K", mul=1, div=8, add=0)
    _, dims = axes("f16[N*2+1, M - 3, 2*P/4, (Q)]")
    assert dims[0] == AxisSpec("N*2+1", base="N", mul=2, add=1)
    assert dims[1] == AxisSpec("M-3", base="M", add=-3)
    assert dims[2] == AxisSpec("P/2", base="P", div=2)
    assert dims[3] == AxisSpec("Q")


def test_derived_dim_by_const_name():
    _, dims = axes("T[N, K/GS]", {"GS": 64})
    assert dims[1] == AxisSpec("K/64", base="K", div=64)


def test_batch_dims():
    _, dims = axes("T[*B, D]")
    assert dims[0] == AxisSpec("B", batch=True) and dims[1] == AxisSpec("D")


def test_grouped_dims_are_two_axes_of_one_storage_dim():
    a = parse_annotation("T[B, (G R), S, E]")
    assert a.has_group and a.dims[1].names == ("G", "R") and a.dims[1].pos == 5
    dims = resolve_dims(a.dims, {}, a.text)
    assert [d.name for d in dims] == ["B", "G", "R", "S", "E"]
    assert [d.joined for d in dims] == [False, False, True, False, False]
    with pytest.raises(mf.AnnotationError, match="is an mf.Const") as e:
        resolve_dims(a.dims, {"R": 2}, a.text)
    assert e.value.column == 5


@pytest.mark.parametrize("text, col, words", [
    ("T[R, D", 6, "end of the annotation"),
    ("T[R; D]", 3, "unexpected ';'"),
    ("T[R,,D]", 4, "unexpected ','"),
    ("[N]", 0, "unexpected '['"),
    ("T(N)", 1, "unexpected '('"),
    ("T[N]x", 4, "unexpected 'x'"),
    ("T[-N]", 2, "unexpected '-'"),
    ("f64[N]", 0, "'f64' is not a metalforge dtype"),
    ("float32[N]", 0, "not a metalforge dtype"),
    ("T[R, *B]", 5, "must come first"),
    ("T[R, D, R]", 8, "'R' appears twice"),
    ("T[2-3]", 2, "at least 1"),
    ("T[N, K=N]", 5, "depends on a dim"),
    ("T[K=4, K]", 7, "'K' appears twice"),
    ("T[N, N*M]", 5, "uses 'N' and 'M'"),
    ("T[K/0]", 4, "division by zero"),
    ("T[K/N]", 2, "uses 'K' and 'N'"),
    ("T[(N+1)/2]", 2, "whole numbers"),
    ("T[3-N]", 2, "must grow with its base"),
])
def test_invalid_annotations_point_at_the_character(text, col, words):
    with pytest.raises(mf.AnnotationError) as e:
        axes(text)
    err = e.value
    assert err.column == col, str(err)
    assert words in str(err)
    lines = str(err).splitlines()
    shown, caret = lines[-2], lines[-1]
    assert shown.strip() == f'"{text}"'
    assert caret.index("^") == shown.index('"') + 1 + col


def _def_line(marker):
    with open(HERE) as f:
        return next(i for i, line in enumerate(f, 1) if marker in line)


def test_kernel_definition_error_names_parameter_file_and_line():
    with pytest.raises(mf.AnnotationError) as e:
        @mf.kernel
        def bad(x: "T[N]",
                w: "T[N,, D]"):  # MARK-bad-annotation
            return x
    msg = str(e.value)
    assert f"{HERE}:{_def_line('MARK-bad-annotation')}" in msg
    assert "kernel 'bad'" in msg and "parameter 'w'" in msg
    assert msg.splitlines()[-1].index("^") == msg.splitlines()[-2].index('"') + 1 + 4


def test_grouped_dim_binds_from_the_other_axes():
    @mf.kernel
    def per_group(x: "T[(G R), D]", w: "T[G, D]"):
        return x * w                                  # w broadcast over the R rows of a group
    x, w = torch.randn(6, 5), torch.randn(3, 5)
    got = per_group(x, w)
    assert got.shape == (6, 5)                        # laid out as x's grouped dim again
    torch.testing.assert_close(got, (x.view(3, 2, 5) * w[:, None]).reshape(6, 5))
    with pytest.raises(mf.ShapeError, match=r"\(G R\) of argument 'x'.*size 7.*multiple of 3"
                       r".*'G' = 3 from argument 'w'"):
        per_group(torch.randn(7, 5), w)

    @mf.kernel
    def unbound(x: "T[(G R), D]"):
        return x * 2
    with pytest.raises(mf.ShapeError, match="'G', 'R' are not bound by any other argument"):
        unbound(x)


def test_scalar_and_const_annotations():
    @mf.kernel
    def k(x: "T[N]", a: float, n: int, flag: bool, c: mf.Const[int] = 3,
          d: "mf.Const[bool]" = False, e: "float" = 1.0):
        return x
    kinds = {p.name: type(p).__name__ for p in k.params}
    assert kinds == {"x": "TensorParam", "a": "ScalarParam", "n": "ScalarParam",
                     "flag": "ScalarParam", "c": "ConstParam", "d": "ConstParam",
                     "e": "ScalarParam"}
    widths = {p.name: p.dtype for p in k.params if type(p).__name__ == "ScalarParam"}
    assert widths == {"a": dtypes.F32, "n": dtypes.I64, "flag": dtypes.BOOL, "e": dtypes.F32}
    c = next(p for p in k.params if p.name == "c")
    assert c.pytype is int and c.default == 3 and c.has_default


@pytest.mark.parametrize("src, words", [
    ("def f(x):\n    return x", "needs an annotation"),
    ("def f(x: 'T[N]', *rest: 'T[N]'):\n    return x", "*args/**kwargs"),
    ("def f(x: 'T[N]' = None):\n    return x", "cannot have defaults"),
    ("def f(x: list):\n    return x", "unsupported annotation"),
    ("def f(x: 'T[N]', c: mf.Const[int] = True):\n    return x", "Const[int] needs"),
    ("def f(x: 'T[N]', s: float = 'a'):\n    return x", "expected a Python float"),
    ("def f(x: 'T[*N, D]', y: 'T[N]'):\n    return x", "'*N' is a batch"),
])
def test_bad_declarations(src, words):
    ns = {"mf": mf}
    exec(compile(src, "<decl>", "exec"), ns)
    with pytest.raises((mf.AnnotationError, mf.BindingError), match=re.escape(words)):
        mf.kernel(ns["f"])


def test_const_of_other_type_refused():
    with pytest.raises(TypeError, match="only mf.Const"):
        mf.Const[float]
