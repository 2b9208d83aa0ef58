"""Contractions the matmul tests and the per-target goldens share."""
import metalforge as mf


@mf.kernel
def matmul(a: "T[M, K]", b: "T[N, K]") -> "T[M, N]":
    return mf.sum(a * b, axis="K")


@mf.kernel
def linear_gelu(x: "T[*B, M, K]", w: "T[N, K]", bias: "T[N]", scale: float = 1.0
                ) -> "T[*B, M, N]":
    """A batched linear layer with a scaled input (prologue), bias and exact GELU (epilogue)."""
    h = mf.sum((x * scale) * w, axis="K") + bias
    return 0.5 * h * (1 + mf.erf(h * 0.7071067811865476))
