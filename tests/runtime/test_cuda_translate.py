"""The CUDA backend's MSL → CUDA C++ translation, on any machine (no GPU needed): every golden
kernel translates, and (where a host C++ compiler exists) the translation passes a syntax check
against the CUDA shim with host stand-ins for the CUDA builtins."""
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

import metalforge as mf
from metalforge.cuda import translate
from metalforge.cuda.library import INCLUDE_DIR
from metalforge.runtime import DeviceError

GOLDEN = sorted((Path(__file__).resolve().parents[1] / "schedule" / "golden").glob("*.metal"))


def test_golden_found():
    assert len(GOLDEN) >= 20


def _declared(src: str, hosts: list[str]) -> list[int]:
    """Each host name's declared [[max_total_threads_per_threadgroup(N)]] (1024 without):
    the attribute of the template its instantiation names."""
    limits = {name: n for n, name in re.findall(
        r"max_total_threads_per_threadgroup\((\d+)\)\]\] kernel void (\w+)", src)}
    names = dict(re.findall(r'host_name\("(\w+)"\)\]\] kernel void (\w+)', src))
    return [int(limits.get(names.get(h, ""), 1024)) for h in hosts]


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.stem)
def test_golden_translates(path, tmp_path):
    src = path.read_text()
    tr = translate(src)
    hosts = [line.split('"')[1] for line in src.splitlines() if "host_name(" in line]
    assert [e.host_name for e in tr.entries] == hosts
    entries = re.findall(r'extern "C" __global__ void (MF_BOUNDS_mf_entry_\w+) (mf_entry_\w+)\(',
                         tr.text)
    assert len(entries) == len(hosts)
    # each entry named after its kernel, for profilers
    assert [e.symbol for e in tr.entries] == [f"mf_entry_{i}_{h}" for i, h in enumerate(hosts)]
    # every kernel is compiled under a register cap the library drops where it spills: a
    # declared group size N < 1024 keeps 1024 threads of the kernel resident per core (64
    # registers), the others two groups of 1024 (32 registers)
    declared = {h: int(n) for h, n in zip(hosts, _declared(src, hosts))}
    for (macro, sym), e in zip(entries, tr.entries):
        assert macro == f"MF_BOUNDS_{sym}" and e.symbol == sym
        n = declared[e.host_name]
        want = f"__launch_bounds__({n}, {1024 // n})" if n < 1024 else \
            "__launch_bounds__(1024, 2)"
        assert f"#ifndef {macro}\n#define {macro} {want}\n#endif" in tr.text
        assert e.max_total_threads == n
    # line numbers are kept: every source line is on the same line of the translation
    body = tr.text.split("\n", 1)[1].splitlines()
    assert all(a.strip() == b.strip() for a, b in zip(src.splitlines(), body)
               if "[[" not in a and "threadgroup" not in a and "template" not in a)
    assert "[[" not in tr.text.split('#line 1 "metalforge_cuda_entries"')[0]
    for e in tr.entries:       # a buffer per argument, in order; constants by value
        assert [a.buffer_index for a in e.args] == list(range(len(e.args)))
        assert all(a.by_pointer == ("*" in a.type_text) for a in e.args)
    for ty, name in re.findall(r"threadgroup (\w+) (mf_\w+)\[", src):    # kernel-scope arrays
        assert re.search(rf"__shared__\s+{ty}\s+{name}\[", tr.text), name
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no host C++ compiler for the syntax check")
    # Metal 4 sources (the contraction goldens at tensor-op targets) compile as the cuda
    # backend compiles them: Metal 4.0, C++20
    metal4 = "MetalPerformancePrimitives" in src
    std = ["-std=c++20", "-D__METAL_VERSION__=400"] if metal4 else ["-std=c++17"]
    f = tmp_path / "tu.cu"
    f.write_text(tr.text)
    r = subprocess.run([cxx, *std, "-fsyntax-only", "-DMF_CUDA_HOST_CHECK",
                        f"-I{INCLUDE_DIR}", "-x", "c++", str(f)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[:4000]


def test_threadgroup_and_positions_translate():
    src = """#include <metal_stdlib>
using namespace metal;
kernel void k(device float* out [[buffer(0)]], constant uint& n [[buffer(1)]],
              device atomic_uint& unused_ref [[buffer(2)]],
              uint2 gid [[thread_position_in_grid]], ushort lid [[thread_index_in_threadgroup]]) {
    threadgroup float tg[64];
    tg[lid] = float(gid.x);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (gid.x < n) out[gid.x] = tg[lid];
}
"""
    tr = translate(src)
    (e,) = tr.entries
    assert [(a.name, a.by_pointer) for a in e.args] == [("out", True), ("n", False),
                                                        ("unused_ref", True)]
    assert re.search(r"__shared__\s+float tg\[64\];", tr.text)
    assert "*mf_a2" in tr.text                       # a device reference arrives as a pointer
    assert "mf_p.thread_position_in_grid()" in tr.text
    assert "mf_p.thread_index_in_threadgroup()" in tr.text


def test_unreadable_source_is_a_syntax_error():
    with pytest.raises(SyntaxError, match="no host-visible kernel"):
        translate("#include <metal_stdlib>\nfloat f(float x) { return x; }\n")
    with pytest.raises(SyntaxError, match="threadgroup"):
        translate("kernel void k(threadgroup float* t [[threadgroup(0)]]) {}")


def test_backend_is_registered():
    assert "cuda" in mf.runtime.BACKENDS
    with mf.backend("cuda"):
        assert mf.runtime.current_backend() == "cuda"

    @mf.kernel(backend="cuda")
    def twice(x: "T[N]"):
        return x * 2

    with pytest.raises(DeviceError, match=r"backend 'cuda' runs on cuda tensors.*\.cuda\(\)"):
        twice(torch.ones(4))


def test_middle_cap_is_one_group_a_core_more():
    # the cap the cuda library tries for a kernel uncapped past its register cap: one group
    # of its threads a core more than its registers allow, where that leaves at least 128
    # registers and takes at most 64 away
    from metalforge.cuda.translate import mid_bounds
    assert mid_bounds(128, 168) == "__launch_bounds__(128, 4)"     # 3 groups -> 4, 128 each
    assert mid_bounds(128, 199) == "__launch_bounds__(128, 3)"     # 2 groups -> 3, 170 each
    assert mid_bounds(256, 140) == "__launch_bounds__(256, 2)"     # 1 group -> 2, 128 each
    assert mid_bounds(128, 252) is None                             # 82 over 170
    assert mid_bounds(128, 120) is None                             # 4 groups -> 5: 102 each
    assert mid_bounds(1024, 100) is None                            # 1 group -> 2: 32 each
