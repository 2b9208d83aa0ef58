"""A matrix-product block: a threadgroup's tile of C += A·B^T over K, staged from device memory
and multiplied on the target's matrix hardware, with fp32 accumulation.

    tile = choose(target, a_dtype, b_dtype, 64)      # geometry, operand type, lowering
    arrays(tile)                                     # the staged tiles (threadgroup memory)
    accumulators(tile, row0, col0)                   # the simdgroup's zeroed fp32 outputs
    loop over K in steps of tile.bk:
        stage(tile, "mf_as", tile.bm, ...)           # A's rows, guarded: 0 outside
                                                     # (stage_vectors: 16-byte loads)
        stage(tile, "mf_bs", tile.bn, ...)           # B's rows (C's columns)
        barrier; products(tile, row0, col0); barrier
    results(tile, emit)                              # emit(row, col, value) per element

The caller owns what the operands are (any per-element expression: a load, a dequantized
word, a scaled or cast value: `stage` takes it as a callback) and what happens to each result
(`emit`: an epilogue, a store, an online softmax). Lowerings, picked by the target
(`metalforge.target`) and the operand dtypes (`tile.choose`):

- `mpp` (module `mpp`): Metal 4 tensor ops, matmul2d over threadgroup tensors into a
  cooperative fp32 destination (half or bfloat operands, and float ones with
  relaxed_precision where a contraction's launch asks for TF32; targets with tensor_ops:
  apple10 and the cuda backend, whose shim runs matmul2d on tensor cores);
- `simdgroup_matrix` (module `simdgroup`): 8x8 fragments, half/bfloat/float operands staged as
  they are, float accumulators (Apple7 .. Apple9, and exact fp32 for f32 operands
  everywhere unless TF32 is asked for).

`tile` holds the geometry, the staged layout and the staging loops both share. The block reads
the thread inputs mf_t (thread in the threadgroup), mf_lane and mf_sg (its simdgroup); the
caller declares mf_t and the simdgroup's place (row0, col0 in the tile).

Other users: attention prefill's Q·K^T is this block with A = the query tile and B = the key
tile (both k-inner over E), its results fed to the online softmax through `emit` (P·V needs a
k-outer B: a `transpose_right=False` variant of the same staged layout); the tiled quantized
matmul stages its dequantized weight tile as B through `stage`'s callback (half operands instead
of today's fp32) and keeps its epilogue. `strided` multiplies operands already in threadgroup
memory at a row stride; `resident` keeps left operands in a simdgroup's registers as matmul2d's
left input cooperative tensors across a loop (the attention backward's wide kernels)."""
from __future__ import annotations

from ... import ir
from . import mpp, simdgroup
from .tile import (
    BK,
    MPP,
    SIMDGROUP,
    SLICE,
    Tile,
    Vector,
    arrays,
    choose,
    fetch_vectors,
    operand_type,
    put_vectors,
    stage,
    stage_vectors,
    staged,
    vectors,
)

__all__ = ["Tile", "choose", "operand_type", "arrays", "stage", "stage_vectors", "staged",
           "accumulators", "products", "results", "helpers", "MPP", "SIMDGROUP", "BK", "SLICE",
           "Vector", "fetch_vectors", "put_vectors", "vectors"]


def accumulators(t: Tile, row0: ir.Expr, col0: ir.Expr) -> list[ir.Stmt]:
    """The simdgroup's zeroed fp32 outputs (and, for mpp, its op and operand tensors at rows
    row0 of A's tile and col0 of B's)."""
    if t.lowering == MPP:
        return mpp.accumulators(t, row0, col0)
    return simdgroup.accumulators(t)


def products(t: Tile, row0: ir.Expr, col0: ir.Expr) -> list[ir.Stmt]:
    """The simdgroup's outputs += its rows of the staged A times its rows of the staged B,
    over the step's values of K (every lane of the simdgroup together)."""
    if t.lowering == MPP:
        return mpp.products(t)
    return simdgroup.products(t, row0, col0)


def results(t: Tile, emit: simdgroup.Emit) -> list[ir.Stmt]:
    """emit(row, col, value) for each output element the lane holds (row, col in the
    simdgroup's block; value fp32)."""
    if t.lowering == MPP:
        return mpp.results(t, emit)
    return simdgroup.results(t, emit)


def helpers(t: Tile) -> tuple[str, ...]:
    return mpp.HELPERS if t.lowering == MPP else simdgroup.HELPERS
