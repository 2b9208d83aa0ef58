"""The frontend's errors (defined with every other user-facing error in `metalforge.errors`)."""
from ..errors import AnnotationError, BindingError, TraceError

__all__ = ["AnnotationError", "BindingError", "TraceError"]
