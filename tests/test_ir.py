"""IR expressions: Python operators build the same frozen trees as the constructors, and both
printers parenthesise them as C would parse them."""
import operator

from hypothesis import given, strategies as st

from metalforge import ir
from metalforge.codegen.msl import expr as msl_expr

j, t, n = ir.Var("mf_j"), ir.Var("mf_t"), ir.Var("mf_n")
R = ir.Lit(4, "uint")


def test_operators_build_binary_nodes():
    e = (j * t + n) * R
    assert e == ir.Binary("*", ir.Binary("+", ir.Binary("*", j, t), n), R)
    assert (j - t) / R % n == ir.Binary("%", ir.Binary("/", ir.Binary("-", j, t), R), n)
    assert (j << R) >> R == ir.Binary(">>", ir.Binary("<<", j, R), R)
    assert (j & t) | (n ^ R) == ir.Binary("|", ir.Binary("&", j, t), ir.Binary("^", n, R))
    assert [j < t, j <= t, j > t, j >= t] == [ir.Binary(op, j, t) for op in ("<", "<=", ">",
                                                                               ">=")]
    assert -j == ir.Unary("-", j)


def test_equality_stays_structural_and_c_comparisons_are_methods():
    assert j == ir.Var("mf_j") and j != t
    assert j.eq(t) == ir.Binary("==", j, t) and j.ne(t) == ir.Binary("!=", j, t)
    assert j.eq(t).and_(n.or_(R)) == ir.Binary("&&", ir.Binary("==", j, t),
                                               ir.Binary("||", n, R))
    assert hash(j * t) == hash(ir.Binary("*", j, t))


def test_printed_with_c_precedence():
    assert ir.expr_text((j * t + n) * R) == "(mf_j * mf_t + mf_n) * 4"
    assert msl_expr((j * t + n) * R) == "(mf_j * mf_t + mf_n) * 4u"
    assert msl_expr(j - (t - n)) == "mf_j - (mf_t - mf_n)"


_OPS = ["+", "-", "*", "/", "%", "<<", ">>", "&", "|", "^", "<", "<=", ">", ">=", "==", "!="]
_PY = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
       "%": operator.mod, "<<": operator.lshift, ">>": operator.rshift, "&": operator.and_,
       "|": operator.or_, "^": operator.xor, "<": operator.lt, "<=": operator.le,
       ">": operator.gt, ">=": operator.ge, "==": ir.ExprOps.eq, "!=": ir.ExprOps.ne}
_leaf = st.sampled_from([j, t, n, R])


@given(st.recursive(_leaf, lambda sub: st.tuples(st.sampled_from(_OPS), sub, sub), max_leaves=8))
def test_operator_spelling_matches_constructor(tree):
    def by_ctor(x):
        return ir.Binary(x[0], by_ctor(x[1]), by_ctor(x[2])) if isinstance(x, tuple) else x

    def by_ops(x):
        if not isinstance(x, tuple):
            return x
        a, b = by_ops(x[1]), by_ops(x[2])
        return _PY[x[0]](a, b)

    assert by_ops(tree) == by_ctor(tree)
