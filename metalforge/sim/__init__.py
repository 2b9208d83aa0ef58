"""metalforge.sim: run Metal Shading Language kernels on the CPU.

``compile_shader(source)`` is a drop-in for ``torch.mps.compile_shader`` on CPU tensors: the MSL
text is compiled as C++17 against metalforge's ``<metal_stdlib>`` shim and every GPU thread runs
as a fiber, so threadgroup barriers and simdgroup collectives behave as on the GPU.  See
README.md ("Testing Metal kernels on Linux") and the module docstrings of library.py (binding),
rewrite.py (the textual pass), compiler.py (compilation and cache) and include/mf_sim/engine.cpp
(execution model).
"""
from ..errors import KernelError
from ..msl.tokens import ParseError
from .library import (
                      Library,
                      LibraryFunction,
                      compile_shader,
                      race_detection,
                      thread_order,
                      threadgroup_fill,
                      whole_groups,
)
from .toolchain import CompilerNotFound

__all__ = ["CompilerNotFound", "KernelError", "Library", "LibraryFunction", "ParseError",
           "compile_shader", "race_detection", "thread_order", "threadgroup_fill",
           "whole_groups"]
