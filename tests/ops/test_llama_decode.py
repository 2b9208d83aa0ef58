"""The decode step of examples/llama_decode.py waits for nothing: every gather of its kernels is
proven in range (RoPE's partner) or deferred (the paged cache's block table), so no call reads
an index report back (a device-to-host copy and a stall on a GPU). The example's own run
(tests/runtime/test_examples.py) checks every stage against torch."""
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

import metalforge as mf
from metalforge.runtime.indexcheck import IndexErrors

_PATH = Path(__file__).resolve().parents[2] / "examples" / "llama_decode.py"
_spec = importlib.util.spec_from_file_location("mf_test_llama_decode", _PATH)
ex = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = ex
_spec.loader.exec_module(ex)


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_decode_step_reads_no_report_back(paged, monkeypatch):
    s = ex.SMALL
    layer = ex.Layer.random(s, torch.float16, "cpu")
    x = torch.randn(1, s.dim).half()
    cache = ex.Cache.random(s, torch.float16, "cpu", paged)
    checked = []
    real = IndexErrors.check

    def check(self, buffer):
        checked.append(self.where)
        assert self.deferred, f"{self.where}: its call reads the index report back"
        return real(self, buffer)
    monkeypatch.setattr(IndexErrors, "check", check)
    for pos in (5, 6):                   # the first call and a warm one
        ex.step(layer, x, cache, pos)
    assert bool(checked) == paged        # only the block table's reads carry a (deferred) check
    mf.check_deferred()


def test_a_bad_block_number_is_raised_at_the_sync_point():
    s = ex.SMALL
    layer = ex.Layer.random(s, torch.float16, "cpu")
    cache = ex.Cache.random(s, torch.float16, "cpu", True)
    cache.table[0, 0] = 10_000                   # past the cache
    cache.write = lambda *a: None                # (the torch write would fail first)
    ex.step(layer, torch.randn(1, s.dim).half(), cache, 5)     # no error at the call
    with pytest.raises(mf.GatherIndexError, match="index 160005 is out of range.*deferred"):
        mf.check_deferred()
