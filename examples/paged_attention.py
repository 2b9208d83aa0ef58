"""Paged attention (decode): grouped-query attention reading K/V through a block table.

    python examples/paged_attention.py

The cache holds NB blocks of BS positions per kv head, flattened to rows: k_cache[n, g] is row
n = block * BS + offset (vLLM's layout, viewed as [NB * BS, G, E]). block_table[b, p] is the
block holding positions [p * BS, (p + 1) * BS) of sequence b: annotated "i32[B, L/BS]", it binds
L = P * BS, and read at key l it gives the block of l (a derived dim is read at l // BS). Each
key's row is gathered with `mf.take`; keys at or past lengths[b] are masked. The attention
kernel's threads find each key's row once as they copy the keys' K and V into threadgroup
memory (16-byte copies), shared there by the query heads of its kv head; a block number outside
the cache raises GatherIndexError. Runs on Metal
on a Mac, else on the simulator; checked against scaled_dot_product_attention per sequence.
"""
import torch
import torch.nn.functional as F

import metalforge as mf
from metalforge.runtime import current_backend


@mf.kernel
def paged_attention(q: "T[B, (G R), E]", k_cache: "T[N, G, E]", v_cache: "T[N, G, E]",
                    block_table: "i32[B, L/BS]", lengths: "i32[B]", scale: float,
                    BS: mf.Const[int] = 16):
    row = block_table * BS + mf.index("L") % BS               # [B, L]: key l's cache row
    k = mf.take(k_cache, axis="N", index=row)                 # [B, G, L, E]
    v = mf.take(v_cache, axis="N", index=row)
    s = mf.sum(q * k, axis="E") * scale                       # [B, G, R, L]
    s = mf.where(mf.index("L") < lengths, s, -mf.inf)         # the sequence's own keys
    return mf.sum(mf.softmax(s, axis="L") * v, axis="L")      # -> [B, (G R), E]


def torch_paged_attention(q, k_cache, v_cache, block_table, lengths, scale, bs=16):
    """Each sequence's keys gathered with torch indexing, then SDPA (GQA)."""
    out = []
    for b in range(q.shape[0]):
        rows = (block_table[b].long()[:, None] * bs + torch.arange(bs, device=q.device))
        rows = rows.flatten()[:int(lengths[b])]
        k, v = (c[rows].transpose(0, 1)[None] for c in (k_cache, v_cache))    # [1, G, Lb, E]
        qb = q[b][None, :, None]                                              # [1, G*R, 1, E]
        out.append(F.scaled_dot_product_attention(qb, k, v, scale=scale, enable_gqa=True)[0, :, 0])
    return torch.stack(out)


# check(): block numbers 0-2 in a cache of at least 3 blocks, at least one visible key each
# (up to 48: sequences longer than one tile of 32 keys, so two key blocks both hold some)
CHECK = {"paged_attention": {"dims": {"N": (48, 80)},
                             "values": {"block_table": (0, 2), "lengths": (1, 48)}}}


if __name__ == "__main__":
    device = "mps" if torch.backends.mps.is_available() else "cpu"
    torch.manual_seed(0)
    batch, g, r, e, bs, blocks, per_seq = 3, 2, 4, 64, 16, 40, 5
    q = torch.randn(batch, g * r, e, dtype=torch.float16, device=device)
    k_cache, v_cache = (torch.randn(blocks * bs, g, e, dtype=torch.float16, device=device)
                        for _ in range(2))
    table = torch.randperm(blocks)[:batch * per_seq].reshape(batch, per_seq).to(torch.int32)
    table = table.to(device)
    lengths = torch.tensor([70, 80, 1], dtype=torch.int32, device=device)
    out = paged_attention(q, k_cache, v_cache, table, lengths, 0.125)
    want = torch_paged_attention(q.float(), k_cache.float(), v_cache.float(), table, lengths,
                                 0.125).half()
    torch.testing.assert_close(out, want, rtol=2e-3, atol=2e-3)
    print(paged_attention.source(q, k_cache, v_cache, table, lengths, 0.125))
    print(f"paged_attention: {batch} sequences of lengths {lengths.tolist()} through a "
          f"{tuple(table.shape)} block table on {current_backend([q])} match "
          "scaled_dot_product_attention")
