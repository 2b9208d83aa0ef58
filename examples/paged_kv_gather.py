"""Paged KV cache: gather each sequence's keys through its block table (`mf.take`).

    python examples/paged_kv_gather.py

The cache holds NB blocks of BS positions (vLLM's layout); block_table[b, p] is the block that
holds positions [p * BS, (p + 1) * BS) of sequence b. One gather by the block table reads every
sequence's keys into a contiguous [B, P * BS, G, E] tensor (a view of the [B, P, BS, G, E]
result). Block numbers are checked against the cache in the kernel: a bad one raises
IndexError. Runs on Metal on a Mac, else on the simulator; checked against torch indexing.
"""
import torch

import metalforge as mf
from metalforge.runtime import current_backend


@mf.kernel
def paged_gather(cache: "T[NB, BS, G, E]", block_table: "i32[B, P]") -> "T[B, P, BS, G, E]":
    return mf.take(cache, axis="NB", index=block_table)


# check(): head dims of whole 16-byte chunks (8, 64: each chunk of a gathered row is one vector
# load) and not (3, 12: the element-by-element path)
CHECK = {"paged_gather": {"dims": {"E": [3, 8, 12, 64]}}}


if __name__ == "__main__":
    device = "mps" if torch.backends.mps.is_available() else "cpu"
    nb, bs, g, e = 64, 16, 2, 64
    cache = torch.randn(nb, bs, g, e, dtype=torch.float16, device=device)
    table = torch.randperm(nb, device=device)[:3 * 5].reshape(3, 5).to(torch.int32)
    print(paged_gather.source(cache, table))
    keys = paged_gather(cache, table).flatten(1, 2)            # [B, L, G, E], L = P * BS
    want = cache[table.long()].flatten(1, 2)
    torch.testing.assert_close(keys, want)
    print(f"paged_kv_gather: {tuple(keys.shape)} keys of {table.shape[0]} sequences from a "
          f"{tuple(cache.shape)} cache on {current_backend([cache])} match torch indexing")
