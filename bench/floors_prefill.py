"""bench/floors.py's prefill part: the matrix prefill kernel (examples/attention.py on the cuda
target, f16, causal, 32 heads, S = L) timed with one phase of its tile loop taken out by a
text edit of the generated source (each edit touches `mf_attention_prefill` only):

- no Q·Kᵀ products: the scores' matmul2d runs dropped (the scores stay 0);
- no P·V products: the values' matmul2d runs dropped;
- no K/V loads: the tile copies from device memory dropped, the full tiles' batched loads
  too (the staged tiles keep what they hold, or a full tile's registers' stale values; the
  zero fill past the copied keys stays);
- no score mask: each score stored as its dot product (the mask and scale computed for
  nothing, so the compiler drops them);
- no softmax exp: the weights and the rescale factor without their exp;
- products only: no K/V loads, no score mask and no softmax exp;
- fast exp: the rescale factors' exp as `fast::exp` too (the weights' is already; a change,
  not a floor: what the exp's accuracy costs).

What is left when a phase is out bounds what any change to that phase can gain; "products
only" is the loop's glue plus its products: the barriers, the row maxima's shuffles, the
weights' conversion to operands, the accumulators rescaled element by element.
"""
from __future__ import annotations

import re
import sys

import torch
import torch.nn.functional as F

KERNELS = ("kernel void mf_attention_prefill(", "kernel void mf_attention_prefill_narrow(")
QK_RUN = re.compile(r"^\s*mf_s_op\.run\(.*\);\n", re.M)
PV_RUN = re.compile(r"^\s*mf_p_op\.run\(.*\);\n", re.M)
KV_COPY = re.compile(r"^\s*\*reinterpret_cast<threadgroup mf_pack8<T>\*>\(mf_kv[01] .*"
                     r"\(([kv]) \+ .*\);\n", re.M)
KV_BATCHED = re.compile(r"^\s*mf_kv[01]_cp\[\du\] = \*reinterpret_cast<device const "
                        r"mf_pack8<T>\*>\(mf_kv[01]_src \+ .*\);\n", re.M)
SCORE_STORE = "mf_s_tile[mf_c] = mf_sv;"
WEIGHT_EXP = "fast::exp2((mf_s_tile[mf_c] - "
FACTOR_EXPS = ("precise::exp(mf_m0 - mf_t0)", "precise::exp(mf_m1 - mf_t1)")
CASES = ((1024, 64), (4096, 128))


def _stop(what: str) -> None:
    raise SystemExit(f"bench/floors.py: edit '{what}': the prefill kernel's text changed; "
                     "update the edit (bench/floors_prefill.py)")


def _in_kernel(src: str, what: str, edit) -> str:
    """`edit` applied to the prefill kernels' text only (each from its signature to the next
    kernel's instantiation: the main kernel and its narrow twin, which E = 64 runs); stops
    where the edit changes nothing in one of them."""
    for kernel in KERNELS:
        i = src.find(kernel)
        if i < 0:
            continue
        j = src.find("template [[host_name(", i)
        body = edit(src[i:j])
        if body == src[i:j]:
            _stop(what)
        src = src[:i] + body + src[j:]
    return src


def no_qk(src: str) -> str:
    return _in_kernel(src, "no Q·Kᵀ products", lambda s: QK_RUN.sub("", s))


def no_pv(src: str) -> str:
    return _in_kernel(src, "no P·V products", lambda s: PV_RUN.sub("", s))


def no_kv(src: str) -> str:
    return _in_kernel(src, "no K/V loads", lambda s: KV_BATCHED.sub("", KV_COPY.sub("", s)))


def no_mask(src: str) -> str:
    return _in_kernel(src, "no score mask",
                      lambda s: s.replace(SCORE_STORE, SCORE_STORE.replace("mf_sv", "mf_dot")))


def no_exp(src: str) -> str:
    def edit(s: str) -> str:
        s = s.replace(WEIGHT_EXP, WEIGHT_EXP[len("fast::exp2"):])
        for factor in FACTOR_EXPS:
            s = s.replace(factor, "1.0f")
        return s
    return _in_kernel(src, "no softmax exp", edit)


def fast_exp(src: str) -> str:
    return _in_kernel(src, "fast exp", lambda s: s.replace("precise::exp(", "fast::exp("))


EDITS = {"no Q·Kᵀ products": [no_qk], "no P·V products": [no_pv], "no K/V loads": [no_kv],
         "no score mask": [no_mask], "no softmax exp": [no_exp],
         "products only": [no_kv, no_mask, no_exp], "fast exp": [fast_exp]}
MODES = ["as generated", *EDITS]
HEADER = f"{'prefill kernel':<34} {'S:E':>9} {'ours us':>9} {'sdpa us':>9} {'sdpa/ours':>9}"


def cases(device: str):
    """(S, E, q, k, v) of each case (meta tensors on "meta")."""
    heads = 32
    for length, e in CASES:
        yield length, e, *(torch.randn(1, heads, length, e, dtype=torch.float16, device=device)
                           for _ in range(3))


def source(device: str = "meta") -> list[str]:
    """The library the cuda backend compiles at each case (no GPU on "meta")."""
    import floors_bw
    from attention import attention
    kernel = attention.with_launch(target="cuda")
    return [floors_bw.cuda_source(kernel, (q, k, v, e ** -0.5))
            for _, e, q, k, v in cases(device)]


def check() -> list[str]:
    """Every edit applied to each case's source (no GPU): one line per case and edit."""
    lines = []
    for (length, e, *_), src in zip(cases("meta"), source()):
        for mode, edits in EDITS.items():
            out = src
            for edit in edits:
                out = edit(out)
            lines.append(f"prefill     {length}:{e:<5} {mode:<24} {len(src) - len(out):>6} "
                         "characters edited")
    return lines


def run(mode: str, repeat: int) -> None:
    """Time each case with this mode's edits installed (floors.install): ours and SDPA."""
    from attention import attention
    from common import timeit
    kernel = attention.with_launch(target="cuda")
    for length, e, q, k, v in cases("cuda"):
        ours = timeit(lambda: kernel(q, k, v, e ** -0.5), "cuda", repeat)
        sdpa = timeit(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                             scale=e ** -0.5), "cuda", repeat)
        print(f"{mode:<34} {f'{length}:{e}':>9} {ours * 1e6:>9.1f} {sdpa * 1e6:>9.1f} "
              f"{sdpa / ours:>8.3f}x", flush=True)


if __name__ == "__main__":
    sys.exit("run through bench/floors.py --parts prefill")
