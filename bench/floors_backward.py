"""bench/floors.py's backward part: the attention backward's wide kernels (examples/attention.py
on the cuda target, f16, causal, 16 heads, E = 128, S = L) timed with one phase of their steps
taken out by a text edit of the generated source (each edit touches the `_wide` kernels only):

- no S / dP products: the runs of S = Q Kᵀ and dP = dO Vᵀ dropped (their blocks stay 0);
- no gradient products: the runs of dV += Pᵀ dO, dK += dSᵀ Q and dQ += dS K dropped (the
  compiler then also drops the element work that feeds only them);
- plain P / dS: each element's P and dS taken as its S and dP dot products (the mask, the
  row's lse and delta, the exp computed for nothing, so the compiler drops them): the
  products and the loop's glue alone;
- fast exp: P's exp as `fast::exp` (a change, not a floor: what the exp's accuracy costs).

The time is `torch.autograd.grad` of the forward's output (its graph kept, the forward not
timed): the delta row kernel, dq and dk/dv. What is left when a phase is out bounds what any
change to that phase can gain.
"""
from __future__ import annotations

import re
import sys

import torch

KERNEL = re.compile(r"kernel void mf_\w+_(dkdv|dq)_wide\(")
S_RUN = re.compile(r"^\s*mf_sres_op\.run\(.*\);\n", re.M)
G_RUN = re.compile(r"^\s*mf_racc_op\.run\(.*\);\n", re.M)
P_VALUE = re.compile(r"mf_w0 = mf_g\d+;")
DS_VALUE = re.compile(r"mf_w1 = mf_g\d+;")
LENGTHS = (1024, 4096)
HEADS, E = 16, 128


def _stop(what: str) -> None:
    raise SystemExit(f"bench/floors.py: edit '{what}': the backward kernels' text changed; "
                     "update the edit (bench/floors_backward.py)")


def _in_kernels(src: str, what: str, edit) -> str:
    """`edit` applied to each wide kernel's text (its signature to the next instantiation) of
    a library that has them; stops where it changes none of them."""
    out, at, found, changed = [], 0, False, False
    for m in KERNEL.finditer(src):
        j = src.find("template [[host_name(", m.start())
        body = edit(src[m.start():j])
        found, changed = True, changed or body != src[m.start():j]
        out += [src[at:m.start()], body]
        at = j
    if found and not changed:
        _stop(what)
    return "".join(out) + src[at:]


def no_scores(src: str) -> str:
    return _in_kernels(src, "no S / dP products", lambda s: S_RUN.sub("", s))


def no_gradients(src: str) -> str:
    return _in_kernels(src, "no gradient products", lambda s: G_RUN.sub("", s))


def plain(src: str) -> str:
    def edit(s: str) -> str:
        return DS_VALUE.sub("mf_w1 = mf_pd;", P_VALUE.sub("mf_w0 = mf_sd;", s))
    return _in_kernels(src, "plain P / dS", edit)


def fast_exp(src: str) -> str:
    return _in_kernels(src, "fast exp", lambda s: s.replace("precise::exp(", "fast::exp("))


EDITS = {"no S / dP products": [no_scores], "no gradient products": [no_gradients],
         "plain P / dS": [plain], "fast exp": [fast_exp]}
MODES = ["as generated", *EDITS]
HEADER = f"{'backward kernels':<34} {'S=L':>9} {'ours ms':>9}"


def source() -> str:
    """The backward kernels' MSL at the cuda target with the cuda backend's launch options
    (the wide kernels, their step), f16: what the cuda backend compiles (no GPU)."""
    from attention import attention

    from metalforge.schedule.policy import backend_launch
    launch = backend_launch("cuda", "attention_grad") or {}
    return attention.with_launch(target="cuda", **launch).backward_source(T="f16")


def check() -> list[str]:
    """Every edit applied to the wide kernels' source (no GPU): one line an edit."""
    src = source()
    lines = []
    for mode, edits in EDITS.items():
        out = src
        for edit in edits:
            out = edit(out)
        lines.append(f"backward    {mode:<24} {len(src) - len(out):>6} characters edited")
    return lines


def run(mode: str, repeat: int) -> None:
    """Time the backward at each length with this mode's edits installed (floors.install)."""
    from attention import attention
    for length in LENGTHS:
        q, k, v, dy = (torch.randn(1, HEADS, length, E, device="cuda", dtype=torch.float16)
                       for _ in range(4))
        leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
        out = attention(*leaves, E ** -0.5)
        torch.autograd.grad(out, leaves, dy, retain_graph=True)
        times = []
        for _ in range(repeat):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            torch.autograd.grad(out, leaves, dy, retain_graph=True)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        times.sort()
        print(f"{mode:<34} {length:>9} {times[len(times) // 2]:>9.3f}", flush=True)


if __name__ == "__main__":
    sys.exit("run through bench/floors.py --parts backward")
