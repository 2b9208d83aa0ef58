"""Schedule building blocks, each on its own: the one ir.LoweredKernel constructor, per-variant
state of the reduction builders, the elementwise vector path (its condition, positions found
once per chunk), the packed-word block."""
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import metalforge as mf
from metalforge import ir, quant, schedule
from metalforge.schedule.base import host_name, make_kernel


@mf.kernel
def scaled(x: "T[R, D]", w: "T[D]", k: mf.Const[int]):
    return x * w * k


@mf.kernel
def layer_norm(x: "T[R, D]"):
    mu = mf.mean(x, axis="D")
    var = mf.mean((x - mu) ** 2, axis="D")
    return (x - mu) * mf.rsqrt(var + 1e-5)


def test_make_kernel_names_template_and_instance():
    g = scaled.graph(T="f16", k=3)
    threads = (ir.ThreadInput("mf_tid", "uint", "thread_position_in_grid"),)
    k = make_kernel(g, False, threads, [ir.Return()], "a summary")
    assert (k.name, k.op, k.template) == ("mf_scaled", "scaled", ("T", "mf_index_t"))
    assert k.instances == (ir.Instance("scaled_f16_k_3", ("half", "uint")),)
    k64 = make_kernel(g, True, threads, [], "", variant="looped")
    assert k64.name == "mf_scaled_looped"
    assert k64.instances[0] == ir.Instance("scaled_f16_k_3_idx64_looped", ("half", "ulong"))
    assert host_name(g, True) == "scaled_f16_k_3_idx64"


def test_each_row_variant_keeps_its_own_state():
    s = schedule.plan(layer_norm.graph(T="f32"))
    # two phases (mean, then variance) and an epilogue: registers read x once per row, the
    # looped variant streams it once per phase and once more for the outputs (with the launch
    # option centered, once for the mean and variance together)
    assert s.passes["simd"] == {"x": 1} and s.passes["group"] == {"x": 1}
    assert s.passes["looped"] == {"x": 3}
    one = schedule.plan(layer_norm.graph(T="f32"), {"centered": True})    # (x - mu) ** 2
    assert one.passes["looped"] == {"x": 2}
    # threadgroup scratch only where partials cross simdgroups, declared per variant
    tg = {v: [st for st in k.body if isinstance(st, ir.ArrayDecl) and st.space == "threadgroup"]
          for v, k in s.variants.items()}
    assert tg["simd"] == [] and len(tg["group"]) == 2 and len(tg["looped"]) == 2
    # one parameter list and helper set shared by the variants
    assert len({k.params for k in s.kernels}) == 1 and len({k.helpers for k in s.kernels}) == 1


def test_vector_condition_checks_broadcast_rows_hold_whole_chunks():
    s = schedule.plan(scaled.graph(T="f32", k=2), {"vector_width": 4})
    src = ir.dump(s.kernel)
    assert "let mf_vec_ok: bool = mf_size_D % 4 == 0" in src
    assert "if mf_start + 4 <= mf_numel && mf_vec_ok:" in src
    scalar_only = schedule.plan(scaled.graph(T="f32", k=2), {"vector_width": 1})
    assert "mf_vec_ok" not in ir.dump(scalar_only.kernel)


def test_unpack_value_reads_every_field_of_a_word():
    """The packed-word block on its own: an MSL kernel built from `unpack_value` extracts each
    `bits`-bit field of random words exactly as metalforge.quant.unpack (MLX's layout)."""
    from metalforge.codegen.msl import expr
    from metalforge.schedule.lower import unpack_value
    from metalforge.sim import compile_shader

    for bits in (2, 4, 8):
        per = 32 // bits
        value = unpack_value(ir.Var("w"), ir.Var("i") % ir.Lit(per, "uint") * ir.Lit(bits, "uint"),
                             bits)
        lib = compile_shader(
            "#include <metal_stdlib>\nusing namespace metal;\n"
            "kernel void f(device const uint* words [[buffer(0)]], device int* out [[buffer(1)]],"
            " uint i [[thread_position_in_grid]]) {\n"
            f"    const uint w = words[i / {per}u];\n    out[i] = {expr(value)};\n}}\n")
        words = torch.randint(0, 2 ** 32, (16,), dtype=torch.int64).to(torch.uint32)
        out = torch.empty(16 * per, dtype=torch.int32)
        lib.f(words, out, threads=out.numel())
        assert torch.equal(out, quant.unpack(words[None], bits=bits)[0])


@mf.kernel
def outer_bias(x: "T[A, B, C]", b: "T[A, C]", s: "T[B]"):
    return x * s + b * mf.index("C") - mf.index("B")


@mf.kernel
def unpack_scale(wq: "u32[N, K/PER]", scales: "T[N, K/GS]", PER: mf.Const[int] = 8,
                 GS: mf.Const[int] = 16) -> "T[N, K]":
    return mf.unpack(wq, bits=32 // PER) * scales


@settings(max_examples=12, deadline=None)
@given(a=st.integers(1, 3), b=st.integers(1, 5), c=st.sampled_from([1, 3, 4, 8, 12, 13, 16]),
       dtype=st.sampled_from(["f32", "f16"]))
def test_vector_chunks_find_positions_once_per_chunk(a, b, c, dtype):
    """The vector path computes a chunk's positions once (every position but the innermost is
    the chunk's): broadcast inputs, mf.index of an outer and the innermost axis, rows that do
    and do not hold whole chunks, against the reference."""
    dt = {"f32": torch.float32, "f16": torch.float16}[dtype]
    x, bias, s = torch.randn(a, b, c).to(dt), torch.randn(a, c).to(dt), torch.randn(b).to(dt)
    torch.testing.assert_close(outer_bias(x, bias, s), outer_bias.reference(x, bias, s),
                               rtol=2e-3, atol=2e-3)


def test_unpacked_values_take_their_slot_from_the_chunk():
    """Unpacking with whole words per chunk (8 f16 values per 8-nibble word), whole chunks per
    word (4 f32 values of an 8-value word), 2-, 8- and 16-bit words, K a multiple of the word
    and not of the vector width: each value's bit offset comes from its chunk."""
    for per, dt in ((8, torch.float16), (8, torch.float32), (16, torch.float32),
                    (4, torch.float16), (2, torch.float32)):
        bits = 32 // per
        for k in (per * 2, per * 6, 96):
            if k % per or k % 16:
                continue
            words = torch.randint(0, 2 ** 32, (3, k // per), dtype=torch.int64).to(torch.uint32)
            scales = torch.randn(3, k // 16).to(dt)
            got = unpack_scale(words, scales, PER=per)
            w = words.to(torch.int64)[..., None] >> (bits * torch.arange(per))   # lowest first
            values = (w & (2 ** bits - 1)).flatten(-2)
            want = values.to(dt) * scales.repeat_interleave(16, 1)
            torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
