"""Targets: which Metal the generated code may assume (language version, GPU family, whether
Metal 4 tensor operations exist), and how one is chosen.

A `Target` is frozen data. The named targets:

    apple7 .. apple9   Metal 3.2, simdgroup_matrix products (M1 .. M4)
    apple10            Metal 4.0, tensor operations (MetalPerformancePrimitives' matmul2d on
                       M5's neural accelerators)
    apple9-metal4      an M3/M4 on macOS 26: Metal 4.0, tensor operations there but run on
                       the ordinary ALUs (only when chosen: the default there is apple9's
                       simdgroup_matrix, as MLX keeps its tensor-op kernels to M5)
    cuda               the cuda backend: Metal 4.0 tensor operations, which its shim runs on
                       tensor cores (mma.sync, f16/bf16 operands, fp32 accumulators)

Precedence (first that says): the launch option `launch={"target": "apple10"}` > the innermost
`with mf.target(...)` block (or the last `mf.target(...)` set outside one) > the environment
variable METALFORGE_TARGET > the backend's default: "mps" asks the running macOS and GPU once
(apple10 on an M5 whose macOS compiles a tiny kernel including the tensor-ops header, else the
chip's family: apple7 .. apple9), "sim" and "mlx" apple9, "cuda" cuda.

Only the schedules whose code depends on it read the target (today: the contraction family,
`mf.sum(a * b, axis="K")`, and attention's prefill kernel on half / bfloat operands); the
backends compile its code at the target's Metal version.
"""
from __future__ import annotations

import os
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .errors import DeviceError
from .once import OnceMap

ENV = "METALFORGE_TARGET"


@dataclass(frozen=True)
class Target:
    """What generated code may assume: `metal_version` (__METAL_VERSION__: 320 is Metal 3.2,
    400 Metal 4.0), the Apple GPU family (0: not an Apple GPU, the cuda backend) and whether
    Metal 4 tensor operations (MetalPerformancePrimitives) are there. `row_lanes`: where the
    element layout of a 16 x 16 fp32 destination cooperative tensor is known (and the same as
    that of a left input of the same shape), the xor masks between the lanes that hold one row
    of it, each lane holding elements of one row in 0..7 and one in 8..15 (M5: MLX's
    BaseNAXFrag; cuda: mma.sync's fragments); () where the code must assume no layout."""
    name: str
    metal_version: int
    gpu_family: int
    tensor_ops: bool
    row_lanes: tuple[int, ...] = ()

    @property
    def bfloat_matrices(self) -> bool:
        """bfloat simdgroup matrices and the bfloat type itself: MSL 3.1 on."""
        return self.metal_version >= 310


TARGETS: dict[str, Target] = {
    t.name: t for t in (
        Target("apple7", 320, 7, False),
        Target("apple8", 320, 8, False),
        Target("apple9", 320, 9, False),
        Target("apple9-metal4", 400, 9, True),
        Target("apple10", 400, 10, True, (1, 8)),
        Target("cuda", 400, 0, True, (1, 2)),
    )}
SIM_DEFAULT = "apple9"          # the simulator's Metal unless chosen (contract: metal 320, 9)
_chosen: ContextVar[Optional[str]] = ContextVar("metalforge_target", default=None)


def get_target(name: Any, what: str = "target") -> Target:
    """The named target, or an error listing them."""
    if not isinstance(name, str) or name not in TARGETS:
        raise DeviceError(f"unknown metalforge {what} {name!r}; choose one of: "
                          f"{', '.join(TARGETS)}")
    return TARGETS[name]


class target:
    """Choose the Metal that generated code may assume, by name ("apple7" .. "apple9",
    "apple10", "cuda"): as a setter (`mf.target("apple10")`: from here on) or for a `with`
    block (the choice before it comes back at its end).

    Example::

        with mf.target("apple10"):
            c = matmul(a, b)     # Metal 4 tensor ops (matmul2d), in the simulator too
    """

    def __init__(self, name: str) -> None:
        self.target = get_target(name)
        self._token: Optional[Token[Optional[str]]] = _chosen.set(self.target.name)

    def __enter__(self) -> "target":
        return self

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            _chosen.reset(self._token)
            self._token = None

    def __repr__(self) -> str:
        return f"metalforge.target({self.target.name!r})"


# the MPS probe: a kernel that needs Metal 4's tensor-ops header and descriptor
PROBE = """#include <metal_stdlib>
#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>
using namespace metal;
using namespace mpp::tensor_ops;

kernel void mf_probe_tensor_ops(device float* out [[buffer(0)]],
                                uint tid [[thread_position_in_grid]]) {
    constexpr auto desc = matmul2d_descriptor(16, 32, 16, false, true, false,
                                              matmul2d_descriptor::mode::multiply_accumulate);
    matmul2d<desc, execution_simdgroup> op;
    out[tid] = 0.0f;
}
"""
_probed: OnceMap[str, str] = OnceMap()
# Apple GPU family by the chip's generation (M1: Apple7, M2: Apple8, M3 and M4: Apple9, M5:
# Apple10)
_FAMILY_OF_CHIP = {1: "apple7", 2: "apple8", 3: "apple9", 4: "apple9"}


def chip_generation() -> Optional[int]:
    """The N of the Mac's "Apple MN ..." chip (sysctl machdep.cpu.brand_string), or None."""
    import re
    import subprocess
    try:
        brand = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"],
                               capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"Apple M(\d+)", brand)
    return int(m.group(1)) if m else None


def pick_mps(generation: Optional[int], tensor_ops_compile: bool) -> str:
    """The Mac's target: apple10 on an M5 or later whose macOS compiles the tensor-ops header,
    else its family's simdgroup_matrix target (apple9 where the chip is not known)."""
    if generation is not None and generation >= 5:
        return "apple10" if tensor_ops_compile else "apple9"
    return _FAMILY_OF_CHIP.get(generation or 0, "apple9")


def probe(compile_shader: Callable[[str], Any], generation: Optional[int]) -> str:
    """The Mac's target from one compile of PROBE (`torch.mps.compile_shader`'s call model:
    the library compiles when it is created; a compile error is a SyntaxError, other failures
    a RuntimeError) and the chip's generation (`pick_mps`)."""
    try:
        compile_shader(PROBE)
        ok = True
    except (SyntaxError, RuntimeError):
        ok = False
    return pick_mps(generation, ok)


def probe_mps() -> str:
    """The target the running Mac supports, asked once (`probe` through
    torch.mps.compile_shader, at the language version the macOS has)."""
    def ask() -> str:
        import torch
        return probe(torch.mps.compile_shader, chip_generation())
    return _probed.get_or_build("mps", ask)


def default_for(backend: str) -> Target:
    """The backend's own target, when nothing chose one."""
    if backend == "mps":
        return TARGETS[probe_mps()]
    if backend == "cuda":
        return TARGETS["cuda"]
    return TARGETS[SIM_DEFAULT]


def current_target(backend: str) -> Target:
    """The target of a call on `backend`: `mf.target(...)` > METALFORGE_TARGET > the
    backend's default (the launch option, above them all, is the launcher's)."""
    name = _chosen.get()
    if name is not None:
        return TARGETS[name]
    env = os.environ.get(ENV)
    if env:
        return get_target(env, f"target in {ENV}")
    return default_for(backend)


def compile_options(t: Optional[Target], backend: str) -> dict[str, int]:
    """Keyword arguments of the backend's compile for code generated for `t` (None: code that
    assumes nothing, compiled as always): the simulator takes the Metal version and GPU family
    (-D__METAL_VERSION__, -DMF_SIM_GPU_FAMILY), the cuda backend the Metal version; only what
    differs from the backend's own default is passed."""
    if t is None or backend == "mps" or backend == "mlx":
        return {}
    base = TARGETS[SIM_DEFAULT]
    if backend == "cuda":
        return {} if t.metal_version == base.metal_version else \
            {"metal_version": t.metal_version}
    if (t.metal_version, t.gpu_family) == (base.metal_version, base.gpu_family):
        return {}
    return {"metal_version": t.metal_version, "gpu_family": t.gpu_family}
