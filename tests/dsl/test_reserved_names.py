"""Any Python identifier names a parameter, a dtype variable or an axis: names that are C++ or
Metal keywords, types and functions the generated code uses, macros, or look like metalforge's
own `mf_` variables are spelled so that the generated Metal compiles and means what it says.
Each kernel runs through the simulator against `.reference` (issue #48)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import metalforge as mf

# C++ and Metal keywords, Metal types and functions, a header macro, metalforge-looking names
PARAM_NAMES = [
    "default", "register", "case", "double", "operator", "sizeof", "volatile", "public",
    "export", "switch", "goto", "auto", "inline", "static_cast", "xor_eq", "device", "constant",
    "threadgroup", "thread", "kernel", "half", "bfloat", "vec", "float", "int", "uint", "long",
    "float4", "packed_half4", "metal", "precise", "min", "select", "simd_sum",
    "threadgroup_barrier", "NAN", "INFINITY", "mf_out", "mf_x", "out", "v1", "start", "numel",
    "tid", "size_D", "index_t", "mf_index_t", "T"]
TYPE_NAMES = ["vec", "device", "thread", "kernel", "sizeof", "default", "constant", "register",
              "mf_out", "mf_index_t"]
AXIS_NAMES = ["default", "register", "kernel", "vec", "thread", "t", "sizeof", "mf_x"]


def _chunks(names: list[str], n: int) -> list[tuple[str, ...]]:
    """`names` in groups of `n`: one kernel names several parameters (compiles are the cost)."""
    return [tuple(names[i:i + n]) for i in range(0, len(names), n)]


def _kernel(src: str, name: str) -> mf.Kernel:
    ns: dict = {"mf": mf}
    exec(compile(src, f"<{name}>", "exec"), ns)
    return mf.kernel(ns["f"], name=name)


def _same(kernel: mf.Kernel, *args) -> None:
    torch.testing.assert_close(kernel(*args), kernel.reference(*args), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("names", _chunks(PARAM_NAMES, 7), ids="-".join)
def test_parameter_names_elementwise(names):
    """Every name but the last a tensor, the last a runtime scalar."""
    *tensors, scalar = names
    params = ", ".join([f'{n}: "T[N]"' for n in tensors] + [f"{scalar}: float"])
    k = _kernel(f"def f({params}):\n    return ({' + '.join(tensors)}) * {scalar}\n", "ew")
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(37, generator=g) for _ in tensors]        # vectors and a tail
    _same(k, *args, 0.5)


@pytest.mark.parametrize("names", _chunks(PARAM_NAMES, 7), ids="-".join)
def test_parameter_names_row_reduction(names):
    """An rms norm of the first name, scaled by the middle ones (weights over D), the last a
    runtime scalar."""
    x, *weights, scalar = names
    params = ", ".join([f'{x}: "T[R, D]"'] + [f'{n}: "T[D]"' for n in weights] +
                       [f"{scalar}: float"])
    scale = " * ".join(weights) if weights else "1.0"
    k = _kernel(f"def f({params}):\n"
                f'    y = {x} * mf.rsqrt(mf.mean({x} * {x}, axis="D") + 1e-5) * {scale}\n'
                f'    return y - mf.max({x}, axis="D") * {scalar}\n', "row")
    g = torch.Generator().manual_seed(1)
    args = [torch.randn(5, 300, generator=g)] + [torch.randn(300, generator=g) for _ in weights]
    _same(k, *args, 0.25)


@pytest.mark.parametrize("names", _chunks(TYPE_NAMES, 2), ids="-".join)
def test_dtype_variable_names(names):
    a, b = names
    k = _kernel(f'def f(x: "{a}[R, D]", w: "{b}[D]"):\n'
                f'    return mf.softmax(x * w, axis="D"), x + w\n', "tv")
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(3, 70, generator=g).half(), torch.randn(70, generator=g).half()
    got, want = k(x, w), k.reference(x, w)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("names", _chunks(AXIS_NAMES, 2), ids="-".join)
def test_axis_names(names):
    """Two axes named `names`, their positions (`mf.index`) and sizes (`mf.size`) read in a
    row reduction and in an elementwise kernel."""
    r, d = names
    k = _kernel(f'def f(x: "T[{r}, {d}]"):\n'
                f'    y = x + mf.index("{d}") * 0.5 - mf.size("{d}") + mf.index("{r}")\n'
                f'    return y - mf.max(y, axis="{d}")\n', "ax")
    x = torch.randn(4, 45, generator=torch.Generator().manual_seed(3))
    _same(k, x)
    e = _kernel(f'def f(x: "T[{r}, {d}]"):\n'
                f'    return x * mf.index("{d}") + mf.index("{r}") * mf.size("{r}")\n', "ax_ew")
    _same(e, x)


@pytest.mark.parametrize("names", [("default", "register", "case", "operator"),
                                   ("device", "thread", "kernel", "half"),
                                   ("out", "v1", "mf_out", "NAN")])
@pytest.mark.parametrize("s", [1, 20])              # decode and prefill
def test_attention_names(names, s):
    q, k, v, scale = names
    kern = _kernel(
        f'def f({q}: "T[B, H, S, E]", {k}: "T[B, H, L, E]", {v}: "T[B, H, L, E]",\n'
        f'      {scale}: float):\n'
        f'    s = mf.sum({q} * {k}, axis="E") * {scale}\n'
        f'    return mf.sum(mf.softmax(s, axis="L") * {v}, axis="L")\n', "attn")
    g = torch.Generator().manual_seed(4)
    qt, kt, vt = (torch.randn(1, 2, n, 32, generator=g) for n in (s, 40, 40))
    torch.testing.assert_close(kern(qt, kt, vt, 0.2),
                               F.scaled_dot_product_attention(qt, kt, vt, scale=0.2),
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["default", "register", "out", "mf_out"])
def test_column_reduction_names(name):
    """A tensor named `name` beside one named `x`, reduced over a column and kept."""
    k = _kernel(f'def f(x: "T[R, D]", {name}: "T[R, D]"):\n'
                f'    y = x * {name}\n'
                f'    return mf.sum(y, axis="R"), y - mf.max(y, axis="R")\n', "col")
    g = torch.Generator().manual_seed(5)
    x, y = torch.randn(33, 21, generator=g), torch.randn(33, 21, generator=g)
    for a, b in zip(k(x, y), k.reference(x, y)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_ordinary_names_are_spelled_as_written():
    """Only names that need it change: the source reads like the description."""
    k = _kernel('def f(x: "T[N]", w: "T[N]"):\n    return x * w\n', "plain")
    src = k.source(torch.randn(8), torch.randn(8))
    assert "device const T* x " in src and "mf_x" in src
    d = _kernel('def f(default: "T[N]"):\n    return default * 2\n', "kw")
    src = d.source(torch.randn(8))
    assert "mf_p_default" in src and " default " not in src


def test_helper_words_are_the_helpers():
    from metalforge.codegen.msl import HELPERS
    from metalforge.schedule.names import HELPER_WORDS
    assert HELPER_WORDS == {h.removeprefix("mf_") for h in HELPERS}


@pytest.mark.parametrize("name", ["erf", "maximum", "floordiv", "default"])
def test_kernel_named_like_a_helper(name):
    """A kernel named after a helper it calls: its template is not the helper's name."""
    k = _kernel('def f(x: "T[R, D]", y: "T[R, D]"):\n'
                '    return mf.erf(mf.maximum(x, y)) + (x // 0.5)\n', name)
    g = torch.Generator().manual_seed(6)
    x, y = torch.randn(3, 40, generator=g), torch.randn(3, 40, generator=g)
    _same(k, x, y)
    src = k.source(x, y)
    assert (f"kernel void mf_{name}(" in src) == (name == "default"), src


def test_every_schedule_variable_is_reserved():
    """Every `mf_<name>` a schedule module spells out is reserved: a tensor or value named
    `<name>` is renamed (mf_in_<name>), so it can neither clash with nor be shadowed by the
    schedule's own variable (a tensor `w` beside the row kernels' lane width `mf_w` did not
    compile; one shadowed in an inner scope would read the wrong value)."""
    import re
    from pathlib import Path

    from metalforge.schedule import names
    root = Path(names.__file__).parent
    spelled = {m.group(1) for p in root.rglob("*.py")
               for m in re.finditer(r'"mf_([a-z][a-z0-9_]*)"', p.read_text())}
    loose = sorted(n for n in spelled if n not in names._SCHEDULE_NAMES
                   and not names._SCHEDULE_PATTERN.match(n))
    assert not loose, f"add to schedule/names.py's _SCHEDULE_NAMES: {loose}"


def test_a_tensor_named_like_a_schedule_variable_compiles():
    @mf.kernel
    def k(x: "T[N, K]", w: "T[K]", b: "T[N, M]"):
        return x * w + mf.sum(b, axis="M")
    x, w, b = torch.randn(3, 5), torch.randn(5), torch.randn(3, 4)
    torch.testing.assert_close(k(x, w, b), x * w + b.sum(1, keepdim=True))
