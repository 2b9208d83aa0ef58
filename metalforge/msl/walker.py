"""The structure walk of preprocessed MSL text (`Walker`).

One pass over the tokens finds, at namespace scope: function definitions (kernels or not,
templated or not, `FuncDef`), explicit instantiations carrying ``[[host_name(...)]]``, global
integer constants, function constants, kernel-scope ``threadgroup`` declarations, and the spans
the rewrite pass blanks: Metal attributes, instantiations, and definitions that differ only in
an address space and so coincide on the CPU (`Walker._drop_space_overloads`, also for member
functions and class specialisations).  parse.py turns what it found into `Signature`s.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .signature import ADDRESS_SPACES, STANDARD_ATTRS, FunctionConstant, TgDecl
from .tokens import (
    ParseError,
    Token,
    after_templates,
    attr_list,
    attr_name,
    match_angle,
    match_bracket,
    name_before,
    split_commas,
    tokenize,
    top_level,
)

# Address spaces that are the same ordinary memory on the CPU (`constant` is `const`, so it stays
# a distinct overload).
_CPU_SAME_SPACES = frozenset(ADDRESS_SPACES) - {"constant"}
_MEMBER_QUALS = frozenset(ADDRESS_SPACES) | {"const", "volatile", "noexcept", "override", "final"}


@dataclass
class FuncDef:
    name: str
    qual: str
    tparams: list[tuple[str, str | None]]    # (name, default text)
    param_toks: list[Token]
    is_kernel: bool
    attrs: list[str]
    body: tuple[int, int]                     # token index range of the body
    offset: int
    tg: list[TgDecl]


def _template_params(toks: list[Token]) -> list[tuple[str, str | None]]:
    out = []
    for part in split_commas(toks):
        dflt = None
        for k, t in enumerate(part):
            if t.text == "=":
                dflt = " ".join(x.text for x in part[k + 1:])
                part = part[:k]
                break
        ids = [t.text for t in part if t.kind == "id"]
        if ids:
            out.append((ids[-1], dflt))
    return out


def _space_overload_key(head: list[Token], ns: list[str]) -> tuple[str, str]:
    """What declarations that differ only in an address space share (the words of `head`
    without attributes and CPU-equivalent space keywords, in namespace `ns`), and the space
    keyword it names ("" for none or `thread`)."""
    key = " ".join(ns + [t.text for t in head if t.kind != "attr" and
                         (t.kind != "id" or t.text not in _CPU_SAME_SPACES)])
    space = next((t.text for t in head if t.kind == "id" and
                  t.text in _CPU_SAME_SPACES - {"thread"}), "")
    return key, space


class Walker:
    def __init__(self, text: str):
        self.text = text
        self.toks = tokenize(text)
        self.funcs: list[FuncDef] = []
        self.insts: list[dict] = []
        self.blank: list[tuple[int, int]] = []
        self.tg: list[TgDecl] = []
        self.consts: dict[str, str] = {}
        self.fcs: list[FunctionConstant] = []
        self.overloads: dict[str, list[tuple[str, int, int]]] = {}
        self.collisions: list[int] = []     # see _drop_space_overloads

    def run(self) -> None:
        toks = self.toks
        for t in toks:
            if t.kind == "attr":
                name, _ = attr_name(t.text)
                if name not in STANDARD_ATTRS:
                    self.blank.append((t.start, t.end))
        self._scope(0, len(toks), [])
        self._drop_space_overloads(self.overloads)

    def _drop_space_overloads(self, groups: dict[str, list[tuple[str, int, int]]]) -> None:
        """Of declarations that coincide on the CPU, keep the first ``thread`` (or unmarked)
        one.  When their texts differ (beyond the space keywords) the kept one would run for
        every call, so the offset of each other one goes to `collisions` (the front-end check
        renames such overloads apart first; what is left here it could not rename)."""
        for group in groups.values():
            keep = next((m for m in group if m[0] in ("", "thread")), group[0])
            for m in group:
                if m is not keep:
                    self.blank.append((self.toks[m[1]].start, self.toks[m[2]].end))
                    if self._cpu_text(m) != self._cpu_text(keep):
                        self.collisions.append(self.toks[m[1]].start)

    def _cpu_text(self, m: tuple[str, int, int]) -> list[str]:
        """The tokens of declaration `m` without attributes and address-space words (member
        groups mix ``constant`` with the others: every qualifier of ``this`` is blanked)."""
        return [t.text for t in self.toks[m[1]:m[2] + 1]
                if t.kind != "attr" and (t.kind != "id" or t.text not in ADDRESS_SPACES)]

    def _scope(self, i: int, end: int, ns: list[str]) -> None:
        toks = self.toks
        stmt_start = i
        while i < end:
            t = toks[i]
            after = self._nested_scope(i, end, ns)
            if after is not None:
                i = stmt_start = after
            elif t.text == "(" and t.kind == "punct":
                # a parenthesised part of a declaration (parameter list, static_assert or
                # initialiser argument): braces inside it are never a function body
                i = match_bracket(toks, i, "(", ")") + 1
            elif t.text == ";":
                self._statement(stmt_start, i, None, ns)
                i = stmt_start = i + 1
            elif t.text == "{":
                i, ended = self._braces(stmt_start, i, ns)
                if ended:
                    stmt_start = i
            else:
                i += 1

    def _nested_scope(self, i: int, end: int, ns: list[str]) -> int | None:
        """Walk the block of `namespace a::b {` or `extern "C" {` starting at toks[i]; the index
        after its '}', or None when toks[i] starts no such block."""
        toks = self.toks
        t = toks[i]
        if t.text == "namespace" and t.kind == "id":
            j = i + 1
            names = []
            while j < end and toks[j].text not in ("{", ";", "="):
                if toks[j].kind == "id":
                    names.append(toks[j].text)
                j += 1
            if j < end and toks[j].text == "{":
                close = match_bracket(toks, j, "{", "}")
                self._scope(j + 1, close, ns + names)
                return close + 1
        if t.text == "extern" and i + 2 < end and toks[i + 1].kind == "str" and \
                toks[i + 2].text == "{":
            close = match_bracket(toks, i + 2, "{", "}")
            self._scope(i + 3, close, ns)
            return close + 1
        return None

    def _braces(self, stmt_start: int, i: int, ns: list[str]) -> tuple[int, bool]:
        """The '{' at toks[i], in the statement from stmt_start: a function body (the statement
        ends with it), a class body or an initialiser (the statement goes on to ';').  Returns
        the index after the matching '}' and whether the statement ended."""
        toks = self.toks
        close = match_bracket(toks, i, "{", "}")
        head = toks[stmt_start:i]
        words = [x.text for x in head]
        k = after_templates(head)
        kind = words[k] if k < len(words) else ""
        # a function definition: a parameter list and no '=' outside brackets (an '=' makes it
        # a variable with a brace initialiser)
        if (")" in words[k:] and "=" not in top_level(head[k:]) and
                kind not in ("struct", "class", "union", "enum", "typedef", "using")):
            self._statement(stmt_start, i, (i, close), ns)
            return close + 1, True
        if kind in ("struct", "class", "union"):
            self._class_body(i, close)
            # specialisations on address spaces only (`S<device T*>`, `S<thread T*>`) coincide
            # on the CPU, as overloaded functions do
            key, space = _space_overload_key(head, ns)
            self.overloads.setdefault("struct " + key, []).append((space, stmt_start, close))
        return close + 1, False

    def _statement(self, s: int, e: int, body: tuple[int, int] | None, ns: list[str]) -> None:
        head = self.toks[s:e]
        if not head:
            return
        if body is None:
            self._declaration(head, e, ns)
            return
        words = [t.text for t in head]
        if words[0] == "template" and (len(words) < 2 or words[1] != "<"):
            return
        self._function(head, s, body, ns)

    def _declaration(self, head: list[Token], e: int, ns: list[str]) -> None:
        """A statement without a body: a global integer constant, a function constant or an
        explicit instantiation are recorded."""
        words = [t.text for t in head]
        # global integer constants, for threadgroup array sizes
        if "=" in words and "(" not in words:
            q = words.index("=")
            if q >= 1 and head[q - 1].kind == "id" and \
                    any(w in ("constexpr", "constant", "const") for w in words[:q]):
                self.consts[words[q - 1]] = " ".join(words[q + 1:])
        if any(t.kind == "attr" and attr_name(t.text)[0] == "function_constant" for t in head):
            self._function_constant(head, e)
            return
        if words[0] == "template" and (len(words) < 2 or words[1] != "<"):
            self._instantiation(head, ns)

    def _function(self, head: list[Token], s: int, body: tuple[int, int],
                  ns: list[str]) -> None:
        """A function definition (kernel or not) whose body is the token range `body`."""
        tparams: list[tuple[str, str | None]] = []
        k = 0
        if head[0].text == "template":
            close = match_angle(head, 1)
            tparams = _template_params(head[2:close])
            k = close + 1
        decl = head[k:]
        is_kernel = any(t.kind == "id" and t.text == "kernel" for t in decl) or \
            any(t.kind == "attr" and "kernel" in dict(attr_list(t.text)) for t in decl)
        # function name: identifier before the parameter list's '('
        popen = next((j for j, t in enumerate(decl) if t.text == "("), None)
        if popen is None or popen == 0:
            return
        if not is_kernel:
            # overloads on address spaces only (`f(thread T&)`, `f(device T&)`) coincide on the
            # CPU: the first (preferably `thread`/unqualified) is kept, see run()
            key, space = _space_overload_key(head, ns)
            self.overloads.setdefault(key, []).append((space, s, body[1]))
        pclose = match_bracket(decl, popen, "(", ")")
        name = name_before(decl, popen)
        if not name:
            return
        tg = self._body(body[0], body[1])
        self.funcs.append(FuncDef(
            name=name.split("::")[-1], qual="::".join(ns + [name]) if ns else name,
            tparams=tparams, param_toks=decl[popen + 1:pclose], is_kernel=is_kernel,
            attrs=[t.text for t in decl if t.kind == "attr"], body=body,
            offset=head[0].start, tg=tg))

    def _class_body(self, open_: int, close: int) -> None:
        """Member functions overloaded on the object's address space (``f() thread``, ``f()
        device``, ``f() const constant``: Metal code such as MLX's complex_t writes one per
        space) are the same function on the CPU, where every space is ordinary memory: the
        qualifier is blanked, and of members that then coincide the first ``thread`` (or
        unqualified) one is kept and the others are blanked whole."""
        toks = self.toks
        members: dict[str, list[tuple[str, int, int]]] = {}
        i = stmt = open_ + 1
        while i < close:
            t = toks[i]
            if t.kind == "id" and t.text in ("public", "private", "protected") and \
                    i + 1 < close and toks[i + 1].text == ":":
                i = stmt = i + 2
                continue
            if t.text == "(" and t.kind == "punct":
                i = match_bracket(toks, i, "(", ")") + 1
                continue
            if t.text == ";":
                self._member(toks[stmt:i], stmt, i, members)
                i = stmt = i + 1
                continue
            if t.text == "{":
                end = match_bracket(toks, i, "{", "}")
                head = toks[stmt:i]
                words = [x.text for x in head]
                k = after_templates(head)
                kind = words[k] if k < len(words) else ""
                if kind in ("struct", "class", "union"):
                    self._class_body(i, end)
                    i = end + 1
                    continue
                tl = top_level(head[k:])
                init_brace = ":" in tl and ")" in words and toks[i - 1].text not in (")",) and \
                    (toks[i - 1].kind == "id" and toks[i - 1].text not in _MEMBER_QUALS or
                     toks[i - 1].text == ">")
                if ")" in words[k:] and "=" not in tl and kind not in ("enum", "typedef", "using") \
                        and not init_brace:
                    self._member(head, stmt, end, members)
                    i = stmt = end + 1
                    if i < close and toks[i].text == ";":
                        i = stmt = i + 1
                    continue
                i = end + 1
                continue
            i += 1
        self._drop_space_overloads(members)

    def _member(self, head: list[Token], s: int, e: int,
                members: dict[str, list[tuple[str, int, int]]]) -> None:
        """Record one member declaration/definition toks[s..e]; blank address-space qualifiers.

        An explicit specialisation of a member function template written inside the class
        (``template <> R operator()(complex64_t x)``: Clang, hence Metal, accepts it; GCC does
        not) loses its ``template <>`` and becomes the plain overload that overload resolution
        prefers for exactly those argument types, as it would pick the specialisation."""
        words = [t.text for t in head]
        if words[:3] == ["template", "<", ">"]:
            self.blank.append((head[0].start, head[2].end))
            head, words = head[3:], words[3:]
        # the parameter list: the first '(' after the template heads (whose parentheses,
        # `enable_if_t<sizeof(T) < 8>`, are not it)
        k = after_templates(head)
        popen = next((j for j, t in enumerate(head) if t.text == "(" and j > k and
                      (head[j - 1].kind == "id" or head[j - 1].text in (")", ">"))), None)
        if popen is None:
            return
        pclose = match_bracket(head, popen, "(", ")")
        if words[popen - 1] == ")" and popen >= 2 and words[popen - 2] == "(" and \
                pclose + 1 < len(head) and words[pclose + 1] == "(":   # operator()(...)
            popen = pclose + 1
            pclose = match_bracket(head, popen, "(", ")")
        space = ""
        key = [t.text for t in head[:pclose + 1] if t.kind != "attr" and
               (t.kind != "id" or t.text not in _CPU_SAME_SPACES)]
        for t in head[pclose + 1:]:
            if t.text in (":", "->", "=", "{") or t.kind == "attr":
                break
            if t.kind == "id" and t.text in ADDRESS_SPACES:
                space = space or t.text
                self.blank.append((t.start, t.end))
            else:
                key.append(t.text)
        members.setdefault(" ".join(key), []).append((space, s, e))

    def _function_constant(self, head: list[Token], semi: int) -> None:
        attr = next(t for t in head if t.kind == "attr")
        _, arg = attr_name(attr.text)
        decl = [t for t in head if t.kind != "attr" and t.text not in ("constant", "const")]
        if len(decl) < 2 or decl[-1].kind != "id" or "=" in [t.text for t in decl]:
            raise ParseError(f"a function constant is declared as `constant T name "
                             f"[[function_constant(index)]];`, got "
                             f"`{self.text[head[0].start:head[-1].end]}`", head[0].start)
        try:
            index = int(arg, 8) if re.fullmatch(r"0[0-7]+", arg) else int(arg, 0)
        except ValueError:
            index = None
        if index is None:
            raise ParseError(f"[[function_constant({arg})]]: the index must be an integer "
                             f"literal", attr.start)
        type_text = " ".join(t.text for t in decl[:-1]).replace(" :: ", "::")
        self.fcs.append(FunctionConstant(name=decl[-1].text, type_text=type_text, index=index,
                                         start=head[0].start, end=self.toks[semi].end))

    def _body(self, b0: int, b1: int) -> list[TgDecl]:
        """Find statement-level `threadgroup T x[N];` declarations in a function body."""
        toks = self.toks
        found: list[TgDecl] = []
        prev = "{"
        i = b0 + 1
        while i < b1:
            t = toks[i]
            if t.kind == "id" and t.text == "threadgroup" and prev in ("{", "}", ";", ":"):
                j = i
                while j < b1 and toks[j].text != ";":
                    j += 1
                decl = toks[i + 1:j]
                words = [x.text for x in decl]
                head_words = words[:words.index("[")] if "[" in words else words
                if decl and not any(w in ("*", "&", "&&", "=", "(") for w in head_words):
                    # type = tokens up to the first declarator; dims = bracket contents
                    parts = split_commas(decl)
                    first = parts[0]
                    br = next((k for k, x in enumerate(first) if x.text == "["), len(first))
                    type_toks = first[:br - 1] if br > 0 else first
                    type_text = " ".join(x.text for x in type_toks).replace(" :: ", "::") \
                        .replace(" < ", "<").replace(" >", ">").replace(" ,", ",")
                    names = []
                    for part in parts:
                        br = next((k for k, x in enumerate(part) if x.text == "["), len(part))
                        if br > 0 and part[br - 1].kind == "id":
                            names.append(part[br - 1].text)
                        dims, k = [], 0
                        while k < len(part):
                            if part[k].text == "[":
                                c = match_bracket(part, k, "[", "]")
                                dims.append(" ".join(x.text for x in part[k + 1:c]))
                                k = c
                            k += 1
                        found.append(TgDecl(start=t.start, end=t.end, type_text=type_text,
                                            dims=dims))
                    self.tg.append(TgDecl(start=t.start, end=t.end, type_text=type_text,
                                          dims=[], names=names,
                                          stmt_end=toks[j].end if j < b1 else 0))
                i = j
                prev = ";"
                continue
            prev = t.text if t.kind == "punct" else "x"
            i += 1
        return found

    def _instantiation(self, head: list[Token], ns: list[str]) -> None:
        attrs = [t for t in head if t.kind == "attr"]
        host = None
        for an, arg in (x for a in attrs for x in attr_list(a.text)):
            if an == "host_name":
                host = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', arg))
        if host is None:
            return
        self.blank.append((head[0].start, head[-1].end + 1))   # through the ';'
        body = [t for t in head[1:] if t.kind != "attr"]
        words = [t.text for t in body]
        if "decltype" in words:
            # template [[host_name]] [[kernel]] decltype(f<A>) f<A>;
            d = words.index("decltype")
            close = match_bracket(body, d + 1, "(", ")")
            rest = body[close + 1:]
            name, targs = self._name_targs(rest)
            self.insts.append(dict(host=host, name=name, targs=targs, params=None,
                                   offset=head[0].start, ns=ns))
            return
        popen = words.index("(") if "(" in words else None
        if popen is None:
            raise ParseError(f"cannot read the instantiation of '{host}'")
        pclose = match_bracket(body, popen, "(", ")")
        pre = body[:popen]
        # the name (and <args>) is at the end of `pre`
        lt = None
        if pre and pre[-1].text in (">", ">>"):
            depth = 0
            for k in range(len(pre) - 1, -1, -1):
                if pre[k].text == ">":
                    depth += 1
                elif pre[k].text == ">>":
                    depth += 2
                elif pre[k].text == "<":
                    depth -= 1
                    if depth == 0:
                        lt = k
                        break
        name = name_before(pre, lt if lt is not None else len(pre))
        targs = None
        if lt is not None:
            targs = self.text[pre[lt].end:pre[-1].start].strip()
        params_text = self.text[body[popen].end:body[pclose].start]
        self.insts.append(dict(host=host, name=name, targs=targs,
                               params=params_text if targs is None else None,
                               param_toks=body[popen + 1:pclose],
                               offset=head[0].start, ns=ns))

    def _name_targs(self, toks: list[Token]) -> tuple[str, str | None]:
        words = [t.text for t in toks]
        if "<" in words:
            lt = words.index("<")
            gt = match_angle(toks, lt)
            name = "".join(words[:lt])
            return name, self.text[toks[lt].end:toks[gt].start].strip()
        return "".join(w for w in words if w != ";"), None

