"""Sums over K of the shared values alone, beside the sums of unpacked weights: an RMSNorm
fused into the projection of its input,

    r = mf.rsqrt(mf.mean(x * x, axis="K") + eps)                   # an xsum
    y = r * mf.sum((mf.unpack(wq, bits=4) * s + b) * (x * w), axis="K")

(the norm's scale is one number per row of x, so it leaves the sum over K: the projection
reads x once and no normalised copy of x is written). Each lane adds the chunk's terms from
the registers x is loaded into (`chunk_terms`; the guarded path from memory, once per chunk
rather than per weight row), then the simdgroup sums them (`combine`): each simdgroup takes
the whole sum of its slice of K; a split block merges them with its rows' partials. Kernels
with xsums are qmv and qmv_split (and the paired or staged kernels): one row of x per
simdgroup (qmvx and qmm are not built).
"""
from __future__ import annotations

from ... import ir
from ...graph import ReduceOp
from .. import reduce
from ..base import IDX
from ..lower import as_float
from .context import QuantState
from .positions import lowering


def name(i: int) -> str:
    """The lane's running value of xsum i."""
    return f"mf_xs_{i}"


def declare(st: QuantState) -> list[ir.Stmt]:
    """Zeroed running values, one per xsum."""
    return [ir.Decl(name(i), "float", ir.Lit(0.0, "float"), const=False)
            for i in range(len(st.ctx.xsums))]


def chunk_terms(st: QuantState, fast: bool) -> list[ir.Stmt]:
    """Add the chunk's terms of every xsum: from registers (`fast`, a whole chunk), else each
    element inside K loaded and added."""
    ctx = st.ctx
    if not ctx.xsums:
        return []
    el = lowering(st, fast)
    body = el.lower([n.args[0] for n in ctx.xsums])
    body += [ir.Assign(ir.Var(name(i)), ir.Var(name(i)) + as_float(el.value(n.args[0]),
                                                                    n.args[0]))
             for i, n in enumerate(ctx.xsums)]
    ctx.uses.helpers.update(el.helpers)
    if not fast:
        k = ir.Var("mf_k0") + ir.Cast(IDX, ir.Var("mf_j"))
        body = [ir.If(k < ctx.size(ctx.axis), body)]
    return [ir.Comment("the sums of the shared values alone (xsums), this chunk's terms"),
            ir.For("mf_j", "uint", ir.Lit(0, "uint"), ir.Lit(ctx.chunk, "uint"), body,
                   unroll=True)]


def reductions(st: QuantState) -> list[reduce.Reduction]:
    """The xsums as reductions over their running values (numbered after the kernel's sums),
    for the merge of a split block's partials."""
    n = len(st.ctx.reds)
    return [reduce.Reduction(node, ReduceOp.SUM, st.ctx.axis, n + 1 + i, acc_at=ir.Var(name(i)))
            for i, node in enumerate(st.ctx.xsums)]


def combine(st: QuantState) -> list[ir.Stmt]:
    """Each xsum across the simdgroup (every lane gets it); its value for the epilogue."""
    out: list[ir.Stmt] = []
    for i, n in enumerate(st.ctx.xsums):
        v = ir.Var(name(i))
        out.append(ir.Assign(v, ir.Call("simd_sum", (v,))))
        st.v.row_values.values[n] = v
    return out
