"""Conformance: MLX's Metal kernel library, unmodified, through metalforge.sim.

Set METALFORGE_MLX_SRC to an MLX checkout (the folder holding ``mlx/backend/metal/kernels``);
without it every test here is skipped, and nothing of MLX is in this repository.  Each kernel
file is read with its ``#include "mlx/..."`` headers inlined (each once, as ``#pragma once``
does), with ``#line`` markers so errors point into MLX's files.  Kernels run with the buffers
and grid MLX's host code (mlx/backend/metal/*.cpp) sets and are compared with ``mlx.core`` on
the CPU (optional test extra ``mlx``; those comparisons are skipped without it).
"""
import math
import os
import re
from pathlib import Path

import pytest
import torch

from metalforge.sim import compile_shader

MLX_SRC = os.environ.get("METALFORGE_MLX_SRC")
KDIR = "mlx/backend/metal/kernels/"
pytestmark = pytest.mark.skipif(
    not MLX_SRC or not (Path(MLX_SRC) / KDIR).is_dir(),
    reason="METALFORGE_MLX_SRC does not point to an MLX checkout")

_INCLUDE = re.compile(r'^\s*#\s*include\s+"(mlx/[^"]+)"')


def inline_mlx(rel: str, seen: set[str] | None = None) -> str:
    """MLX source file `rel` with its "mlx/..." includes inlined once each."""
    seen = set() if seen is None else seen
    if rel in seen:
        return ""
    seen.add(rel)
    out = [f'#line 1 "{rel}"']
    for n, line in enumerate((Path(MLX_SRC) / rel).read_text().split("\n"), 1):
        m = _INCLUDE.match(line)
        if m:
            out.append(inline_mlx(m.group(1), seen))
            out.append(f'#line {n + 1} "{rel}"')
        elif line.strip() == "#pragma once":
            out.append("")
        else:
            out.append(line)
    return "\n".join(out)


_libs: dict[str, object] = {}
# Files with kernels where lanes that returned leave a later threadgroup_barrier to the others
# (gemv.h: only lane 0 of each simdgroup meets the barrier of the threadgroup reduction); Apple
# GPUs run them, the simulator does with exited_leave_barriers.
EXITED_LEAVE_BARRIERS = {"gemv.metal"}


def library(name: str):
    if name not in _libs:
        _libs[name] = compile_shader(inline_mlx(KDIR + name),
                                     exited_leave_barriers=name in EXITED_LEAVE_BARRIERS)
    return _libs[name]


# file -> kernels to look up (files with many kernels compile lazily, per looked-up kernel)
FILES = {
    "rms_norm.metal": ["rmsfloat32", "rms_loopedfloat16", "vjp_rmsbfloat16"],
    "layer_norm.metal": ["layer_normfloat32", "layer_norm_loopedbfloat16"],
    "softmax.metal": ["block_softmax_float32", "looped_softmax_precise_float16"],
    "logsumexp.metal": None,
    "unary.metal": ["v_Expfloat32float32", "v_Log1pfloat32float32", "gn4large_Sinbfloat16bfloat16"],
    "binary.metal": ["vv_Addfloat32", "vv_Multiplyfloat16", "g2_Maximumbfloat16"],
    "ternary.metal": ["g1_Selectfloat32", "g2_Selectbfloat16"],
    "copy.metal": ["s_copyfloat32float16", "g2_copyint32int32"],
    "arg_reduce.metal": None,
    "reduce.metal": ["all_reduce_sumfloat32", "row_reduce_small_1_reduce_maxfloat16"],
    "rope.metal": None,
    "quantized.metal": ["affine_qmv_float_gs_64_b_4_batch_0"],
    "gemv.metal": ["gemv_float32_bm1_bn8_sm1_sn32_tm4_tn4_nc0_axpby0"],
    "scaled_dot_product_attention.metal": None,
    "steel/gemm/kernels/steel_gemm_fused.metal": [
        "steel_gemm_fused_nn_float32_float32_bm64_bn64_bk16_wm2_wn2",
        "steel_gemm_fused_nt_bfloat16_bfloat16_bm64_bn32_bk32_wm2_wn2"],
    "steel/attn/kernels/steel_attention.metal": [
        "steel_attention_float32_bq32_bk32_bd64_wm4_wn1_maskfloat32"],
}


@pytest.mark.parametrize("name", list(FILES))
def test_mlx_kernel_file_compiles(name):
    lib = library(name)
    names = dir(lib)
    assert names
    for k in FILES[name] or []:
        assert k in names, f"{name} has no kernel {k}"
        getattr(lib, k)          # compiles it (lazily built libraries compile here)


# ------------------------------------------------------------------------- runs vs mlx[cpu]
mx = pytest.importorskip("mlx.core") if MLX_SRC else None

_TNAME = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
_TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def _mx(t: torch.Tensor):
    return mx.array(t.float().numpy()).astype(
        {torch.float32: mx.float32, torch.float16: mx.float16,
         torch.bfloat16: mx.bfloat16}[t.dtype])


def _torch(a, dtype) -> torch.Tensor:
    import numpy as np
    return torch.from_numpy(np.array(a.astype(mx.float32))).to(dtype)


def np_of(a):
    import numpy as np
    return np.array(a)


def _close(got, want, dtype):
    tol = _TOL[dtype]
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol, equal_nan=True)


def _row_grid(axis_size: int, n_rows: int, n_reads: int = 4, looped_limit: int = 4096):
    """normalization.cpp / softmax.cpp: one threadgroup per row."""
    if axis_size <= looped_limit:
        tg = 32 * math.ceil(math.ceil(axis_size / n_reads) / 32)
    else:
        tg = 1024
    return [n_rows * tg], [tg]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("axis", [96, 4100])
def test_rms_norm_matches_mlx(dtype, axis):
    lib = library("rms_norm.metal")
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, axis, generator=g).to(dtype)
    w = torch.randn(axis, generator=g).to(dtype)
    out = torch.zeros_like(x)
    name = ("rms_looped" if axis > 4096 else "rms") + _TNAME[dtype]
    grid, group = _row_grid(axis, 3)
    getattr(lib, name)(x, w, out, 1e-5, axis, 1, threads=grid, group_size=group,
                       arg_casts={4: "int32", 5: "int32"})
    want = _torch(mx.fast.rms_norm(_mx(x), _mx(w), 1e-5), dtype)
    _close(out, want, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
# 250: normalization.cpp's threadgroup (32 threads of 8 reads) covers the row exactly.  With more
# threads than ceil(axis / 8) (e.g. axis 100), MLX's layer_norm_single_row writes
# thread_x[n..7] with a negative n, outside the thread's array: the GPU happens to tolerate it,
# the simulator faults.
@pytest.mark.parametrize("axis", [250, 7000])
def test_layer_norm_matches_mlx(dtype, axis):
    lib = library("layer_norm.metal")
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(2, axis, generator=g) * 3 + 1).to(dtype)
    w = torch.randn(axis, generator=g).to(dtype)
    b = torch.randn(axis, generator=g).to(dtype)
    out = torch.zeros_like(x)
    name = ("layer_norm_looped" if axis > 6656 else "layer_norm") + _TNAME[dtype]
    grid, group = _row_grid(axis, 2, n_reads=8 if axis <= 6656 else 4, looped_limit=6656)
    getattr(lib, name)(x, w, b, out, 1e-5, axis, 1, 1, threads=grid, group_size=group,
                       arg_casts={5: "int32", 6: "int32", 7: "int32"})
    want = _torch(mx.fast.layer_norm(_mx(x), _mx(w), _mx(b), 1e-5), dtype)
    _close(out, want, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("axis", [33, 4097])
def test_softmax_matches_mlx(dtype, axis):
    lib = library("softmax.metal")
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(2, axis, generator=g) * 4).to(dtype)
    out = torch.zeros_like(x)
    name = ("looped_softmax_" if axis > 4096 else "block_softmax_") + _TNAME[dtype]
    grid, group = _row_grid(axis, 2)
    getattr(lib, name)(x, out, axis, threads=grid, group_size=group, arg_casts={2: "int32"})
    want = _torch(mx.softmax(_mx(x), axis=-1), dtype)
    _close(out, want, dtype)


@pytest.mark.parametrize("op,mxop,dtype", [
    ("Exp", mx.exp if mx else None, torch.float32),
    ("Log1p", mx.log1p if mx else None, torch.float32),
    ("Exp", mx.exp if mx else None, torch.float16),
    ("Sin", mx.sin if mx else None, torch.bfloat16)])
def test_unary_matches_mlx(op, mxop, dtype):
    lib = library("unary.metal")
    x = torch.linspace(-3, 3, 1000).to(dtype)
    out = torch.zeros_like(x)
    t = _TNAME[dtype]
    getattr(lib, f"v_{op}{t}{t}")(x, out, x.numel(), threads=x.numel(),
                                  arg_casts={2: "int32"})
    _close(out, _torch(mxop(_mx(x)), dtype), dtype)


@pytest.mark.parametrize("op,mxop,dtype", [
    ("Add", mx.add if mx else None, torch.float32),
    ("Multiply", mx.multiply if mx else None, torch.float16),
    ("Maximum", mx.maximum if mx else None, torch.bfloat16)])
def test_binary_matches_mlx(op, mxop, dtype):
    lib = library("binary.metal")
    g = torch.Generator().manual_seed(4)
    a = torch.randn(777, generator=g).to(dtype)
    b = torch.randn(777, generator=g).to(dtype)
    out = torch.zeros_like(a)
    getattr(lib, f"vv_{op}{_TNAME[dtype]}")(a, b, out, a.numel(), threads=a.numel(),
                                            arg_casts={3: "int32"})
    _close(out, _torch(mxop(_mx(a), _mx(b)), dtype), dtype)


@pytest.mark.parametrize("traditional", [False, True])
def test_rope_single_matches_mlx(traditional):
    # rope.cpp, the inference case (one time step, contiguous, one offset): function constants
    # forward(1), traditional(2), hs_transpose(3); grid (dims/2, B*N); buffers 0-4 and 10
    lib = compile_shader(inline_mlx(KDIR + "rope.metal"),
                         function_constants={1: True, 2: traditional, 3: False})
    B, N, D, offset, scale, base = 2, 3, 64, 5, 0.5, 10000.0
    g = torch.Generator().manual_seed(5)
    x = torch.randn(B, N, 1, D, generator=g)
    out = torch.zeros_like(x)
    lib.rope_single_float32(x, out, offset, scale, D, None, None, None, None, None,
                            math.log2(base), threads=[D // 2, B * N], group_size=[32, 3],
                            arg_casts={2: "int32"})
    want = mx.fast.rope(_mx(x), D, traditional=traditional, base=base, scale=scale,
                        offset=offset)
    _close(out, _torch(want, torch.float32), torch.float32)


def test_sdpa_vector_matches_mlx():
    # scaled_dot_product_attention.cpp, sdpa_vector(): one query position, no mask or sinks
    # (function constants 20-25 false), grid = (B * Hq, Lq) threadgroups of 1024 threads
    lib = compile_shader(inline_mlx(KDIR + "scaled_dot_product_attention.metal"),
                         function_constants={k: False for k in range(20, 26)})
    B, Hq, Hkv, N, D = 1, 4, 2, 37, 64
    g = torch.Generator().manual_seed(6)
    q = torch.randn(B, Hq, 1, D, generator=g)
    k = torch.randn(B, Hkv, N, D, generator=g)
    v = torch.randn(B, Hkv, N, D, generator=g)
    out = torch.zeros_like(q)
    scale = D ** -0.5
    lib.sdpa_vector_float_64_64(q, k, v, out, Hq // Hkv, N, N * D, D, N * D, D, scale,
                                None, None, None, None, None, None, None,
                                threads=[B * Hq * 1024, 1, 1], group_size=[1024, 1, 1],
                                arg_casts={4: "int32", 5: "int32"})
    want = mx.fast.scaled_dot_product_attention(_mx(q), _mx(k), _mx(v), scale=scale)
    _close(out, _torch(want, torch.float32), torch.float32)


def test_affine_qmv_matches_mlx():
    # quantized.cpp, qmv(): grid (M, ceil(N / 8), B) threadgroups of (32, 2); N % 8 != 0 picks
    # the general (not _fast) kernel.  With B = 1 MLX leaves buffers 7-14 (batch shapes and
    # strides) unbound and the kernel does not read them; the simulator binds every present
    # parameter, so they get placeholder values.
    import numpy as np
    lib = library("quantized.metal")
    M, N, K, gs, bits = 3, 12, 256, 64, 4
    g = torch.Generator().manual_seed(7)
    w = torch.randn(N, K, generator=g)
    x = torch.randn(M, K, generator=g)
    wq, scales, biases = mx.quantize(_mx(w), group_size=gs, bits=bits)
    wq_t = torch.from_numpy(np.array(wq).view(np.int32))
    s_t, b_t = _torch(scales, torch.float32), _torch(biases, torch.float32)
    y = torch.zeros(M, N)
    lib.affine_qmv_float_gs_64_b_4_batch_0(
        wq_t, s_t, b_t, x, y, K, N, 0, [0], [0], 0, [0], [0], [0], [0],
        threads=[M * 32, -(-N // 8) * 2, 1], group_size=[32, 2, 1],
        arg_casts={5: "int32", 6: "int32", 7: "int32", 8: "int32", 10: "int32", 11: "int32"})
    want = mx.quantized_matmul(_mx(x), wq, scales, biases, transpose=True, group_size=gs,
                               bits=bits)
    _close(y, _torch(want, torch.float32), torch.float16)   # 4-bit weights: sums of 256 terms


def _gemv_grid(n_out: int, per_group: int, bn: int, bm: int, batch: int):
    """matmul.cpp gemv_axbpy: threadgroups (ceil(n_out / per_group), 1, batch) of (32, bn, bm)."""
    n_tgp = -(-n_out // per_group)
    return [n_tgp * 32, bn, bm * batch], [32, bn, bm]


@pytest.mark.parametrize("M,K,kname,bm,bn,sm,tm", [
    # K >= 16 * M: bm 1, bn 8;  otherwise bm 4 (M < 4096), sm 1, sn 32
    (20, 512, "gemv_float32_bm1_bn8_sm1_sn32_tm4_tn4_nc0_axpby0", 1, 8, 1, 4),
    (50, 200, "gemv_float32_bm4_bn1_sm1_sn32_tm4_tn4_nc0_axpby0", 4, 1, 1, 4),
    # K <= 64: bm 1, sm 8, sn 4
    (37, 60, "gemv_float32_bm1_bn1_sm8_sn4_tm4_tn4_nc0_axpby0", 1, 1, 8, 4)])
def test_gemv_matches_mlx(M, K, kname, bm, bn, sm, tm):
    # matmul.cpp gemv_axbpy without axpby: A (M, K) @ x (K, 1); batch_shape {1}, strides {0};
    # buffers 2 (bias), 7, 8 (alpha, beta), 13, 14 are unbound there: placeholders here.
    lib = library("gemv.metal")
    g = torch.Generator().manual_seed(8)
    a = torch.randn(M, K, generator=g)
    x = torch.randn(K, generator=g)
    out = torch.zeros(M)
    grid, group = _gemv_grid(M, bm * sm * tm, bn, bm, 1)
    getattr(lib, kname)(a, x, torch.zeros(1), out, K, M, K, 1.0, 0.0, 1, [1], [0], [0], [0], 0,
                        threads=grid, group_size=group,
                        arg_casts={4: "int32", 5: "int32", 6: "int32", 9: "int32", 10: "int32",
                                   14: "int32"})
    want = mx.matmul(_mx(a), _mx(x))
    _close(out, _torch(want, torch.float32), torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_gemv_t_matches_mlx(dtype):
    # x (B, 1, K) @ W (B, K, N), W row-major: the matrix is transposed for gemv, gemv_t; K < 8192:
    # sm 8, sn 4; N < 512: bn 2; tn 4.  batch_shape {B} (one dim: the contiguous kernel, nc0).
    lib = library("gemv.metal")
    B, K, N = 2, 300, 70
    g = torch.Generator().manual_seed(9)
    x = torch.randn(B, 1, K, generator=g).to(dtype)
    w = torch.randn(B, K, N, generator=g).to(dtype)
    out = torch.zeros(B, 1, N, dtype=dtype)
    grid, group = _gemv_grid(N, 2 * 4 * 4, 2, 1, B)
    kname = f"gemv_t_{_TNAME[dtype]}_bm1_bn2_sm8_sn4_tm4_tn4_nc0_axpby0"
    getattr(lib, kname)(w, x, torch.zeros(1, dtype=dtype), out, K, N, N, 1.0, 0.0, 1, [B],
                        [K], [K * N], [0], 0, threads=grid, group_size=group,
                        arg_casts={4: "int32", 5: "int32", 6: "int32", 9: "int32", 10: "int32",
                                   14: "int32"})
    want = mx.matmul(_mx(x), _mx(w))
    _close(out, _torch(want, dtype), dtype)


def _gemm_params(M, N, K, lda, ldb, ldd, bm, bn, bk, batch_stride_a=0, batch_stride_b=0,
                 batch_stride_d=0, batch_ndim=1) -> torch.Tensor:
    """steel/gemm/params.h GEMMParams, as matmul.cpp fills it (swizzle_log 0)."""
    import struct
    tn, tm = -(-N // bn), -(-M // bm)
    raw = struct.pack("<8i3q3i4x", M, N, K, lda, ldb, ldd, tn, tm,
                      batch_stride_a, batch_stride_b, batch_stride_d, 0, K // bk, batch_ndim)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


@pytest.mark.parametrize("dtype,trans,M,N,K,bm,bn,bk,wm,wn", [
    # float32 takes MLX's default tile (64, 64, 16, 2, 2); half/bfloat nt on a small device
    # (GEMM_TPARAM_MACRO, devc 'g'): (64, 32, 32, 2, 2)
    (torch.float32, "nn", 70, 100, 40, 64, 64, 16, 2, 2),
    (torch.bfloat16, "nt", 64, 64, 96, 64, 32, 32, 2, 2),
    (torch.float16, "nt", 33, 50, 20, 64, 32, 32, 2, 2)])
def test_steel_gemm_fused_matches_mlx(dtype, trans, M, N, K, bm, bn, bk, wm, wn):
    # matmul.cpp steel_matmul_regular_axpby without batch or C: function constants has_batch
    # (10), use_out_source (100), do_axpby (110) false, align_M/N/K (200-202) from the shape;
    # threadgroups (tiles_n, tiles_m, 1) of (32, wn, wm); buffers 0, 1, 3, 4.
    fc = {10: False, 100: False, 110: False,
          200: M % bm == 0, 201: N % bn == 0, 202: K % bk == 0}
    lib = compile_shader(inline_mlx(KDIR + "steel/gemm/kernels/steel_gemm_fused.metal"),
                         function_constants=fc)
    g = torch.Generator().manual_seed(10)
    a = torch.randn(M, K, generator=g).to(dtype)
    b = (torch.randn(N, K, generator=g) if trans[1] == "t" else
         torch.randn(K, N, generator=g)).to(dtype)
    out = torch.zeros(M, N, dtype=dtype)
    t = _TNAME[dtype]
    kname = f"steel_gemm_fused_{trans}_{t}_{t}_bm{bm}_bn{bn}_bk{bk}_wm{wm}_wn{wn}"
    params = _gemm_params(M, N, K, K, b.shape[1], N, bm, bn, bk, M * K, K * N, M * N)
    tiles = [-(-N // bn), -(-M // bm), 1]
    getattr(lib, kname)(a, b, None, out, params, None, None, None,
                        threads=[tiles[0] * 32, tiles[1] * wn, wm], group_size=[32, wn, wm])
    want = mx.matmul(_mx(a), _mx(b).T if trans[1] == "t" else _mx(b))
    _close(out, _torch(want, dtype), dtype)


def _run_steel_attention(lib, dtype, qL, kL, D, causal, bq, bk, heads, seed):
    """One call of MLX's steel attention kernel (bq x bk tiles, wm 4, wn 1: threadgroups (NQ,
    H, B) of (32, 4, 1), buffers 0-4), B = 1, heads = (H, Hkv), against mlx's own SDPA."""
    (H, Hkv), B = heads, 1
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, qL, D, generator=g).to(dtype)
    k = torch.randn(B, Hkv, kL, D, generator=g).to(dtype)
    v = torch.randn(B, Hkv, kL, D, generator=g).to(dtype)
    o = torch.zeros_like(q)
    scale = D ** -0.5
    params = _attn_params(B, H, D, qL, kL, H // Hkv, scale, bq, bk, q, k, v, o)
    t = _TNAME[dtype]
    kname = f"steel_attention_{t}_bq{bq}_bk{bk}_bd{D}_wm4_wn1_mask{t}"
    NQ = -(-qL // bq)
    getattr(lib, kname)(q, k, v, o, params, None, None, None,
                        threads=[NQ * 32, H * 4, B], group_size=[32, 4, 1])
    want = mx.fast.scaled_dot_product_attention(_mx(q), _mx(k), _mx(v), scale=scale,
                                                mask="causal" if causal else None)
    _close(o, _torch(want, dtype), dtype)


def _attn_params(B, H, D, qL, kL, gqa, scale, bq, bk, q, k, v, o) -> torch.Tensor:
    """steel/attn/params.h AttnParams, as scaled_dot_product_attention.cpp fills it."""
    import struct
    NQ, NK = -(-qL // bq), -(-kL // bk)
    NQa, NKa = qL // bq, kL // bk
    strides = [s for t in (q, k, v, o) for s in t.stride()[:3]]
    raw = struct.pack("<6if7i12q", B, H, D, qL, kL, gqa, scale, NQ, NK, NQa, NKa,
                      qL - NQa * bq, kL - NKa * bk, kL - qL, *strides)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


@pytest.mark.parametrize("dtype,D,qL,kL,causal", [
    (torch.float32, 64, 40, 50, False),
    (torch.float16, 128, 32, 48, True)])
def test_steel_attention_matches_mlx(dtype, D, qL, kL, causal):
    # scaled_dot_product_attention.cpp sdpa_full_self_attention_metal (no NAX): bq 32,
    # bk 32 (D < 128) or 16, wm 4, wn 1; function constants align_Q (200), align_K (201),
    # has_mask (300), do_causal (301), has_sinks (302); threadgroups (NQ, H, B) of (32, 4, 1);
    # buffers 0-4.
    bq, bk = 32, (32 if D < 128 else 16)
    fc = {200: qL % bq == 0, 201: kL % bk == 0, 300: False, 301: causal, 302: False}
    lib = compile_shader(inline_mlx(KDIR + "steel/attn/kernels/steel_attention.metal"),
                         function_constants=fc)
    _run_steel_attention(lib, dtype, qL, kL, D, causal, bq, bk, heads=(4, 2), seed=11)


@pytest.mark.parametrize("dtype,axis", [(torch.float32, 100), (torch.bfloat16, 5000)])
def test_logsumexp_matches_mlx(dtype, axis):
    # logsumexp.cpp: block kernel (axis <= 4096) with one threadgroup of 32 * ceil(axis / 4 / 32)
    # threads per row, else the looped kernel with the kernel's maximum (1024) per row.
    lib = library("logsumexp.metal")
    g = torch.Generator().manual_seed(12)
    x = (torch.randn(3, axis, generator=g) * 3).to(dtype)
    out = torch.zeros(3, dtype=dtype)
    name = ("looped_" if axis > 4096 else "block_") + "logsumexp_" + _TNAME[dtype]
    grid, group = _row_grid(axis, 3)
    getattr(lib, name)(x, out, axis, threads=grid, group_size=group, arg_casts={2: "int32"})
    _close(out, _torch(mx.logsumexp(_mx(x), axis=-1), dtype), dtype)


def _block_dims(dim0: int, dim1: int, dim2: int, pow2: int = 10) -> list[int]:
    """mlx/backend/metal/utils.cpp get_block_dims_common: powers of two, at most 2**pow2
    threads, grown one dimension at a time."""
    pows, total = [0, 0, 0], 0
    while True:
        before = total
        for k, d in enumerate((dim0, dim1, dim2)):
            if d >= 1 << (pows[k] + 1):
                pows[k] += 1
                total += 1
            if total == 10:
                return [1 << p for p in pows]
        if total in (before, pow2):
            return [1 << p for p in pows]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ternary_select_matches_mlx(dtype):
    # ternary.cpp, a general 2-D select with broadcast operands: g2_Select<type>, strides in
    # buffers 4-6, a grid (cols, rows, 1) of get_block_dims threadgroups.
    lib = library("ternary.metal")
    g = torch.Generator().manual_seed(13)
    R, C = 5, 37
    cond = torch.rand(R, 1, generator=g) > 0.5
    a = torch.randn(R, C, generator=g).to(dtype)
    b = torch.randn(C, generator=g).to(dtype)
    out = torch.zeros(R, C, dtype=dtype)
    getattr(lib, f"g2_Select{_TNAME[dtype]}")(
        cond, a, b, out, [1, 0], [C, 1], [0, 1],
        threads=[C, R, 1], group_size=_block_dims(C, R, 1))
    want = mx.where(mx.array(cond.numpy()), _mx(a), _mx(b)[None, :])
    _close(out, _torch(want, dtype), dtype)


def test_copy_matches_mlx():
    lib = library("copy.metal")
    # fill_gpu: the scalar copy, size < 2**16 so one element per thread: s_copy<in><out>
    val = torch.tensor([1.2345678])
    out = torch.zeros(1000, dtype=torch.float16)
    lib.s_copyfloat32float16(val, out, out.numel(), threads=[1000], group_size=[1000],
                             arg_casts={2: "int32"})
    _close(out, torch.full((1000,), 1.2345678).half(), torch.float16)
    # copy_gpu_inplace, a general 2-D copy of a transposed int32 view: buffer 3 holds the
    # source strides, buffer 2 (the shape, for more than 3 dims) is unbound
    src = torch.arange(6 * 45, dtype=torch.int32).reshape(6, 45).T      # (45, 6), strides (1, 45)
    dst = torch.zeros(45, 6, dtype=torch.int32)
    lib.g2_copyint32int32(src, dst, None, [1, 45], threads=[6, 45, 1],
                          group_size=_block_dims(6, 45, 1))
    want = np_of(mx.array(src.numpy()) + 0)
    assert torch.equal(dst, torch.from_numpy(want))


@pytest.mark.parametrize("op,dtype,shape,axis", [
    ("argmax", torch.float32, (4, 300), 1),
    ("argmin", torch.float16, (100, 6), 0)])
def test_arg_reduce_matches_mlx(op, dtype, shape, axis):
    # primitives.cpp ArgReduce::eval_gpu: one threadgroup of 32 * ceil(ceil(axis / 4) / 32)
    # threads per output element; shape and strides without the reduced axis
    lib = library("arg_reduce.metal")
    g = torch.Generator().manual_seed(14)
    x = torch.randn(*shape, generator=g).to(dtype)
    out_shape = [n for d, n in enumerate(shape) if d != axis]
    out = torch.zeros(out_shape, dtype=torch.int32)       # uint32 in MLX, same bits here
    axis_size = shape[axis]
    tg = min(-(-axis_size // 4), 1024)
    tg = -(-tg // 32) * 32
    in_strides = [s for d, s in enumerate(x.stride()) if d != axis]
    getattr(lib, f"{op}_{_TNAME[dtype]}")(
        x, out, out_shape, in_strides, list(out.stride()), len(out_shape), x.stride(axis),
        axis_size, threads=[tg, out.numel(), 1], group_size=[tg, 1, 1],
        arg_casts={2: "int32"})
    want = getattr(mx, op)(_mx(x), axis=axis)
    assert torch.equal(out.long(), torch.from_numpy(np_of(want)).long())


@pytest.mark.parametrize("n", [3000, 20000])
def test_all_reduce_sum_matches_mlx(n):
    # reduce.cpp all_reduce_dispatch: up to 4 * 1024 elements one threadgroup; beyond, a first
    # pass of 128 rows into an intermediate and a second pass of 32 threads over it
    lib = library("reduce.metal")
    g = torch.Generator().manual_seed(15)
    x = torch.randn(n, generator=g)
    out = torch.zeros(1)
    if n <= 4 * 1024:
        tg = -(-(-(-n // 4)) // 32) * 32
        lib.all_reduce_sumfloat32(x, out, n, n, threads=[tg, 1, 1], group_size=[tg, 1, 1])
    else:
        rows = 32 * 4
        row_size = -(-n // rows)
        tg = -(-min(-(-row_size // 4), 1024) // 32) * 32
        mid = torch.zeros(rows)
        lib.all_reduce_sumfloat32(x, mid, n, row_size, threads=[tg, rows, 1],
                                  group_size=[tg, 1, 1])
        lib.all_reduce_sumfloat32(mid, out, rows, rows, threads=[32, 1, 1],
                                  group_size=[32, 1, 1])
    torch.testing.assert_close(out, _torch(mx.sum(_mx(x)), torch.float32).reshape(1),
                               rtol=1e-5, atol=1e-4)


# ------------------------------------------------------------- Metal 4 tensor ops (NAX kernels)
@pytest.mark.parametrize("dtype,trans,M,N,K,family", [
    (torch.float16, "nt", 70, 100, 300, 10),
    (torch.bfloat16, "tn", 50, 72, 280, 10),
    (torch.float16, "nt", 70, 100, 300, 9)])
def test_steel_gemm_fused_nax_matches_mlx_on_m5_only(dtype, trans, M, N, K, family):
    # MLX's M5 GEMM (steel/gemm/kernels/steel_gemm_fused_nax.metal: matmul2d over cooperative
    # tensors filled with M5's layout hard-coded in BaseNAXFrag), compiled for Metal 4 at GPU
    # family 10 it matches mlx[cpu]; at family 9 (another cooperative-tensor layout) it must
    # not.  matmul.cpp's steel_matmul_nax: tile (64, 64, 256, 2, 2) (the smallest MLX builds),
    # threadgroups (tiles_n, tiles_m, 1) of (32, wn, wm).
    bm, bn, bk, wm, wn = 64, 64, 256, 2, 2
    fc = {10: False, 100: False, 110: False,
          200: M % bm == 0, 201: N % bn == 0, 202: K % bk == 0}
    lib = compile_shader(inline_mlx(KDIR + "steel/gemm/kernels/steel_gemm_fused_nax.metal"),
                         function_constants=fc, metal_version=400, gpu_family=family)
    g = torch.Generator().manual_seed(11)
    a = (torch.randn(K, M, generator=g) if trans[0] == "t" else
         torch.randn(M, K, generator=g)).to(dtype)
    b = (torch.randn(N, K, generator=g) if trans[1] == "t" else
         torch.randn(K, N, generator=g)).to(dtype)
    out = torch.zeros(M, N, dtype=dtype)
    t = _TNAME[dtype]
    kname = f"steel_gemm_fused_nax_{trans}_{t}_{t}_bm{bm}_bn{bn}_bk{bk}_wm{wm}_wn{wn}"
    params = _gemm_params(M, N, K, a.shape[1], b.shape[1], N, bm, bn, bk, M * K, K * N, M * N)
    tiles = [-(-N // bn), -(-M // bm), 1]
    getattr(lib, kname)(a, b, None, out, params, None, None, None,
                        threads=[tiles[0] * 32, tiles[1] * wn, wm], group_size=[32, wn, wm])
    want = mx.matmul(_mx(a).T if trans[0] == "t" else _mx(a),
                     _mx(b).T if trans[1] == "t" else _mx(b))
    if family >= 10:
        _close(out, _torch(want, dtype), dtype)
    else:
        assert (out.float() - _torch(want, dtype).float()).abs().max() > 1.0


@pytest.mark.parametrize("dtype,D,qL,kL,causal", [
    (torch.float16, 64, 40, 70, True),
    (torch.bfloat16, 128, 64, 64, False)])
def test_steel_attention_nax_matches_mlx(dtype, D, qL, kL, causal):
    # scaled_dot_product_attention.cpp sdpa_full_self_attention_nax: bq 64, bk 32, wm 4, wn 1
    # (D < 256); function constants as the non-NAX kernel; threadgroups (NQ, H, B) of
    # (32, wm, wn); Metal 4 at GPU family 10 (M5).
    bq, bk = 64, 32
    fc = {200: qL % bq == 0, 201: kL % bk == 0, 300: False, 301: causal, 302: False}
    lib = compile_shader(inline_mlx(KDIR + "steel/attn/kernels/steel_attention_nax.metal"),
                         function_constants=fc, metal_version=400, gpu_family=10)
    _run_steel_attention(lib, dtype, qL, kL, D, causal, bq, bk, heads=(2, 1), seed=12)


def test_affine_qmm_t_nax_matches_mlx():
    # quantized.cpp qmm_nax (transposed weight, K % 64 == 0): bm 64 (M > 32), bn = bk = 64,
    # wm = wn = 2; grid (ceil(N / 64), ceil(M / 64), 1) threadgroups of (32, wn, wm); N % 64
    # == 0 picks _alN_true (with N % 64 != 0, MLX's QuantizedBlockLoader::load_safe compares
    # the row with the K extent and reads scales and biases past the end of their buffers,
    # which the simulator reports); with B = 1 buffers 8-15 (batch shapes, strides) are unbound
    # and unread (placeholders here).  Metal 4 at GPU family 10 (M5); M = 40: partial M tile.
    import numpy as np
    lib = compile_shader(inline_mlx(KDIR + "quantized_nax.metal"), metal_version=400,
                         gpu_family=10)
    M, N, K, gs, bits = 40, 128, 128, 64, 4
    g = torch.Generator().manual_seed(13)
    w = torch.randn(N, K, generator=g)
    x = torch.randn(M, K, generator=g).half()
    wq, scales, biases = mx.quantize(_mx(w).astype(mx.float16), group_size=gs, bits=bits)
    wq_t = torch.from_numpy(np.array(wq).view(np.int32))
    s_t, b_t = _torch(scales, torch.float16), _torch(biases, torch.float16)
    y = torch.zeros(M, N).half()
    kname = "affine_qmm_t_nax_float16_t_gs_64_b_4_bm64_bn64_bk64_wm2_wn2_alN_true_batch_0"
    getattr(lib, kname)(wq_t, s_t, b_t, x, y, K, N, M, 0, [0], [0], 0, [0], [0], [0], [0],
                        threads=[-(-N // 64) * 32, -(-M // 64) * 2, 2], group_size=[32, 2, 2],
                        arg_casts={5: "int32", 6: "int32", 7: "int32", 8: "int32",
                                   9: "int32", 11: "int32", 12: "int32"})
    want = mx.quantized_matmul(_mx(x), wq, scales, biases, transpose=True, group_size=gs,
                               bits=bits)
    # mlx[cpu]'s own f16 quantized_matmul is up to ~0.1 off the product with the dequantized
    # weight (outputs up to ~30): compare with it at that tolerance, and with that product
    # (fp32) at f16 output rounding
    torch.testing.assert_close(y.float(), _torch(want, torch.float32), rtol=2e-2, atol=0.15)
    wd = _torch(mx.dequantize(wq, scales, biases, group_size=gs, bits=bits), torch.float32)
    torch.testing.assert_close(y.float(), x.float() @ wd.T, rtol=4e-3, atol=4e-2)
