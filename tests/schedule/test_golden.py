"""Golden MSL: `source()` and `ir()` of every example kernel × {f32, f16}, plus one 64-bit-index
case, compared byte for byte with the files in tests/golden/.

A refactor must leave these unchanged; a change to code generation rewrites them on purpose:

    METALFORGE_UPDATE_GOLDEN=1 python -m pytest tests/schedule/test_golden.py

and the diff of tests/golden/ goes into review with the change.
"""
import importlib.util
import os
from pathlib import Path

import pytest

import metalforge as mf

from . import matmul_kernels

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE = os.environ.get("METALFORGE_UPDATE_GOLDEN") == "1"


def _example_kernels():
    out = []
    for path in sorted((ROOT / "examples").glob("*.py")):
        spec = importlib.util.spec_from_file_location(f"mf_golden_{path.stem}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        out += [(name, k) for name, k in sorted(vars(mod).items()) if isinstance(k, mf.Kernel)]
    return out


KERNELS = _example_kernels()
CASES = [(name, k, {"T": dt}) for name, k in KERNELS for dt in ("f32", "f16")]
# 64-bit indexing
CASES.append(("silu", dict(KERNELS)["silu"], {"T": "f32", "B": 1, "D": 2 ** 31}))
# the contraction family (schedule/matmul) at each target (metalforge/target.py):
# simdgroup_matrix (apple9), Metal 4 tensor ops (apple10; cuda, whose shim runs them on tensor
# cores); f32 operands keep simdgroup_matrix at every target
TARGET_CASES = [("matmul", "f16", "apple9"), ("matmul", "f16", "apple10"),
                ("matmul", "f16", "cuda"), ("matmul", "f32", "apple10"),
                ("linear_gelu", "bf16", "apple9"),
                # the tiled quantized matmul on the matrix block (schedule/quant/blocked.py)
                ("q4_linear", "f16", "apple10"), ("q4_linear", "bf16", "cuda"),
                ("q4_linear", "bf16", "apple9")]


def _case_id(name, bindings):
    return "_".join([name] + [f"{k}{v}" for k, v in bindings.items()])


def _compare(path: Path, text: str):
    if UPDATE:
        path.write_text(text)
        return
    assert path.exists(), f"{path.name} is missing: run with METALFORGE_UPDATE_GOLDEN=1"
    expected = path.read_text()
    assert text == expected, (f"{path.name} changed; if on purpose, rerun with "
                              f"METALFORGE_UPDATE_GOLDEN=1 and review the diff")


@pytest.mark.parametrize("name,kernel,bindings", CASES,
                         ids=[_case_id(n, b) for n, _, b in CASES])
def test_golden(name, kernel, bindings):
    cid = _case_id(name, bindings)
    _compare(GOLDEN / f"{cid}.metal", kernel.source(**bindings))
    _compare(GOLDEN / f"{cid}.ir", kernel.ir(**bindings))


def _target_id(name, dt, target):
    return f"{name}_T{dt}_{target}"


@pytest.mark.parametrize("name,dt,target", TARGET_CASES,
                         ids=[_target_id(*c) for c in TARGET_CASES])
def test_golden_target(name, dt, target):
    kernel = getattr(matmul_kernels, name)
    cid = _target_id(name, dt, target)
    with mf.target(target):
        _compare(GOLDEN / f"{cid}.metal", kernel.source(T=dt))
        _compare(GOLDEN / f"{cid}.ir", kernel.ir(T=dt))


# contractions with their layout options (schedule/policy.py): 128 x 128 tiles, padded staged
# rows (strided tensors), tiles read a step ahead, bands of tiles
TABLE_CASES = [("matmul", "f16", "cuda")]
PADDED = {"tile": 128, "stage_pad": 8, "prefetch": True, "tile_groups": 8}


@pytest.mark.parametrize("name,dt,backend", TABLE_CASES,
                         ids=[f"{_target_id(*c)}_table" for c in TABLE_CASES])
def test_golden_backend_table(name, dt, backend):
    kernel = getattr(matmul_kernels, name).with_launch(**PADDED)
    cid = f"{_target_id(name, dt, backend)}_table"
    with mf.target(backend):
        _compare(GOLDEN / f"{cid}.metal", kernel.source(T=dt))
        _compare(GOLDEN / f"{cid}.ir", kernel.ir(T=dt))


# attention's prefill kernel (schedule/attention/mma.py) at each lowering: Metal 4 tensor ops
# (apple10; the cuda target's text is the same) with half operands, simdgroup_matrix with
# bfloat (f16 at apple9: attention_Tf16)
ATTENTION_TARGET_CASES = [("attention", "f16", "apple10"), ("attention", "bf16", "apple9")]


@pytest.mark.parametrize("name,dt,target", ATTENTION_TARGET_CASES,
                         ids=[_target_id(*c) for c in ATTENTION_TARGET_CASES])
def test_golden_attention_target(name, dt, target):
    kernel = dict(KERNELS)[name]
    cid = _target_id(name, dt, target)
    with mf.target(target):
        _compare(GOLDEN / f"{cid}.metal", kernel.source(T=dt))
        _compare(GOLDEN / f"{cid}.ir", kernel.ir(T=dt))


def test_no_stale_golden_files():
    expected = {f"{_case_id(n, b)}{ext}" for n, _, b in CASES for ext in (".metal", ".ir")}
    expected |= {f"{_target_id(*c)}{ext}" for c in TARGET_CASES for ext in (".metal", ".ir")}
    expected |= {f"{_target_id(*c)}_table{ext}" for c in TABLE_CASES for ext in (".metal", ".ir")}
    expected |= {f"{_target_id(*c)}{ext}" for c in ATTENTION_TARGET_CASES
                 for ext in (".metal", ".ir")}
    stale = sorted(p.name for p in GOLDEN.iterdir() if p.name not in expected)
    if UPDATE:
        for name in stale:
            (GOLDEN / name).unlink()
        return
    assert not stale, f"golden files with no case: {stale}"
