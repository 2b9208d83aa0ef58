"""Metal scalar, vector and array types by name: their scalar, components and byte size, and the
small integer constant expressions (array extents, attribute arguments) MSL text spells them
with."""
from __future__ import annotations

import re

_SCALAR_SIZES = {
    "bool": 1, "char": 1, "uchar": 1, "int8_t": 1, "uint8_t": 1, "short": 2, "ushort": 2,
    "int16_t": 2, "uint16_t": 2, "half": 2, "bfloat": 2, "int": 4, "uint": 4, "int32_t": 4,
    "uint32_t": 4, "float": 4, "long": 8, "ulong": 8, "int64_t": 8, "uint64_t": 8, "size_t": 8,
    "unsigned": 4, "signed": 4, "double": 8,
}
_FLOAT_SCALARS = {"half", "bfloat", "float", "double"}


def scalar_of(type_name: str) -> tuple[str, int, int] | None:
    """(scalar, components, byte size) of a Metal scalar/vector/packed type name, else None."""
    t = re.sub(r"^(?:::)?metal::", "", type_name.strip())
    t = {"unsigned int": "uint", "unsigned short": "ushort", "unsigned char": "uchar",
         "unsigned long": "ulong", "signed char": "char", "long long": "long",
         "unsigned long long": "ulong"}.get(t, t)
    if t in _SCALAR_SIZES:
        return t, 1, _SCALAR_SIZES[t]
    m = re.fullmatch(r"(packed_)?([a-z]+?)([234])?", t)
    if m and m.group(2) in _SCALAR_SIZES:
        s, n = m.group(2), int(m.group(3) or 1)
        sz = _SCALAR_SIZES[s]
        if n == 1:
            return s, 1, sz
        # a 3-vector occupies four elements unless packed (MSL spec, "Vector data types")
        return s, n, sz * (n if (m.group(1) or n != 3) else 4)
    m = re.fullmatch(r"(?:metal::)?atomic_(int|uint|float|bool|ulong|long)", t)
    if m:
        return m.group(1), 1, _SCALAR_SIZES[m.group(1)]
    m = re.fullmatch(r"vec<\s*(\w+)\s*,\s*([234])\s*>", t)
    if m and m.group(1) in _SCALAR_SIZES:
        n = int(m.group(2))
        return m.group(1), n, _SCALAR_SIZES[m.group(1)] * (4 if n == 3 else n)
    return None


def is_float_scalar(s: str) -> bool:
    return s in _FLOAT_SCALARS


def eval_int(expr: str, names: dict[str, str]) -> int | None:
    """Evaluate a small integer constant expression, resolving identifiers through `names`."""
    seen = 0
    while True:
        seen += 1
        if seen > 20:
            return None
        changed = False

        def sub(m: re.Match) -> str:
            nonlocal changed
            w = m.group()
            if w in names:
                changed = True
                return f"({names[w]})"
            return w
        expr = re.sub(r"(?<![\w.])[A-Za-z_]\w*(?:::\w+)*", sub, expr)
        if not changed:
            break
    expr = re.sub(r"(?<=\d)[uUlL]+\b", "", expr)
    if not re.fullmatch(r"[\d\s+\-*/%()<>]*", expr) or not expr.strip():
        return None
    try:
        v = eval(expr.replace("/", "//"), {"__builtins__": {}}, {})  # digits and operators only
    except Exception:
        return None
    return int(v) if isinstance(v, int) else None


def type_size(type_text: str, names: dict[str, str]) -> int | None:
    t = type_text.strip()
    for w, v in names.items():
        t = re.sub(rf"(?<![\w:]){re.escape(w)}(?!\w)", v, t)
    sc = scalar_of(t)
    if sc:
        return sc[2]
    m = re.fullmatch(r"(?:::)?(?:metal::)?array<\s*(.+)\s*,\s*([^,<>]+)>", t)
    if m:
        inner, n = type_size(m.group(1), names), eval_int(m.group(2), names)
        return inner * n if inner is not None and n is not None else None
    return None


