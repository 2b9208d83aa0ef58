"""The pieces every scan kernel is made of: a scan's combine and identity, the serial scan of
a thread's elements, the simdgroup prefix of the threads' totals (Metal's
simd_prefix_exclusive_sum for sums; a shuffle-up ladder with the scan's combine for the
others), and the threadgroup carry across simdgroups.

Combines: cumsum adds, cumprod multiplies, cummax/cummin take the NaN-propagating maximum
and minimum of floats (`mf_maximum`, `mf_minimum`: a NaN stays in every later element, as in
torch; Metal's max/min of integers), logcumsumexp takes `mf_logaddexp` (log(exp(a) + exp(b))
without overflow; -inf is its identity); the segmented cumsum of cummax's gradient
(`ScanOp.SEGSUM`) runs on float2 pairs (flags, sum), combined by `mf_segsum` (restarting
the sum after an element whose `end` argument is true), its result the pair's sum. Every
combine is associative, so a thread's serial scan, the simdgroup ladder and the threadgroup
carry give the same elements as a serial scan up to float rounding."""
from __future__ import annotations

from ... import ir
from ...graph import ScanOp
from .. import reduce
from ..hardware import SIMD_WIDTH
from ..lower import compute_type
from .context import SUMS, Scan

U = "uint"


def lit(v: int) -> ir.Lit:
    """A uint literal."""
    return ir.Lit(v, U)


def identity(s: Scan) -> ir.Expr:
    """The value that combines with x to x: 0, 1, -inf / lowest, +inf / max, -inf; the pair
    (0, 0) (no end, sum 0) of a segmented cumsum."""
    if s.kind == ScanOp.SEGSUM:
        return ir.Call("float2", (ir.Lit(0.0, "float"), ir.Lit(0.0, "float")))
    combine = {ScanOp.CUMSUM: "sum", ScanOp.CUMPROD: "prod", ScanOp.CUMMAX: "max",
               ScanOp.LOGCUMSUMEXP: "max", ScanOp.CUMMIN: "min"}[s.kind]
    return reduce.identity_of(combine, s.acc_type)


def combine(s: Scan, a: ir.Expr, b: ir.Expr) -> ir.Expr:
    """a (the earlier elements' value) combined with b (the later ones')."""
    if s.kind == ScanOp.CUMSUM:
        return a + b
    if s.kind == ScanOp.CUMPROD:
        return a * b
    if s.kind == ScanOp.LOGCUMSUMEXP:
        return ir.Call("mf_logaddexp", (a, b))
    if s.kind == ScanOp.SEGSUM:
        return ir.Call("mf_segsum", (a, b))
    fn = "max" if s.kind == ScanOp.CUMMAX else "min"
    return ir.Call(f"mf_{fn}imum" if s.is_float else fn, (a, b))


def helpers(s: Scan) -> set[str]:
    """The helper functions a scan's combine calls."""
    if s.kind == ScanOp.LOGCUMSUMEXP:
        return {"mf_logaddexp"}
    if s.kind == ScanOp.SEGSUM:
        return {"mf_segsum"}
    if s.kind in (ScanOp.CUMMAX, ScanOp.CUMMIN) and s.is_float:
        return {"mf_maximum" if s.kind == ScanOp.CUMMAX else "mf_minimum"}
    return set()


def acc_value(s: Scan, v: ir.Expr, end: ir.Expr = ir.Lit(False, "bool")) -> ir.Expr:
    """An element value (its compute type) as the scan's running type; a segmented cumsum's
    the pair (1 where the element ends a segment (`end`, its second argument) else 0, v)."""
    if s.kind == ScanOp.SEGSUM:
        return ir.Call("float2", (ir.Select(end, ir.Lit(1.0, "float"), ir.Lit(0.0, "float")),
                                  ir.Cast("float", v)))
    return v if s.acc_type == compute_type(s.arg.dtype) else ir.Cast(s.acc_type, v)


def result(s: Scan, v: ir.Expr) -> ir.Expr:
    """A running value as the scan node's compute type (what its users read): a segmented
    cumsum's, the pair's sum."""
    if s.kind == ScanOp.SEGSUM:
        return ir.Lane(v, ir.Lit(1, "uint"))
    return v if s.acc_type == s.value_type else ir.Cast(s.value_type, v)


# -- across the simdgroup and the threadgroup --------------------------------------------------

def simd_exclusive(s: Scan, segmented: bool = False) -> list[ir.Stmt]:
    """mf_excl{i}: the combine of the thread totals mf_run{i} of the lanes below this one in
    its simdgroup (the identity for lane 0), and mf_simd{i}, the simdgroup's total (every
    lane: lane 31's inclusive value). `segmented`: the simdgroup holds 32 / mf_w rows of mf_w
    lanes each (mf_t the lane's index in its row): the prefix and the total are the row's
    (a ladder for every kind; simd_prefix_exclusive_sum spans the whole simdgroup)."""
    run, excl, incl = ir.Var(s.name("run")), s.name("excl"), s.name("incl")
    last: ir.Expr = lit(SIMD_WIDTH - 1)
    if s.kind in SUMS and not segmented:
        return [ir.Decl(excl, s.acc_type, ir.Call("simd_prefix_exclusive_sum", (run,))),
                ir.Decl(s.name("simd"), s.acc_type, ir.Call("simd_shuffle", (
                    ir.Var(excl) + run, last)))]
    lane, up = ir.Var("mf_t" if segmented else "mf_lane"), ir.Var(s.name("up"))
    if segmented:
        last = ir.Var("mf_lane") | (ir.Var("mf_w") - lit(1))
    step = lit(1) << ir.Var("mf_s")
    return [
        ir.Comment("inclusive prefix over the " + ("row's lanes" if segmented else "lanes") +
                   ": a shuffle-up ladder of 1, 2, 4, 8, 16"),
        ir.Decl(incl, s.acc_type, run, const=False),
        ir.For("mf_s", U, lit(0), lit(SIMD_WIDTH.bit_length() - 1), [
            ir.Decl(up.name, s.acc_type, ir.Call("simd_shuffle_up", (ir.Var(incl), step))),
            ir.If(lane >= step, [ir.Assign(ir.Var(incl), combine(s, up, ir.Var(incl)))])],
            unroll=True),
        ir.Comment("every lane shuffles (a collective), the first then takes the identity"),
        ir.Decl(s.name("prev"), s.acc_type, ir.Call("simd_shuffle_up", (ir.Var(incl), lit(1)))),
        ir.Decl(excl, s.acc_type, ir.Select(lane.eq(lit(0)), identity(s),
                                            ir.Var(s.name("prev")))),
        ir.Decl(s.name("simd"), s.acc_type, ir.Call("simd_shuffle", (ir.Var(incl), last)))]


def threadgroup_carry(scans: list[Scan]) -> list[ir.Stmt]:
    """Each simdgroup's total through threadgroup memory (mf_tg{i}[32], written by lane 0):
    mf_before{i}, the combine of the simdgroups before this one, and mf_chunk{i}, of all of
    them (the chunk's total). A barrier before the reads, and one after them, so that the next
    chunk's writes wait until every thread has read."""
    sg, nsg, sl = ir.Var("mf_sg"), ir.Var("mf_nsg"), ir.Var("mf_s")
    writes: list[ir.Stmt] = []
    decls: list[ir.Stmt] = []
    loop: list[ir.Stmt] = []
    for s in scans:
        tg = ir.Var(s.name("tg"))
        writes.append(ir.Assign(ir.Lane(tg, sg), ir.Var(s.name("simd"))))
        before, chunk, got = ir.Var(s.name("before")), ir.Var(s.name("chunk")), s.name("got")
        decls += [ir.Decl(before.name, s.acc_type, identity(s), const=False),
                  ir.Decl(chunk.name, s.acc_type, identity(s), const=False)]
        loop += [ir.Decl(got, s.acc_type, ir.Lane(tg, sl)),
                 ir.If(sl < sg, [ir.Assign(before, combine(s, before, ir.Var(got)))]),
                 ir.Assign(chunk, combine(s, chunk, ir.Var(got)))]
    out: list[ir.Stmt] = [ir.If(ir.Var("mf_lane").eq(lit(0)), writes), ir.Barrier()]
    return out + decls + [ir.For("mf_s", U, lit(0), nsg, loop), ir.Barrier()]


def tg_arrays(scans: list[Scan]) -> list[ir.ArrayDecl]:
    """One threadgroup slot per simdgroup for each scan's simdgroup totals."""
    return [ir.ArrayDecl(s.name("tg"), s.acc_type, SIMD_WIDTH, "threadgroup") for s in scans]
