"""metalforge.cuda: run Metal Shading Language kernels on NVIDIA GPUs.

``compile_shader(source)`` is a drop-in for ``torch.mps.compile_shader`` on CUDA tensors: the
MSL text is translated to CUDA C++ (translate.py: metalforge.msl's signature parser, a few
textual rewrites and generated ``__global__`` entry points) against metalforge's CUDA
``<metal_stdlib>`` shim (include/), compiled with NVRTC through torch, and launched on torch's
current stream. See library.py for the call model.
"""
from ..errors import KernelError
from .library import CudaFunction, CudaLibrary, compile_shader
from .translate import translate

__all__ = ["compile_shader", "CudaLibrary", "CudaFunction", "KernelError", "translate"]
