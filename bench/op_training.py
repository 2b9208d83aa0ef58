"""A training step (forward + backward) through `kernel.as_op(...)`: the operator called eagerly
on plain tensors ("op": the kernel's direct differentiable call, `torch_ops.plain_eager`), the
same call through the registered operators ("dispatch": `op.dispatched`, the forward that saves
for its backward, `metalforge.op_saving`, as torch.compile runs it and as "op" ran before #53),
the operator as it was (`torch.ops.<ns>.<name>` called directly: it saves its inputs only, so
attention's backward runs the forward again, and cross-entropy's recomputes its rows'
logsumexp), the kernel called directly (`runtime.autograd`: the same saving), the operator under
torch.compile, and torch.

    python bench/op_training.py --device cuda --repeat 30
    python bench/op_training.py --device cuda --lengths 1024 4096 --vocab 131072
    python bench/op_training.py --device cuda --repeat 30 --index-check checked

"dispatch" minus "op" is the host time of the custom ops' dispatcher layers (two custom ops a
step, each through torch's autograd and dispatch wrappers); it shows in the step's time where
the host waits for the GPU within the step: cross-entropy's gather (`mf.take` of the target)
is index-checked, and a checked call reads its 16-byte report after the kernel (a device-to-host
copy: the host waits), in the forward and the backward, so none of the step's host work overlaps
the GPU's. A second cross-entropy row ("deferred"; `--index-check` picks the rows) launches its
kernels with `index_check="deferred"` (the report read at `mf.check_deferred()`, after the
row's timing): the host work then overlaps the GPU's, as attention's does (no gather).

Attention: examples/attention.py, f16, B = 1, 16 heads, E = 128, S = L in {1024, 4096},
causal, against SDPA's forward + backward. Cross-entropy: bench/cross_entropy.py's loss kernel,
R = 4096 rows, V = 131072 (rows longer than a threadgroup holds: the forward writes each row's
logsumexp, 4 bytes), against F.cross_entropy. The time is that of `out = f(*leaves);
torch.autograd.grad(out, leaves, dy)`; "plain/op" is the old operator's time over the eager
operator's (> 1: the new one is faster; attention's should be near (fwd + bwd) / bwd, one
forward saved).
On CUDA, CUDA-event times of --repeat steps after warm-up (attention_backward._time); on the
simulator (--device cpu) a smoke test at small sizes.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import metalforge as mf

sys.path.insert(0, str(Path(__file__).resolve().parent))

from attention_backward import _time  # noqa: E402
from common import DTYPES, attention_parser, example, pick_device  # noqa: E402
from cross_entropy import cross_entropy  # noqa: E402

attention = example("attention").attention
ATTENTION = attention.as_op("bench::op_training_attention")
XENT = cross_entropy.as_op("bench::op_training_xent")
_DEFERRED = cross_entropy.with_launch(index_check="deferred")
XENT_DEFERRED = (_DEFERRED, _DEFERRED.as_op("bench::op_training_xent_deferred"))
SIDES = ("op", "dispatch", "plain", "direct", "compiled", "torch")


def _step(fn, inputs, dy):
    """One training step of fn over fresh leaves of `inputs` (the gradients of the floats)."""
    leaves = [x.detach().clone().requires_grad_(x.dtype.is_floating_point) for x in inputs]
    floats = [x for x in leaves if x.requires_grad]
    return lambda: torch.autograd.grad(fn(*leaves), floats, dy)


def _row(label: str, sides: dict, inputs, dy, device: str, repeat: int) -> None:
    want = _step(sides["torch"], inputs, dy)()
    times, err = {}, 0.0
    for name, fn in sides.items():
        if fn is None:
            continue
        step = _step(fn, inputs, dy)
        got = step()
        err = max([err] + [float((a.float() - b.float()).abs().max()
                                 / b.float().abs().max().clamp_min(1e-6))
                           for a, b in zip(got, want)])
        times[name] = _time(step, device, repeat)
    cols = " ".join(f"{times[n] * 1e3:>11.3f}" if n in times else f"{'-':>11}" for n in SIDES)
    print(f"{label:>30} {cols} {times['plain'] / times['op']:>10.3f}x {err:>8.1e}", flush=True)


def attention_case(device: str, dtype, length: int, heads: int, e: int, repeat: int,
                   compiled: bool) -> None:
    q, k, v, dy = (torch.randn(1, heads, length, e, dtype=dtype, device=device)
                   for _ in range(4))
    scale = e ** -0.5
    sides = {
        "op": lambda a, b, c: ATTENTION(a, b, c, scale),
        "dispatch": lambda a, b, c: ATTENTION.dispatched(a, b, c, scale),
        "plain": lambda a, b, c: ATTENTION.op(a, b, c, scale, True),   # the operator as it was
        "direct": lambda a, b, c: attention(a, b, c, scale),
        "compiled": torch.compile(lambda a, b, c: ATTENTION(a, b, c, scale), fullgraph=True)
        if compiled else None,
        "torch": lambda a, b, c: F.scaled_dot_product_attention(a, b, c, scale=scale,
                                                                is_causal=True)}
    _row(f"attention S=L={length}", sides, (q, k, v), dy, device, repeat)


def xent_case(device: str, dtype, rows: int, vocab: int, repeat: int, compiled: bool,
              index_check: str = "checked") -> None:
    x = torch.randn(rows, vocab, device=device).to(dtype)
    t = torch.randint(0, vocab, (rows,), device=device, dtype=torch.int32)
    dy = torch.randn(rows, device=device).to(dtype)
    kernel, op = (cross_entropy, XENT) if index_check == "checked" else XENT_DEFERRED
    sides = {
        "op": op, "dispatch": op.dispatched, "plain": op.op, "direct": kernel,
        "compiled": torch.compile(op, fullgraph=True) if compiled else None,
        "torch": lambda a, b: F.cross_entropy(a, b.long(), reduction="none")}
    label = f"xent R={rows} V={vocab}" + ("" if index_check == "checked" else " deferred")
    _row(label, sides, (x, t), dy, device, repeat)
    mf.check_deferred()                 # a deferred report is read here: an index error raises


def main(argv=None) -> None:
    ap = attention_parser(__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--vocab", nargs="+", type=int, default=[131072])
    ap.add_argument("--index-check", nargs="+", choices=("checked", "deferred"),
                    default=["checked", "deferred"],
                    help="cross-entropy's gather check, a row each (deferred: no host wait)")
    args = ap.parse_args(argv)
    device = pick_device(args.device)
    heads, e, lengths, rows, vocab, repeat = (args.heads, args.e, args.lengths, args.rows,
                                              args.vocab, args.repeat)
    if device == "cpu":                         # the simulator: a smoke test
        heads, e, lengths, rows, vocab, repeat = 2, 32, [48], 4, [17000], 1
    compiled = args.compile and device != "cpu"
    print(f"training step through as_op on {device}, {args.dtype}: ms per forward + backward")
    print(f"{'case':>30} " + " ".join(f"{n + ' ms':>11}" for n in SIDES)
          + f" {'plain/op':>11} {'rel err':>8}")
    for length in lengths:
        attention_case(device, DTYPES[args.dtype], length, heads, e, repeat, compiled)
    for v in vocab:
        for check in args.index_check:
            xent_case(device, DTYPES[args.dtype], rows, v, repeat, compiled, check)


if __name__ == "__main__":
    main()
