"""metalforge.testing.mutate: generic site-by-site mutants of generated MSL, run through check.

These tests prove the mutator, the runner and the equivalence rules; the 95% gate over the
example kernels is test_mutation_gate.py."""
import re

import pytest

import metalforge as mf
from metalforge.runtime.launcher import render, specialisation
from metalforge.testing.mutate import OPERATORS, Mutant, mutants, mutation_test, sample


@mf.kernel
def mut_rowmax(x: "T[R, D]"):
    return mf.max(mf.exp(x), axis="D")


def source_of(kernel, **dtypes):
    s = specialisation(kernel.graph(**dtypes), kernel.launch).schedule(False)
    return render(s)


def test_every_operator_finds_sites_in_a_reduction():
    src = source_of(mut_rowmax, T="f32")
    ms = mutants(src)
    assert {m.operator for m in ms} == {name for name, _, _ in OPERATORS}
    for m in ms:                      # one site each: exactly one line differs, code lines only
        diff = [(a, b) for a, b in zip(src.splitlines(), m.source.splitlines()) if a != b]
        assert len(diff) <= 1 and m.source != src
        assert not m.before.strip().startswith(("//", "#"))
    assert sample(ms, 12, seed=3) == sample(ms, 12, seed=3)                  # deterministic
    assert len({m.operator for m in sample(ms, 7)}) == 7                      # spread


def test_check_kills_mutants():
    src = source_of(mut_rowmax, T="f32")
    ms = mutants(src)
    pick = [next(m for m in ms if m.operator == "math_function" and "exp(" in m.before),
            next(m for m in ms if m.operator == "drop_simd_collective")]
    rep = mutation_test(mut_rowmax, src, chosen=pick,
                        check_options=dict(dtypes={"T": "f32"}, max_examples=4))
    assert rep.killed == pick and rep.score == 1.0
    assert rep.describe().startswith("mut_rowmax: 2 killed, 0 survived, 0 equivalent, 0 stillborn")


def test_a_mutant_check_never_compiles_is_an_error_not_a_survivor():
    stray = Mutant("x", 1, 0, "", "", "kernel void k() {}\n", "a source nobody compiles")
    with pytest.raises(RuntimeError, match="never compiled"):
        mutation_test(mut_rowmax, "", chosen=[stray], check_options=dict(dtypes={"T": "f32"},
                                                                          max_examples=1))


def test_equivalence_rules_are_narrow():
    """Each rule argues its own class of mutants and nothing else."""
    from metalforge.testing.mutate import equivalence
    src = source_of(mut_rowmax, T="f32")
    ms = mutants(src)
    argued = {m: equivalence(m, mut_rowmax) for m in ms}
    edge = [m for m, r in argued.items() if r is not None and r.name == "vector edge"]
    grown = [m for m, r in argued.items() if r is not None and r.name == "array grown"]
    assert edge and all("u <= " in m.before and "u < " in m.after for m in edge)
    assert grown and all(re.fullmatch(r"\s*(threadgroup )?\w+ \w+\[\d+\];", m.before)
                         for m in grown)
    assert all(int(re.search(r"\[(\d+)\]", m.after)[1]) ==
               int(re.search(r"\[(\d+)\]", m.before)[1]) + 1 for m in grown)
    assert all(r is None for m, r in argued.items() if m not in edge and m not in grown)
    # array indices and loop bounds are not declarations
    assert any(m.operator == "integer_constant" and argued[m] is None for m in ms)
