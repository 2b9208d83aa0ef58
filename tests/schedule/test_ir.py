"""IR expressions: Python operators build the same frozen trees as the constructors, and both
printers parenthesise them as C would parse them."""
import operator

from hypothesis import given
from hypothesis import strategies as st

from metalforge import ir
from metalforge.codegen.msl import expr as msl_expr
from metalforge.codegen.msl import render

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


def test_an_element_of_a_vector_load_dereferences_first():
    # `*p[i]` would index the pointer: the load is parenthesised, `(*p)[i]`
    load = ir.Load("mf_stage", j * R, 4, "float", space="threadgroup")
    assert msl_expr(ir.Lane(load, n)) == (
        "(*reinterpret_cast<threadgroup const vec<float, 4>*>(mf_stage + mf_j * 4u))[mf_n]")
    assert msl_expr(load).startswith("*reinterpret_cast")          # alone: no parentheses


def test_bitwise_operands_keep_their_parentheses():
    # C parses `w >> s & m` as (w >> s) & m, but readers should not have to know that
    assert ir.expr_text((j >> t) & (R << n)) == "(mf_j >> mf_t) & (4 << mf_n)"
    assert ir.expr_text(j & (t - R)) == "mf_j & (mf_t - 4)"
    assert ir.expr_text((j + t) | (n ^ R)) == "(mf_j + mf_t) | (mf_n ^ 4)"
    assert ir.expr_text(j & t & n) == "mf_j & mf_t & mf_n"          # the same operator: none
    assert ir.expr_text((j >> t) + n) == "(mf_j >> mf_t) + mf_n"      # C precedence as before
    assert ir.expr_text(j >> t + n) == "mf_j >> mf_t + mf_n"


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


# --------------------------------------------------------------------------- passes, printers

def _loop(stop, body, var="mf_c"):
    return ir.For(var, "uint", ir.Lit(0, "uint"), ir.Lit(stop, "uint"), body, unroll=True)


def test_single_trip_loops_become_blocks():
    use = ir.Assign(ir.Var("mf_x"), ir.Var("mf_c"))
    keep = ir.Assign(ir.Var("mf_x"), ir.Lit(1, "uint"))
    body = ir.inline_single_trip([_loop(1, [use]), _loop(1, [keep]), _loop(2, [use]),
                                  ir.If(n, [_loop(1, [_loop(1, [keep], "mf_d")])])])
    assert body[0] == ir.Block([ir.Decl("mf_c", "uint", ir.Lit(0, "uint")), use])
    assert body[1] == ir.Block([keep])                 # the variable is not read: no constant
    assert body[2] == _loop(2, [use])                  # two trips: a loop
    assert body[3] == ir.If(n, [ir.Block([ir.Block([keep])])])


def test_a_loop_that_breaks_stays_a_loop():
    loop = _loop(1, [ir.If(n, [ir.Break()])])
    assert ir.inline_single_trip([loop]) == [loop]
    inner = _loop(1, [_loop(3, [ir.Break()], "mf_d")])     # the break leaves the inner loop
    assert isinstance(ir.inline_single_trip([inner])[0], ir.Block)


def test_msl_prints_blocks_and_the_ir_dump_keeps_the_loop():
    k = ir.LoweredKernel("mf_k", "k", (), (ir.Instance("k", ()),), (), (), [
        _loop(1, [ir.Assign(ir.Var("mf_x"), ir.Var("mf_c"))])])
    assert "    {\n        const uint mf_c = 0u;\n        mf_x = mf_c;\n    }\n" in render(k)
    assert "for mf_c: uint in [0, 1):  (unrolled)" in ir.dump(k)
