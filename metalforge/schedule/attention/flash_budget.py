"""The geometry of the FlashAttention-2 prefill kernel (`flash`): rows per threadgroup (16 a
simdgroup: launch={'prefill_rows': 64 or 128}), and the keys a staged tile holds for a given
E, from one budget of threadgroup memory shared by

    K tile, V tile   kt keys x (E rounded to 8, + 8) 2-byte values each (the decode kernels'
                     padded rows: stride in bytes an odd multiple of 16, no bank conflicts
                     in ldmatrix / simdgroup loads)
    q rows           rows x the same row stride (the left operand of S = Q K^T, staged once)
    per simdgroup    16 x kt fp32 scores (P, as the operand type, written over them) and
                     its rows' factors, maxima and sums (3 x 16 floats); the score rows
                     padded by SCORE_PAD floats where that still fits (`score_pad`: P's
                     rows then 16 x an odd number of bytes apart, no bank conflicts where
                     the P x V products load them)

kt: the largest power of two up to FLASH_TILE_KEYS that fits FLASH_BYTES, at least 16 (one
16 x 16 block of keys); 0 where none fits (128 rows at E > 64: the host refuses the call).
Pure functions of sizes: the host (`schedule.py`) and the kernel builder both read them."""
from __future__ import annotations

FLASH_BYTES = 32768                 # Metal's threadgroup memory (and the cuda shim's static)
FLASH_TILE_KEYS = 32                # most keys a tile (the softmax's 16 registers a lane)
FLASH_ROWS = (64, 128)              # prefill_rows values this kernel takes (32: `mma`)
ROW_BLOCK = 16                      # query rows a simdgroup
STATS = 3 * ROW_BLOCK               # floats a simdgroup keeps per tile: factor, max, sum
PAD = 8                             # values after each staged row (16 bytes)
SCORE_PAD = 4                       # floats after each score row, where they fit


def row_values(e: int) -> int:
    """A staged row's stride in values: E rounded up to 8 (16-byte chunks) plus PAD."""
    return -(-e // 8) * 8 + PAD


def slice_floats(kt: int, pad: int = 0) -> int:
    """One simdgroup's slice: its scores (16 rows of kt + pad fp32) and its rows' stats."""
    return ROW_BLOCK * (kt + pad) + STATS


def layout_bytes(e: int, rows: int, kt: int, pad: int = 0) -> int:
    """Threadgroup bytes of the layout above (score rows padded by `pad` floats)."""
    sgs = rows // ROW_BLOCK
    return (2 * kt + rows) * row_values(e) * 2 + sgs * slice_floats(kt, pad) * 4


def score_pad(e: int, rows: int, kt: int) -> int:
    """SCORE_PAD where the padded layout fits FLASH_BYTES, else 0 (the kernel computes the
    same: `flash._layout`)."""
    return SCORE_PAD if layout_bytes(e, rows, kt, SCORE_PAD) <= FLASH_BYTES else 0


def keys_per_tile(e: int, rows: int) -> int:
    """Keys a tile holds at E = e with `rows` query rows a threadgroup (0: none fits)."""
    kt = FLASH_TILE_KEYS
    while kt >= ROW_BLOCK and layout_bytes(e, rows, kt) > FLASH_BYTES:
        kt //= 2
    return kt if kt >= ROW_BLOCK else 0


def max_e(rows: int, emax: int) -> int:
    """The largest E (up to emax) at which a tile fits."""
    return max((e for e in range(1, emax + 1) if keys_per_tile(e, rows)), default=0)


def most_bytes(rows: int, emax: int) -> int:
    """The layout's largest size over E up to emax (where it fits): the array's size."""
    return max((layout_bytes(e, rows, kt, score_pad(e, rows, kt)) for e in range(1, emax + 1)
                for kt in (keys_per_tile(e, rows),) if kt), default=0)
