"""Contractions the matmul tests and the per-target goldens share."""
import metalforge as mf


@mf.kernel
def matmul(a: "T[M, K]", b: "T[N, K]") -> "T[M, N]":
    return mf.sum(a * b, axis="K")


@mf.kernel
def linear_gelu(x: "T[*B, M, K]", w: "f32[N, K]", bias: "T[N]") -> "T[*B, M, N]":
    """A batched linear layer on fp32 master weights cast to T (a prologue: the operands stay
    half or bfloat), with bias and exact GELU (the epilogue)."""
    h = mf.sum(x * w.to("T"), axis="K") + bias
    return 0.5 * h * (1 + mf.erf(h * 0.7071067811865476))


@mf.kernel
def scaled(x: "T[M, K]", w: "T[N, K]", scale: float) -> "T[M, N]":
    """A computed prologue: x * scale is an fp32 value (as the reference computes it)."""
    return mf.sum((x * scale) * w, axis="K")


@mf.kernel
def q4_linear(wq: "u32[N, K/8]", scales: "T[N, K/GS]", biases: "T[N, K/GS]",  # noqa: F821
              x: "T[M, K]", bias: "T[N]", GS: mf.Const[int] = 64) -> "T[M, N]":  # noqa: F821
    """The tiled quantized matmul (schedule/quant/blocked.py: the weight tile dequantized and
    rounded to T as the matrix block's B) with a bias in the epilogue."""
    return mf.sum((mf.unpack(wq, bits=4) * scales + biases) * x, axis="K") + bias
