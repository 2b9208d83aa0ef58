"""Tokens of preprocessed MSL text, and the bracket matching every reader of it needs.

`tokenize` splits preprocessed C++ (line markers and other ``#`` lines skipped) into identifiers,
numbers, string literals, punctuation and whole attributes (``[[...]]``, kept as their inner
text); `match_bracket` / `match_angle` find closing brackets (a ``<`` that compares is not
one), `split_commas` splits at top-level commas, `attr_list` reads one attribute's entries and
`LineMap` maps an offset back to the user's ``file:line``.  `ParseError` is what every reader of
the text (metalforge.msl, the simulator's checks) raises for text it cannot read.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import MetalforgeError


class ParseError(MetalforgeError):
    """The source has a kernel a backend cannot run (message says why and where).

    ``offset`` (into the preprocessed text) is set when the message has no location yet;
    `parse` turns it into the user's ``file:line``."""

    def __init__(self, msg: str, offset: int | None = None):
        super().__init__(msg)
        self.offset = offset


@dataclass
class Token:
    kind: str   # 'id', 'num', 'str', 'punct', 'attr'
    text: str
    start: int
    end: int


_ID = re.compile(r"[A-Za-z_]\w*")
_NUM = re.compile(r"\.?\d(?:[\w.]|[eEpP][+-])*")
_PUNCT3 = ("<<=", ">>=", "...", "->*")
_PUNCT2 = ("::", "->", "++", "--", "<<", "<=", ">=", "==", "!=", "&&", "||", "+=", "-=", "*=",
           "/=", "%=", "&=", "|=", "^=", ".*")


# One match per identifier, number or punctuator, in `_token_at`'s order (an identifier, a
# number, the longer punctuators first, then any one character); the whitespace inside a line
# in one match too. `tokenize` reads the text with these instead of one character at a time (the
# simulator tokenizes every source several times); the tokens are the same.
_WORD = re.compile(r"(?P<id>[A-Za-z_]\w*)|(?P<num>\.?\d(?:[\w.]|[eEpP][+-])*)|(?P<punct>"
                   + "|".join(re.escape(p) for p in _PUNCT3 + _PUNCT2) + "|.)", re.DOTALL)
_BLANKS = re.compile(r"[ \t\r\f\v]+")


def tokenize(text: str) -> list[Token]:
    """Tokens of preprocessed C++ (line markers and other # lines are skipped)."""
    toks: list[Token] = []
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if c == "\n":
            i, line_start = i + 1, True
            continue
        if c in " \t\r\f\v":
            blanks = _BLANKS.match(text, i)
            i = blanks.end() if blanks else i + 1
            continue
        if c == "#" or c == "/":                         # a # line or a comment
            j, after = _skip(text, i, line_start)
            if j != i:
                i, line_start = j, after
                continue
        line_start = False
        m = None if c == '"' or c == "'" or text.startswith("[[", i) else _WORD.match(text, i)
        if m is not None:                                # (any other character: punctuation)
            toks.append(Token(m.lastgroup or "punct", m.group(), i, m.end()))
        else:                                            # a literal or an attribute
            toks.append(_token_at(text, i))
        i = toks[-1].end
    return toks


def _skip(text: str, i: int, line_start: bool) -> tuple[int, bool]:
    """Past the whitespace, comment or # line at text[i] (i itself when a token starts there),
    and whether the next character starts a line."""
    c = text[i]
    if c == "\n":
        return i + 1, True
    if c in " \t\r\f\v":
        return i + 1, line_start
    if c == "#" and line_start:
        return _directive_end(text, i), True
    if text.startswith("//", i):
        return _line_end(text, i), False
    if text.startswith("/*", i):
        j = text.find("*/", i + 2)
        return (len(text) if j < 0 else j + 2), False
    return i, False


def _directive_end(text: str, i: int) -> int:
    """The end of the # line at text[i], past its backslash-continued lines."""
    j = _line_end(text, i)
    while j < len(text) and text[max(i, j - 2):j].rstrip("\r").endswith("\\"):
        j = _line_end(text, j + 1)
    return j


def _line_end(text: str, i: int) -> int:
    j = text.find("\n", i)
    return len(text) if j < 0 else j


def _token_at(text: str, i: int) -> Token:
    """The token starting at text[i]."""
    c = text[i]
    if c == '"' or c == "'":
        return _quoted_at(text, i)
    if text.startswith("[[", i):
        return _attribute_at(text, i)
    for kind, pattern in (("id", _ID), ("num", _NUM)):
        m = pattern.match(text, i)
        if m:
            return Token(kind, m.group(), i, m.end())
    for p in _PUNCT3 + _PUNCT2:
        if text.startswith(p, i):
            return Token("punct", p, i, i + len(p))
    return Token("punct", c, i, i + 1)


def _quoted_at(text: str, i: int) -> Token:
    """A string or character literal."""
    j, n = i + 1, len(text)
    while j < n and text[j] != text[i]:
        j += 2 if text[j] == "\\" else 1
    return Token("str", text[i:j + 1], i, j + 1)


def _attribute_at(text: str, i: int) -> Token:
    """An attribute ``[[...]]`` (nested brackets included), as its inner text."""
    depth, j, n = 0, i, len(text)
    while j < n:
        if text[j] == "[":
            depth += 1
        elif text[j] == "]":
            depth -= 1
            if depth == 0:
                break
        j += 1
    return Token("attr", text[i + 2:j - 1].strip(), i, j + 1)


def match_bracket(toks: list[Token], i: int, open_: str, close: str) -> int:
    """Index of the token closing the bracket opened at toks[i]."""
    depth = 0
    for j in range(i, len(toks)):
        t = toks[j].text
        if toks[j].kind != "punct":
            continue
        if t == open_:
            depth += 1
        elif t == close:
            depth -= 1
            if depth == 0:
                return j
    raise ParseError(f"unbalanced '{open_}': no matching '{close}'", toks[i].start if i < len(toks)
                     else None)


def after_templates(head: list[Token]) -> int:
    """Index of the first token of a declaration after its `template <...>` headers."""
    k = 0
    while k + 1 < len(head) and head[k].text == "template" and head[k + 1].text == "<":
        k = match_angle(head, k + 1) + 1
    return k


def match_angle(toks: list[Token], i: int) -> int:
    """Index of the '>' closing the template bracket opened at toks[i]."""
    depth = 0
    j = i
    while j < len(toks):
        t = toks[j].text
        if t in ("(", "["):
            j = match_bracket(toks, j, t, ")" if t == "(" else "]") + 1
            continue
        if t == "<" and _is_less_than(toks, j):
            j += 1
            continue
        if t == "<":
            depth += 1
        elif t == ">":
            depth -= 1
        elif t == ">>":
            depth -= 2
        if depth <= 0 and t in (">", ">>"):
            return j
        j += 1
    raise ParseError("unbalanced '<' in a template", toks[i].start if i < len(toks) else None)


def name_before(toks: list[Token], idx: int) -> str:
    """The (possibly qualified) name that ends just before toks[idx]."""
    parts: list[str] = []
    j = idx - 1
    while j >= 0 and toks[j].kind == "id":
        parts.insert(0, toks[j].text)
        j -= 1
        if j >= 0 and toks[j].text == "::":
            parts.insert(0, "::")
            j -= 1
            continue
        break
    return "".join(parts)


def top_level(toks: list[Token]) -> list[str]:
    """Texts of the tokens outside (), [] and {} brackets."""
    out, depth = [], 0
    for t in toks:
        if t.kind == "punct" and t.text in "([{":
            depth += 1
        elif t.kind == "punct" and t.text in ")]}":
            depth -= 1
        elif depth == 0:
            out.append(t.text)
    return out


def _is_less_than(toks: list[Token], j: int) -> bool:
    """Whether the '<' at toks[j] compares (`sizeof(T) < 8`, `4 < N`) rather than opening
    template arguments: a template name is never a literal or a closing parenthesis."""
    return j > 0 and (toks[j - 1].kind == "num" or toks[j - 1].text == ")")


def split_commas(toks: list[Token]) -> list[list[Token]]:
    parts: list[list[Token]] = [[]]
    depth = 0
    for j, t in enumerate(toks):
        if t.kind == "punct" and t.text == "<" and _is_less_than(toks, j):
            pass
        elif t.kind == "punct" and t.text in "([{<":
            depth += 1
        elif t.kind == "punct" and t.text in ")]}>":
            depth -= 1
        elif t.kind == "punct" and t.text == ">>":
            depth -= 2
        if t.kind == "punct" and t.text == "," and depth == 0:
            parts.append([])
            continue
        parts[-1].append(t)
    return [p for p in parts if p]


_LINEMARK = re.compile(r'^#\s*(?:line\s+)?(\d+)\s+"([^"]*)"', re.M)


class LineMap:
    """Maps offsets in preprocessed text back to (file, line) via its line markers."""

    def __init__(self, text: str):
        self.marks: list[tuple[int, int, str]] = []   # (offset of next line, line no, file)
        for m in _LINEMARK.finditer(text):
            nl = text.find("\n", m.end())
            self.marks.append((len(text) if nl < 0 else nl + 1, int(m.group(1)), m.group(2)))
        self.text = text

    def locate(self, off: int) -> tuple[str, int]:
        best = None
        for mark in self.marks:
            if mark[0] <= off:
                best = mark
            else:
                break
        if best is None:
            return "", self.text.count("\n", 0, off) + 1
        return best[2], best[1] + self.text.count("\n", best[0], off)


def attr_name(a: str) -> tuple[str, str]:
    m = re.match(r"\s*(\w+)\s*(?:\((.*)\))?\s*$", a, re.S)
    return (m.group(1), (m.group(2) or "").strip()) if m else (a, "")


def attr_list(text: str) -> list[tuple[str, str]]:
    """(name, argument) of each attribute in one ``[[a(x), b]]``."""
    parts, depth, cur = [], 0, ""
    for c in text:
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
        if c == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += c
    parts.append(cur)
    return [attr_name(x) for x in parts if x.strip()]

