"""What `metalforge doctor` records about the machine: OS and chip, torch and MLX versions, the
backend it checks on, and the Metal language version that backend compiles for (read from
`__METAL_VERSION__` by a one-thread probe kernel, so it is what compile_shader really uses)."""
from __future__ import annotations

import platform
import subprocess
from typing import Any, Callable, Optional

import torch

from .._version import __version__

PROBE = """#include <metal_stdlib>
using namespace metal;
kernel void mf_probe_version(device int* out [[buffer(0)]],
                             uint i [[thread_position_in_grid]]) {
    if (i == 0) { out[0] = __METAL_VERSION__; }
}
"""


def _compiler(backend: str) -> Callable[[str], Any]:
    if backend == "mps":
        return torch.mps.compile_shader
    if backend == "cuda":
        from ..cuda import compile_shader
        return compile_shader
    from ..sim import compile_shader as sim_compile
    return sim_compile


def metal_version(backend: str, device: str) -> Optional[str]:
    """'3.2' for __METAL_VERSION__ 320 as the backend's compiler sees it; None if the probe
    does not run."""
    try:
        lib = _compiler(backend)(PROBE)
        out = torch.zeros(1, dtype=torch.int32, device=device)
        lib.mf_probe_version(out, threads=1, group_size=1)
        v = int(out.cpu()[0])
    except Exception:  # noqa: BLE001 - the report says it is unknown
        return None
    return f"{v // 100}.{v % 100 // 10}"


def _chip() -> Optional[str]:
    """The Mac's chip ("Apple M3 Max"), from sysctl."""
    try:
        r = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True,
                           text=True, timeout=5)
        return r.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _mlx() -> dict[str, Any]:
    try:
        import mlx.core as mx
    except ImportError:
        return {}
    info: dict[str, Any] = {"mlx": getattr(mx, "__version__", "unknown")}
    try:
        dev = mx.metal.device_info() if mx.metal.is_available() else {}
        gpu = {k: dev[k] for k in ("device_name", "architecture") if k in dev}
        if gpu:
            info["mlx_gpu"] = gpu
    except Exception:  # noqa: BLE001 - older MLX: no device_info
        pass
    return info


def facts(backend: str, device: str) -> dict[str, Any]:
    """The machine as the report shows it (no user names or paths)."""
    out: dict[str, Any] = {
        "metalforge": __version__, "python": platform.python_version(),
        "torch": torch.__version__, "os": platform.system(), "arch": platform.machine(),
        "backend": backend}
    if platform.system() == "Darwin":
        out["macos"] = platform.mac_ver()[0]
        out["chip"] = _chip()
    if backend == "cuda":
        out["gpu"] = torch.cuda.get_device_name()
    if backend == "mps":
        out["mps_available"] = torch.backends.mps.is_available()
    out["metal_version"] = metal_version(backend, device)
    out.update(_mlx())
    return out


def describe(f: dict[str, Any]) -> str:
    """One line for the terminal."""
    where = f.get("chip") or f.get("gpu") or f["arch"]
    os_ = f"macOS {f['macos']}" if f.get("macos") else f["os"]
    mlx = f", MLX {f['mlx']}" if f.get("mlx") else ""
    return (f"metalforge {f['metalforge']} on {os_}, {where}; torch {f['torch']}{mlx}; backend "
            f"{f['backend']} (Metal {f.get('metal_version') or 'version unknown'})")
