"""The rules of the Metal front-end check (frontcheck.py) that are read off clang's AST.

clang in "C++ for OpenCL" mode type-checks address spaces as Metal does, but it accepts what
OpenCL allows and Metal does not; these rules cover that, on the cursors of the checked file:

- a pointer or reference declared (variable or parameter) without an address space: OpenCL
  makes it ``__generic``, Metal before MSL 4.1 has no generic space;
- a program-scope variable outside the ``constant`` space (a mutable global, a ``thread``,
  ``device`` or ``threadgroup`` one), and a ``constexpr``/``const`` program-scope array or
  object indexed at run time (Metal would have to put it in memory; scalars fold away);
- ``double`` / ``long double`` written in a declaration or a cast;
- C++ Metal does not support: ``new``/``delete``, exceptions, ``goto``, virtual functions,
  ``thread_local``, RTTI;
- a kernel that does not return ``void``;
- a ``threadgroup`` variable declared in a function that is not a kernel (a helper, a
  lambda), and a ``static`` local outside ``constant`` (the program-scope rule, in a function).
"""
from __future__ import annotations

import re

MSG_GLOBAL = "program scope variable must reside in constant address space"
MSG_STATIC = "static local variable must reside in constant address space"
MSG_TG_LOCAL = "non-kernel function variable cannot be declared in threadgroup address space"
_FORBIDDEN_EXPR = {
    "CXX_NEW_EXPR": "'new' is not supported in Metal (no dynamic allocation)",
    "CXX_DELETE_EXPR": "'delete' is not supported in Metal (no dynamic allocation)",
    "CXX_THROW_EXPR": "cannot use 'throw': Metal does not support exceptions",
    "CXX_TRY_STMT": "cannot use 'try': Metal does not support exceptions",
    "GOTO_STMT": "'goto' is not supported in Metal",
    "INDIRECT_GOTO_STMT": "'goto' is not supported in Metal",
    "CXX_TYPEID_EXPR": "'typeid' is not supported in Metal (no RTTI)",
    "CXX_DYNAMIC_CAST_EXPR": "'dynamic_cast' is not supported in Metal (no RTTI)",
}
_CASTS = {"CSTYLE_CAST_EXPR", "CXX_FUNCTIONAL_CAST_EXPR", "CXX_STATIC_CAST_EXPR"}
_FUNCS = {"FUNCTION_DECL", "FUNCTION_TEMPLATE", "CXX_METHOD", "CONSTRUCTOR", "DESTRUCTOR",
          "CONVERSION_FUNCTION", "LAMBDA_EXPR"}
_SCOPES = {"NAMESPACE", "LINKAGE_SPEC", "UNEXPOSED_DECL"}


class _Walk:
    """One pass over the cursors of the checked file, collecting (location, message)."""

    def __init__(self, ci, file_name: str, source: bytes | None = None):
        self.ci = ci
        self.source = source
        self.K = ci.CursorKind
        self.T = ci.TypeKind
        self.file_name = file_name
        self.out: list[tuple[object, str]] = []
        # constexpr/const program-scope (and static local) arrays and objects -> the rule
        self.tables: dict[str, str] = {}

    def error(self, cursor, msg: str) -> None:
        self.out.append((cursor.location, msg))

    def scope(self, cursor) -> None:
        """A translation unit or namespace: its variables are program-scope ones."""
        for c in cursor.get_children():
            f = c.location.file
            if f is None or not f.name.endswith(self.file_name):
                continue
            kind = c.kind.name
            if kind in _SCOPES:
                self.scope(c)
            elif kind == "VAR_DECL":
                self.global_var(c)
                self.body(c, in_func=False)
            else:
                self.body(c, in_func=kind in _FUNCS)

    def global_var(self, c) -> None:
        spelling = c.type.spelling
        if "__constant" in spelling:
            return
        folded = c.type.is_const_qualified() or self.has_token(c, "constexpr")
        if not folded:
            self.error(c, f"{MSG_GLOBAL} ('{c.spelling}' is not 'constant')")
        elif c.type.get_canonical().kind in (self.T.CONSTANTARRAY, self.T.RECORD,
                                             self.T.INCOMPLETEARRAY):
            self.tables[c.get_usr()] = MSG_GLOBAL

    def body(self, cursor, in_func: bool) -> None:
        """Every cursor below `cursor` (iteratively, the trees are deep), with the function
        that encloses it (None at program scope; True: one above `cursor`, not known)."""
        stack = [(cursor, True if in_func else None)]
        while stack:
            c, func = stack.pop()
            kind = c.kind.name
            self.visit(c, kind, func)
            if kind in _FUNCS:
                func = c
            stack.extend((ch, func) for ch in reversed(list(c.get_children())))  # in order

    def visit(self, c, kind: str, func) -> None:
        in_func = func is not None
        if kind in _FORBIDDEN_EXPR:
            self.error(c, _FORBIDDEN_EXPR[kind])
        elif kind in ("VAR_DECL", "PARM_DECL"):
            self.declaration(c, kind, in_func)
            if kind == "VAR_DECL" and in_func:
                self.local_var(c, func)
        elif kind == "CXX_METHOD" and c.is_virtual_method():
            self.error(c, f"virtual functions are not supported in Metal ('{c.spelling}')")
        elif kind in ("FUNCTION_DECL", "FUNCTION_TEMPLATE"):
            self.kernel_return(c)
        elif kind in _CASTS:
            self.double(c, c.type)
        elif kind == "ARRAY_SUBSCRIPT_EXPR" and in_func and self.tables:
            self.table_index(c)
        elif kind == "CALL_EXPR" and in_func:
            self.this_space(c)
        if kind in ("FUNCTION_DECL", "CXX_METHOD", "FUNCTION_TEMPLATE"):
            self.double(c, c.result_type)

    def local_var(self, c, func) -> None:
        """A variable declared in a function: a `threadgroup` one only in a kernel, a `static`
        one only in `constant` (or folded, as at program scope)."""
        t = c.type
        if _declares_threadgroup(self, c, t, self.T) and func is not True and \
                not self.is_kernel(func):
            self.error(c, f"{MSG_TG_LOCAL} ('{c.spelling}' is declared in "
                          f"'{func.spelling}'; declare it in the kernel and pass a "
                          f"'threadgroup' pointer)")
        if c.storage_class.name == "STATIC" and "__constant" not in t.spelling:
            if not (t.is_const_qualified() or self.has_token(c, "constexpr")):
                self.error(c, f"{MSG_STATIC} ('{c.spelling}' is not 'constant')")
            elif t.get_canonical().kind in (self.T.CONSTANTARRAY, self.T.RECORD,
                                            self.T.INCOMPLETEARRAY):
                self.tables[c.get_usr()] = MSG_STATIC

    def has_token(self, c, word: str) -> bool:
        """Whether `word` is a token of `c`'s text: read off the checked file's text when
        given (libclang returns no tokens for a cursor whose text starts with a macro of the
        precompiled prelude, such as ``threadgroup``), else clang's tokens."""
        e = c.extent
        if self.source is not None and e.start.file is not None and e.end.file is not None \
                and e.start.file.name.endswith(self.file_name):
            text = self.source[e.start.offset:e.end.offset + 1].decode(errors="replace")
            return re.search(rf"\b{word}\b", text) is not None
        return any(t.spelling == word for t in c.get_tokens())

    def this_space(self, c) -> None:
        """A member function of the source called on an object in another address space than
        the one it is marked for (unmarked: ``thread``; OpenCL would take any but
        ``constant``)."""
        m = c.referenced
        if m is None or m.kind != self.K.CXX_METHOD or m.is_static_method() or \
                not _in_file(m, self.file_name):
            return
        kids = list(c.get_children())
        if not kids or kids[0].kind != self.K.MEMBER_REF_EXPR:
            return                              # an operator, or no object written
        obj = next(kids[0].get_children(), None)
        while obj is not None and obj.kind == self.K.UNEXPOSED_EXPR:    # implicit casts
            obj = next(obj.get_children(), None)
        if obj is None:
            return                              # implicit this
        t = obj.type.get_pointee() if obj.type.kind == self.T.POINTER else obj.type
        written = _space(m.type.spelling.rsplit(")", 1)[-1])      # the method's mark
        have, marked = _thread(_space(t.spelling)), _thread(written)
        if have != marked:
            unmarked = written in (None, "__generic")
            what = "not marked" if unmarked else "marked"
            want = _METAL_SPACE[have] if unmarked else _METAL_SPACE[marked]
            name = " ".join(w for w in t.spelling.split() if w not in _METAL_SPACE)
            self.error(c, f"'this' argument to member function '{m.spelling}' has type "
                          f"'{_METAL_SPACE[have]} {name}', but function is {what} {want}")

    def is_kernel(self, c) -> bool:
        return any(ch.kind == self.K.ANNOTATE_ATTR and ch.spelling == "mf_kernel"
                   for ch in c.get_children())

    def declaration(self, c, kind: str, in_func: bool) -> None:
        t = c.type
        if kind == "VAR_DECL" and c.tls_kind.name != "NONE":
            self.error(c, f"thread_local storage is not supported in Metal ('{c.spelling}')")
        if t.kind in (self.T.POINTER, self.T.LVALUEREFERENCE, self.T.RVALUEREFERENCE):
            pointee = t.get_pointee()
            if "__generic" in pointee.spelling and pointee.kind != self.T.POINTER and \
                    not self.has_token(c, "auto"):
                what = "pointer" if t.kind == self.T.POINTER else "reference"
                self.error(c, f"{what} type must have explicit address space qualifier "
                              f"('{c.spelling}': write device, constant, threadgroup or "
                              f"thread)")
        self.double(c, t)

    def double(self, c, t) -> None:
        """`double`/`long double` in type `t` of `c`, when its text spells it."""
        for _ in range(8):
            if t.kind in (self.T.POINTER, self.T.LVALUEREFERENCE, self.T.RVALUEREFERENCE):
                t = t.get_pointee()
            elif t.kind in (self.T.CONSTANTARRAY, self.T.INCOMPLETEARRAY):
                t = t.element_type
            else:
                break
        kind = t.get_canonical().kind
        if kind in (self.T.DOUBLE, self.T.LONGDOUBLE) and self.has_token(c, "double"):
            name = "long double" if kind == self.T.LONGDOUBLE else "double"
            self.error(c, f"'{name}' is not supported in Metal")

    def kernel_return(self, c) -> None:
        if self.is_kernel(c):
            if c.result_type.kind != self.T.VOID:
                self.error(c, f"kernel function '{c.spelling}' must return void, not "
                              f"'{c.result_type.spelling}'")

    def table_index(self, c) -> None:
        kids = list(c.get_children())
        if len(kids) != 2 or kids[1].kind == self.K.INTEGER_LITERAL:
            return
        base = kids[0]
        while base.kind == self.K.UNEXPOSED_EXPR and list(base.get_children()):
            base = next(base.get_children())
        if base.kind == self.K.DECL_REF_EXPR and base.referenced is not None and \
                base.referenced.get_usr() in self.tables:
            rule = self.tables[base.referenced.get_usr()]
            self.error(c, f"{rule} ('{base.spelling}' is indexed at run time; declare it "
                          f"'constant')")


_METAL_SPACE = {"__global": "device", "__constant": "constant", "__local": "threadgroup",
                "__private": "thread", "__generic": "thread"}


def _thread(space: str | None) -> str:
    """OpenCL's generic space (an unmarked method's `this`), or none, is Metal's thread."""
    return "__private" if space in (None, "__generic") else space


def _space(spelling: str) -> str | None:
    """The named address space written last in a type's spelling, if any."""
    found = re.findall(r"\b__(?:global|constant|local|private|generic)\b", spelling)
    return found[-1] if found else None


def _in_file(c, file_name: str) -> bool:
    f = c.location.file
    return f is not None and f.name.endswith(file_name)


def _declares_threadgroup(w: _Walk, c, t, T) -> bool:
    """Whether variable `c` (of type `t`) is threadgroup storage: a `__local` object, or the
    reference to one that frontcheck.py's `_tg_reference` made of ``threadgroup T x[N];``."""
    if t.kind == T.POINTER:
        return False
    if t.kind == T.LVALUEREFERENCE:
        return "__local" in t.get_pointee().spelling and w.has_token(c, "mf_tg")
    return t.spelling.startswith("__local") or " __local" in t.spelling


def ast_errors(tu, file_name: str, source: str | None = None) -> list[tuple[object, str]]:
    """(clang SourceLocation, message) for each rule above broken in `tu`'s main file (whose
    text is `source`, when given)."""
    import clang.cindex as ci
    w = _Walk(ci, file_name, None if source is None else source.encode())
    w.scope(tu.cursor)
    return w.out
