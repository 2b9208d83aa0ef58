"""out= and declared in-place outputs (runtime/outputs.py, runtime/into.py, as_op's mutated
arguments): results written into the caller's tensors (views at an offset included, in place),
every refusal (dtype, shape, device, non-contiguous, misaligned, overlapping an input read other
than element for element, autograd), checked against torch computed directly. Kernels are the
examples' (their MSL is what test_examples compiles); all run on the simulator."""
import importlib.util
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import metalforge as mf
from metalforge import quant
from metalforge.errors import BindingError, DeviceError, ShapeError
from metalforge.runtime.outputs import AliasError

ROOT = Path(__file__).resolve().parents[2]


def _example(stem):
    path = ROOT / "examples" / f"{stem}.py"
    spec = importlib.util.spec_from_file_location(f"mf_out_{stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


silu = _example("silu").silu
rms_norm = _example("rms_norm").rms_norm
add_silu = _example("two_outputs").add_silu


def _rms(x, w, eps=1e-6):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


# --------------------------------------------------------------------------- each family

def test_elementwise_out_is_written_and_returned():
    x = torch.randn(3, 40)
    out = torch.full((3, 40), 7.0)
    got = silu(x, out=out)
    assert got is out
    torch.testing.assert_close(out, F.silu(x))
    got = silu(x + 1, out=out)                          # warm: the same closure, new values
    assert got is out
    torch.testing.assert_close(out, F.silu(x + 1))


def test_row_of_a_3d_cache_is_written_in_place():
    """rows family: out=cache[pos] writes that row of the cache (a contiguous view at a storage
    offset), nothing else; one closure serves every position."""
    cache = torch.zeros(5, 4, 64)
    w = torch.randn(64)
    xs = [torch.randn(4, 64) for _ in range(5)]
    for pos in (3, 1):
        row = cache[pos]
        got = rms_norm(xs[pos], w, out=row)
        assert got.data_ptr() == cache[pos].data_ptr()
    for pos in range(5):
        want = _rms(xs[pos], w) if pos in (3, 1) else torch.zeros(4, 64)
        torch.testing.assert_close(cache[pos], want, rtol=1e-5, atol=1e-5)


def test_column_quant_and_gather_families():
    column_sum = _example("column_sum").column_sum
    x = torch.randn(64, 100)
    out = torch.empty(2, 100)
    assert column_sum(x, out=out[1]).data_ptr() == out[1].data_ptr()
    torch.testing.assert_close(out[1], x.sum(0), rtol=1e-4, atol=1e-4)

    q4_matvec = _example("q4_matvec").q4_matvec
    w = torch.randn(96, 512)
    wq, scales, biases = quant.quantize(w, group_size=64, bits=4)
    xq = torch.randn(1, 512)
    y = torch.zeros(3, 1, 96)
    q4_matvec(wq, scales, biases, xq, out=y[2])
    w_hat = quant.dequantize(wq, scales, biases, group_size=64, bits=4)
    torch.testing.assert_close(y[2], xq @ w_hat.t(), rtol=2e-3, atol=2e-3)
    assert not y[:2].any()

    embed = _example("embedding").embed
    table = torch.randn(50, 32)
    ids = torch.tensor([3, 49, 0], dtype=torch.int32)
    cache = torch.zeros(4, 3, 32)
    embed(table, ids, out=cache[1])
    torch.testing.assert_close(cache[1], F.embedding(ids.long(), table))
    assert not cache[0].any() and not cache[2:].any()


def test_attention_out():
    attention = _example("attention").attention
    q = torch.randn(1, 4, 1, 32)
    k, v = torch.randn(1, 2, 9, 32), torch.randn(1, 2, 9, 32)
    out = torch.zeros(2, 1, 4, 1, 32)
    got = attention(q, k, v, 32 ** -0.5, out=out[1])
    assert got.data_ptr() == out[1].data_ptr()
    kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    want = F.scaled_dot_product_attention(q, kk, vv, scale=32 ** -0.5)
    torch.testing.assert_close(out[1], want, rtol=1e-4, atol=1e-4)
    assert not out[0].any()


def test_several_outputs():
    x, r = torch.randn(2, 3, 48), torch.randn(2, 3, 48)
    h, act = torch.empty(2, 3, 48), torch.empty(2, 3, 48)
    got = add_silu(x, r, out=(h, act))
    assert got[0] is h and got[1] is act
    torch.testing.assert_close(h, x + r)
    torch.testing.assert_close(act, F.silu(x + r))
    got = add_silu(x, r, out=(None, act))              # None: that output is allocated
    assert got[1] is act and got[0] is not h
    torch.testing.assert_close(got[0], x + r)
    with pytest.raises(BindingError, match=r"out=\(t0, t1, \.\.\.\) with 2 entries"):
        add_silu(x, r, out=h)
    with pytest.raises(AliasError, match=r"out\[0\] and out\[1\] overlap"):
        add_silu(x, r, out=(h, h))


# --------------------------------------------------------------------------- refusals

def test_each_wrong_out_is_refused_with_what_was_expected():
    x = torch.randn(4, 64)
    with pytest.raises(BindingError, match=r"kernel 'silu'.*out \(output 0, axes \[B, D\]\) "
                                           r"has dtype torch.float16.*pass a torch.float32"):
        silu(x, out=torch.empty(4, 64, dtype=torch.float16))
    with pytest.raises(ShapeError, match=r"has shape \(4, 65\), but the arguments bind the "
                                         r"output to \(4, 64\)"):
        silu(x, out=torch.empty(4, 65))
    with pytest.raises(DeviceError, match=r"is on meta, but the arguments are on cpu"):
        silu(x, out=torch.empty(4, 64, device="meta"))
    with pytest.raises(BindingError, match=r"not contiguous \(strides \(1, 4\)\).*"
                                           r"cache\[pos\].*t\.copy_"):
        silu(x, out=torch.empty(64, 4).t())
    flat = torch.empty(4 * 64 + 1)
    with pytest.raises(BindingError, match=r"storage offset 1.*vector stores of 4 elements"):
        silu(x, out=flat[1:].view(4, 64))
    with pytest.raises(BindingError, match=r"out= takes a tensor or a tuple of 1.*got str"):
        silu(x, out="t")
    with pytest.raises(BindingError, match=r"out\[0\] must be a torch.Tensor or None, got float"):
        silu(x, out=[1.0])


def test_overlapping_an_input_read_otherwise_is_refused():
    y = torch.randn(8, 64)
    with pytest.raises(AliasError, match=r"out overlaps input 'x'.*different positions"):
        silu(y[:4], out=y[1:5])                      # shifted: would read what was written
    x, w = torch.randn(4, 64), torch.randn(64)
    with pytest.raises(AliasError, match=r"out overlaps input 'x'.*through a reduce.*"
                                         r"wrong results.*x\.clone\(\)"):
        rms_norm(x, w, out=x)
    with pytest.raises(AliasError, match=r"overlaps input 'w'"):
        rms_norm(x[:1], w, out=w.view(1, 64))
    embed = _example("embedding").embed
    table = torch.randn(8, 32)
    with pytest.raises(AliasError, match=r"gathers from 'table'"):
        embed(table, torch.tensor([1, 0, 2, 3, 4, 5, 6, 7], dtype=torch.int32), out=table)
    # warm: a closure recorded for other memory still refuses an overlap
    z = torch.randn(8, 64)
    silu(z[:4], out=z[4:])
    with pytest.raises(AliasError):
        silu(z[:4], out=z[1:5])


def test_element_for_element_in_place_is_allowed():
    """out=x where the kernel reads each element of x only where it writes it."""
    x, r = torch.randn(3, 48), torch.randn(3, 48)
    want = F.silu(x)
    y = x.clone()
    assert silu(y, out=y) is y
    torch.testing.assert_close(y, want)
    rr = r.clone()
    add_silu(x, rr, out=(rr, None))                  # residual += x, in place
    torch.testing.assert_close(rr, x + r)


def test_autograd_is_refused_unless_no_grad():
    x = torch.randn(2, 8, requires_grad=True)
    out = torch.empty(2, 8)
    with pytest.raises(BindingError, match=r"does not support automatic differentiation.*"
                                           r"torch\.no_grad"):
        silu(x, out=out)
    with torch.no_grad():
        silu(x, out=out)
    torch.testing.assert_close(out, F.silu(x.detach()))


# --------------------------------------------------------------------------- declared in place

@mf.kernel(inplace="acc")
def accumulate(acc: "T[N]", x: "T[N]", s: float = 1.0):
    return acc + x * s


def test_declared_in_place_output_and_its_operator_under_compile():
    acc, x = torch.ones(40), torch.randn(40)
    assert accumulate(acc, x, 2.0) is acc
    torch.testing.assert_close(acc, 1 + 2 * x)
    view = torch.zeros(3, 40)[1]
    accumulate(view, x)                              # a view at an offset, in place
    torch.testing.assert_close(view, x)

    op = accumulate.as_op("mf_test_out::accumulate")
    assert "Tensor(a!) acc" in op.schema and op.schema.endswith("-> ()")

    def step(a, x):
        op(a, x, s=3.0)
        return a * 2
    a = torch.ones(40)
    got = torch.compile(step, fullgraph=True, backend="aot_eager")(a, x)
    torch.testing.assert_close(a, 1 + 3 * x)          # the mutation reached the caller's tensor
    torch.testing.assert_close(got, 2 * (1 + 3 * x))
    with pytest.raises(BindingError, match="automatic differentiation"):
        op(torch.ones(40, requires_grad=True), x)
    torch.library.opcheck(op.op, (torch.ones(40), x, 2.0))


def test_operator_out_variant_under_compile():
    op = silu.as_op("mf_test_out::silu")
    assert op.out_schema == "(Tensor x, Tensor(a!) out) -> ()"
    x, out = torch.randn(3, 40), torch.empty(3, 40)

    def f(x, out):
        op(x, out=out)
        return out + 1
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(x, out)
    torch.testing.assert_close(out, F.silu(x))
    torch.testing.assert_close(got, F.silu(x) + 1)
    torch.library.opcheck(op.out_op, (x, torch.empty(3, 40)))


def test_declaration_errors():
    def ident(x: "T[N]"):
        return x
    with pytest.raises(BindingError, match=r"'cache', which is not a tensor parameter"):
        mf.kernel(inplace="cache")(ident)
    @mf.kernel
    def twice(out: "T[N]"):                          # a parameter named out: out= is it
        return out * 2
    x = torch.randn(40)
    torch.testing.assert_close(twice(out=x), 2 * x)
    x = torch.randn(40)
    with pytest.raises(BindingError, match=r"declared written into argument 'acc'"):
        accumulate(x, x, out=torch.empty(40))


def test_in_place_argument_is_named_in_errors_and_mlx_out_is_refused():
    acc = torch.zeros(80)[::2]                           # not contiguous
    with pytest.raises(BindingError, match=r"argument 'acc' \(written in place\) \(output 0"
                                           r".*not contiguous"):
        accumulate(acc, torch.randn(40))
    # MLX arrays are immutable: out= is refused before anything runs (any array type will do)
    from metalforge.runtime import outputs
    g = silu.graph(torch.randn(2, 4))
    with pytest.raises(mf.UnsupportedConstruct, match=r"mx arrays are immutable"):
        outputs.given(g, {"x": object()}, torch.empty(2, 4), (), lambda v: True)
    assert outputs.given(g, {"x": object()}, None, (), lambda v: True) is None
    # a declared in-place output on MLX: a fresh array is returned (nothing to write into)
    assert outputs.given(g, {"x": object()}, None, ((0, "x"),), lambda v: True) is None
