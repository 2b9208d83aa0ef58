"""metalforge: a declarative kernel DSL for Apple-silicon GPUs (see README.md).

    import metalforge as mf

    @mf.kernel
    def silu(x: "T[N]"):
        return x * mf.sigmoid(x)
"""
from __future__ import annotations

from . import dtypes
from ._version import __version__
from .autotuner import autotune
from .dtypes import BF16 as bf16
from .dtypes import F16 as f16
from .dtypes import F32 as f32
from .dtypes import I8 as i8
from .dtypes import I16 as i16
from .dtypes import I32 as i32
from .dtypes import I64 as i64
from .dtypes import U8 as u8
from .dtypes import U16 as u16
from .dtypes import U32 as u32
from .dtypes import U64 as u64
from .errors import (
    AnnotationError,
    BackendUnavailable,
    BindingError,
    CandidateMismatch,
    DeviceError,
    GatherIndexError,
    LaunchError,
    MetalforgeError,
    QuantizationError,
    ShapeError,
    TraceError,
    UnsupportedConstruct,
    UnsupportedOnBackend,
)
from .export import load_exported
from .frontend import tracer as _tracer
from .frontend.kernel import Const, Kernel, kernel
from .frontend.ops import (
    abs,
    argmax,
    argmin,
    ceil,
    clamp,
    cos,
    cummax,
    cummin,
    cumprod,
    cumsum,
    erf,
    exp,
    exp2,
    floor,
    index,
    inf,
    log,
    log2,
    log_softmax,
    logcumsumexp,
    logsumexp,
    max,
    maximum,
    mean,
    min,
    minimum,
    prod,
    rand,
    randn,
    rsqrt,
    scatter_add,
    sigmoid,
    sin,
    size,
    softmax,
    sqrt,
    sum,
    take,
    tanh,
    unpack,
    where,
)
from .runtime import backend
from .runtime.indexcheck import check_deferred, synchronize
from .runtime.outputs import AliasError
from .target import target

_OPS = ("where", "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "tanh",
        "sigmoid", "erf", "abs", "floor", "ceil", "maximum", "minimum", "clamp", "index",
        "size", "inf", "sum", "mean", "max", "min", "prod", "argmax", "argmin", "softmax",
        "log_softmax", "logsumexp", "take", "unpack", "scatter_add")
_OPS += ("cumsum", "cumprod", "cummax", "cummin", "logcumsumexp")
_OPS += ("rand", "randn")                        # counter-based random numbers (Philox)

__all__ = ["kernel", "Kernel", "Const", "backend", "autotune", "dtypes", "MetalforgeError",
           "AnnotationError", "BindingError", "TraceError", "ShapeError", "DeviceError",
           "LaunchError", "UnsupportedConstruct", "CandidateMismatch", "BackendUnavailable",
           "UnsupportedOnBackend", "GatherIndexError", "QuantizationError", "f32", "f16", "bf16",
           "i64", "i32", "u32", "i16", "u16", "i8", "u8", "u64", *_OPS]
__all__ += ["check_deferred", "synchronize"]     # deferred gather index checks
__all__ += ["AliasError"]
__all__ += ["load_exported"]
__all__ += ["target"]                             # which Metal generated code may assume


def __getattr__(name: str):
    if name == "bool":      # mf.bool as a dtype, without shadowing the builtin in this module
        return dtypes.BOOL
    at = ""
    if _tracer._CURRENT.get() is not None:          # inside a kernel: say where the user called it
        file, line = _tracer.user_frame_loc()
        at = f"{file}:{line}: "
    raise AttributeError(f"{at}module 'metalforge' has no attribute '{name}'; the DSL "
                         f"functions are: {', '.join(_OPS)}")
