"""Rotary position embeddings (RoPE), written with gathers (`mf.take`).

    python examples/rope.py

Five variants, each checked against an independent torch implementation: rotate-half RoPE
with positions from a tensor and the angles computed in the kernel (Llama/NeoX layout),
interleaved RoPE (pairs 2j, 2j+1; GPT-J layout), partial rotary dims (only the first
`rot_dims` of each head rotate), cos/sin read from precomputed tables, and a q/k RMSNorm fused
with RoPE (one row-reduction kernel: the norm's sum and the rotation in one pass). The partner
element (the other half of the pair) is a gather along E by an index expression, with no index
tensor in memory: interleaved RoPE reads it from the vector it loaded (lane k ^ 1), the fused
kernel from the lane holding it (simd shuffles, for rows one simdgroup holds); the others read
it a second time, from cache (docs/reference/gathers.md). Runs on Metal on a Mac, else on the
simulator.
"""
import torch

import metalforge as mf
from metalforge.runtime import current_backend


@mf.kernel                                    # rotate-half RoPE, positions from a tensor
def rope(x: "T[B, H, S, E]", pos: "i32[B, S]", base: float = 10000.0):
    i, half = mf.index("E"), mf.size("E") // 2
    partner = mf.take(x, axis="E", index=mf.where(i < half, i + half, i - half))
    theta = pos * base ** (-2.0 * (i % half) / mf.size("E"))     # f32: pos is an integer
    out = x * mf.cos(theta) + mf.where(i < half, -partner, partner) * mf.sin(theta)
    return out.to("T")                                             # back to x's dtype


@mf.kernel                                    # interleaved pairs (2j, 2j + 1)
def rope_interleaved(x: "T[B, H, S, E]", pos: "i32[B, S]", base: float = 10000.0):
    i = mf.index("E")
    partner = mf.take(x, axis="E", index=i ^ 1)
    theta = pos * base ** (-2.0 * (i // 2) / mf.size("E"))
    out = x * mf.cos(theta) + mf.where(i % 2 == 0, -partner, partner) * mf.sin(theta)
    return out.to("T")


@mf.kernel                                    # only the first rot_dims dims of a head rotate
def rope_partial(x: "T[B, H, S, E]", pos: "i32[B, S]", base: float = 10000.0,
                 rot_dims: mf.Const[int] = 32):
    i, half = mf.index("E"), rot_dims // 2
    rotated = i < rot_dims
    partner = mf.take(x, axis="E",
                      index=mf.where(i < half, i + half, mf.where(rotated, i - half, i)))
    theta = pos * base ** (-2.0 * (i % half) / rot_dims)
    out = x * mf.cos(theta) + mf.where(i < half, -partner, partner) * mf.sin(theta)
    return mf.where(rotated, out, x).to("T")


@mf.kernel                                    # cos/sin from tables over (S, E/2)
def rope_cached(x: "T[B, H, S, E]", cos: "T[S, E/2]", sin: "T[S, E/2]"):
    i, half = mf.index("E"), mf.size("E") // 2
    partner = mf.take(x, axis="E", index=mf.where(i < half, i + half, i - half))
    c = mf.take(cos, axis="E/2", index=i % half)
    s = mf.take(sin, axis="E/2", index=i % half)
    return x * c + mf.where(i < half, -partner, partner) * s


@mf.kernel                                    # q/k RMSNorm and RoPE fused: one row kernel
def qk_norm_rope(x: "T[B, H, S, E]", w: "T[E]", pos: "i32[B, S]", eps: float = 1e-6,
                 base: float = 10000.0):
    i, half = mf.index("E"), mf.size("E") // 2
    j = mf.where(i < half, i + half, i - half)                     # the partner's position
    inv = mf.rsqrt(mf.mean(x * x, axis="E") + eps)                 # per head: a row reduction
    y = x * inv * w
    partner = mf.take(x, axis="E", index=j) * inv * mf.take(w, axis="E", index=j)
    theta = pos * base ** (-2.0 * (i % half) / mf.size("E"))
    return (y * mf.cos(theta) + mf.where(i < half, -partner, partner) * mf.sin(theta)).to("T")


# what check() may draw: RoPE pairs elements of a head, so E is even where every element
# rotates (rope_partial: at least rot_dims, the rest pass through); positions stay small where
# the kernel computes the angles: cos(pos * f) at pos ~ 30000 turns a 1-ulp difference of the
# GPU's pow into ~4e-3 of the output, far over f32's tolerance (torch's own fp32 RoPE has the
# same error against a float64 one)
# Head dims: whole vectors of 8 (64, 128) and not (6, 34: the rows end in a partial chunk, so
# the kernels' element-by-element path runs too; rope_partial also 33: with 34 an f32 tensor
# holds a whole number of 4-wide chunks whenever B*H*S is even, check once drew no other, and
# the guard of the last partial chunk never ran); qk_norm_rope's rows span its three
# row-length variants (one simdgroup, one threadgroup, looped: 8194 for f32, 16386 for 2-byte
# types), with a memory budget that keeps those to a few rows (the simulator runs every thread);
# 520 gives the one-threadgroup kernel three simdgroups (at 256 it has one), so its exchange of
# partial sums through threadgroup memory runs.
# base: a RoPE base (1e2 to 1e5); a base near 0 makes the angles pos * base^(-2j/E) huge, where
# one ulp of the GPU's pow moves sin/cos by O(1) (found by the CUDA run of check)
# x (the rotations only): linear in x, so all-zero and tiny heads (|x| near the smallest normal,
# under the absolute tolerance) show nothing of cos/sin; with them drawn, check ran rope's vector
# path only on such heads and missed `x * cos` turned into `x / cos` there (a mutant; the same in
# rope_interleaved). qk_norm_rope keeps them: its norm's sum of squares is defined on them.
_SMALL = {"pos": (0, 16), "base": (100.0, 100000.0)}
_ROTATE = {**_SMALL, "x": ["normal", "shifted", "mixed", "large", "special"]}
_E = [2, 6, 8, 34, 64, 128]
CHECK = {"rope": {"dims": {"E": _E}, "values": _ROTATE},
         "rope_interleaved": {"dims": {"E": _E}, "values": _ROTATE},
         "rope_cached": {"dims": {"E": _E}},
         "rope_partial": {"dims": {"E": [32, 33, 34, 64, 128]}, "values": _ROTATE},
         "qk_norm_rope": {"dims": {"E": _E + [256, 520, 8194, 16386]}, "values": _SMALL,
                          "memory_budget": 1 << 17}}


# independent torch implementations --------------------------------------------------------

def angles(pos: torch.Tensor, dims: int, base: float = 10000.0) -> torch.Tensor:
    """[..., dims / 2] angles pos * base^(-2j / dims), in float64."""
    inv = base ** (-torch.arange(0, dims, 2, dtype=torch.float64, device=pos.device) / dims)
    return pos.to(torch.float64)[..., None] * inv


def torch_rope(x, pos, base=10000.0):
    th = angles(pos, x.shape[-1], base)[:, None].repeat(1, 1, 1, 2)       # [B, 1, S, E]
    x1, x2 = x.double().chunk(2, dim=-1)
    return (x.double() * th.cos() + torch.cat([-x2, x1], -1) * th.sin()).to(x.dtype)


def torch_rope_interleaved(x, pos, base=10000.0):
    th = angles(pos, x.shape[-1], base)[:, None]                           # [B, 1, S, E/2]
    xd = x.double().unflatten(-1, (-1, 2))
    a, b = xd[..., 0], xd[..., 1]
    out = torch.stack([a * th.cos() - b * th.sin(), b * th.cos() + a * th.sin()], -1)
    return out.flatten(-2).to(x.dtype)


def torch_rope_partial(x, pos, rot_dims, base=10000.0):
    rot = torch_rope(x[..., :rot_dims], pos, base)
    return torch.cat([rot, x[..., rot_dims:]], -1)


if __name__ == "__main__":
    device = "mps" if torch.backends.mps.is_available() else "cpu"
    torch.manual_seed(0)
    x = torch.randn(2, 4, 33, 64, dtype=torch.float16, device=device)
    pos = torch.randint(0, 4096, (2, 33), dtype=torch.int32, device=device)
    print(rope.source(x, pos))
    tol = dict(rtol=2e-3, atol=3e-3)
    torch.testing.assert_close(rope(x, pos), torch_rope(x, pos), **tol)
    torch.testing.assert_close(rope_interleaved(x, pos), torch_rope_interleaved(x, pos), **tol)
    torch.testing.assert_close(rope_partial(x, pos, rot_dims=32),
                               torch_rope_partial(x, pos, 32), **tol)
    th = angles(torch.arange(33, device=device), 64)
    cos, sin = th.cos().half(), th.sin().half()
    seq = torch.arange(33, dtype=torch.int32, device=device).expand(2, 33).contiguous()
    torch.testing.assert_close(rope_cached(x, cos, sin), torch_rope(x, seq), **tol)
    w = torch.randn(64, dtype=torch.float16, device=device)
    normed = torch.nn.functional.rms_norm(x.float(), (64,), w.float(), eps=1e-6).half()
    torch.testing.assert_close(qk_norm_rope(x, w, pos), torch_rope(normed, pos), **tol)
    print(f"rope: 5 variants of {tuple(x.shape)} {x.dtype} on {current_backend([x])} match "
          "independent torch implementations")
