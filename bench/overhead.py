"""Warm-call host overhead: µs of Python per kernel call, with the GPU launch replaced by a no-op.

    python bench/overhead.py                    # MPS on a Mac, CUDA on NVIDIA, else the simulator
    python bench/overhead.py --device cuda --calls 20000
    python bench/overhead.py --device cuda --real            # real launches, CPU and wall time
    python bench/overhead.py --grad --calls 2000             # warm training steps, stubbed

Every compiled kernel object is wrapped so that calling it does nothing (compilation, the
pipeline limits and everything before the launch are real), then each kernel is called warm
`--calls` times in a loop; the number is the median over `--rounds` rounds of the process's CPU
time per call (CPU time, not wall time, so a loaded machine does not inflate it).
That is metalforge's own cost per call: binding, checks, shape binding, output allocation and
argument marshalling. Next to it, torch eager on the same tensors (which includes torch's real
kernel, so on CPU it is dominated by the arithmetic) and on 1-element tensors (torch's dispatch
floor), plus `torch.empty_like` (one output allocation).

`--grad` times warm training steps instead (`overhead_grad.py`): `out = f(*leaves);
torch.autograd.grad(out, leaves, dy)` with the launches stubbed, for attention, cross-entropy
and rms_norm with weight: µs a step and kernel launches a step, through the warm replays of
`runtime.gradwarm` and through the full path every kernel took before (`runs.run`: check, bind,
dispatch, and the saving plan chosen per call), next to a warm call without grad and torch
eager's step on the same tensors and on 1-element ones.

`--real` launches for real (nothing stubbed): the whole host cost of a warm call, the backend's
launch included (for `cuda`: metalforge.cuda's plan, the stream lookup and cuLaunchKernelEx),
next to torch eager on the same tensors; on cuda in four variants side by side (`VARIANTS`:
the plan's launch inlined in the replay with cuLaunchKernelEx, the plan's launch called, the
inlined one with cuLaunchKernel, the kernel object's keyword call as before the planned
launch). Each number is µs per call, median over the
rounds, as CPU time of the process (the loop only) and as wall time (the loop plus the
synchronisation that ends it, so a GPU slower than the host shows up there). With no
synchronisation inside the loop the launches queue up; keep `--size` small enough that the GPU
keeps pace (the default does on an H100), else the wall time is the GPU's.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from add_rms_norm import add_rms_norm  # noqa: E402
from column_sum import column_sum  # noqa: E402
from common import DTYPES, pick_device, sync  # noqa: E402
from rms_norm import rms_norm  # noqa: E402
from silu import silu  # noqa: E402
from softmax import softmax  # noqa: E402
from two_outputs import add_silu  # noqa: E402

from metalforge.runtime import backends, fastpath, launcher  # noqa: E402

_PLANNED = fastpath.planned


class NoLaunch:
    """A compiled kernel object whose call does nothing (its attributes are the real ones);
    `launches` counts the (stubbed) launches of every such kernel."""
    launches = 0

    def __init__(self, kernel):
        self._kernel = kernel

    def __getattr__(self, name):
        if name == "planned":           # the backend's planned launch (cuda): stubbed too
            getattr(self._kernel, name)
            return lambda *args, **kw: NoLaunch._count
        if name == "launch_plan":       # its plan, inlined by the replay: not offered
            return lambda *args, **kw: None
        return getattr(self._kernel, name)

    def __call__(self, *args, threads, group_size, arg_casts=None):
        NoLaunch.launches += 1

    @staticmethod
    def _count(*args):
        NoLaunch.launches += 1


def stub_launches() -> None:
    real = backends.kernel_object
    made: dict[int, NoLaunch] = {}

    def kernel_object(backend_name, source, host_name, options=()):
        k = real(backend_name, source, host_name, options)
        return made.setdefault(id(k), NoLaunch(k))

    launcher.kernel_object = kernel_object


class PlanOnNoDriver:
    """A compiled kernel object whose warm launches go through a real `metalforge.cuda` plan
    (made from the kernel's MSL; its packing, buffers and generated launch code) on a driver
    that does nothing: the cuda path's Python on any machine (`--driver-stub`; ctypes' own
    conversion of the four launch arguments, about 0.2 µs, is not in it)."""

    def __init__(self, kernel, source: str, host: str):
        from metalforge.cuda import call as C
        from metalforge.cuda.translate import translate
        self._kernel, self._host, self._c = kernel, host, C
        (self._entry,) = [e for e in translate(source).entries if e.host_name == host]
        self._driver = C.Driver(lambda *a: 0, lambda device: 0, None, lambda d: None,
                                lambda *a: 0)

    def __getattr__(self, name):
        return getattr(self._kernel, name)

    def __call__(self, *args, threads, group_size, arg_casts=None):
        return None

    def planned(self, *args, **kw):
        return self.launch_plan(*args, **kw).run

    def launch_plan(self, *args, threads, group_size, arg_casts=None):
        import ctypes
        return self._c.plan_unchecked(self._entry, args, threads, group_size, arg_casts,
                                      ctypes.c_void_p(1), self._driver)


def stub_driver() -> None:
    real = backends.kernel_object
    made: dict[int, PlanOnNoDriver] = {}

    def kernel_object(backend_name, source, host_name, options=()):
        k = real(backend_name, source, host_name, options)
        return made.setdefault(id(k), PlanOnNoDriver(k, source, host_name))

    launcher.kernel_object = kernel_object


def per_call_real(fn, calls: int, rounds: int, device: str) -> tuple[float, float]:
    """(CPU µs, wall µs) per call of `fn`, medians over `rounds` loops of `calls` calls (no
    sync inside): the process's CPU time of the loop alone (other load on the machine does not
    count), and the wall time of the loop and the sync after it."""
    for _ in range(min(calls, 200)):
        fn()
    sync(device)
    cpu, wall = [], []
    for _ in range(rounds):
        w0, c0 = time.perf_counter(), time.process_time()
        for _ in range(calls):
            fn()
        c1 = time.process_time()
        sync(device)
        w1 = time.perf_counter()
        cpu.append((c1 - c0) / calls * 1e6)
        wall.append((w1 - w0) / calls * 1e6)
    return statistics.median(cpu), statistics.median(wall)


def per_call(fn, calls: int, rounds: int, device: str) -> float:
    """Median CPU µs per call (`per_call_real`'s first number)."""
    return per_call_real(fn, calls, rounds, device)[0]


# How a warm call reaches the GPU, each selectable so that one run times them side by side:
#   inline     the replay holds the cuda plan's launch code itself (`Plan.lines`: no call
#              into the plan, pointers taken once, constants converted once), cuLaunchKernelEx
#   run        the replay calls the plan's compiled launch (`Plan.run`, one more call, every
#              argument converted by the plan: the warm path before the inlined launch)
#   classic    `inline` through cuLaunchKernel (METALFORGE_CUDA_LAUNCH=classic)
#   unplanned  the replay calls the kernel object (its call key and plan lookup on every
#              call, then the plan's launch: the warm path before the planned launch)
VARIANTS = ("inline", "run", "classic", "unplanned")


def _as_run(*args):
    """`fastpath.planned` for the `run` variant: the plan's launch as a function."""
    plan = _PLANNED(*args)
    return getattr(plan, "run", plan)


def use_variant(name: str, kernels) -> None:
    """Switch the warm path to variant `name`: forget every kernel's warm closures and every
    cuda kernel's plans (made under the previous variant) and the cuda driver's choice of
    launch call."""
    import os

    from metalforge.cuda import library
    from metalforge.runtime import fastpath
    if name == "classic":
        os.environ["METALFORGE_CUDA_LAUNCH"] = "classic"
    else:
        os.environ.pop("METALFORGE_CUDA_LAUNCH", None)
    library._calls = None
    fastpath.planned = {"unplanned": lambda *args: None, "run": _as_run}.get(name, _PLANNED)
    for k in list(backends._kernels.values()):
        if hasattr(k, "_plans"):
            k._plans._entries.clear()
    for kernel in kernels:
        kernel._calls.warm.clear()


def real(a, device: str, rows: int, cols: int) -> None:
    variants = VARIANTS if device == "cuda" else ("inline",)
    print(f"warm-call host cost, real launches (device {device}, {a.dtype} {rows}x{cols}, "
          f"median of {a.rounds} x {a.calls} calls; µs per call, CPU = process time of the "
          f"loop, wall = loop + final sync)")
    head = "".join(f" {v + ' CPU':>14} {v + ' wall':>15}" for v in variants)
    print(f"{'family':12} {'kernel':22}{head} {'torch CPU':>10} {'torch wall':>11}")
    all_cases = list(cases(rows, cols, DTYPES[a.dtype], device))
    kernels = [silu, add_silu, rms_norm, add_rms_norm, softmax, column_sum]
    ours: dict[str, list[tuple[float, float]]] = {}
    for v in variants:
        use_variant(v, kernels)
        ours[v] = [per_call_real(fn, a.calls, a.rounds, device) for _, _, fn, _, _ in all_cases]
    for k, (family, name, _, eager, _) in enumerate(all_cases):
        tc, tw = per_call_real(eager, a.calls, a.rounds, device)
        cols_ = "".join(f" {ours[v][k][0]:14.2f} {ours[v][k][1]:15.2f}" for v in variants)
        print(f"{family:12} {name:22}{cols_} {tc:10.2f} {tw:11.2f}")


def driver_stub(a, device: str, rows: int, cols: int) -> None:
    stub_driver()
    variants = ("inline", "run")
    print(f"warm-call host cost through a cuda plan on a no-op driver (device {device}, "
          f"{a.dtype} {rows}x{cols}, median of {a.rounds} x {a.calls} calls; CPU µs per call)")
    print(f"{'family':12} {'kernel':22}" + "".join(f" {v:>8}" for v in variants)
          + f" {'torch 1-elem':>13}")
    all_cases = list(cases(rows, cols, DTYPES[a.dtype], device))
    kernels = [silu, add_silu, rms_norm, add_rms_norm, softmax, column_sum]
    ours = {}
    for v in variants:
        use_variant(v, kernels)
        ours[v] = [per_call(fn, a.calls, a.rounds, device) for _, _, fn, _, _ in all_cases]
    for k, (family, name, _, _, eager1) in enumerate(all_cases):
        print(f"{family:12} {name:22}" + "".join(f" {ours[v][k]:8.2f}" for v in variants)
              + f" {per_call(eager1, a.calls, a.rounds, device):13.2f}")


def cases(rows: int, cols: int, dtype, device):
    def t(*shape):
        return torch.randn(*shape, dtype=dtype, device=device)
    x, r, w = t(rows, cols), t(rows, cols), t(cols)
    x1, r1, w1 = t(1, 1), t(1, 1), t(1)
    yield ("elementwise", "silu", lambda: silu(x), lambda: F.silu(x), lambda: F.silu(x1))
    yield ("elementwise", "add_silu (2 outputs)", lambda: add_silu(x, r),
           lambda: (x + r, F.silu(x + r)), lambda: (x1 + r1, F.silu(x1 + r1)))
    yield ("row", "rms_norm", lambda: rms_norm(x, w),
           lambda: F.rms_norm(x, (cols,), w, eps=1e-6),
           lambda: F.rms_norm(x1, (1,), w1, eps=1e-6))
    yield ("row", "add_rms_norm", lambda: add_rms_norm(x, r, w),
           lambda: F.rms_norm(x + r, (cols,), w, eps=1e-6),
           lambda: F.rms_norm(x1 + r1, (1,), w1, eps=1e-6))
    yield ("row", "softmax", lambda: softmax(x), lambda: torch.softmax(x, -1),
           lambda: torch.softmax(x1, -1))
    yield ("column", "column_sum", lambda: column_sum(x), lambda: x.sum(0), lambda: x1.sum(0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["mps", "cuda", "cpu"])
    ap.add_argument("--dtype", default="f32", choices=list(DTYPES))
    ap.add_argument("--size", default="64x4096", help="rows x cols of the arguments")
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--real", action="store_true",
                    help="real launches (no stub): CPU and wall µs per call, next to torch eager")
    ap.add_argument("--grad", action="store_true",
                    help="warm training steps (forward + torch.autograd.grad), launches stubbed: "
                         "µs and kernel launches a step, the warm replays (gradwarm) and the "
                         "full path of every kernel side by side, next to torch eager")
    ap.add_argument("--driver-stub", action="store_true",
                    help="launch through a metalforge.cuda plan on a driver that does nothing "
                         "(the cuda path's Python, on any device), the plan's launch inlined "
                         "in the replay and called, side by side")
    a = ap.parse_args()
    device = pick_device(a.device)
    rows, cols = (int(v) for v in a.size.split("x"))
    if a.real:
        real(a, device, rows, cols)
        return
    if a.driver_stub:
        driver_stub(a, device, rows, cols)
        return
    if a.grad:
        from overhead_grad import grad_steps
        stub_launches()
        grad_steps(a, device, rows, cols, per_call, NoLaunch)
        return
    stub_launches()
    print(f"warm-call overhead, launch stubbed (device {device}, {a.dtype} {rows}x{cols}, "
          f"median of {a.rounds} x {a.calls} calls)")
    print(f"{'family':12} {'kernel':22} {'ours µs':>8} {'torch µs':>9} {'torch 1-elem µs':>16}")
    for family, name, ours, eager, eager1 in cases(rows, cols, DTYPES[a.dtype], device):
        us = [per_call(ours, a.calls, a.rounds, device),
              per_call(eager, max(50, a.calls // 20), a.rounds, device),   # real work on CPU
              per_call(eager1, a.calls, a.rounds, device)]
        print(f"{family:12} {name:22} {us[0]:8.2f} {us[1]:9.2f} {us[2]:16.2f}")
    x = torch.randn(rows, cols, dtype=DTYPES[a.dtype], device=device)
    print(f"torch.empty_like (one output allocation): "
          f"{per_call(lambda: torch.empty_like(x), a.calls, a.rounds, device):.2f} µs")


if __name__ == "__main__":
    main()
