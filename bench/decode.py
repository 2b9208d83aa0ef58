"""A whole decode step (examples/llama_decode.py) against torch, stage by stage and in all.

    python bench/decode.py --device cuda                      # Llama-3-8B's layer, f16
    python bench/decode.py --device cuda --dtype bf16 --paged

Ours: 4-bit weights (MLX's affine layout, group 64), every stage a metalforge kernel. torch:
the same step with the dequantized f16/bf16 weights (F.rms_norm, F.linear, RoPE in torch ops,
scaled_dot_product_attention with GQA, silu), eager and under torch.compile. Per stage: ours,
torch eager, and ours' share of the stage's bytes at copy_'s rate; then the whole step as one
callable (on CUDA: GPU time of CUDA-graph replays, common.timeit), its launch count, and the
eager wall time of one step (host launch cost included, synchronised). The step has no torch
op: K and V are written into the cache row by their projection (`out=`). The KV cache holds
`--context` positions; the step attends position `pos` = context - 1 (every key).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

import metalforge as mf

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import DTYPES, compile_time, copy_time, example, parse_launch, pick_device, sync, timeit  # noqa: E402

ex = example("llama_decode")


def _nbytes(*ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts if isinstance(t, torch.Tensor))


def swiglu(gu: torch.Tensor, hidden: int) -> torch.Tensor:
    return torch.nn.functional.silu(gu[:, :hidden]) * gu[:, hidden:]


@mf.kernel            # SwiGLU fused into the down projection: x staged once per threadgroup
def down_swiglu(wq: "u32[N, F/8]", s: "T[N, F/64]", b: "T[N, F/64]",  # noqa: F821, F722
                g: "T[M, F]", u: "T[M, F]", r: "T[M, N]") -> "T[M, N]":  # noqa: F821, F722
    return r + mf.sum((mf.unpack(wq, bits=4) * s + b) * (g * mf.sigmoid(g) * u), axis="F")


def stage_calls(layer, x, cache, pos, ours, theirs, w):
    """(name, our call, torch call, bytes ours moves) per stage, on the inputs the full steps
    computed (so each stage is timed on real data). torch's q/k/v stage is its norm, one
    F.linear of the stacked weights, RoPE and the cache write; ours the two projection
    kernels (norm and RoPE inside, K and V written into the cache row)."""
    s = layer.shape
    E, hq, hkv = s.head_dim, s.heads, s.kv_heads
    q = ours["q"]
    kv = cache.k[:pos + 1].transpose(0, 1)[None], cache.v[:pos + 1].transpose(0, 1)[None]
    a2 = ours["attention"].reshape(1, hq * E)
    m = ours["swiglu"]
    F = torch.nn.functional
    if cache.table is None:
        att = lambda: ex.decode_attention(q, cache.k, cache.v, E ** -0.5, pos)  # noqa: E731
    else:
        att = lambda: ex.paged_decode_attention(q, cache.k, cache.v, cache.table,  # noqa: E731
                                                E ** -0.5, pos, BS=s.block)
    kvbytes = 2 * (pos + 1) * hkv * E * x.element_size()
    rows = cache.rows(pos, s.block)
    h2 = F.rms_norm(theirs["x2"], (s.dim,), layer.w_mlp, eps=1e-5)
    gu = F.linear(h2, w["gate_up"]).contiguous()

    def qkv_ours():
        ex.q_rope(*layer.heads("q"), x, layer.w_attn, pos)
        ex.kv_rope(*layer.heads("k"), *layer.heads("v"), x, layer.w_attn, pos, out=rows)

    def qkv_torch():
        h = F.rms_norm(x, (s.dim,), layer.w_attn, eps=1e-5)
        heads = F.linear(h, w["qkv"]).view(1, hq + 2 * hkv, E)
        ex.torch_rope(heads[:, :hq], pos)
        cache.write(pos, s.block, ex.torch_rope(heads[:, hq:hq + hkv], pos),
                    heads[:, hq + hkv:])
    return [
        ("norm+qkv+rope", qkv_ours, qkv_torch, _nbytes(*layer.q, *layer.k, *layer.v)),
        ("attention", att,
         lambda: F.scaled_dot_product_attention(theirs["q"][:, :, None], *kv,
                                                scale=E ** -0.5, enable_gqa=True), kvbytes),
        ("o_proj+add", lambda: ex.qlinear_add(*layer.o, a2, x),
         lambda: x + F.linear(a2, w["o"]), _nbytes(*layer.o)),
        ("norm+gate_up", lambda: ex.gate_up(*layer.gate, *layer.up, ours["x2"], layer.w_mlp),
         lambda: swiglu(F.linear(F.rms_norm(theirs["x2"], (s.dim,), layer.w_mlp, eps=1e-5),
                                 w["gate_up"]), s.hidden),
         _nbytes(*layer.gate, *layer.up)),
        ("down+add", lambda: ex.qlinear_add(*layer.down, m, ours["x2"]),
         lambda: ours["x2"] + F.linear(m, w["down"]), _nbytes(*layer.down)),
        # not in the step: SwiGLU in the down projection's staged prologue (qmv_prologue)
        # against torch's silu, product and projection
        ("swiglu+down", lambda: down_swiglu(*layer.down, gu[:, :s.hidden], gu[:, s.hidden:],
                                            ours["x2"]),
         lambda: ours["x2"] + F.linear(swiglu(gu, s.hidden), w["down"]),
         _nbytes(*layer.down)),
    ]


def launches(layer, x, cache, pos) -> int:
    """metalforge launches of one step: each kernel of the example counts the launches a call
    makes (`Kernel.launches`) while the step runs."""
    count = [0]
    kernels = {n: k for n, k in vars(ex).items() if isinstance(k, mf.Kernel)}

    def counted(k):
        def call(*a, **kw):
            launch_kw = {n: v for n, v in kw.items() if n != "out"}    # where it writes: the same
            count[0] += len(k.launches(*a, **launch_kw))
            return k(*a, **kw)
        return call
    try:
        for n, k in kernels.items():
            setattr(ex, n, counted(k))
        ex.step(layer, x, cache, pos)
    finally:
        for n, k in kernels.items():
            setattr(ex, n, k)
    return count[0]


def wall(fn, device: str, repeat: int) -> float:
    """Median wall seconds of one synchronised eager call (host cost included)."""
    fn()
    sync(device)
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        sync(device)
        ts.append(time.perf_counter() - t0)
    return sorted(ts)[len(ts) // 2]


def attention_launch(launch: dict) -> None:
    """The example's decode attention kernels with `launch` on top of their own options
    (the step calls them through the example module)."""
    if launch:
        print(f"attention launch {launch}")
        for name in ("decode_attention", "paged_decode_attention"):
            setattr(ex, name, getattr(ex, name).with_launch(**launch))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("mps", "cuda", "cpu"), default=None)
    ap.add_argument("--dtype", choices=("f16", "bf16"), default="f16")
    ap.add_argument("--paged", action="store_true")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=None)
    ap.add_argument("--no-compile", dest="compile", action="store_false")
    ap.add_argument("--attention-launch", nargs="*", metavar="K=V",
                    help="launch options of the step's attention kernel (contiguous and "
                         "paged), e.g. key_splits=64")
    a = ap.parse_args()
    attention_launch(parse_launch(a.attention_launch))
    device = pick_device(a.device)
    dtype = DTYPES[a.dtype]
    shape = ex.Shape(context=a.context) if device != "cpu" else ex.SMALL
    repeat = a.repeat or (50 if device != "cpu" else 2)
    pos = shape.context - 1
    layer = ex.Layer.random(shape, dtype, device)
    w = ex.torch_weights(layer)
    x = torch.randn(1, shape.dim, dtype=dtype, device=device)
    cache = ex.Cache.random(shape, dtype, device, a.paged)
    ours = ex.step(layer, x, cache, pos)
    theirs = ex.torch_step(layer, x, cache, pos, w)
    print(f"decode step: D={shape.dim}, {shape.heads}/{shape.kv_heads} heads of "
          f"{shape.head_dim}, F={shape.hidden}, cache {shape.context} positions "
          f"({'paged' if a.paged else 'contiguous'}), {a.dtype}, 4-bit weights (ours) vs "
          f"{a.dtype} weights (torch), on {device}")
    print(f"{'stage':<12} {'ours us':>9} {'torch us':>9} {'vs torch':>9} {'bytes':>11} "
          f"{'%copy':>6}")
    for name, f_ours, f_torch, nbytes in stage_calls(layer, x, cache, pos, ours, theirs, w):
        t_o, t_t = timeit(f_ours, device, repeat), timeit(f_torch, device, repeat)
        c = copy_time(nbytes, device, repeat)
        print(f"{name:<12} {t_o * 1e6:>9.1f} {t_t * 1e6:>9.1f} {t_t / t_o:>8.2f}x "
              f"{nbytes:>11} {100 * c / t_o:>5.0f}%")
    step_ours = lambda: ex.step(layer, x, cache, pos)                          # noqa: E731
    step_torch = lambda: ex.torch_step(layer, x, cache, pos, w)               # noqa: E731
    t_o, t_t = timeit(step_ours, device, repeat), timeit(step_torch, device, repeat)
    t_c = compile_time(step_torch, device, repeat, a.compile)
    comp = f"{t_c * 1e6:.1f} us ({t_c / t_o:.2f}x)" if t_c else "-"
    print(f"whole step: ours {t_o * 1e6:.1f} us, torch {t_t * 1e6:.1f} us "
          f"({t_t / t_o:.2f}x), torch.compile {comp}; "
          f"{launches(layer, x, cache, pos)} metalforge launches, no torch op")
    w_o, w_t = wall(step_ours, device, repeat), wall(step_torch, device, repeat)
    print(f"eager wall per step (synchronised): ours {w_o * 1e6:.0f} us, torch "
          f"{w_t * 1e6:.0f} us ({w_t / w_o:.2f}x)")


if __name__ == "__main__":
    main()
