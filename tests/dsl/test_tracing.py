"""Tracing: the graph a kernel body produces, broadcasting by name, specialisation, and the
errors for what cannot be traced, each naming this file and the offending line."""
import math
import os

import numpy as np
import pytest
import torch

import metalforge as mf
from metalforge import dtypes

HERE = os.path.abspath(__file__)


def line_of(marker):
    with open(HERE) as f:
        return next(i for i, line in enumerate(f, 1) if line.rstrip().endswith(marker))


def f32(*shape):
    return torch.randn(*shape)


def expect_error(fn, args, marker, words, exc=mf.TraceError, **kwargs):
    with pytest.raises(exc) as e:
        fn.graph(*args, **kwargs)
    msg = str(e.value)
    assert f"{HERE}:{line_of(marker)}" in msg, msg
    for w in words:
        assert w in msg, msg
    return msg


# --------------------------------------------------------------------------- graphs

def test_broadcast_by_name_not_position():
    @mf.kernel
    def k(x: "T[R, D]", w: "T[D]", c: "T[R]"):
        return x * w + c

    g = k.graph(f32(3, 4), f32(4), f32(3))
    out = g.outputs[0]
    assert out.axes == ("R", "D") and out.node.axes == ("R", "D")
    mul = out.node.args[0]
    assert mul.attr == "mul" and {a.attr for a in mul.args} == {"x", "w"}


def test_transposed_input_keeps_canonical_axes_and_output_order():
    @mf.kernel
    def k(x: "T[R, D]", y: "T[D, R]"):
        return x + y, mf.sum(y, axis="R")

    g = k.graph(f32(3, 4), f32(4, 3))
    loads = {n.attr: n for n in g.nodes() if n.op == "load"}
    assert loads["y"].axes == ("R", "D")            # canonical order, storage order in params
    assert g.param("y").axes == ("D", "R")
    assert g.outputs[0].axes == ("R", "D") and g.outputs[1].axes == ("D",)


def test_return_annotation_orders_output():
    @mf.kernel
    def outer(x: "T[R]", y: "T[D]") -> "T[D, R]":
        return x * y

    assert outer.graph(f32(2), f32(3)).outputs[0].axes == ("D", "R")

    @mf.kernel
    def two(x: "T[R, D]") -> ("T[D, R]", "T[R]"):
        return x, mf.max(x, axis="D")

    g = two.graph(f32(2, 3))
    assert [o.axes for o in g.outputs] == [("D", "R"), ("R",)]


def test_reductions_remove_their_axis_and_mean_is_sum_over_size():
    @mf.kernel
    def k(x: "T[*B, D]"):
        return mf.mean(x, axis="D")

    g = k.graph(f32(2, 3, 4))
    div = g.outputs[0].node
    assert div.op == "binary" and div.attr == "div" and div.axes == ("B",)
    s, n = div.args
    assert s.op == "reduce" and s.attr == ("sum", "D")
    assert n.op == "cast" and n.args[0].op == "size" and n.args[0].attr == "D"


def test_helpers_are_built_from_primitives():
    @mf.kernel
    def k(x: "T[R, D]"):
        return mf.softmax(x, "D"), mf.log_softmax(x, "D"), mf.logsumexp(x, "D")

    g = k.graph(f32(2, 3))
    ops = {n.op for n in g.nodes()}
    assert ops <= {"load", "reduce", "binary", "unary", "const", "where"}
    kinds = sorted(n.attr[0] for n in g.nodes() if n.op == "reduce")
    assert kinds == ["max", "max", "max", "sum", "sum", "sum"]


def test_pow_lowering():
    @mf.kernel
    def k(x: "T[N]"):
        return x ** 2, x ** 3, x ** 0.5, x ** -1, 2.0 ** x

    g = k.graph(f32(4))
    sq, cube, half, inv, exp2 = (o.node for o in g.outputs)
    assert sq.attr == "mul" and sq.args[0] is sq.args[1]
    assert cube.attr == "mul" and cube.args[0].attr == "mul"
    for n in (half, inv, exp2):
        assert n.attr == "pow"


def test_const_specialises_and_each_variant_is_traced_once():
    calls = []

    @mf.kernel
    def k(x: "T[N]", causal: mf.Const[bool] = True, reps: mf.Const[int] = 2):
        calls.append(1)
        y = x
        for _ in range(reps):
            y = y + 1.0
        if causal:
            y = mf.where(mf.index("N") > 2, y, -mf.inf)
        return y

    x = f32(5)
    g1 = k.graph(x)
    assert k.graph(x) is g1 and len(calls) == 1
    g2 = k.graph(x, causal=False, reps=3)
    assert g2 is not g1 and len(calls) == 2
    assert g1.consts == {"causal": True, "reps": 2}
    assert "where" in {n.op for n in g1.nodes()} and "where" not in {n.op for n in g2.nodes()}
    assert sum(n.attr == "add" for n in g2.nodes() if n.op == "binary") == 3
    k.graph(x.half())
    assert k.variants() == [{"T": "f32", "causal": True, "reps": 2},
                            {"T": "f32", "causal": False, "reps": 3},
                            {"T": "f16", "causal": True, "reps": 2}]


def test_derived_dims_from_const_in_graph():
    @mf.kernel
    def k(wq: "u32[N, K/GS]", x: "f32[K]", GS: mf.Const[int] = 8):
        return wq & 15

    g = k.graph(torch.zeros(2, 4, dtype=torch.uint32), f32(32))
    spec = g.param("wq").dims[1]
    assert (spec.name, spec.base, spec.div) == ("K/8", "K", 8)
    assert k.graph(torch.zeros(2, 2, dtype=torch.uint32), f32(32), GS=16).param("wq").dims[1].name \
        == "K/16"


def test_node_locations_are_user_lines():
    @mf.kernel
    def k(x: "T[N]"):
        y = mf.exp(x)  # LOC-exp
        return y

    node = k.graph(f32(3)).outputs[0].node
    assert node.loc == (HERE, line_of("# LOC-exp"))


def test_keyword_only_and_defaults():
    @mf.kernel
    def k(x: "T[N]", *, scale: float = 2.0, shift: mf.Const[int] = 1):
        return x * scale + shift

    g = k.graph(f32(3))
    assert [p.name for p in g.params] == ["x", "scale", "shift"]
    assert g.consts == {"shift": 1}


def test_source_bindings_without_tensors():
    @mf.kernel
    def k(x: "T[R, D]", w: "U[D]", c: mf.Const[int] = 1):
        return x * w

    g = k.graph(T="f16", U=torch.bfloat16, c=4)
    assert g.dtype_vars == {"T": dtypes.F16, "U": dtypes.BF16} and g.consts == {"c": 4}
    assert g.outputs[0].dtype is dtypes.F32     # f16 * bf16 -> f32, as torch
    with pytest.raises(mf.BindingError, match="unknown binding Q"):
        k.graph(Q=3)
    with pytest.raises(mf.BindingError, match="not a dtype"):
        k.graph(T="float64")


# --------------------------------------------------------------------------- trace errors

@mf.kernel
def data_if(x: "T[N]"):
    if x > 0:  # ERR-if
        return x
    return -x


@mf.kernel
def data_while(x: "T[N]", eps: float):
    while eps > 1.0:  # ERR-while
        x = x / 2
    return x


@mf.kernel
def call_len(x: "T[N]"):
    return x / len(x)  # ERR-len


@mf.kernel
def iterate(x: "T[N]"):
    total = 0.0
    for v in x:  # ERR-iter
        total = total + v
    return total


@mf.kernel
def index_it(x: "T[N]"):
    return x[0]  # ERR-index


@mf.kernel
def unknown_fn(x: "T[N]"):
    return mf.softplus(x)  # ERR-unknown-fn


@mf.kernel
def unknown_attr(x: "T[N]"):
    return x.exp()  # ERR-attr


@mf.kernel
def use_math(x: "T[N]"):
    return math.exp(x)  # ERR-math


@mf.kernel
def use_torch(x: "T[N]"):
    return torch.exp(x)  # ERR-torch


@mf.kernel
def use_numpy(x: "T[N]"):
    return np.exp(x)  # ERR-numpy


@mf.kernel
def bad_axis(x: "T[R, D]", w: "T[D]"):
    return x * mf.sum(w, axis="R")  # ERR-axis


@mf.kernel
def unknown_axis(x: "T[N]"):
    return x + mf.index("Q")  # ERR-unknown-axis


@mf.kernel
def derived_mix(w: "u32[N, K*2]", x: "u32[N, K]"):
    return w + x  # ERR-derived


@mf.kernel
def uint_promo(a: "u32[N]", b: "i32[N]"):
    return a + b  # ERR-uint


@mf.kernel
def float_bits(a: "f32[N]"):
    return a & 1  # ERR-bits


@mf.kernel
def where_int(a: "f32[N]", m: "i32[N]"):
    return mf.where(m, a, 0.0)  # ERR-where


@mf.kernel
def mean_int(a: "i32[N]"):
    return mf.mean(a, axis="N")  # ERR-mean


CAPTURED = torch.ones(3)


@mf.kernel
def captured(x: "T[N]"):
    return x + CAPTURED  # ERR-captured


@mf.kernel
def builtin_max(x: "T[N]", y: "T[N]"):
    return max(x, y)  # ERR-builtin-max


def helper(v):
    return v.sqrt()  # ERR-helper


@mf.kernel
def via_helper(x: "T[N]"):
    return helper(x) + 1


@mf.kernel
def bool_sub(a: "bool[N]", b: "bool[N]"):
    return a - b  # ERR-boolsub


@mf.kernel
def int_neg_pow(a: "i32[N]"):
    return a ** -2  # ERR-negpow


@mf.kernel
def matmul(a: "T[M, K]", b: "T[K, N]"):
    return a @ b  # ERR-matmul


@mf.kernel
def matmul_no_shared(a: "T[M, K]", b: "T[N]"):
    return a @ b  # ERR-matmul-none


@mf.kernel
def matmul_reflected(a: "T[M, K]"):
    return torch.ones(3) @ a  # ERR-matmul-r


@pytest.mark.parametrize("kern, args, marker, words", [
    (data_if, (f32(3),), "# ERR-if", ["control flow", "mf.where", "if x > 0"]),
    (data_while, (f32(3),), "# ERR-while", ["control flow", "while eps > 1.0"]),
    (call_len, (f32(3),), "# ERR-len", ["len()", "mf.size"]),
    (iterate, (f32(3),), "# ERR-iter", ["iterated"]),
    (index_it, (f32(3),), "# ERR-index", ["indexing"]),
    (unknown_attr, (f32(3),), "# ERR-attr", ["no attribute 'exp'", "mf.exp(x)"]),
    (use_math, (f32(3),), "# ERR-math", ["Python number", "use mf.exp(x) instead of math.exp(x)"]),
    (use_torch, (f32(3),), "# ERR-torch", ["torch.exp", "mf.exp"]),
    (use_numpy, (f32(3),), "# ERR-numpy", ["numpy.exp", "mf.exp"]),
    (bad_axis, (f32(2, 3), f32(3)), "# ERR-axis", ["mf.sum", "['D']", "'R'"]),
    (unknown_axis, (f32(3),), "# ERR-unknown-axis", ["unknown axis 'Q'", "['N']"]),
    (derived_mix, (torch.zeros(2, 16, dtype=torch.uint32), torch.zeros(2, 8, dtype=torch.uint32)),
     "# ERR-derived", ["'K*2'", "'K'", "whole division"]),
    (uint_promo, (torch.zeros(2, dtype=torch.uint32), torch.zeros(2, dtype=torch.int32)),
     "# ERR-uint", ["does not promote u32 with i32", ".to("]),
    (float_bits, (f32(3),), "# ERR-bits", ["'&'", "integer or bool"]),
    (where_int, (f32(3), torch.zeros(3, dtype=torch.int32)), "# ERR-where", ["bool condition"]),
    (mean_int, (torch.zeros(3, dtype=torch.int32),), "# ERR-mean", ["floating-point"]),
    (captured, (f32(3),), "# ERR-captured", ["captured", "argument"]),
    (builtin_max, (f32(3), f32(3)), "# ERR-builtin-max", ["max/min", "mf.maximum"]),
    (via_helper, (f32(3),), "# ERR-helper", ["no attribute 'sqrt'", "mf.sqrt"]),
    (bool_sub, (torch.zeros(3, dtype=torch.bool),) * 2, "# ERR-boolsub",
     ["subtracting with a bool"]),
    (int_neg_pow, (torch.zeros(3, dtype=torch.int32),), "# ERR-negpow", ["negative integer"]),
    (matmul, (f32(3, 4), f32(4, 5)), "# ERR-matmul",
     ["'@' (matrix product)", 'mf.sum(a * b, axis="K")', "'K', the axis both"]),
    (matmul_no_shared, (f32(3, 4), f32(5)), "# ERR-matmul-none",
     ["'@'", "share no axis", "mf.sum(a * b"]),
    (matmul_reflected, (f32(3, 4),), "# ERR-matmul-r", ["'@'", "mf.sum(a * b"]),
])
def test_trace_errors_name_file_and_line(kern, args, marker, words):
    msg = expect_error(kern, args, marker, words)
    assert f"kernel '{kern.name}'" in msg


def test_unknown_mf_function_names_the_line():
    expect_error(unknown_fn, (f32(3),), "# ERR-unknown-fn",
                 ["no attribute 'softplus'", "sigmoid"],
                 exc=AttributeError)


# --------------------------------------------------------------------------- output errors

def test_output_errors_name_the_kernel_definition():
    @mf.kernel
    def nothing(x: "T[N]"):  # OUT-nothing
        x + 1

    @mf.kernel
    def python_value(x: "T[N]"):  # OUT-python
        return 1.0

    @mf.kernel
    def scalar_only(x: "T[N]", s: float):  # OUT-scalar
        return s * 2

    @mf.kernel
    def outer(x: "T[R]", y: "T[D]"):  # OUT-ambiguous
        return x * y

    @mf.kernel
    def wrong_ret(x: "T[R, D]") -> "T[R]":  # OUT-ret
        return x

    @mf.kernel
    def wrong_dtype(x: "T[R]") -> "f16[R]":  # OUT-dtype
        return x

    for k, marker, words in [(nothing, "# OUT-nothing", "returns nothing"),
                             (python_value, "# OUT-python", "not a value computed"),
                             (scalar_only, "# OUT-scalar", "depends on no tensor"),
                             (outer, "# OUT-ambiguous", "ambiguous"),
                             (wrong_ret, "# OUT-ret", "return annotation"),
                             (wrong_dtype, "# OUT-dtype", "convert with .to")]:
        expect_error(k, (f32(3),) if k is not outer else (f32(2), f32(3)), marker, [words])


# --------------------------------------------------------------------------- binding errors

@mf.kernel
def bind_me(x: "T[R, D]", w: "T[D]", m: "bool[R]", eps: float = 1e-5, n: int = 2,
            flag: bool = False, c: mf.Const[int] = 1):  # BIND-def
    return mf.where(m, x * w + eps * n, 0.0)


@pytest.mark.parametrize("args, kwargs, words", [
    ((f32(2, 3),), {}, ["missing a required argument: 'w'"]),
    ((f32(2, 3), f32(3), torch.ones(2, dtype=torch.bool), 1.0, 2, True, 1, 5), {},
     ["too many positional arguments"]),
    ((f32(2, 3), f32(3), torch.ones(2, dtype=torch.bool)), {"zzz": 1},
     ["unexpected keyword argument 'zzz'"]),
    (([1.0, 2.0], f32(3), torch.ones(2, dtype=torch.bool)), {},
     ["argument 'x'", "expected a torch.Tensor", "got list"]),
    ((f32(2, 3), f32(3), torch.ones(2)), {}, ["argument 'm'", "bool[R]", "torch.bool",
                                              "torch.float32"]),
    ((f32(2, 3), f32(3).half(), torch.ones(2, dtype=torch.bool)), {},
     ["dtype variable T", "argument 'x'", "argument 'w'", "f16", "f32"]),
    ((f32(2, 3), f32(3), torch.ones(2, dtype=torch.bool)), {"eps": "small"},
     ["argument 'eps'", "expected a Python float", "str"]),
    ((f32(2, 3), f32(3), torch.ones(2, dtype=torch.bool)), {"n": 2.5},
     ["argument 'n'", "expected a Python int"]),
    ((f32(2, 3), f32(3), torch.ones(2, dtype=torch.bool)), {"flag": 1},
     ["argument 'flag'", "expected a Python bool"]),
    ((f32(2, 3), f32(3), torch.ones(2, dtype=torch.bool)), {"c": 1.5},
     ["argument 'c'", "Const[int] needs a Python int"]),
    ((f32(2, 3).double(), f32(3).double(), torch.ones(2, dtype=torch.bool)), {},
     ["argument 'x'", "torch.float64 is not supported"]),
])
def test_binding_errors(args, kwargs, words):
    for call in (bind_me, bind_me.reference, bind_me.graph):
        if call == bind_me.graph and "missing" in words[0]:
            continue            # graph() binds partially (introspection)
        with pytest.raises(mf.BindingError) as e:
            call(*args, **kwargs)
        msg = str(e.value)
        assert f"kernel 'bind_me' ({HERE}:{line_of('# BIND-def') - 1})" in msg, msg
        if call == bind_me.graph and "zzz" in words[0]:
            assert "unknown binding zzz=1" in msg     # graph() also takes dims and dtype vars
            continue
        for w in words:
            assert w in msg, msg


def test_python_scalars_accept_ints_for_float():
    r = bind_me.reference(torch.ones(2, 3), torch.ones(3), torch.tensor([True, False]), eps=1)
    assert torch.equal(r, torch.tensor([[3.0] * 3, [0.0] * 3]))


def test_public_api_names():
    for name in ("kernel", "Const", "backend", "where", "exp", "exp2", "log", "log2", "sqrt",
                 "rsqrt", "sin", "cos", "tanh", "sigmoid", "erf", "abs", "floor", "ceil",
                 "maximum", "minimum", "clamp", "index", "size", "inf", "sum", "mean", "max",
                 "min", "prod", "argmax", "argmin", "softmax", "log_softmax", "logsumexp"):
        assert hasattr(mf, name), name
    assert mf.f16 is dtypes.F16 and mf.bool is dtypes.BOOL and mf.inf == float("inf")
    with pytest.raises(AttributeError, match="DSL functions are"):
        mf.softplus


def test_to_accepts_dsl_names_dtype_vars_and_torch_dtypes():
    @mf.kernel
    def k(x: "T[N]", i: "U[N]"):
        return i.to("T"), x.to(torch.bfloat16), x.to(mf.i32), x.to("u8")

    g = k.graph(f32(3).half(), torch.zeros(3, dtype=torch.int32))
    assert [o.dtype for o in g.outputs] == [dtypes.F16, dtypes.BF16, dtypes.I32, dtypes.U8]

    @mf.kernel
    def bad(x: "T[N]"):
        return x.to("float64")  # ERR-to

    expect_error(bad, (f32(3),), "# ERR-to", ["unknown dtype 'float64'"])
