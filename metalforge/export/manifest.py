"""The export manifest (`manifest.json`), schema 1.

    {"schema": 1,
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
        "where": "kernel 'rms_norm' (file:line)"}]}

A launch binds every argument; `threads` and `group_size` are Metal's dispatchThreads sizes (as
torch.mps.compile_shader takes them). Tensors are contiguous, in the shapes given. A "sorted"
argument is its input tensor flattened and sorted (torch.sort, stable): part "keys" the values,
"order" the positions (both int64). A report whose flag is set after the launches means an
index out of range at site `index_errors[site]`.

The grid, threadgroup and variant choice are those of the exported sizes: metalforge chooses
them from the sizes at each call, by rules that are Python code (the schedules), so an export
fixes the sizes and records the result; export every shape set you will call with (entries
accumulate in one manifest, one source file each).
"""
from __future__ import annotations

from typing import Any

SCHEMA = 1


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
