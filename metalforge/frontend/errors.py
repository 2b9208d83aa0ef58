"""Errors the frontend raises. Each message names the kernel, the user's file:line and what
would be right."""
from __future__ import annotations


class AnnotationError(ValueError):
    """A malformed or unsupported annotation. `column` is the offending character's offset."""
    column: int = 0
    annotation: str = ""


class TraceError(TypeError):
    """The kernel body does something the DSL cannot trace (data-dependent control flow,
    unknown function, bad axis, type promotion torch refuses, ...)."""


class BindingError(TypeError):
    """Arguments that do not fit the kernel's signature or annotations."""
