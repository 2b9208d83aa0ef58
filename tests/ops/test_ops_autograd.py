"""Kernels as PyTorch operators (torch.library: opcheck, torch.compile, torch.export) and their
derived backward kernels (metalforge.autodiff), run through the simulator and checked against
torch.autograd on the float64 reference."""
import importlib.util
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import metalforge as mf
from metalforge import autodiff, schedule
from metalforge.graph import ScalarParam, TensorParam
from metalforge.once import OnceMap
from metalforge.torch_ops import NotDifferentiable, OpError

ROOT = Path(__file__).resolve().parents[2]
SIZES = [7, 40, 5, 33, 3]


def _example_kernels():
    out = []
    for path in sorted((ROOT / "examples").glob("*.py")):
        spec = importlib.util.spec_from_file_location(f"mf_ops_{path.stem}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        out += [(f"{path.stem}.{n}", k) for n, k in sorted(vars(mod).items())
                if isinstance(k, mf.Kernel)]
    return out


KERNELS = _example_kernels()


def _inputs(kernel, seed=0, dtype=torch.float32, requires_grad=False):
    """Sample arguments: each dim name gets its own size, *B is (2, 3)."""
    gen = torch.Generator().manual_seed(seed)
    # E: RoPE heads (even, and at least rot_dims); L: keys, at least as many as the queries
    # (S), so that no causal or windowed query row has every key masked (a NaN row, which
    # opcheck's eager-vs-traced comparison does not accept); N: a paged cache's rows, enough
    # for block numbers 1-2 of 16 rows each
    sizes, args = {"E": 64, "L": 40, "N": 64}, []
    tensors = [p for p in kernel.params if isinstance(p, TensorParam)]
    for p in tensors:                   # bases of derived dims: whole groups (K/8, K/64)
        for d in p.dims:
            if d.derived:
                sizes[d.base] = 128
    for p in tensors:
        shape = []
        for d in p.dims:
            if d.batch:
                shape += [2, 3]
            elif d.derived:
                shape.append(sizes[d.base] * d.mul // d.div + d.add)
            elif d.size is not None:          # a literal dim: its fixed size
                shape.append(d.size)
            elif d.joined:                    # "(G R)": one dim of G * R
                shape[-1] *= sizes.setdefault(d.name, 2)
            else:
                shape.append(sizes.setdefault(d.name, SIZES[len(sizes) % len(SIZES)]))
        dt = dtype if p.dtype_var else p.dtype.torch
        t = torch.randn(shape, generator=gen).to(dt) if dt.is_floating_point else \
            torch.ones(shape, dtype=dt) if dt == torch.bool else \
            torch.randint(1, 3, shape, generator=gen).to(dt)   # indices, block numbers, lengths
        args.append(t.requires_grad_(requires_grad and dt.is_floating_point))
    args += [p.pytype(1) for p in kernel.params       # required runtime scalars (after tensors)
             if isinstance(p, ScalarParam) and not p.has_default]
    return args


def _float_outputs(kernel, args):
    return [o for o in kernel.graph(*args).outputs if o.dtype.is_float]


def _reference_grads(kernel, args, dys):
    leaves = [a.detach().clone().requires_grad_(a.requires_grad)
              if isinstance(a, torch.Tensor) else a for a in args]
    out = kernel.reference(*leaves)
    outs = out if isinstance(out, tuple) else (out,)
    pairs = [(o, d) for o, d in zip(outs, dys) if d is not None]
    wrt = [t for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad]
    return torch.autograd.grad([o for o, _ in pairs], wrt, [d for _, d in pairs],
                               allow_unused=True)


@pytest.mark.parametrize("name,kernel", KERNELS, ids=[n for n, _ in KERNELS])
def test_opcheck_every_example(name, kernel):
    op = kernel.as_op(f"mf_test::{name.replace('.', '_')}")
    torch.library.opcheck(op.op, tuple(_inputs(kernel, requires_grad=_differentiable(kernel))))


def _differentiable(kernel) -> bool:
    """Whether autodiff derives this kernel's backward (argmax, gathers and per-group
    broadcasts it refuses, with an error at the call)."""
    try:
        autodiff.derive(kernel.graph(T="f32"))
    except NotDifferentiable:
        return False
    return True


DIFFERENTIABLE = [(n, k) for n, k in KERNELS if _differentiable(k)]


@pytest.mark.parametrize("name,kernel", DIFFERENTIABLE, ids=[n for n, _ in DIFFERENTIABLE])
def test_gradients_match_reference(name, kernel):
    args = _inputs(kernel, seed=1, requires_grad=True)
    out = kernel(*args)
    outs = out if isinstance(out, tuple) else (out,)
    gen = torch.Generator().manual_seed(2)
    dys = [torch.randn(o.shape, generator=gen) if o.dtype.is_floating_point else None
           for o in outs]
    wrt = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    pairs = [(o, d) for o, d in zip(outs, dys) if d is not None]
    got = torch.autograd.grad([o for o, _ in pairs], wrt, [d for _, d in pairs],
                              allow_unused=True)
    want = _reference_grads(kernel, args, dys)
    for a, g, w in zip(wrt, got, want):
        w = torch.zeros_like(a) if w is None else w
        assert g is not None and g.shape == a.shape and g.dtype == a.dtype
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


def _rms_norm():
    return dict(KERNELS)["rms_norm.rms_norm"]


def test_rms_norm_backward_is_one_row_kernel_and_one_column_kernel():
    g = _rms_norm().graph(T="f16")
    bw = autodiff.derive(g)
    assert [schedule.family(k) for k in bw.kernels] == ["row", "column"]
    dx_kernel, dw_kernel = bw.kernels
    assert {t.name for t in dx_kernel.tensors} == {"x", "w", "dy"}        # each read once
    assert [o.axes for o in dx_kernel.outputs] == [("B", "D"), ("B",)]     # dx, sum_D per row
    assert {t.name for t in dw_kernel.tensors} == {"x", "dy", "sum_D"}
    assert bw.grads == {"x": (0, 0), "w": (1, 0)}
    assert bw.reads == ("x", "w")
    src = _rms_norm().backward_source(T="f16", D=1000)
    assert "rms_norm_backward1" in src and "rms_norm_backward2" in src


def test_elementwise_backward_is_one_elementwise_kernel():
    silu = dict(KERNELS)["silu.silu"]
    bw = autodiff.derive(silu.graph(T="f32"))
    assert [schedule.family(k) for k in bw.kernels] == ["elementwise"]
    swiglu = dict(KERNELS)["swiglu.swiglu"]
    bw = autodiff.derive(swiglu.graph(T="f32"))
    assert [schedule.family(k) for k in bw.kernels] == ["elementwise"]
    assert len(bw.kernels[0].outputs) == 2                 # dgate and dup in one launch


def test_broadcast_input_gradient_is_summed_over_broadcast_axis():
    bias_scale = dict(KERNELS)["bias_scale.bias_scale"]
    x = torch.randn(9, 12, requires_grad=True)
    b = torch.randn(12, requires_grad=True)
    y = bias_scale(x, b, 0.25)
    dy = torch.randn(9, 12)
    y.backward(dy)
    torch.testing.assert_close(b.grad, (dy * 0.25).sum(0))
    torch.testing.assert_close(x.grad, dy * 0.25)


@settings(max_examples=8, deadline=None)
@given(lead=st.lists(st.integers(1, 4), min_size=0, max_size=2), d=st.integers(1, 300),
       dtype=st.sampled_from([torch.float32, torch.float16]))
def test_rms_norm_gradients_any_shape(lead, d, dtype):
    k = _rms_norm()
    x = torch.randn(*lead, d).to(dtype).requires_grad_()
    w = torch.randn(d).to(dtype).requires_grad_()
    dy = torch.randn(*lead, d).to(dtype)
    gx, gw = torch.autograd.grad(k(x, w), [x, w], dy)
    rx, rw = _reference_grads(k, [x, w], [dy])
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(gx, rx, rtol=tol, atol=tol)
    torch.testing.assert_close(gw, rw, rtol=tol, atol=tol * max(1, len(lead) and 4))


def test_compile_fullgraph_and_export_record_the_op():
    op = _rms_norm().as_op("mf_test::rms_norm_compiled")
    x = torch.randn(2, 3, 24, requires_grad=True)
    w = torch.randn(24, requires_grad=True)
    f = torch.compile(lambda x, w: (op(x, w, eps=1e-5) * 2).sum(), fullgraph=True,
                      backend="aot_eager")
    f(x, w).backward()
    gx, gw = x.grad, w.grad
    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    ((x2 * torch.rsqrt((x2 * x2).mean(-1, keepdim=True) + 1e-5) * w2) * 2).sum().backward()
    torch.testing.assert_close(gx, x2.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gw, w2.grad, rtol=1e-4, atol=1e-5)

    class M(torch.nn.Module):
        def forward(self, x, w):
            return op(x, w)
    ep = torch.export.export(M(), (torch.randn(4, 5, 24), torch.randn(24)))
    targets = [n.target for n in ep.graph.nodes if n.op == "call_function"]
    assert torch.ops.mf_test.rms_norm_compiled.default in targets


def test_compiled_gradient_of_a_transposed_input_flows_back_through_a_view():
    """The backward operator's fake gradients are contiguous, as the kernels write them: with
    `empty_like` of a transposed input (attention's heads, [B, S, H, E] -> [B, H, S, E]) the
    compiled backward took a `.view` of the real gradient ("view size is not compatible")."""
    op = dict(KERNELS)["silu.silu"].as_op("mf_test::silu_transposed")
    x = torch.randn(4, 6, requires_grad=True)
    c = torch.arange(6.0)
    f = torch.compile(lambda x: (op(x.view(2, 2, 6).transpose(0, 1)) * c).sum(),
                      fullgraph=True, backend="aot_eager")
    f(x).backward()
    xr = x.detach().clone().requires_grad_()
    (torch.nn.functional.silu(xr.view(2, 2, 6).transpose(0, 1)) * c).sum().backward()
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-5, atol=1e-6)


def test_schema_has_scalars_consts_and_defaults():
    @mf.kernel
    def scaled(x: "T[R, D]", m: "bool[R, D]", s: float = 0.5, k: mf.Const[int] = 2,
               flip: mf.Const[bool] = False):
        y = mf.where(m, x * s, x) * k
        return -y if flip else y
    op = scaled.as_op("mf_test::scaled")
    assert op.schema == ("(Tensor x, Tensor m, float s=0.5, int k=2, bool flip=False) -> "
                         "Tensor")
    x = torch.randn(4, 6, requires_grad=True)
    m = torch.rand(4, 6) > 0.5
    y = op(x, m, flip=True)
    torch.testing.assert_close(y, -torch.where(m, x * 0.5, x) * 2)
    y.sum().backward()                                      # bool mask: no gradient, no error
    torch.testing.assert_close(x.grad, -torch.where(m, 0.5, 1.0) * 2)
    torch.library.opcheck(op.op, (x.detach().requires_grad_(), m, 0.25, 3, True))


def test_no_derivative_is_a_clear_error_at_the_call():
    argmax = dict(KERNELS)["row_argmax.row_argmax"]
    x = torch.randn(4, 9, requires_grad=True)
    with pytest.raises(NotDifferentiable, match="row_argmax.*no derivative"):
        argmax(x)
    op = argmax.as_op("mf_test::argmax_grad")
    with pytest.raises(NotDifferentiable, match="row_argmax"):
        op(x)
    assert torch.equal(argmax(x.detach()), x.detach().argmax(-1))

    @mf.kernel
    def rowprod(x: "T[R, D]"):
        return mf.prod(x, axis="D")
    with pytest.raises(NotDifferentiable, match="mf.prod"):
        rowprod(x)


def test_op_name_errors():
    k = _rms_norm()
    with pytest.raises(OpError, match="namespace::name"):
        k.as_op("rms_norm")
    assert k.as_op("mf_test::again") is k.as_op("mf_test::again")
    silu = dict(KERNELS)["silu.silu"]
    with pytest.raises(OpError, match="already registered"):
        silu.as_op("mf_test::again")
    with pytest.raises(OpError, match="PyTorch already has"):
        silu.as_op("aten::relu")


def test_gradients_of_every_differentiable_op():
    @mf.kernel
    def many(x: "T[R, D]", y: "T[R, D]", v: "T[D]", p: float = 1.5):
        a = mf.exp(x) + mf.log(y) + mf.sqrt(y) + mf.rsqrt(y) + mf.sin(x) * mf.cos(v)
        b = mf.tanh(x) * mf.sigmoid(v) + mf.erf(x) + mf.abs(x) * mf.exp2(x) + mf.log2(y)
        c = mf.maximum(x, v) - mf.minimum(x, 0.25) + mf.clamp(x, -0.5, 0.5) + y ** p
        d = (x % 0.7) + x / y + mf.where(x > v, x * x, -y) + mf.floor(x) * x
        return a + b + c + d

    @mf.kernel
    def reductions(x: "T[R, D]", v: "T[R]"):
        r = mf.max(x, axis="D") * 2 + mf.min(x, axis="D") + mf.mean(x * v, axis="D")
        return r + mf.logsumexp(x, axis="D")

    gen = torch.Generator().manual_seed(3)
    x = torch.randn(6, 37, generator=gen).requires_grad_()
    y = (torch.rand(6, 37, generator=gen) + 0.5).requires_grad_()
    v = torch.randn(37, generator=gen).requires_grad_()
    dy = torch.randn(6, 37, generator=gen)
    got = torch.autograd.grad(many(x, y, v), [x, y, v], dy)
    want = _reference_grads(many, [x, y, v], [dy])
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)

    xt = torch.randn(6, 37, generator=gen).round().requires_grad_()    # ties in max and min
    vr = torch.randn(6, generator=gen).requires_grad_()
    dr = torch.randn(6, generator=gen)
    got = torch.autograd.grad(reductions(xt, vr), [xt, vr], dr)
    want = _reference_grads(reductions, [xt, vr], [dr])
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


def test_cli_show_backward(capsys):
    from metalforge.cli import main
    assert main(["show", f"{ROOT / 'examples' / 'rms_norm.py'}::rms_norm", "--backward",
                 "--dtype", "f16"]) == 0
    out = capsys.readouterr().out
    assert "// backward kernel 1 of 2 of 'rms_norm': writes dx, sum_D; reads x, w, dy" in out
    assert 'host_name("rms_norm_backward2_f16_column")' in out
    assert main(["show", f"{ROOT / 'examples' / 'row_argmax.py'}::row_argmax",
                 "--backward"]) == 1
    assert "no derivative" in capsys.readouterr().err


def test_double_backward_is_refused_clearly():
    silu = dict(KERNELS)["silu.silu"]
    x = torch.randn(4, 8, requires_grad=True)
    with pytest.raises(NotDifferentiable, match="double backward"):
        torch.autograd.grad(silu(x).sum(), x, create_graph=True)
    op = silu.as_op("mf_test::silu_double")
    # the operator gives first-order gradients (eagerly through the direct call's autograd,
    # else through its backward op), which refuse to be differentiated
    g, = torch.autograd.grad(op(x).sum(), x, create_graph=True)
    torch.testing.assert_close(g, torch.autograd.grad(silu(x).sum(), x)[0], rtol=0, atol=0)
    with pytest.raises(NotDifferentiable, match="silu_double_backward: double backward"):
        torch.autograd.grad((g * g).sum(), x)
    g, = torch.autograd.grad(op.dispatched(x).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="silu_double_backward"):
        torch.autograd.grad(g.sum(), x)


def test_check_compares_gradients_and_catches_a_wrong_one(monkeypatch):
    from metalforge.testing import check
    silu = dict(KERNELS)["silu.silu"]
    assert check(silu, dtypes={"T": ["f32"]}, max_examples=3, grad=True).examples >= 3
    real = autodiff._contributions

    def off_by_one_percent(b, n, g):
        out = real(b, n, g)
        if n.op == "unary" and n.attr == "sigmoid":
            return [(i, b.scale(c, 1.01)) for i, c in out]
        return out
    monkeypatch.setattr(autodiff, "_contributions", off_by_one_percent)
    monkeypatch.setattr(autodiff, "_cache", OnceMap())
    with pytest.raises(AssertionError, match="gradient with respect to 'x'"):
        check(silu, dtypes={"T": ["f32"]}, max_examples=5, grad=True)
    check(silu, dtypes={"T": ["f32"]}, max_examples=3)       # off by default; outputs are right
