"""How the names a user chose are spelled in the generated Metal: the one place that decides it.

Any Python identifier may name a parameter, a dtype variable or an axis, but the generated text
is C++: a name that is a C++ or Metal keyword (`default`, `register`, `device`, `kernel`), a type
or function the generated code uses unqualified (`half`, `vec`, `min`, `simd_sum`), a macro of
the headers (`NAN`), or an `mf_` identifier (metalforge's own) would not compile, or would
silently mean something else. Such names get a prefix no ordinary name has; every other name is
spelled as written, so the generated code stays readable.

- `param_name`: a tensor or scalar parameter (`default` → `mf_p_default`)
- `type_name`: a dtype variable, a template parameter (`vec` → `mf_type_vec`)
- `value_name`: the value a kernel loads from a tensor (`x` → `mf_x`; `v1`, `out`, `start`,
  `size_D`, ... would be metalforge's own variables: `mf_in_v1`)
- `tensor_var`: a variable of a tensor's (`mf_x_v`, its loaded vector)
- `kernel_name`: a kernel template (`mf_silu`; `mf_kernel_erf`, not the helper `mf_erf`)
- `index_name`: the position along an axis (`mf_index_L`; for `t`, which would be the index
  type, `mf_index_ax_t`)
"""
from __future__ import annotations

import re
from typing import Iterable, Mapping, TypeVar

V = TypeVar("V")

IDX = "mf_index_t"               # the index type: a template parameter, uint or ulong

_CXX_KEYWORDS = """
alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t
char32_t class compl concept const consteval constexpr constinit const_cast continue co_await
co_return co_yield decltype default delete do double dynamic_cast else enum explicit export extern
false final float for friend goto if import inline int long module mutable namespace new noexcept
not not_eq nullptr operator or or_eq override private protected public register
reinterpret_cast requires restrict return short signed sizeof static static_assert static_cast
struct switch template this thread_local throw true try typedef typeid typename typeof union
unsigned using virtual void volatile wchar_t while xor xor_eq main
""".split()

_METAL_WORDS = """
device constant thread threadgroup threadgroup_imageblock ray_data object_data kernel vertex
fragment visible intersection mesh object stitchable half bfloat uint ushort uchar ulong size_t
ptrdiff_t vec array atomic metal std precise fast simd mem_flags memory_order thread_scope sampler
texture1d texture2d texture3d texturecube texture_buffer depth2d packed_vec as_type
numeric_limits simdgroup_matrix simdgroup_float8x8 simdgroup_half8x8 simdgroup_bfloat8x8
abs fabs min max fmin fmax floor ceil round trunc rint exp exp2 exp10 log log2 log10 sqrt rsqrt
sin cos tan tanh sinh cosh asin acos atan atan2 erf pow powr fmod copysign clamp saturate
select isnan isinf isfinite signbit sign mix step fma mad dot cross length normalize all any
threadgroup_barrier simdgroup_barrier simdgroup_load simdgroup_store
simdgroup_multiply_accumulate NAN INFINITY HUGE_VALF MAXFLOAT FLT_MAX FLT_MIN M_PI_F
"""
# Metal 4 tensor operations (the contraction kernel at tensor-op targets)
_METAL_WORDS += """
mpp tensor_ops tensor tensor_inline tensor_handle tensor_offset dextents extents int32_t
matmul2d matmul2d_descriptor execution_simdgroup execution_simdgroups
make_filled_simdgroup_matrix ulong2
"""

_SCALARS = ("bool", "char", "uchar", "short", "ushort", "int", "uint", "long", "ulong", "half",
            "float", "bfloat")
_VECTORS = [f"{p}{s}{n}" for p in ("", "packed_") for s in _SCALARS for n in (2, 3, 4)]
_MATRICES = [f"{s}{r}x{c}" for s in ("half", "float", "bfloat")
             for r in (2, 3, 4) for c in (2, 3, 4)]
_ATOMICS = [f"atomic_{s}" for s in ("int", "uint", "bool", "float", "ulong")]

# names the generated code cannot use as they are
RESERVED = frozenset(_CXX_KEYWORDS + _METAL_WORDS.split() + _VECTORS + _MATRICES + _ATOMICS + [IDX])
# Metal's families of functions and types (simd_sum, simd_shuffle_xor, atomic_fetch_add, ...),
# metalforge's own identifiers, and those C++ reserves
_RESERVED_PREFIXES = ("simd_", "simdgroup_", "quad_", "threadgroup_", "atomic_", "mf_", "_")

# what metalforge's own variables look like after `mf_`: a tensor whose name looks like one
# loads into `mf_in_<name>` instead of `mf_<name>`
_SCHEDULE_NAMES = frozenset({"c", "d", "e", "i", "j", "k", "l", "m", "n", "r", "t", "v", "sg",
                             "qx", "xe", "tid", "lane", "row", "base", "group", "lid", "tpg",
                             "nsg", "score", "corr", "acc", "task", "outer", "blocks", "out",
                             "start", "numel", "err", "scratch", "splits", "index_t",
                             # every other mf_<name> a schedule declares (or a helper's name):
                             # a tensor named so gets mf_in_<name> (tests/dsl/test_reserved_names)
                             "a", "ae", "at", "atomic_add", "av", "block", "bm", "bn", "cc",
                             "chunk", "chunk_rows", "chunks", "col", "count", "dc", "do",
                             "mn", "pw", "qv", "s_op", "s_tile", "p_tile",
                             "divide", "dr", "dst", "dv", "erf", "first", "floordiv", "fremainder",
                             "grp", "half", "hi", "ipow", "k_end", "k_first", "kb", "key",
                             "keys", "kf", "khi", "kk", "klo", "kn", "kp", "kq", "ks", "kt",
                             "lane8", "last", "lend", "live", "lo", "logaddexp",
                             "lower_bound", "m_new", "m_tiles", "macc", "mat_load",
                             "maximum", "mblocks", "mc", "md", "minimum", "mm", "mma", "mo",
                             "mr", "ms", "mv", "mx", "n_tiles", "nkeys", "nlive", "o", "of",
                             "off", "online_add", "online_add_chunk", "online_merge",
                             "order", "own", "p", "pack8_of", "part", "partial", "parts",
                             "per", "pk", "place_weight", "pos", "pow", "ps", "q", "qf",
                             "qi", "qrow", "racc", "red", "remainder", "rhi", "rlo",
                             "run_ok", "s", "same_slot", "sc", "sdot", "seg", "segs", "sf",
                             "share", "slice", "split", "src", "srow", "step", "stride",
                             "sub", "sum", "sum_add", "tile", "tiles", "tk", "tm", "tmax",
                             "tn", "u", "vec", "vec_ok", "vf", "w", "wlog", "wn", "wp",
                             "ws", "x", "xblock", "xn", "xs", "xsf", "xsum", "y", "z",
                             "chunk_len", "f", "flat",
                             # the quantized matvec's staged rows, paired rows and prologue
                             "blk", "padded", "poff", "xstage", "xstaged"})
_SCHEDULE_NAMES |= {"philox", "rand_bits", "randn"}          # the random numbers' helpers
_SCHEDULE_NAMES |= {"segsum"}                               # cummax's gradient's helper
# a centered pair's helpers (schedule/centered.py; its state mf_n2, mf_k2, mf_t2 and squares
# mf_sq2 follow _SCHEDULE_PATTERN)
_SCHEDULE_NAMES |= {"centered_add", "centered_add_chunk", "centered_done", "centered_merge",
                    "simd_centered"}
# the matrix block and the contraction kernel (schedule/matrix, schedule/matmul)
_SCHEDULE_NAMES |= {"as", "batch", "bs", "desc", "fa", "fb", "fi", "fj", "op", "sm", "sn",
                    "vals", "mat_elements", "tensor_ops", "left0", "left1", "right0", "right1"}
# ... its padded tiles read a step ahead, bands of tiles, steps of 64 values of K
_SCHEDULE_NAMES |= {"pa", "pb", "at_tile", "band", "band_rows", "left2", "left3", "right2",
                    "right3"}
# attention prefill on 16x16 blocks (schedule/attention/mma*.py, schedule/matrix/strided.py)
_SCHEDULE_NAMES |= {"dot", "es", "ew", "mma16", "oacc", "ov", "pe", "pn", "pr", "probe", "pt",
                    "pv", "qs", "qt", "row0", "sacc", "shared", "slices", "spart", "st",
                    "strides", "sv", "tsg", "wr", "wv", "xv", "zc", "zr"}
# the tiled quantized kernel's teams (schedule/quant/teams.py) and one-launch column merges
_SCHEDULE_NAMES |= {"parked", "team", "coherent", "coherent_load", "coherent_store", "counter",
                    "device_fence", "ticket", "ticket_reset"}
# attention's backward kernels (schedule/attention_grad)
_SCHEDULE_NAMES |= {"b", "cf", "delta", "dk", "dkf", "dof", "dp", "dq", "dqf", "dvf", "eb", "g",
                    "kbeg", "kend", "lse", "nblk", "pf", "tall", "tdo", "tdot", "tks", "tkt", "tq",
                    "tqt", "tr", "tv", "tvt"}
# ... on 16x16 matrix blocks (schedule/attention_grad/blocks.py)
_SCHEDULE_NAMES |= {"gacc", "pd", "rs", "sd", "si", "sp", "sr", "tc", "td", "tl", "tp"}
# ... their staging, row accumulators and 4-simdgroup kernels (staging.py, rowacc.py, wide.py)
_SCHEDULE_NAMES |= {"ein", "gi", "kc", "lhi", "llo", "oc0", "oc1", "sres"}
# the register-resident prefill (schedule/attention/flash.py): the lane's rows, their
# positions (mf_rpos_<axis>0 / 1: _SCHEDULE_PATTERN), the columns past E zeroed once
_SCHEDULE_NAMES |= {"lr0", "lr1", "qhi", "e_in", "zw"}
# the flash prefill's mask-free tiles and lazy maxes
_SCHEDULE_NAMES |= {"kilo", "kihi", "up0", "up1", "ms0", "ms1"}
# generated temporaries (mf_v1, mf_e2, mf_take3, mf_out0, ...) and per-axis or per-tensor
# variables (mf_size_D, mf_pos_R, mf_index_L, mf_in_x, mf_p_x, mf_reg_x, ...)
_SCHEDULE_PATTERN = re.compile(r"^(?:[a-z]\d+|take\d+|out\d+|tg[a-z]?\d+|sq\d+(?:_d)?|"
                               r"(?:size|pos|tpos|rpos|index|in|p|type|reg|tg|row|col|stride|span|"
                               r"stage|simd|mf|xs|partner)_.*)$")


def _plain(name: str) -> bool:
    """Whether a user's name can be spelled as it is."""
    return name not in RESERVED and not name.startswith(_RESERVED_PREFIXES) and "__" not in name


def param_name(name: str, dtype_vars: Iterable[str] = ()) -> str:
    """A tensor or scalar parameter's name in the kernel signature (also not a dtype
    variable's name, which would shadow the template parameter)."""
    return name if _plain(name) and name not in dtype_vars else f"mf_p_{name}"


def type_name(var: str) -> str:
    """A dtype variable's name as a template parameter."""
    return var if _plain(var) else f"mf_type_{var}"


def template_vars(dtype_vars: Mapping[str, V]) -> dict[str, V]:
    """A graph's dtype variables keyed by their template parameter names."""
    return {type_name(v): d for v, d in dtype_vars.items()}


def value_name(name: str) -> str:
    """The variable holding a tensor's element once loaded."""
    if name in _SCHEDULE_NAMES or _SCHEDULE_PATTERN.match(name):
        return f"mf_in_{name}"
    return f"mf_{name}"


def tensor_var(name: str, suffix: str) -> str:
    """A variable of a tensor's (`mf_x_v`, its vector; `mf_x_reg`, its registers): as the
    outputs' are `mf_out_v`, `mf_out0_v`, a tensor named like an output (or like another of
    metalforge's own variables) gets `mf_in_out_v`."""
    if name == "out" or _SCHEDULE_PATTERN.match(name):
        return f"mf_in_{name}_{suffix}"
    return f"mf_{name}_{suffix}"


# the helper functions of codegen/helpers.metal, after their mf_ (a kernel's template must not
# share a name with one; tests/dsl/test_reserved_names.py checks the list against the file)
HELPER_WORDS = frozenset("""
erf maximum minimum pow ipow shl shr remainder fremainder floordiv simd_max simd_min
simd_argmax simd_argmin simd_iargmax simd_iargmin sum_add online_add online_add_chunk
online_merge simd_online pack8_of place_weight mma mat_load atomic_add lower_bound
logaddexp divide centered_add centered_add_chunk centered_done centered_merge
simd_centered""".split())
HELPER_WORDS |= {"philox", "rand_bits", "randn"}             # mf.rand / mf.randn (Philox)
HELPER_WORDS |= {"mat_elements", "tensor_ops"}              # the matrix block (schedule/matrix)
HELPER_WORDS |= {"mma16", "strides"}                       # strided 16x16 blocks (prefill)
HELPER_WORDS |= {"coherent", "device_fence", "ticket"}      # one-launch column merges
HELPER_WORDS |= {"segsum"}                                  # cummax's gradient (schedule/scan)


def kernel_name(op: str, suffix: str = "") -> str:
    """A kernel template's name, `mf_<op>[_<variant>]` (`mf_kernel_erf` where a helper has the
    name)."""
    return f"mf_kernel_{op}{suffix}" if f"{op}{suffix}" in HELPER_WORDS else f"mf_{op}{suffix}"


def index_name(ident: str) -> str:
    """The variable holding the position along an axis (`ident`: the axis as an identifier)."""
    return f"mf_index_ax_{ident}" if ident == "t" or ident.startswith("ax_") else \
        f"mf_index_{ident}"
