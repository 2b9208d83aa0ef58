"""Ahead-of-time export: `metalforge export FILE.py::NAME --dtype f16 --shape D=4096 -o out/`
writes each specialisation's Metal source, a build script for a .metallib and a manifest
(manifest.py: schema, bindings, launches); `mf.load_exported(out)` runs them with no tracing."""
from __future__ import annotations

from .loader import Exported, ExportedKernel, load_exported
from .manifest import SCHEMA
from .writer import export

__all__ = ["export", "load_exported", "Exported", "ExportedKernel", "SCHEMA"]
