"""The cuda shim's host syntax check, shared by the tests that translate MSL for the cuda
backend where no GPU is: g++ (or clang++) reads the translation with -fsyntax-only against the
shim's headers (MF_CUDA_HOST_CHECK stands in for NVRTC's built-ins)."""
import shutil
import subprocess
from pathlib import Path

import pytest

from metalforge.cuda.library import INCLUDE_DIR


def assert_host_syntax(text: str, tmp_path: Path, metal_version: int = 0) -> None:
    """`text` (a cuda translation) compiles on the host, as C++20 at Metal 4.0 when
    `metal_version` is 400 or more, else as C++17; skipped without a host compiler."""
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no host C++ compiler for the syntax check")
    std = ["-std=c++20", f"-D__METAL_VERSION__={metal_version}"] if metal_version >= 400 \
        else ["-std=c++17"]
    (tmp_path / "tu.cu").write_text(text)
    r = subprocess.run([cxx, *std, "-fsyntax-only", "-w", "-DMF_CUDA_HOST_CHECK",
                        f"-I{INCLUDE_DIR}", "-x", "c++", "tu.cu"], capture_output=True,
                       text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[:4000]
