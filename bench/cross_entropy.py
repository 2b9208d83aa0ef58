"""Cross-entropy per row: ours vs torch eager and torch.compile, bytes, % of copy_, peak memory.

    python bench/cross_entropy.py --device cuda                 # R = 4096, V = 32K and 128K
    python bench/cross_entropy.py --device cuda --dtype bf16 --vocab 131072

Ours: one row kernel for the loss, `logsumexp(x) - take(x, V, t)` (the row read once, online
max and sum over rows longer than a threadgroup holds, the target logit read once per row, no
softmax written); for the backward either the hand-written row kernel `(softmax(x) - one_hot(t))
* g` ("hand": loss kernel + backward kernel) or metalforge's derived backward through
`torch.autograd.grad` on our loss ("auto": dx = g * exp(x - lse) - one-hot * g, one fused
kernel; where rows are longer than a threadgroup holds (V = 128K) the forward also writes each
row's logsumexp, 4 bytes, and the backward is then one elementwise pass over the logits instead
of an online pass plus the pass writing dx: `metalforge.runtime.saving` picks by the bytes),
"smooth+z auto" the same with label smoothing 0.1 and a z-loss 1e-4 (against F.cross_entropy's
label_smoothing plus the z-loss), or one kernel writing the loss and dx at once for a gradient
known up front (the mean's 1/R: "fused", as fused-loss libraries do). Torch:
`F.cross_entropy(x, t, reduction="none")` eager (its log_softmax is written out) and
torch.compile of the same function; forward + backward with `torch.autograd.grad(loss, x, g)`,
for torch.compile through the compiled loss (AOTAutograd compiling its backward too, as in
training).

Bytes are our schedules' counts (loss: the logits once, the targets, one gathered logit per row,
the losses; backward: the logits once per pass it makes, the targets and gradients, the saved
logsumexp where there is one, dx written); GB/s over them, %copy against `copy_` moving as
many. Peak is the largest torch.cuda.max_memory_allocated over one call beyond what was
allocated before it (the inputs; "comp MiB" for torch.compile's): torch eager's forward holds
the [R, V] log-softmax; ours holds dx and, saved, 4 bytes a row. On CUDA, times are GPU times of
CUDA-graph replays (common.timeit; a gather kernel's index report is not read while a graph is
captured). On the simulator (--device cpu) a smoke test of the script at small sizes.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import metalforge as mf
from metalforge import autodiff, runtime
from metalforge.runtime import saving
from metalforge.shapes import bind_shapes

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    DTYPES,
    add_compile_flag,
    compile_time,
    copy_time,
    pick_device,
    plan,
    ratio,
    timeit,
    us,
)

SMOOTHING, Z_LOSS = 0.1, 1e-4


@mf.kernel
def cross_entropy(logits: "T[R, V]", target: "i32[R]") -> "T[R]":  # noqa: F821
    return mf.logsumexp(logits, axis="V") - mf.take(logits, axis="V", index=target)


@mf.kernel
def cross_entropy_full(logits: "T[R, V]", target: "i32[R]", smoothing: float = 0.0,  # noqa: F821
                       z_loss: float = 0.0, ignore_index: int = -100) -> "T[R]":  # noqa: F821
    lse = mf.logsumexp(logits, axis="V")
    ignored = target == ignore_index
    x_t = mf.take(logits, axis="V", index=mf.where(ignored, 0, target))   # clamped
    loss = ((1 - smoothing) * (lse - x_t) + smoothing * (lse - mf.mean(logits, axis="V"))
            + z_loss * lse * lse)
    return mf.where(ignored, 0.0, loss)


def torch_full(x, t64, smoothing=SMOOTHING, z_loss=Z_LOSS):
    """F.cross_entropy with label smoothing, ignored rows, plus the z-loss (as PaLM's)."""
    loss = F.cross_entropy(x, t64, reduction="none", label_smoothing=smoothing)
    return loss + z_loss * torch.logsumexp(x.float(), -1).to(x.dtype) ** 2 * (t64 != -100)


@mf.kernel
def cross_entropy_backward(logits: "T[R, V]", target: "i32[R]",  # noqa: F821
                           grad: "T[R]") -> "T[R, V]":  # noqa: F821
    one_hot = mf.where(mf.index("V") == target, 1.0, 0.0)
    return ((mf.softmax(logits, axis="V") - one_hot) * grad).to("T")


@mf.kernel
def cross_entropy_fused(logits: "T[R, V]", target: "i32[R]", scale: float = 1.0):  # noqa: F821
    lse = mf.logsumexp(logits, axis="V")
    loss = lse - mf.take(logits, axis="V", index=target)
    one_hot = mf.where(mf.index("V") == target, 1.0, 0.0)
    return loss, ((mf.exp(logits - lse) - one_hot) * scale).to("T")


def peak_bytes(fn, device: str) -> int | None:
    """Bytes allocated at the peak of one call of fn beyond those allocated before it (CUDA)."""
    if device != "cuda":
        return None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def mib(b: int | None) -> str:
    return f"{b / 2**20:>8.0f}" if b is not None else f"{'-':>8}"


def kernel_bytes(kernels) -> int:
    """Bytes our schedules count for the calls [(kernel, args)]."""
    total = 0
    for k, kargs in kernels:
        sched, sizes = plan(k, kargs)
        total += sched.traffic(sizes).total
    return total


def derived_bytes(kernel, args, scalars=None) -> int:
    """Bytes of the forward and the derived backward (d logits) as a call on logits that
    require grad runs them: the forward saving its logsumexp where that moves fewer bytes
    (`metalforge.runtime.saving`), then the backward kernels."""
    g = kernel.graph(*args)
    values = {p.name: a for p, a in zip(g.params, args)} | dict(scalars or {})
    sizes = bind_shapes(g, {p.name: values[p.name] for p in g.tensors}).sizes
    bw = saving.choose(g, ("logits",), values, kernel.launch)
    fwd = g if bw is None else saving.forward_saving(g, bw)
    bw = bw or autodiff.backward_of(g, ("logits",))
    backend = kernel.backend or runtime.current_backend([args[0]])
    return saving.moved(fwd, bw.kernels, sizes, kernel.launch, backend)


def cases(x, t, t64, g):
    """{name: (ours, torch eager, bytes our kernels move, torch's loss of xr for the compiled
    forward + backward or None: torch.compile of the eager function)} of one shape."""
    xr = x.detach().requires_grad_()

    def torch_fwd():
        return F.cross_entropy(x, t64, reduction="none")

    def torch_both():
        return torch.autograd.grad(F.cross_entropy(xr, t64, reduction="none"), xr, g)

    def ours_hand():
        return cross_entropy(x, t), cross_entropy_backward(x, t, g)

    def ours_autograd():
        return torch.autograd.grad(cross_entropy(xr, t), xr, g)

    def ours_full():            # label smoothing and z-loss, derived
        return torch.autograd.grad(cross_entropy_full(xr, t, SMOOTHING, Z_LOSS), xr, g)

    def torch_full_both():
        return torch.autograd.grad(torch_full(xr, t64), xr, g)
    scale = float(g[0])
    fwd = [(cross_entropy, (x, t))]
    both = fwd + [(cross_entropy_backward, (x, t, g))]
    fused = [(cross_entropy_fused, (x, t, scale))]
    full = {"smoothing": SMOOTHING, "z_loss": Z_LOSS, "ignore_index": -100}
    def plain(x):
        return F.cross_entropy(x, t64, reduction="none")
    return {"loss": (lambda: cross_entropy(x, t), torch_fwd, kernel_bytes(fwd), None),
            "loss+bwd hand": (ours_hand, torch_both, kernel_bytes(both), (plain, xr, g)),
            "loss+bwd auto": (ours_autograd, torch_both, derived_bytes(cross_entropy, (x, t)),
                              (plain, xr, g)),
            "smooth+z auto": (ours_full, torch_full_both,
                              derived_bytes(cross_entropy_full, (x, t), full),
                              (lambda x: torch_full(x, t64), xr, g)),
            "loss+dx fused": (lambda: cross_entropy_fused(x, t, scale), torch_both,
                              kernel_bytes(fused), (plain, xr, g))}


def compiled_grad(loss_fn, xr, g):
    """torch.compile of the loss (AOTAutograd compiles its backward too: the training path),
    then torch.autograd.grad through it, as a call timed like the others."""
    torch._dynamo.reset()
    compiled = torch.compile(loss_fn, dynamic=False)
    return lambda: torch.autograd.grad(compiled(xr), xr, g)


def compiled_row(torch_fn, grad_case, device: str, repeat: int, enabled: bool):
    """(seconds per call, peak bytes) of torch.compile: of torch_fn itself (forward rows), or
    of the loss with its backward (`compiled_grad`); (None, None) where skipped or failed."""
    if grad_case is None:
        comp = compile_time(torch_fn, device, repeat, enabled)
        if comp is None:
            return None, None             # compile_time compiled it: measure that one
        return comp, peak_bytes(torch.compile(torch_fn, dynamic=False), device)
    if not enabled or device == "cpu":
        return None, None
    try:
        fn = compiled_grad(*grad_case)
        return timeit(fn, device, repeat), peak_bytes(fn, device)
    except Exception as e:  # noqa: BLE001 - a failed compile is a '-' in the table
        print(f"  (torch.compile failed: {type(e).__name__}: {str(e)[:120]})", flush=True)
        return None, None


def check(x, t, t64, g) -> None:
    """Ours against torch in f32 before timing."""
    tol = dict(rtol=2e-2, atol=2e-2)
    want = F.cross_entropy(x.float(), t64, reduction="none")
    torch.testing.assert_close(cross_entropy(x, t).float(), want, **tol)
    xr = x.float().requires_grad_()
    (dx,) = torch.autograd.grad(F.cross_entropy(xr, t64, reduction="none"), xr, g.float())
    torch.testing.assert_close(cross_entropy_backward(x, t, g).float(), dx, **tol)
    loss, dx_fused = cross_entropy_fused(x, t, float(g[0]))
    torch.testing.assert_close(loss.float(), want, **tol)
    torch.testing.assert_close(dx_fused.float(), dx, **tol)
    xr = x.detach().requires_grad_()          # the derived backward, smoothing and z-loss
    (got,) = torch.autograd.grad(cross_entropy_full(xr, t, SMOOTHING, Z_LOSS), xr, g)
    xf = x.float().requires_grad_()
    (want_full,) = torch.autograd.grad(torch_full(xf, t64), xf, g.float())
    torch.testing.assert_close(got.float(), want_full, **tol)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("mps", "cuda", "cpu"), default=None)
    ap.add_argument("--dtype", nargs="+", default=["f16", "bf16"], choices=list(DTYPES))
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--vocab", nargs="+", type=int, default=[32768, 131072])
    ap.add_argument("--repeat", type=int, default=30)
    add_compile_flag(ap)
    args = ap.parse_args(argv)
    device = pick_device(args.device)
    repeat = args.repeat if device != "cpu" else 1
    print(f"device {device}")
    print(f"{'dtype':>5} {'R x V':>12} {'what':>14} {'bytes':>11} {'ours us':>9} {'torch us':>9} "
          f"{'compile us':>10} {'copy us':>8} {'ours GB/s':>9} {'%copy':>6} {'vs eager':>9} "
          f"{'vs compile':>10} {'ours MiB':>8} {'torch MiB':>9} {'comp MiB':>8}")
    for dname in args.dtype:
        dtype = DTYPES[dname]
        for v in args.vocab:
            r = args.rows if device != "cpu" else 4
            v = v if device != "cpu" else min(v, 20000)
            x = torch.randn(r, v, device=device).mul_(4).to(dtype)
            t64 = torch.randint(0, v, (r,), device=device)
            t = t64.to(torch.int32)
            g = torch.full((r,), 1.0 / r, device=device, dtype=dtype)    # the mean's gradient
            check(x, t, t64, g)
            for what, case in cases(x, t, t64, g).items():
                try:
                    print(measure(f"{dname:>5} {f'{r}x{v}':>12} {what:>14}", case, device,
                                  repeat, args.compile), flush=True)
                except Exception as e:  # noqa: BLE001 - one failed row, not the table
                    print(f"{dname:>5} {f'{r}x{v}':>12} {what:>14}  failed: "
                          f"{type(e).__name__}: {str(e)[:160]}", flush=True)


def measure(label: str, case, device: str, repeat: int, compile_: bool) -> str:
    """One row of the table: ours, torch eager and torch.compile timed (`cases`)."""
    ours_fn, torch_fn, nbytes, grad_case = case
    ours = timeit(ours_fn, device, repeat)
    theirs = timeit(torch_fn, device, repeat)
    comp, comp_peak = compiled_row(torch_fn, grad_case, device, repeat, compile_)
    copy = copy_time(nbytes, device, repeat)
    return (f"{label} {nbytes:>11} {ours * 1e6:>9.1f} {theirs * 1e6:>9.1f} {us(comp, 10)} "
            f"{copy * 1e6:>8.1f} {nbytes / ours / 1e9:>9.0f} {100 * copy / ours:>5.0f}% "
            f"{ratio(theirs, ours, 9)} {ratio(comp, ours, 10)} "
            f"{mib(peak_bytes(ours_fn, device))} {mib(peak_bytes(torch_fn, device)):>9} "
            f"{mib(comp_peak)}")

if __name__ == "__main__":
    main()
