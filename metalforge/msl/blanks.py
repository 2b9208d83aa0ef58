"""The text edits both backends that compile MSL as C++ make (the simulator's rewrite.py, the
cuda backend's translate.py): the parsed attributes and instantiations blanked with the text's
lines kept, and a doubled `const constant` left as one `const`."""
from __future__ import annotations

import re

from .signature import ParsedSource

# `const` and `constant` in one run of declaration specifiers, possibly with others between them
# (MLX: `static constant constexpr const`).
_CONST_CONSTANT = re.compile(r"\bconst((?:\s+(?:constexpr|static|inline|volatile))*\s+)constant\b"
                             r"|\bconstant((?:\s+(?:constexpr|static|inline|volatile))*\s+)const\b")


def _drop_doubled_const(m: re.Match) -> str:
    if m.group(1) is not None:                       # "const constant" -> "const         "
        return "const" + m.group(1) + " " * len("constant")
    return " " * len("constant") + m.group(2) + "const"


def blanked(text: str, parsed: ParsedSource) -> str:
    """`text` with the parsed attributes and instantiations blanked: spaces, every newline
    kept, so every line keeps its number (the simulator's and the cuda backend's rewrites)."""
    chars = list(text)
    for a, b in parsed.blank_spans:
        for k in range(a, min(b, len(chars))):
            if chars[k] != "\n":
                chars[k] = " "
    return "".join(chars)


def single_const(text: str) -> str:
    """`const` and `constant` in one declaration (both spelled `const` by the shims' `#define
    constant const`) left as one `const`, columns kept."""
    return _CONST_CONSTANT.sub(_drop_doubled_const, text)
