"""The export manifest (`manifest.json`), schema 2.

    {"schema": 2,
     "specialisations": [{
        "kernel": "rms_norm",             # the kernel's name; several entries may share it
        "bindings": {"T": "f16"},         # dtype variables and mf.Const values it was traced at
        "sizes": {"R": 16, "D": 4096},    # every axis size (static: one entry per shape set)
        "source": "rms_norm-0.metal",     # the Metal library (build_<name>.sh -> .metallib)
        "inputs": [{"name", "kind": "tensor", "dtype", "annotation", "shape"} |
                   {"name", "kind": "scalar", "type": "float"|"int"|"bool", "default"?}],
        "outputs": [{"dtype", "axes", "shape"}],
        "arguments": [                    # buffer i of every launch, in order
            {"index", "kind": "input", "name"} | {"index", "kind": "output", "output"} |
            {"index", "kind": "scalar", "name", "type"} |
            {"index", "kind": "constant", "of", "value"} |      # an axis size, element count
            {"index", "kind": "scratch", "floats"} |             # a zeroed f32 buffer
            {"index", "kind": "report"} |                        # 4 int32, zeroed: (flag,
            {"index", "kind": "sorted", "name", "part"}],        #  site, index lo, hi)
        "arg_casts": {"5": "int32"},      # compile_shader's arg_casts for scalar buffers
        "launches": [{"host_name", "threads", "group_size"}],   # dispatchThreads, in order
        "index_errors": ["mf.take from ..."],   # report site k -> what it checked
        "where": "kernel 'rms_norm' (file:line)",
        "rule": {...} | {"unavailable": "why"},      # the size rule: below
        "mlx": {"source": "rms_norm-0.mlx.json"} | {"unavailable": "why"}}]}

A launch binds every argument; `threads` and `group_size` are Metal's dispatchThreads sizes (as
torch.mps.compile_shader takes them). Tensors are contiguous, in the shapes given. A "sorted"
argument is its input tensor flattened and sorted (torch.sort, stable): part "keys" the values,
"order" the positions (both int64). A report whose flag is set after the launches means an
index out of range at site `index_errors[site]`.

The fields above are those of the exported sizes. The "rule" gives the same for any sizes, as
formulas (export/rule.py traces the launcher's own code with symbolic sizes and checks the result
against it):

    "rule": {
      "sizes": {"B": ["x", 0, []], "D": ["x", 1, []]},  # base size <- tensor, dim, divided by
                                                         # the product of these sizes; or
                       # [tensor, dim, [], [mul, div, add]]: that dim is size * mul // div + add
                       # (the size is (dim - add) * div // mul)
      "checks": TREE,          # leaves {"refuse": message} (a call the kernel refuses or that
                               # needs another export: 64-bit indexing, ...) or {} (none)
      "inputs": [[TREE, ...]], "outputs": [[TREE, ...]],  # per tensor, per dim: its size
      "constants": {"4": TREE}, "scratch": {"6": TREE},   # by argument index
      "launches": TREE,        # leaves {"value": [{"host_name", "threads", "group_size"}]}:
                               # the variant selection, grid and threadgroup rule
      "max_threads": 1024,     # present where every pipeline was taken to allow 1024 threads
      "text": ["if D <= 256:", ...]}   # the launches tree for a reader

    TREE: {"if": EXPR, "then": TREE, "else": TREE} | {"value": EXPR}  (other leaves as said)
    EXPR: an int | a symbol: a size ("D") or "max_threads(<host name>)", the running
          pipeline's max_threads_per_threadgroup (at most 1024) | [op, EXPR, ...] with op in
          + - * // % << >> & | (Python's: // and % floor), neg, max, cdiv (ceil(a / b)),
          bit_length (of a non-negative int), <= ==, not (1 true, 0 false)

A call at other shapes: read each base size as "sizes" says; evaluate "checks" (refuse where it
says); every tensor's shape must equal "inputs"; then bind "constants", zeroed f32 "scratch"
buffers and run "launches", each with 1 <= group_size <= its pipeline's limit and threads
< 2^32. A kernel whose launch code has no such form (a size no dim of an argument gives, too
many cases) has {"unavailable": why}: it runs at its exported sizes only.

"mlx": each kernel in `mx.fast.metal_kernel`'s form (export/mlx.py).
"""
from __future__ import annotations

from typing import Any

SCHEMA = 2


def merge_into(doc: dict[str, Any], entry: dict[str, Any]) -> str:
    """Add `entry` to the manifest `doc` (replacing one with the same kernel, bindings and
    sizes); its file stem (`<kernel>-<n>`)."""
    if doc.get("schema") != SCHEMA:
        raise ValueError(f"manifest schema {doc.get('schema')!r}; this metalforge writes and "
                         f"reads schema {SCHEMA}")
    specs = doc["specialisations"]
    same = [i for i, e in enumerate(specs) if (e["kernel"], e["bindings"], e["sizes"]) ==
            (entry["kernel"], entry["bindings"], entry["sizes"])]
    if same:
        specs[same[0]] = entry
        n = same[0]
    else:
        specs.append(entry)
        n = len(specs) - 1
    return f"{entry['kernel']}-{n}"
