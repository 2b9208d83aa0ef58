"""`bench/overhead.py --grad`: the host cost of a warm training step through metalforge's
autograd, with every kernel launch stubbed (overhead.py's `NoLaunch`).

A step is `out = f(*leaves); torch.autograd.grad(out, leaves, dy)`: the differentiable call's
forward (`runtime.autograd`) and each backward kernel. Two ways of running those kernels, side
by side in one run:
    warm   each kernel replays the closure its first call recorded (`runtime.gradwarm`: keyed
           as a kernel's own warm calls), the saving plan kept per key
    full   each kernel takes `runs.run`'s full path (check, bind, dispatch) and the forward
           chooses its saving plan on every call (as before `gradwarm`; the backward's
           bookkeeping is `gradrun.BackwardRun`'s in both)
Beside them: the kernel's warm call without grad (one launch, the fast path), the kernel
launches a step makes, and torch eager's step on the same tensors (on the CPU that includes
torch's arithmetic) and on 1-element tensors (torch autograd's dispatch floor).
"""
from __future__ import annotations

import importlib
import math

import torch
import torch.nn.functional as F

from metalforge.runtime import autograd as ag
from metalforge.runtime import gradwarm
from metalforge.runtime.runs import run

VARIANTS = ("full", "warm")
_WARM = (gradwarm.GraphPath.run, ag.memo)


def _full_run(path, values):
    """The full path of each kernel (with the options it takes of the call's)."""
    return run(path.graph, values, backend=path.backend, launch=path.launch)


def use_variant(name: str) -> None:
    """Run the differentiable calls' kernels the `name` way (`VARIANTS`)."""
    if name == "full":
        gradwarm.GraphPath.run, ag.memo = _full_run, lambda *a: a[-1]()
    else:
        gradwarm.GraphPath.run, ag.memo = _WARM


def cases(rows: int, cols: int, dtype, device: str):
    """(name, ours (leaves) -> outputs, torch (leaves) -> outputs, leaves, 1-element leaves,
    extra inputs) of each kernel: attention 1x2x64x32 causal, cross-entropy rows x cols,
    rms_norm rows x cols with weight."""
    attention = importlib.import_module("attention").attention
    cross_entropy = importlib.import_module("cross_entropy").cross_entropy
    rms_norm = importlib.import_module("rms_norm").rms_norm

    def t(*shape):
        return torch.randn(*shape, dtype=dtype, device=device)
    scale = 1 / math.sqrt(32)
    yield ("attention 1x2x64x32", lambda q, k, v: attention(q, k, v, scale),
           lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale),
           [t(1, 2, 64, 32) for _ in range(3)], [t(1, 1, 1, 1) for _ in range(3)])
    target = torch.randint(0, cols, (rows,), dtype=torch.int32, device=device)
    t64, t1 = target.long(), torch.zeros(1, dtype=torch.long, device=device)
    yield (f"cross_entropy {rows}x{cols}", lambda x: cross_entropy(x, target),
           lambda x: F.cross_entropy(x, t64 if x.shape[0] == rows else t1, reduction="none"),
           [t(rows, cols)], [t(1, 1)])
    yield (f"rms_norm {rows}x{cols} + w", lambda x, w: rms_norm(x, w),
           lambda x, w: F.rms_norm(x, (x.shape[-1],), w, eps=1e-6),
           [t(rows, cols), t(cols)], [t(1, 1), t(1)])


def _step(fn, leaves):
    """One training step of `fn` on `leaves` (each requiring grad), dy random, made once."""
    ls = [x.clone().requires_grad_() for x in leaves]
    out = fn(*ls)
    dy = torch.randn_like(out)

    def step():
        return torch.autograd.grad(fn(*ls), ls, dy)
    return step


def grad_steps(a, device: str, rows: int, cols: int, per_call, no_launch) -> None:
    """Print the table: µs a warm step per variant, launches a step, the warm call without
    grad, torch eager on the same tensors and on 1-element ones."""
    steps = max(50, a.calls // 10)
    print(f"warm training-step host cost, launches stubbed (device {device}, {a.dtype}, median "
          f"of {a.rounds} x {steps} steps; µs per forward + torch.autograd.grad)")
    print(f"{'kernel':26} {'launches':>8}" + "".join(f" {v + ' µs':>9}" for v in VARIANTS)
          + f" {'no-grad call':>13} {'torch µs':>9} {'torch 1-elem':>13}")
    dtype = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[a.dtype]
    for name, ours, eager, leaves, ones in cases(rows, cols, dtype, device):
        step = _step(ours, leaves)
        times = {}
        for v in VARIANTS:
            use_variant(v)
            times[v] = per_call(step, steps, a.rounds, device)
        no_launch.launches = 0
        step()
        launches = no_launch.launches
        plain = [x.detach() for x in leaves]
        nograd = per_call(lambda: ours(*plain), a.calls, a.rounds, device)
        torch_us = per_call(_step(eager, leaves), max(20, steps // 10), a.rounds, device)
        torch1 = per_call(_step(eager, ones), steps, a.rounds, device)
        print(f"{name:26} {launches:8d}" + "".join(f" {times[v]:9.2f}" for v in VARIANTS)
              + f" {nograd:13.2f} {torch_us:9.2f} {torch1:13.2f}")
    use_variant("warm")
