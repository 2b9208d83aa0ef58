"""metalforge.shapes: binding named dims to tensor sizes, and each kind of shape error."""
import pytest
import torch

from metalforge import dtypes
from metalforge.graph import AxisSpec, Graph, Node, Output, TensorParam
from metalforge.shapes import ShapeError, bind_shapes, flat_shape, output_shape


def tp(name, *dims, ann=None):
    return TensorParam(name, dtypes.F32, None, tuple(dims), ann or f"f32[{name}]")


def graph(*params):
    node = Node("load", (), dtypes.F32, params[0].axes, attr=params[0].name)
    return Graph("k", tuple(params), (Output(node, params[0].axes, dtypes.F32),),
                 loc=("/src/user.py", 12))


R, D, N = AxisSpec("R"), AxisSpec("D"), AxisSpec("N")
B = AxisSpec("B", batch=True)
K8 = AxisSpec("K/8", base="K", div=8)
K = AxisSpec("K")


def t(*shape):
    return torch.zeros(shape)


def test_plain_dims_bind():
    g = graph(tp("x", R, D), tp("w", D))
    b = bind_shapes(g, {"x": t(3, 5), "w": t(5)})
    assert b.sizes == {"R": 3, "D": 5} and b.batch == {}


def test_mismatched_dim_names_both_arguments_and_sizes():
    g = graph(tp("x", R, D, ann="f32[R, D]"), tp("w", D, ann="f32[D]"))
    with pytest.raises(ShapeError) as e:
        bind_shapes(g, {"x": t(3, 5), "w": t(6)})
    msg = str(e.value)
    for part in ("'D'", "'x'", "'w'", "5", "6", "kernel 'k'", "/src/user.py:12"):
        assert part in msg


def test_rank_error():
    g = graph(tp("x", R, D, ann="f32[R, D]"))
    with pytest.raises(ShapeError, match=r"'x'.*exactly 2 dim.*\(3,\)"):
        bind_shapes(g, {"x": t(3)})


def test_batch_dims_flatten_and_reexpand():
    g = graph(tp("x", B, D), tp("w", D))
    b = bind_shapes(g, {"x": t(2, 3, 4, 5), "w": t(5)})
    assert b.sizes == {"B": 24, "D": 5} and b.batch == {"B": (2, 3, 4)}
    assert flat_shape(b, g.tensors[0]) == (24, 5)
    assert output_shape(b, Output(g.outputs[0].node, ("B", "D"), dtypes.F32)) == (2, 3, 4, 5)


def test_batch_may_be_empty():
    g = graph(tp("x", B, D))
    b = bind_shapes(g, {"x": t(7)})
    assert b.sizes == {"B": 1, "D": 7} and b.batch == {"B": ()}
    assert output_shape(b, g.outputs[0]) == (7,)


def test_batch_rank_and_mismatch():
    g = graph(tp("x", B, D, ann="f32[*B, D]"), tp("y", B, D, ann="f32[*B, D]"))
    with pytest.raises(ShapeError, match="at least 1"):
        bind_shapes(g, {"x": torch.zeros(()), "y": t(3)})
    with pytest.raises(ShapeError, match=r"\*B.*\(2, 3\).*'x'.*\(6,\).*'y'"):
        bind_shapes(g, {"x": t(2, 3, 4), "y": t(6, 4)})


def test_derived_dim_checked_against_base():
    g = graph(tp("w", N, K8), tp("x", K))
    b = bind_shapes(g, {"w": t(2, 4), "x": t(32)})
    assert b.sizes == {"N": 2, "K/8": 4, "K": 32}
    with pytest.raises(ShapeError, match=r"'K/8'.*must be 4.*got 5"):
        bind_shapes(g, {"w": t(2, 5), "x": t(32)})
    with pytest.raises(ShapeError, match="divisible by 8"):
        bind_shapes(g, {"w": t(2, 4), "x": t(33)})


def test_derived_dim_solves_base():
    g = graph(tp("w", N, K8))
    assert bind_shapes(g, {"w": t(2, 4)}).sizes["K"] == 32
    odd = AxisSpec("N*2+1", base="N", mul=2, add=1)
    g2 = graph(tp("y", odd))
    assert bind_shapes(g2, {"y": t(9)}).sizes["N"] == 4
    with pytest.raises(ShapeError, match="no whole size of 'N'"):
        bind_shapes(g2, {"y": t(8)})


def test_missing_tensor():
    g = graph(tp("x", R))
    with pytest.raises(ShapeError, match="no tensor given for argument 'x'"):
        bind_shapes(g, {})
