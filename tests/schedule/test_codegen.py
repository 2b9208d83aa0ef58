"""Schedule → IR → MSL text: golden snippets where the text matters, variants, policy checks.

Graphs are built by hand here so these tests pin the backend alone; the runtime tests run the
same kernels through the tracer and the simulator.
"""
from importlib import resources

import pytest
import torch

from metalforge import ir, schedule, sim
from metalforge.codegen import render_msl
from metalforge.codegen.msl import HELPERS
from metalforge.dtypes import BOOL, F16, F32, I64
from metalforge.graph import AxisSpec, Graph, Node, Output, ScalarParam, TensorParam
from metalforge.schedule import LaunchError, UnsupportedConstruct


def tensor(name, dtype, axes, var="T"):
    dims = tuple(AxisSpec(a, batch=a == "B") for a in axes)
    ann = f"{var or dtype.name}[{', '.join(('*' + a) if a == 'B' else a for a in axes)}]"
    return TensorParam(name, dtype, var, dims, ann)


def load(p):
    return Node("load", (), p.dtype, p.axes, p.name)


def bias_scale(dtype=F16):
    x, b = tensor("x", dtype, ("R", "D")), tensor("bias", dtype, ("D",))
    s = ScalarParam("scale", float, F32, 0.5, True)
    add = Node("binary", (load(x), load(b)), dtype, ("R", "D"), "add")
    mul = Node("binary", (add, Node("scalar", (), F32, (), "scale")), dtype, ("R", "D"), "mul")
    return Graph("bias_scale", (x, b, s), (Output(mul, ("R", "D"), dtype),),
                 dtype_vars={"T": dtype})


def test_signature_golden():
    src = render_msl(schedule.plan(bias_scale()).kernel)
    want = """\
template <typename T, typename mf_index_t>
kernel void mf_bias_scale(
    device const T* x [[buffer(0)]],
    device const T* bias [[buffer(1)]],
    device T* mf_out [[buffer(2)]],
    constant float& scale [[buffer(3)]],
    constant mf_index_t& mf_numel [[buffer(4)]],
    constant mf_index_t& mf_size_D [[buffer(5)]],
    uint mf_tid [[thread_position_in_grid]])
{"""
    assert want in src
    inst = 'template [[host_name("bias_scale_f16")]] kernel void mf_bias_scale<half, uint>('
    assert inst in src
    assert "    constant uint& mf_numel [[buffer(4)]]," in src
    assert src.startswith("#include <metal_stdlib>\nusing namespace metal;\n")


def test_vector_phase_golden():
    src = render_msl(schedule.plan(bias_scale(), {"vector_width": 4}).kernel)
    want = """\
    if (mf_start + 4u <= mf_numel && mf_vec_ok) {
        // load: 4-wide vectors from the contiguous inputs
        const vec<T, 4> mf_x_v = *reinterpret_cast<device const vec<T, 4>*>(x + mf_start);
        const vec<T, 4> mf_bias_v = *reinterpret_cast<device const vec<T, 4>*>(bias + mf_start % mf_size_D);
        vec<T, 4> mf_out_v;
        // compute each lane
        for (uint mf_k = 0u; mf_k < 4u; ++mf_k) {
            // compute (f16/bf16 in f32)
            const float mf_in_x = float(mf_x_v[mf_k]);
            const float mf_bias = float(mf_bias_v[mf_k]);
            const float mf_v1 = mf_in_x + mf_bias;
            const float mf_v2 = mf_v1 * scale;
            // store
            mf_out_v[mf_k] = T(mf_v2);
        }
        // store: 4-wide vectors
        *reinterpret_cast<device vec<T, 4>*>(mf_out + mf_start) = mf_out_v;
    } else {"""  # noqa: E501  (generated text, as printed)
    assert want in src
    assert "const bool mf_vec_ok = mf_size_D % 4u == 0u;" in src
    # the tail is guarded element by element
    assert "if (mf_i < mf_numel) {" in src
    assert "mf_out[mf_i] = T(mf_v2);" in src


def test_one_statement_per_line_and_mf_prefix():
    src = render_msl(schedule.plan(bias_scale()).kernel)
    body = src.split("{", 1)[1]
    for line in body.splitlines():
        assert line.count(";") <= 1 or line.lstrip().startswith("for ("), line
    declared = [ln.split("=")[0].split()[-1] for ln in body.splitlines()
                if ln.strip().startswith("const ") and "=" in ln]
    assert declared and all(n.startswith("mf_") for n in declared)


def test_index64_variant():
    k = schedule.plan(bias_scale(), index64=True).kernel
    src = render_msl(k)
    assert 'host_name("bias_scale_f16_idx64")' in src
    assert "mf_bias_scale<half, ulong>" in src
    assert "constant ulong& mf_numel [[buffer(4)]]" in src
    assert k.param_for(("numel",)).cast is None          # ulong ← Python int (int64): no cast
    assert schedule.plan(bias_scale()).kernel.param_for(("numel",)).cast == "int32"
    assert schedule.needs_index64({"R": 2, "D": 2 ** 31}, 2 ** 32)
    assert not schedule.needs_index64({"R": 2, "D": 2 ** 20}, 2 ** 21)


def test_broadcast_indexing_forms():
    # w[R] over [R, D] is a prefix: i / size(D); u[D, R] is a transposed subset: positions
    x, w, u = tensor("x", F32, ("R", "D")), tensor("w", F32, ("R",)), tensor("u", F32, ("D", "R"))
    e = Node("binary", (Node("binary", (load(x), load(w)), F32, ("R", "D"), "mul"), load(u)),
             F32, ("R", "D"), "add")
    g = Graph("bc", (x, w, u), (Output(e, ("R", "D"), F32),), dtype_vars={"T": F32})
    src = render_msl(schedule.plan(g).kernel)
    assert "w[mf_i / mf_size_D]" in src
    assert "const mf_index_t mf_pos_R = mf_i / mf_size_D;" in src
    assert "const mf_index_t mf_pos_D = mf_i % mf_size_D;" in src
    assert "u[mf_pos_D * mf_size_R + mf_pos_R]" in src


def test_scalar_widths_and_casts():
    x = tensor("x", F32, ("N",))
    flag = ScalarParam("flag", bool, BOOL, False, True)
    n = ScalarParam("n", int, I64, 1, True)
    v = Node("where", (Node("scalar", (), BOOL, (), "flag"), load(x),
                       Node("cast", (Node("scalar", (), I64, (), "n"),), F32, ())), F32, ("N",))
    g = Graph("pick", (x, flag, n), (Output(v, ("N",), F32),), dtype_vars={"T": F32})
    k = schedule.plan(g).kernel
    src = render_msl(k)
    assert "constant bool& flag [[buffer(2)]]" in src
    assert "constant long& n [[buffer(3)]]" in src
    assert k.param_for(("scalar", "flag")).cast == "uint8"
    assert k.param_for(("scalar", "n")).cast is None


def test_reserved_names_are_renamed():
    x = tensor("max", F32, ("N",))
    e = Node("unary", (load(x),), F32, ("N",), "exp")
    g = Graph("k", (x,), (Output(e, ("N",), F32),), dtype_vars={"T": F32})
    src = render_msl(schedule.plan(g).kernel)
    assert "device const T* mf_p_max [[buffer(0)]]" in src
    assert "precise::exp(" in src


def test_reduction_over_two_axes_is_a_clear_error():
    x = tensor("x", F32, ("R", "D"))
    r = Node("reduce", (load(x),), F32, ("R",), ("sum", "D"), loc=("user.py", 12))
    r2 = Node("reduce", (load(x),), F32, ("D",), ("sum", "R"), loc=("user.py", 13))
    both = Node("binary", (r, r2), F32, ("R", "D"), "add")      # two sets of axes: {D}, {R}
    g = Graph("total", (x,), (Output(both, ("R", "D"), F32),), dtype_vars={"T": F32})
    with pytest.raises(UnsupportedConstruct, match=r"several axes.*mf\.sum.*'R'.*user\.py:13"):
        schedule.plan(g)


def test_policy_overrides_and_validation():
    g = bias_scale()
    s = schedule.plan(g, {"vectors_per_thread": 2, "threads_per_group": 128, "small_grid": 0})
    assert s.policy.elements_per_thread == 16          # 2 x 8 halves (16-byte vectors)
    assert s.launch({"R": 3, "D": 100}) == (19, 19)
    # grids of fewer than small_grid elements take the small kernel: 4 halves a vector
    s = schedule.plan(g, {"vectors_per_thread": 2, "threads_per_group": 128, "small_grid": 301})
    assert s.launch({"R": 3, "D": 100}) == (38, 38)
    assert s.host_name({"R": 3, "D": 100}).endswith("_small")
    assert s.launch({"R": 3, "D": 101}) == (19, 19)
    with pytest.raises(LaunchError, match=r"small_grid must be an int >= 0 \(0: never"):
        schedule.plan(g, {"small_grid": -1})
    s = schedule.plan(g, {"vectors_per_thread": 2, "vector_width": 4})
    assert s.policy.elements_per_thread == 8
    assert s.launch({"R": 3, "D": 100}) == (38, 38)
    assert schedule.plan(g, {"vector_width": 1}).vector_inputs == ()
    with pytest.raises(LaunchError, match="exceeds Metal's limit of 1024"):
        schedule.plan(g, {"threads_per_group": 2048})
    with pytest.raises(LaunchError, match="'rows_per_group'.*do not apply.*elementwise"):
        schedule.plan(g, {"rows_per_group": 2})
    with pytest.raises(LaunchError, match="vector_width must be 1, 2, 4 or 8"):
        schedule.plan(g, {"vector_width": 3})
    with pytest.raises(LaunchError, match="max_threads_per_threadgroup=512"):
        schedule.policy.validate_for_kernel(s.policy.__class__("elementwise", 1024), "k", 512)
    simd = schedule.policy.LaunchPolicy("row", threads_per_group=100, uses_simd=True)
    with pytest.raises(LaunchError, match="multiple of 32"):
        schedule.policy.validate(simd)
    big = schedule.policy.LaunchPolicy("row", threadgroup_bytes=40000)
    with pytest.raises(LaunchError, match="32768-byte limit"):
        schedule.policy.validate(big)


def test_traffic_counts_each_tensor_once():
    s = schedule.plan(bias_scale())
    t = s.traffic({"R": 10, "D": 64})
    assert (t.read, t.written) == (10 * 64 * 2 + 64 * 2, 10 * 64 * 2)


def test_ir_dump_is_readable():
    text = ir.dump(schedule.plan(bias_scale(), {"vector_width": 4}).kernel)
    assert "kernel mf_bias_scale<T, mf_index_t>" in text
    assert "instance bias_scale_f16: T=half, mf_index_t=uint" in text
    assert "[3] scale: float (scalar; scalar scale)" in text
    assert "[4] mf_numel: mf_index_t (scalar; element count, arg_cast int32)" in text
    assert "let mf_x_v: vec<T, 4> = x[mf_start : +4]" in text
    assert "store mf_out[mf_start : +4] = mf_out_v" in text


def test_helpers_file_compiles_whole_and_computes():
    """helpers.metal (every helper a generated kernel may include) compiled as one library by
    the simulator, with a kernel that instantiates and calls each of them."""
    text = resources.files("metalforge.codegen").joinpath("helpers.metal").read_text()
    kernel = """
kernel void all_helpers(device float* f [[buffer(0)]], device int* n [[buffer(1)]],
                        uint i [[thread_position_in_grid]]) {
    float x = float(i) * 0.25f - 2.0f;
    float c = 0.0f, m = -INFINITY, m2 = x;
    const float s = mf_sum_add(c, 1.0f, x) + mf_online_add(m, c, 0.0f, x)
        + mf_online_merge(m2, 1.0f, m, 1.0f) + mf_simd_online(m2, 1.0f);
    float v = x, w = x;
    int iv = int(i);
    const uint a = mf_simd_argmax(v, i) + mf_simd_argmin(w, i) + mf_simd_iargmax(iv, i)
        + mf_simd_iargmin(iv, i);
    f[i * 4] = mf_erf(x);
    f[i * 4 + 1] = mf_maximum(x, 0.0f) + mf_minimum(x, 0.0f) + mf_pow(x, 2.0f)
        + mf_fremainder(x, 1.5f) + mf_simd_max(x) + mf_simd_min(x) + s + float(a);
    f[i * 4 + 2] = mf_fremainder(x, 1.5f);
    const mf_pack8<float> p8 = mf_pack8_of(x, x, x, x, x, x, x, x);
    f[i * 4 + 3] = mf_pow(x, 3.0f) + (mf_lane8(p8, 7u) - x);
    const int k = int(i) - 16;
    n[i * 4] = mf_floordiv(k, 3);
    n[i * 4 + 1] = mf_remainder(k, 3);
    n[i * 4 + 2] = mf_ipow(k, 3) + mf_shl(k, 40) + mf_shr(k, -1);
    n[i * 4 + 3] = mf_shr(k, 2);
}
"""
    # mf_tensor_ops is Metal 4's tensor-op header (an include, no function), which the Metal 4
    # kernels that use it compile at their target (tests/schedule/test_matmul.py)
    metal4 = "// helper: mf_tensor_ops\n" + HELPERS["mf_tensor_ops"] + "\n"
    assert metal4 in text
    text = text.replace(metal4, "")
    # each helper defines a function of its name (mf_coherent: mf_coherent_load / _store)
    assert all(f"mf_{name[3:]}(" in text or f"mf_{name[3:]}_load(" in text
               for name in HELPERS if name != "mf_tensor_ops")
    lib = sim.compile_shader(text + kernel)
    f, n = torch.zeros(32 * 4), torch.zeros(32 * 4, dtype=torch.int32)
    lib.all_helpers(f, n, threads=32, group_size=32)
    x = torch.arange(32) * 0.25 - 2.0
    k = torch.arange(32, dtype=torch.int32) - 16
    torch.testing.assert_close(f[0::4], torch.erf(x), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(f[2::4], torch.remainder(x, 1.5))
    torch.testing.assert_close(f[3::4], x ** 3)
    assert torch.equal(n[0::4], torch.div(k, 3, rounding_mode="floor").int())
    assert torch.equal(n[1::4], torch.remainder(k, 3).int())
    assert torch.equal(n[3::4], k >> 2)
