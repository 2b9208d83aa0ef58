"""Code generators: kernel IR → source text for a target (Metal Shading Language today)."""
from .msl import render as render_msl
from .msl import render_library

__all__ = ["render_msl", "render_library"]
