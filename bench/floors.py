"""Floors: the generated kernels timed with part of their work taken out (CUDA only).

    python bench/floors.py [--parts decode qmv short rows elementwise columns prefill backward]
                           [--repeat 30] [--no-compile]
    python bench/floors.py --check [--parts rows elementwise columns prefill backward]   # no GPU

Each target still open in bench/README.md ("Floors") is set against the same kernel with some
of its work removed by a text edit of the generated Metal source before the cuda backend
compiles it: what the rest of the kernel costs. Where the edited kernel is faster, no change
to the removed part can beat it; where it is slower, the compiler scheduled the rest
differently and it bounds nothing.

- decode: examples/attention.py at the bench's decode shape (B=1, 32/8 heads, E=128, f16, L in
  {4096, 16384, 65536}) as generated, without the scores' dot products, without the values'
  accumulation, without both, and without both and every barrier of the tile loop; SDPA.
- qmv: examples/q4_matvec.py (M = 1, f16, the bench's four shapes) as generated, and with its
  unpacking and FMAs replaced by one xor of each row's words (loads, x and the sums kept);
  copy_ of the same bytes and F.linear.
- short: rows of 128 (8192 of them, f32 and f16): metalforge's own copy (x + 0), silu and
  log_softmax against torch's copy_, silu and log_softmax.
- rows: examples' softmax, log_softmax, layer_norm, rms_norm and bench/reductions.py's
  softmax_t (softmax(x / t)) at 64x65536 and 2048x16384, f16 and f32: as generated, "no
  math" (each per-element value the plain sum of what it reads; reductions kept as
  generated) and "no math, folds as adds" (each fold into an accumulator one add: reductions
  removed down to what keeps every load alive).
- elementwise: silu at 8192x8192, f16 / bf16 / f32: as generated and "identity" (silu's math
  replaced by its input; loads and stores kept).
- columns: column_sum and column_max at 4096x128 and 4096x4096, f16 / f32: as generated,
  "folds as adds" (compensated sums and NaN-keeping max as one add) and "one row per chunk"
  (every chunk of the reduced axis reads its first row only: the launches' fixed cost).
  The rows, elementwise and columns tables: ours (the variant the shape launches), torch
  eager, torch.compile (timed in the "as generated" process, compiled once per case; '-' with
  --no-compile), copy_ of the schedule's bytes, %copy and torch / ours. The edits are in
  bench/floors_bw.py; `--check` applies them to the source the cuda backend would compile at
  each shape (its launch table), without a GPU.
- prefill: the matrix prefill kernel (f16, causal, 32 heads, S:E 1024:64 and 4096:128) without
  its Q·Kᵀ products, its P·V products, its K/V loads, its score mask or its softmax exp, and
  with the products alone; SDPA (bench/floors_prefill.py).
- backward: the attention backward's wide kernels (f16, causal, 16 heads, E = 128, S = L 1024
  and 4096) without their S / dP products, without their gradient products, or with plain
  P / dS (bench/floors_backward.py).

Each edit runs in a process of its own (compiled libraries and call plans are cached per
process). Edited kernels compute wrong values: they are timed, never checked.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "examples"))

import floors_backward  # noqa: E402
import floors_bw  # noqa: E402
import floors_prefill  # noqa: E402
from common import add_compile_flag, copy_time, plan, timeit  # noqa: E402

# the generated text each edit looks for (an edit whose text is gone stops with its name)
SCORES = "if (mf_key < mf_tn) {\n            if (mf_vec_ok) {"
VALUES = "for (uint mf_u = mf_u0; mf_u < mf_u1; ++mf_u) {"
TILE_LOOP, AFTER_LOOP = "for (mf_index_t mf_tk = mf_l0;", "// row by row"
BARRIER = "threadgroup_barrier(mem_flags::mem_threadgroup);"
UNPACK = "            // each row: unpack its words from registers, add to its sum\n"
ROW_TOTAL = ("            for (uint mf_r = 0u; mf_r < 4u; ++mf_r) {\n"
             "                mf_acc[mf_r] = fma(mf_row_scale")
XOR_ROWS = ("            float mf_qx[16];\n"
            "            for (uint mf_p = 0u; mf_p < 16u; ++mf_p) { mf_qx[mf_p] = 0.0f; }\n"
            "            for (uint mf_r = 0u; mf_r < 4u; ++mf_r) { mf_qx[mf_r * 4u] = float("
            "mf_wq_w[mf_r][0] ^ mf_wq_w[mf_r][1] ^ mf_wq_w[mf_r][2] ^ mf_wq_w[mf_r][3]) * "
            "mf_xe[mf_r]; }\n")


def _need(src: str, text: str, what: str) -> None:
    if text not in src:
        sys.exit(f"bench/floors.py: the generated text of {what} changed ({text[:40]!r}...); "
                 "update the edit")


def no_scores(src: str) -> str:
    if "mf_attention_decode(" not in src:
        return src
    _need(src, SCORES, "the decode kernel's scores")
    return src.replace(SCORES, SCORES.replace("mf_key < mf_tn", "false"))


def no_values(src: str) -> str:
    if "mf_attention_decode(" not in src:
        return src
    _need(src, VALUES, "the decode kernel's values")
    return src.replace(VALUES, VALUES.replace("mf_u < mf_u1", "false"))


def no_barriers(src: str) -> str:
    """The decode kernel's tile loop without a barrier."""
    i = src.find("kernel void mf_attention_decode(")
    if i < 0:
        return src
    _need(src[i:], TILE_LOOP, "the decode kernel's tile loop")
    j = src.find(TILE_LOOP, i)
    _need(src[j:], AFTER_LOOP, "the decode kernel's end")
    e = src.find(AFTER_LOOP, j)
    return src[:j] + src[j:e].replace(BARRIER, "") + src[e:]


def no_unpack(src: str) -> str:
    if "mf_q4_matvec_qmv(" not in src:
        return src
    _need(src, UNPACK, "the qmv kernel's unpacking")
    i = src.find(UNPACK, src.find("kernel void mf_q4_matvec_qmv("))
    _need(src[i:], ROW_TOTAL, "the qmv kernel's row totals")
    j = src.find(ROW_TOTAL, i)
    return src[:i] + XOR_ROWS + src[j:]


EDITS = {"as generated": [], "no scores": [no_scores], "no values": [no_values],
         "no scores, no values": [no_scores, no_values],
         "no scores, no values, no barriers": [no_scores, no_values, no_barriers],
         "no unpacking": [no_unpack], **floors_bw.EDITS, **floors_prefill.EDITS,
         **floors_backward.EDITS}
PARTS = {"decode": ["as generated", "no scores", "no values", "no scores, no values",
                    "no scores, no values, no barriers"],
         "qmv": ["as generated", "no unpacking"], "short": ["as generated"],
         **floors_bw.PARTS, "prefill": floors_prefill.MODES, "backward": floors_backward.MODES}


def install(mode: str) -> None:
    """Route the cuda backend's compiles through this mode's edits."""
    from metalforge.runtime import backends
    compile_shader = backends.cuda_compile_shader

    def edited(source: str, **options):
        for edit in EDITS[mode]:
            source = edit(source)
        return compile_shader(source, **options)
    backends.cuda_compile_shader = edited


def decode(mode: str, repeat: int) -> None:
    from attention import attention
    for length in (4096, 16384, 65536):
        q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.float16)
        k = torch.randn(1, 8, length, 128, device="cuda", dtype=torch.float16)
        v = torch.randn_like(k)
        ours = timeit(lambda: attention(q, k, v, 128 ** -0.5), "cuda", repeat)
        sdpa = timeit(lambda: F.scaled_dot_product_attention(q, k, v, scale=128 ** -0.5,
                                                             enable_gqa=True), "cuda", repeat)
        print(f"{mode:<34} {length:>6} {ours * 1e6:>8.1f} {sdpa * 1e6:>8.1f} "
              f"{sdpa / ours:>8.2f}x", flush=True)


def qmv(mode: str, repeat: int) -> None:
    from q4_matvec import q4_matvec

    from metalforge import quant
    for spec in ("4096x4096", "11008x4096", "4096x11008", "14336x4096"):
        n, k = (int(v) for v in spec.split("x"))
        w = torch.randn(n, k, device="cuda", dtype=torch.float16)
        x = torch.randn(1, k, device="cuda", dtype=torch.float16)
        wq, s, b = quant.quantize(w, group_size=64, bits=4)
        sched, sizes = plan(q4_matvec, (wq, s, b, x))
        nbytes = sched.traffic(sizes).total
        ours = timeit(lambda: q4_matvec(wq, s, b, x), "cuda", repeat)
        copy = copy_time(nbytes, "cuda", repeat)
        linear = timeit(lambda: F.linear(x, w), "cuda", repeat)
        print(f"{mode:<34} {spec:>11} {ours * 1e6:>8.1f} {copy * 1e6:>8.1f} "
              f"{100 * copy / ours:>5.0f}% {linear / ours:>8.2f}x", flush=True)


def short(mode: str, repeat: int) -> None:
    from log_softmax import log_softmax
    from silu import silu

    import metalforge as mf

    @mf.kernel
    def plus_zero(x: "T[B, D]"):  # noqa: F821
        return x + 0.0

    for dtype in (torch.float32, torch.float16):
        x = torch.randn(8192, 128, device="cuda", dtype=dtype)
        dst = torch.empty_like(x)
        pairs = (("copy", lambda: plus_zero(x), lambda: dst.copy_(x)),
                 ("silu", lambda: silu(x), lambda: F.silu(x)),
                 ("log_softmax", lambda: log_softmax(x), lambda: torch.log_softmax(x, -1)))
        for name, ours, theirs in pairs:
            a, t = timeit(ours, "cuda", repeat), timeit(theirs, "cuda", repeat)
            print(f"{str(dtype)[6:]:<8} {name:<12} {a * 1e6:>8.2f} {t * 1e6:>8.2f} "
                  f"{t / a:>8.2f}x", flush=True)


HEADERS = {"decode": f"{'decode kernel':<34} {'L':>6} {'ours us':>8} {'sdpa us':>8} "
                     f"{'sdpa/ours':>9}",
           "qmv": f"{'qmv kernel':<34} {'N x K':>11} {'ours us':>8} {'copy us':>8} "
                  f"{'%copy':>6} {'linear/ours':>9}",
           "short": f"{'dtype':<8} {'op':<12} {'ours us':>8} {'torch us':>8} {'torch/ours':>9}",
           **{part: floors_bw.HEADER for part in floors_bw.PARTS},
           "prefill": floors_prefill.HEADER, "backward": floors_backward.HEADER}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", nargs="+", default=list(PARTS), choices=list(PARTS))
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--check", action="store_true",
                    help="no GPU: apply the parts' edits to the source the cuda backend would "
                         "compile (rows, elementwise, columns, prefill, backward) and stop")
    add_compile_flag(ap)
    ap.add_argument("--one", nargs=2, metavar=("PART", "MODE"), help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.check:
        for part in args.parts:
            if part in floors_bw.PARTS:
                print("\n".join(floors_bw.check(part)), flush=True)
            elif part == "prefill":
                print("\n".join(floors_prefill.check()), flush=True)
            elif part == "backward":
                print("\n".join(floors_backward.check()), flush=True)
        return
    if not torch.cuda.is_available():
        sys.exit("bench/floors.py edits what the cuda backend compiles: it needs a CUDA GPU")
    if args.one:
        part, mode = args.one
        install(mode)
        if part in floors_bw.PARTS:
            floors_bw.run(part, mode, args.repeat, args.compile, args.store)
            return
        {"decode": decode, "qmv": qmv, "short": short,
         "prefill": floors_prefill.run, "backward": floors_backward.run}[part](mode,
                                                                             args.repeat)
        return
    print(f"device {torch.cuda.get_device_name()}, CUDA graph replays, median of "
          f"{args.repeat}")
    with tempfile.TemporaryDirectory() as tmp:
        for part in args.parts:
            print(HEADERS[part], flush=True)
            store = str(Path(tmp) / f"{part}.json")   # torch.compile's times, for edited rows
            for mode in PARTS[part]:
                subprocess.run([sys.executable, __file__, "--one", part, mode,
                                "--repeat", str(args.repeat), "--store", store]
                               + ([] if args.compile else ["--no-compile"]), check=True)


if __name__ == "__main__":
    main()
