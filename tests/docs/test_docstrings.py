"""Every public name says what it does and shows one example (`help(mf.kernel)`, ...)."""
from __future__ import annotations

import inspect

import pytest

import metalforge as mf
from metalforge import quant, sim, testing

_PUBLIC = [(f"mf.{n}", getattr(mf, n)) for n in mf.__all__
           if callable(getattr(mf, n)) and not isinstance(getattr(mf, n), mf.dtypes.DType)
           and not (isinstance(getattr(mf, n), type) and issubclass(getattr(mf, n), Exception))]
_PUBLIC += [("testing.check", testing.check), ("sim.compile_shader", sim.compile_shader)]
_PUBLIC += [(f"quant.{n}", getattr(quant, n))
            for n in ("quantize", "dequantize", "unpack", "pack", "pack_layout")]


@pytest.mark.parametrize("name,obj", _PUBLIC, ids=[n for n, _ in _PUBLIC])
def test_public_name_has_docstring_with_example(name, obj):
    doc = inspect.getdoc(obj) or ""
    assert len(doc.split()) >= 6, f"{name}: no docstring saying what it does"
    assert "Example" in doc, f"{name}: its docstring shows no example"


def test_errors_have_docstrings():
    for n in mf.__all__:
        o = getattr(mf, n)
        if isinstance(o, type) and issubclass(o, Exception):
            assert inspect.getdoc(o), f"mf.{n} has no docstring"
