"""One decode step of a Llama-style decoder layer, every stage a metalforge kernel.

    python examples/llama_decode.py

The layer (Llama-3-8B's shape at full size: D = 4096, 32 query heads over 8 key/value heads of
E = 128, F = 14336; small here so the simulator runs it quickly) with 4-bit weights in MLX's
affine layout (group 64) and an f16/bf16 KV cache, contiguous or paged. One step for one new
token at position `pos`:

    q   = q_rope(W_q, x, w_attn, pos)           RoPE(norm(x) W_q^T): norm and RoPE in the
                                               projection (a row's partner from the same kernel)
    k, v = kv_rope(W_k, W_v, x, w_attn, pos, out=cache rows)   written into the cache in place
    a   = decode_attention(q, k_cache, v_cache, pos)    keys 0..pos only
    x2  = qlinear_add(W_o, a, x)               x + a W_o^T: the residual in the epilogue
    m   = gate_up(W_gate, W_up, x2, w_mlp)     silu(h2 W_gate^T) * (h2 W_up^T), h2 = norm(x2)
    y   = qlinear_add(W_down, m, x2)

RMSNorm's scale is one number per row of x, so each projection of a normalised x takes it as a
sum of x * x beside its own sum (x read once, no normalised copy written) and multiplies its
result. RoPE's partner row (i + half, i - half past the middle) is another weight row's sum:
the projection gives one threadgroup every row of a head and reads the partner from
threadgroup memory (its index proven in range when the kernel is built). K and V go straight
into the cache row (`out=` views: no copy).

6 metalforge kernels and no torch op per step, 7 launches at full size (decode attention
splits a long cache's keys over threadgroups, then merges); the paged cache: the same with the
paged attention kernel (as in examples/paged_attention.py), the cache row found from the
host's copy of the block numbers (no device read).
Every stage is checked against torch (F.rms_norm, F.linear on the dequantized weights, RoPE,
scaled_dot_product_attention, silu) stage by stage; bench/decode.py times the step on a GPU.
Runs on Metal on a Mac, else on the simulator.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

import metalforge as mf
from metalforge import quant
from metalforge.runtime import current_backend

GROUP = 64


def rope(y, pos: int, base: float):
    """Rotate-half RoPE of y (over E) at position `pos`: the partner of element i is element
    i + half (i - half past the middle), proven in range, so read without a check."""
    i, half = mf.index("E"), mf.size("E") // 2
    partner = mf.take(y, axis="E", index=mf.where(i < half, i + half, i - half))
    theta = pos * base ** (-2.0 * (i % half) / mf.size("E"))
    return y * mf.cos(theta) + mf.where(i < half, -partner, partner) * mf.sin(theta)


def rms(x, eps: float):
    """RMSNorm's scale of each row of x: one number per row, so it multiplies a projection's
    sum instead of x (the projection reads x once, no normalised copy is written)."""
    return mf.rsqrt(mf.mean(x * x, axis="K") + eps)


@mf.kernel            # q = RoPE(norm(x) W_q^T) per head: the partner row from the same kernel
def q_rope(wq: "u32[H, E, K/8]", sq: "T[H, E, K/GS]", bq: "T[H, E, K/GS]", x: "T[M, K]",
           w: "T[K]", pos: int, eps: float = 1e-5, base: float = 500000.0,
           GS: mf.Const[int] = GROUP) -> "T[M, H, E]":
    y = rms(x, eps) * mf.sum((mf.unpack(wq, bits=4) * sq + bq) * (x * w), axis="K")
    return rope(y, pos, base).to("T")


@mf.kernel            # k = RoPE(norm(x) W_k^T), v = norm(x) W_v^T: written into the cache row
def kv_rope(wk: "u32[G, E, K/8]", sk: "T[G, E, K/GS]", bk: "T[G, E, K/GS]",
            wv: "u32[G, E, K/8]", sv: "T[G, E, K/GS]", bv: "T[G, E, K/GS]",
            x: "T[M, K]", w: "T[K]", pos: int, eps: float = 1e-5, base: float = 500000.0,
            GS: mf.Const[int] = GROUP) -> ("T[M, G, E]", "T[M, G, E]"):
    r, xw = rms(x, eps), x * w
    k = r * mf.sum((mf.unpack(wk, bits=4) * sk + bk) * xw, axis="K")
    v = r * mf.sum((mf.unpack(wv, bits=4) * sv + bv) * xw, axis="K")
    return rope(k, pos, base).to("T"), v.to("T")


@mf.kernel            # x + a W^T with W in 4 bits: the residual in the epilogue
def qlinear_add(wq: "u32[N, K/8]", scales: "T[N, K/GS]", biases: "T[N, K/GS]",
                x: "T[M, K]", r: "T[M, N]", GS: mf.Const[int] = GROUP) -> "T[M, N]":
    return r + mf.sum((mf.unpack(wq, bits=4) * scales + biases) * x, axis="K")


@mf.kernel            # one query position against the cache's keys 0..pos (GQA)
def decode_attention(q: "T[B, (G R), E]", k: "T[L, G, E]", v: "T[L, G, E]", scale: float,
                     pos: int):
    s = mf.sum(q * k, axis="E") * scale
    s = mf.where(mf.index("L") <= pos, s, -mf.inf)
    return mf.sum(mf.softmax(s, axis="L") * v, axis="L")


# the block table is a tensor: its reads cannot be proven in range, so they are checked; with
# the check deferred the step never waits for the GPU, and a bad block number is raised at the
# next mf.check_deferred() / mf.synchronize() (the caller's sync point: sampling the token)
@mf.kernel(launch={"index_check": "deferred"})
def paged_decode_attention(q: "T[B, (G R), E]", k_cache: "T[N, G, E]", v_cache: "T[N, G, E]",
                    block_table: "i32[B, L/BS]", scale: float, pos: int,
                    BS: mf.Const[int] = 16):
    row = block_table * BS + mf.index("L") % BS
    k = mf.take(k_cache, axis="N", index=row)
    v = mf.take(v_cache, axis="N", index=row)
    s = mf.sum(q * k, axis="E") * scale
    s = mf.where(mf.index("L") <= pos, s, -mf.inf)
    return mf.sum(mf.softmax(s, axis="L") * v, axis="L")


@mf.kernel            # SwiGLU's two projections of norm(x), silu(gate) * up in the epilogue
def gate_up(wg: "u32[F, K/8]", sg: "T[F, K/GS]", bg: "T[F, K/GS]",
            wu: "u32[F, K/8]", su: "T[F, K/GS]", bu: "T[F, K/GS]", x: "T[M, K]", w: "T[K]",
            eps: float = 1e-5, GS: mf.Const[int] = GROUP) -> "T[M, F]":
    r, xw = rms(x, eps), x * w
    g = r * mf.sum((mf.unpack(wg, bits=4) * sg + bg) * xw, axis="K")
    u = r * mf.sum((mf.unpack(wu, bits=4) * su + bu) * xw, axis="K")
    return (g * mf.sigmoid(g) * u).to("T")


# check(): heads of 2 up to 64 rows (34: a partial block of rows; 7, odd: the staged kernel,
# its rows 3..6 pairing with 0..3); small positions and a RoPE base (a pos of ~30000 turns one
# ulp of pow into ~4e-3 of the output); block numbers 0-2 in a cache of at least 3 blocks of
# 16 rows, at least key 0 visible
_ROPE_CHECK = {"dims": {"E": [2, 7, 8, 34, 64]},
               "values": {"pos": (0, 16), "base": (100.0, 100000.0)}}
CHECK = {"q_rope": _ROPE_CHECK, "kv_rope": _ROPE_CHECK,
         "paged_decode_attention": {"dims": {"N": (48, 80)},
                                    "values": {"block_table": (0, 2), "pos": (0, 47)}}}


# --------------------------------------------------------------------------- the layer

@dataclass(frozen=True)
class Shape:
    dim: int = 4096
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    hidden: int = 14336
    context: int = 4096            # cache length (positions)
    block: int = 16                # paged cache: positions per block


@dataclass
class Layer:
    """Weights: f16/bf16 norms, 4-bit projections as (words, scales, biases) and their
    dequantized values (what torch multiplies by)."""
    shape: Shape
    w_attn: torch.Tensor
    w_mlp: torch.Tensor
    q: tuple
    k: tuple
    v: tuple
    o: tuple
    gate: tuple
    up: tuple
    down: tuple

    @staticmethod
    def random(shape: Shape, dtype: torch.dtype, device: str, seed: int = 0) -> "Layer":
        g = torch.Generator().manual_seed(seed)
        s = shape

        def linear(n: int, k: int) -> tuple:
            w = (torch.randn(n, k, generator=g) / k ** 0.5).to(dtype).to(device)
            return quant.quantize(w, group_size=GROUP, bits=4)

        def gain() -> torch.Tensor:
            return (1 + 0.1 * torch.randn(s.dim, generator=g)).to(dtype).to(device)
        q_rows, kv_rows = s.heads * s.head_dim, s.kv_heads * s.head_dim
        return Layer(s, gain(), gain(), linear(q_rows, s.dim), linear(kv_rows, s.dim),
                     linear(kv_rows, s.dim), linear(s.dim, q_rows), linear(s.hidden, s.dim),
                     linear(s.hidden, s.dim), linear(s.dim, s.hidden))

    def heads(self, name: str) -> tuple:
        """Projection `name`'s (words, scales, biases) viewed per head: [heads, E, ...]."""
        E = self.shape.head_dim
        return tuple(t.view(-1, E, t.shape[-1]) for t in getattr(self, name))


def dequantized(w: tuple) -> torch.Tensor:
    return quant.dequantize(*w, group_size=GROUP, bits=4)


@dataclass
class Cache:
    """K/V for one sequence: contiguous [context, kv_heads, head_dim] rows, or paged (the same
    rows in blocks of `block` positions, placed by `table`; the host that allocates the blocks
    keeps their numbers too, `blocks`, so it knows a position's row without reading the
    device)."""
    k: torch.Tensor
    v: torch.Tensor
    table: torch.Tensor | None = None           # [1, context / block] i32, paged only
    blocks: tuple[int, ...] = ()                # the same block numbers, on the host

    @staticmethod
    def random(shape: Shape, dtype: torch.dtype, device: str, paged: bool,
               seed: int = 1) -> "Cache":
        g = torch.Generator().manual_seed(seed)
        rows = (shape.context, shape.kv_heads, shape.head_dim)
        k, v = (torch.randn(rows, generator=g).to(dtype).to(device) for _ in range(2))
        if not paged:
            return Cache(k, v)
        blocks = torch.randperm(shape.context // shape.block, generator=g).to(torch.int32)
        return Cache(k, v, blocks.to(device)[None], tuple(blocks.tolist()))

    def row(self, pos: int, block: int) -> int:
        """The cache row of position `pos` (paged: from the host's block numbers)."""
        if self.table is None:
            return pos
        return self.blocks[pos // block] * block + pos % block

    def rows(self, pos: int, block: int) -> tuple[torch.Tensor, torch.Tensor]:
        """[1, kv_heads, head_dim] views of K's and V's row for `pos`: a kernel writes into them
        in place (`out=`)."""
        r = self.row(pos, block)
        return self.k[r:r + 1], self.v[r:r + 1]

    def write(self, pos: int, block: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """torch's cache write: copies into the row."""
        kr, vr = self.rows(pos, block)
        kr.copy_(k.reshape(kr.shape))
        vr.copy_(v.reshape(vr.shape))

    def keys_in_order(self, block: int) -> tuple[torch.Tensor, torch.Tensor]:
        """[context, kv_heads, head_dim] K and V in position order (torch's view)."""
        if self.table is None:
            return self.k, self.v
        rows = (self.table[0].long()[:, None] * block
                + torch.arange(block, device=self.k.device)).flatten()
        return self.k[rows], self.v[rows]


def step(layer: Layer, x: torch.Tensor, cache: Cache, pos: int) -> dict[str, torch.Tensor]:
    """One decode step with metalforge kernels; every stage's result, by name."""
    s = layer.shape
    E, hq = s.head_dim, s.heads
    out: dict[str, torch.Tensor] = {}
    out["q"] = q = q_rope(*layer.heads("q"), x, layer.w_attn, pos)
    out["k"], out["v"] = kv_rope(*layer.heads("k"), *layer.heads("v"), x, layer.w_attn, pos,
                                 out=cache.rows(pos, s.block))
    if cache.table is None:
        a = decode_attention(q, cache.k, cache.v, E ** -0.5, pos)
    else:
        a = paged_decode_attention(q, cache.k, cache.v, cache.table, E ** -0.5, pos, BS=s.block)
    out["attention"] = a
    out["x2"] = x2 = qlinear_add(*layer.o, a.reshape(1, hq * E), x)
    out["swiglu"] = m = gate_up(*layer.gate, *layer.up, x2, layer.w_mlp)
    out["y"] = qlinear_add(*layer.down, m, x2)
    return out


# --------------------------------------------------------------------------- torch

def torch_rope(x: torch.Tensor, pos: int, base: float = 500000.0) -> torch.Tensor:
    """Rotate-half RoPE of [..., E] at one position, in float64."""
    E = x.shape[-1]
    inv = base ** (-torch.arange(0, E, 2, dtype=torch.float64, device=x.device) / E)
    th = (pos * inv).repeat(2)
    x1, x2 = x.double().chunk(2, dim=-1)
    return (x.double() * th.cos() + torch.cat([-x2, x1], -1) * th.sin()).to(x.dtype)


def torch_step(layer: Layer, x: torch.Tensor, cache: Cache, pos: int,
               weights: dict | None = None) -> dict[str, torch.Tensor]:
    """The same step in torch with the dequantized (f16/bf16) weights."""
    s = layer.shape
    E, hq, hkv = s.head_dim, s.heads, s.kv_heads
    w = weights or torch_weights(layer)
    out: dict[str, torch.Tensor] = {}
    h = F.rms_norm(x, (s.dim,), layer.w_attn, eps=1e-5)
    heads = F.linear(h, w["qkv"]).view(1, hq + 2 * hkv, E)
    out["q"] = q = torch_rope(heads[:, :hq], pos)
    out["k"], out["v"] = torch_rope(heads[:, hq:hq + hkv], pos), heads[:, hq + hkv:]
    cache.write(pos, s.block, out["k"], out["v"])
    k, v = cache.keys_in_order(s.block)
    k, v = (t[:pos + 1].transpose(0, 1)[None] for t in (k, v))          # [1, G, pos+1, E]
    a = F.scaled_dot_product_attention(q[:, :, None], k, v, scale=E ** -0.5, enable_gqa=True)
    out["attention"] = a = a[:, :, 0]
    out["x2"] = x2 = x + F.linear(a.reshape(1, hq * E), w["o"])
    h2 = F.rms_norm(x2, (s.dim,), layer.w_mlp, eps=1e-5)
    gu = F.linear(h2, w["gate_up"])
    out["swiglu"] = m = F.silu(gu[:, :s.hidden]) * gu[:, s.hidden:]
    out["y"] = x2 + F.linear(m, w["down"])
    return out


def torch_weights(layer: Layer) -> dict[str, torch.Tensor]:
    """The dequantized weights, q, k and v stacked (one F.linear for all), gate and up too."""
    w = {n: dequantized(getattr(layer, n)) for n in ("o", "down")}
    w["qkv"] = torch.cat([dequantized(layer.q), dequantized(layer.k), dequantized(layer.v)])
    w["gate_up"] = torch.cat([dequantized(layer.gate), dequantized(layer.up)])
    return w


SMALL = Shape(dim=256, heads=4, kv_heads=2, head_dim=64, hidden=512, context=64, block=16)
TOL = {torch.float16: dict(rtol=2e-2, atol=2e-2), torch.bfloat16: dict(rtol=5e-2, atol=6e-2)}


def compare(shape: Shape, dtype: torch.dtype, device: str, paged: bool, pos: int) -> list[str]:
    """Run both steps on the same inputs and caches; the stages checked, in order."""
    layer = Layer.random(shape, dtype, device)
    x = torch.randn(1, shape.dim, generator=torch.Generator().manual_seed(2)).to(dtype)
    x = x.to(device)
    ours_cache = Cache.random(shape, dtype, device, paged)
    theirs_cache = Cache.random(shape, dtype, device, paged)
    ours = step(layer, x, ours_cache, pos)
    mf.check_deferred()                      # the paged step's block-table reads: all in range
    theirs = torch_step(layer, x, theirs_cache, pos)
    for name in ours:
        torch.testing.assert_close(ours[name].float(), theirs[name].float(), **TOL[dtype],
                                   msg=lambda m, n=name: f"stage {n}: {m}")
    torch.testing.assert_close(ours_cache.k, theirs_cache.k, **TOL[dtype])
    torch.testing.assert_close(ours_cache.v, theirs_cache.v, **TOL[dtype])
    return list(ours)


if __name__ == "__main__":
    device = "mps" if torch.backends.mps.is_available() else "cpu"
    x = torch.randn(1, SMALL.dim, dtype=torch.float16, device=device)
    print(q_rope.source(*Layer.random(SMALL, torch.float16, device).heads("q"), x,
                        torch.ones(SMALL.dim, dtype=torch.float16, device=device), 0))
    for dtype in (torch.float16, torch.bfloat16):
        for paged in (False, True):
            stages = compare(SMALL, dtype, device, paged, pos=37)
    print(f"llama_decode: {len(stages)} stages ({', '.join(stages)}), f16 and bf16, contiguous "
          f"and paged cache, on {current_backend([x])} match torch stage by stage")
