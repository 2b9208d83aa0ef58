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
- a kernel that does not return ``void``.
"""
from __future__ import annotations

MSG_GLOBAL = "program scope variable must reside in constant address space"
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

    def __init__(self, ci, file_name: str):
        self.ci = ci
        self.K = ci.CursorKind
        self.T = ci.TypeKind
        self.file_name = file_name
        self.out: list[tuple[object, str]] = []
        self.tables: set[str] = set()        # constexpr/const program-scope arrays and objects

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
        folded = c.type.is_const_qualified() or _has_token(c, "constexpr")
        if not folded:
            self.error(c, f"{MSG_GLOBAL} ('{c.spelling}' is not 'constant')")
        elif c.type.get_canonical().kind in (self.T.CONSTANTARRAY, self.T.RECORD,
                                             self.T.INCOMPLETEARRAY):
            self.tables.add(c.get_usr())

    def body(self, cursor, in_func: bool) -> None:
        """Every cursor below `cursor` (iteratively, the trees are deep)."""
        stack = [(cursor, in_func)]
        while stack:
            c, inside = stack.pop()
            kind = c.kind.name
            self.visit(c, kind, inside)
            inside = inside or kind in _FUNCS
            stack.extend((ch, inside) for ch in c.get_children())

    def visit(self, c, kind: str, in_func: bool) -> None:
        if kind in _FORBIDDEN_EXPR:
            self.error(c, _FORBIDDEN_EXPR[kind])
        elif kind in ("VAR_DECL", "PARM_DECL"):
            self.declaration(c, kind, in_func)
        elif kind == "CXX_METHOD" and c.is_virtual_method():
            self.error(c, f"virtual functions are not supported in Metal ('{c.spelling}')")
        elif kind in ("FUNCTION_DECL", "FUNCTION_TEMPLATE"):
            self.kernel_return(c)
        elif kind in _CASTS:
            self.double(c, c.type)
        elif kind == "ARRAY_SUBSCRIPT_EXPR" and in_func and self.tables:
            self.table_index(c)
        if kind in ("FUNCTION_DECL", "CXX_METHOD", "FUNCTION_TEMPLATE"):
            self.double(c, c.result_type)

    def declaration(self, c, kind: str, in_func: bool) -> None:
        t = c.type
        if kind == "VAR_DECL" and c.tls_kind.name != "NONE":
            self.error(c, f"thread_local storage is not supported in Metal ('{c.spelling}')")
        if t.kind in (self.T.POINTER, self.T.LVALUEREFERENCE, self.T.RVALUEREFERENCE):
            pointee = t.get_pointee()
            if "__generic" in pointee.spelling and pointee.kind != self.T.POINTER and \
                    not _has_token(c, "auto"):
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
        if kind in (self.T.DOUBLE, self.T.LONGDOUBLE) and _has_token(c, "double"):
            name = "long double" if kind == self.T.LONGDOUBLE else "double"
            self.error(c, f"'{name}' is not supported in Metal")

    def kernel_return(self, c) -> None:
        if any(ch.kind == self.K.ANNOTATE_ATTR and ch.spelling == "mf_kernel"
               for ch in c.get_children()):
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
            self.error(c, f"{MSG_GLOBAL} ('{base.spelling}' is indexed at run time; declare "
                          f"it 'constant')")


def _has_token(c, word: str) -> bool:
    return any(t.spelling == word for t in c.get_tokens())


def ast_errors(tu, file_name: str) -> list[tuple[object, str]]:
    """(clang SourceLocation, message) for each rule above broken in `tu`'s main file."""
    import clang.cindex as ci
    w = _Walk(ci, file_name)
    w.scope(tu.cursor)
    return w.out
