"""Embedding lookup: a gather by an index tensor (`mf.take`).

    python examples/embedding.py

out[n, d] = table[ids[n], d]. Each id is checked against the table's size inside the kernel;
an id out of range raises IndexError (as F.embedding does) and nothing is read outside the
table. Runs on Metal on a Mac, else on the simulator; checked against F.embedding.
"""
import torch

import metalforge as mf
from metalforge.runtime import current_backend


@mf.kernel
def embed(table: "T[V, D]", ids: "i32[N]") -> "T[N, D]":
    return mf.take(table, axis="V", index=ids)


@mf.kernel                                    # lookup fused with a scale (Gemma-style)
def embed_scaled(table: "T[V, D]", ids: "i32[*B]", scale: float = 1.0) -> "T[*B, D]":
    return mf.take(table, axis="V", index=ids) * scale


# check(): row lengths of whole 16-byte chunks (8, 32, 64: each chunk of the gathered row is one
# vector load) and not (1, 7, 33: the element-by-element path)
_D = [1, 7, 8, 32, 33, 64]
CHECK = {"embed": {"dims": {"D": _D}}, "embed_scaled": {"dims": {"D": _D}}}


if __name__ == "__main__":
    device = "mps" if torch.backends.mps.is_available() else "cpu"
    table = torch.randn(1000, 256, dtype=torch.bfloat16, device=device)
    ids = torch.randint(0, 1000, (37,), dtype=torch.int32, device=device)
    print(embed.source(table, ids))
    torch.testing.assert_close(embed(table, ids), torch.nn.functional.embedding(ids, table))
    batch = torch.randint(0, 1000, (3, 5), dtype=torch.int32, device=device)
    want = (torch.nn.functional.embedding(batch, table).float() * 16.0).bfloat16()
    torch.testing.assert_close(embed_scaled(table, batch, 16.0), want)
    try:
        embed(table, torch.tensor([5, 1000], dtype=torch.int32, device=device))
    except IndexError as e:
        print(f"out of range: {e}")
    print(f"embedding: {tuple(ids.shape)} ids into {tuple(table.shape)} on "
          f"{current_backend([table])} match F.embedding")
