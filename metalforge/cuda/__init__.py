"""metalforge.cuda: run Metal Shading Language kernels on NVIDIA GPUs.

``compile_shader(source)`` is a drop-in for ``torch.mps.compile_shader`` on CUDA tensors: the
MSL text is translated to CUDA C++ (translate.py: the simulator's signature parser, a few
textual rewrites and generated ``__global__`` entry points) against metalforge's CUDA
``<metal_stdlib>`` shim (include/), compiled with NVRTC through torch, and launched on torch's
current stream. See library.py for the call model.
"""
from .library import Kernel, KernelError, Library, LibraryFunction, compile_shader
from .translate import translate

__all__ = ["compile_shader", "Library", "LibraryFunction", "Kernel", "KernelError", "translate"]
