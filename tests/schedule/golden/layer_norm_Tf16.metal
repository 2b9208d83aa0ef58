#include <metal_stdlib>
using namespace metal;

// one pass for a sum and the sum of squares around its mean (LayerNorm's mean and variance): a
// thread folds x - k, k its first element, into a count n, a sum t and a sum u of squares
// (returned), and x into the plain sum s (Neumaier-compensated by c, as in mf_sum_add);
// mf_centered_done turns u into the squares around the mean. Shifted by one of its own values,
// u - t^2 / n loses at most log10(n + 1) digits (u <= (n + 1) times the result), where around 0
// a mean far from 0 would take them all. Past an inf or NaN element the squares are NaN.
inline float mf_centered_add(thread float& n, thread float& k, thread float& t, thread float& s,
                             thread float& c, float u, float x) {
    if (n == 0.0f) {
        k = x;
    }
    const float mf_y = x - k;
    t = t + mf_y;
    n = n + 1.0f;
    const float mf_s = s + x;
    if (isfinite(mf_s)) {
        c += abs(s) >= abs(x) ? (s - mf_s) + x : (x - mf_s) + s;
    }
    s = mf_s;
    return u + mf_y * mf_y;
}

// mf_centered_add over a chunk of m elements x[0..m) (a thread's chunk, all in the row) at once:
// the chunk's sums are formed plainly and x's is added to s with Neumaier compensation
inline float mf_centered_add_chunk(thread float& n, thread float& k, thread float& t,
                                   thread float& s, thread float& c, float u,
                                   thread const float* x, uint m) {
    if (n == 0.0f) {
        k = x[0];
    }
    float mf_xs = 0.0f;
    float mf_ys = 0.0f;
    for (uint mf_i = 0u; mf_i < m; ++mf_i) {
        const float mf_y = x[mf_i] - k;
        mf_xs += x[mf_i];
        mf_ys += mf_y;
        u += mf_y * mf_y;
    }
    t = t + mf_ys;
    n = n + float(m);
    const float mf_s = s + mf_xs;
    if (isfinite(mf_s)) {
        c += abs(s) >= abs(mf_xs) ? (s - mf_s) + mf_xs : (mf_xs - mf_s) + s;
    }
    s = mf_s;
    return u;
}

// after a thread's loop: its sum u of squared distances from its shift k as the squares around
// its mean, u - t^2 / n (0 for no element; a rounding below 0 is 0; NaN stays NaN)
inline float mf_centered_done(float n, float t, float u) {
    if (n == 0.0f) {
        return 0.0f;
    }
    const float mf_q = u - t * (t / n);
    return mf_q < 0.0f ? 0.0f : mf_q;
}

// merge running (count n, shift k, sum t of x - k, squares q around the mean) states (Chan et
// al.): returns q + q2 + d^2 n n2 / (n + n2), d the distance between the two means, and sets
// n, k, t to the merged state's, shifted by the smaller k. Symmetric in its two states, bit for
// bit (every lane of a butterfly ends with the same state); an empty state (n 0) adds nothing.
inline float mf_centered_merge(thread float& n, thread float& k, thread float& t, float q,
                               float n2, float k2, float t2, float q2) {
    if (n2 == 0.0f) {
        return q;
    }
    if (n == 0.0f || k2 < k) {
        const float mf_n = n, mf_k = k, mf_t = t, mf_q = q;
        n = n2; k = k2; t = t2; q = q2;
        n2 = mf_n; k2 = mf_k; t2 = mf_t; q2 = mf_q;
        if (n2 == 0.0f) {
            return q;
        }
    }
    const float mf_e = k2 - k;
    const float mf_d = (mf_e + t2 / n2) - t / n;
    q = (q + q2) + mf_d * mf_d * (n * n2 / (n + n2));
    t = t + (t2 + n2 * mf_e);
    n = n + n2;
    return q;
}

// x / y within 2.5 ulp, for every x and y: Metal's fast::divide (x times an approximate
// reciprocal) states that bound for |y| in [2^-126, 2^126]; a y outside (huge, or subnormal)
// is scaled into it first (x / y = s * (x / (y * s)), s a power of two), and 0, infinities and
// NaN keep IEEE's quotients (1/0 = inf, 0/0 = NaN, x/inf = 0). No branch: the correctly
// rounded division is a long instruction sequence with a slow path, which held f16 silu at
// 90% of copy_ on the H200.
inline float mf_divide(float x, float y) {
    const float a = abs(y);
    const float s = a > 8.50705917e37f ? 0.25f : (a < 1.17549435e-38f ? 16777216.0f : 1.0f);
    return s * fast::divide(x, y * s);
}

// 8 consecutive elements moved as one 16-byte access (Metal's vectors stop at 4 components,
// 8 bytes for a 2-byte type): `*reinterpret_cast<device const mf_pack8<T>*>(p)` reads them,
// mf_lane8 gives one element, mf_pack8_of builds one to store.
template <typename T>
struct alignas(16) mf_pack8 {
    T v[8];
};

template <typename T>
inline T mf_lane8(thread const mf_pack8<T>& p, uint i) {
    return p.v[i];
}

template <typename T>
inline mf_pack8<T> mf_pack8_of(T a0, T a1, T a2, T a3, T a4, T a5, T a6, T a7) {
    mf_pack8<T> p = {{a0, a1, a2, a3, a4, a5, a6, a7}};
    return p;
}

// merge (count, shift, shifted sum, squares) states across a simdgroup by an xor butterfly
// (mf_centered_merge); returns the squares, sets n, k and t in every lane
inline float mf_simd_centered(thread float& n, thread float& k, thread float& t, float q) {
    for (ushort mf_o = 1; mf_o < 32; mf_o <<= 1) {
        const float mf_n2 = simd_shuffle_xor(n, mf_o);
        const float mf_k2 = simd_shuffle_xor(k, mf_o);
        const float mf_t2 = simd_shuffle_xor(t, mf_o);
        const float mf_q2 = simd_shuffle_xor(q, mf_o);
        q = mf_centered_merge(n, k, t, q, mf_n2, mf_k2, mf_t2, mf_q2);
    }
    return q;
}

// layer_norm (simd): reduces 'D' over rows [B] in 2 phase(s); the fewest lanes of a simdgroup per row that hold it, 8 elements per lane in registers; 8-wide vector loads/stores where aligned; fp32 accumulation
// generated by metalforge

template <typename T, typename mf_index_t>
kernel void mf_layer_norm_simd(
    device const T* x [[buffer(0)]],
    device const T* w [[buffer(1)]],
    device const T* b [[buffer(2)]],
    device T* mf_out [[buffer(3)]],
    constant float& eps [[buffer(4)]],
    constant mf_index_t& mf_size_D [[buffer(5)]],
    constant mf_index_t& mf_size_B [[buffer(6)]],
    uint mf_tid [[thread_position_in_grid]],
    uint mf_lane [[thread_index_in_simdgroup]])
{
    // mf_w = 1 << mf_wlog lanes per row: the fewest, a power of two up to 32, that hold it at 8 elements each (32 / mf_w rows per simdgroup; threads per threadgroup: set at launch)
    const uint mf_wlog = 32u - clz(max((uint(mf_size_D) + (8u - 1u)) / 8u, 1u) - 1u);
    const uint mf_w = 1u << mf_wlog;
    const uint mf_row = mf_tid >> mf_wlog;
    if (mf_index_t(mf_row) >= mf_size_B) {
        return;
    }
    const uint mf_t = mf_tid & (mf_w - 1u);
    const uint mf_base = mf_t * 8u;
    const bool mf_vec_ok = mf_size_D % 8u == 0u;
    // rows that are not a multiple of the vector width move element by element: a thread's slots strided by the row's threads there, a simdgroup's accesses contiguous
    const uint mf_first = mf_vec_ok ? mf_base : mf_t;
    const uint mf_step = mf_vec_ok ? 1u : mf_w;
    const uint mf_last = mf_first + 7u * mf_step;
    const mf_index_t mf_row_x = mf_index_t(mf_row) * mf_size_D;
    const mf_index_t mf_row_b = 0u;
    const mf_index_t mf_row_w = 0u;
    const mf_index_t mf_row_mf_out = mf_index_t(mf_row) * mf_size_D;
    // phase 1: sum over D
    float mf_acc1 = 0.0f;
    // load 8 elements per thread of x into registers
    T mf_reg_x[8];
    if (mf_vec_ok && mf_base + 8u <= mf_size_D) {
        // 8-wide vector loads
        {
            const uint mf_c = 0u;
            const mf_pack8<T> mf_x_v = *reinterpret_cast<device const mf_pack8<T>*>(x + mf_row_x + mf_index_t(mf_base) + mf_c * 8u);
            for (uint mf_l = 0u; mf_l < 8u; ++mf_l) {
                mf_reg_x[mf_c * 8u + mf_l] = mf_lane8(mf_x_v, mf_l);
            }
        }
    } else if (mf_first < mf_size_D) {
        // row tail or unaligned rows: scalar, guarded
        for (uint mf_k = 0u; mf_k < 8u; ++mf_k) {
            mf_reg_x[mf_k] = mf_first + mf_k * mf_step < mf_size_D ? x[mf_row_x + mf_index_t(mf_first + mf_k * mf_step)] : T(0.0f);
        }
    }
    // each of this thread's 8 elements
    if (mf_last < mf_size_D) {
        // all of them in the row: no per-element check
        for (uint mf_k = 0u; mf_k < 8u; ++mf_k) {
            const float mf_in_x = float(mf_reg_x[mf_k]);
            mf_acc1 = mf_acc1 + mf_in_x;
        }
    } else if (mf_first < mf_size_D) {
        // the row's end: each element checked
        for (uint mf_k = 0u; mf_k < 8u; ++mf_k) {
            const uint mf_pos = mf_first + mf_k * mf_step;
            if (mf_pos < mf_size_D) {
                const float mf_in_x = float(mf_reg_x[mf_k]);
                mf_acc1 = mf_acc1 + mf_in_x;
            }
        }
    }
    // combine the row's lanes (xor butterfly; a fixed trip count, so the compiler unrolls it)
    for (uint mf_off = 1u; mf_off < 32u; mf_off += mf_off) {
        if (mf_off < mf_w) {
            const float mf_o1 = simd_shuffle_xor(mf_acc1, mf_off);
            mf_acc1 = mf_acc1 + mf_o1;
        }
    }
    // phase 2: sum over D
    const float mf_r1 = float(long(mf_size_D));
    const float mf_r2 = mf_divide(mf_acc1, mf_r1);
    float mf_acc2 = 0.0f;
    // each of this thread's 8 elements
    if (mf_last < mf_size_D) {
        // all of them in the row: no per-element check
        for (uint mf_k = 0u; mf_k < 8u; ++mf_k) {
            const float mf_in_x = float(mf_reg_x[mf_k]);
            const float mf_v1 = mf_in_x - mf_r2;
            const float mf_v2 = mf_in_x - mf_r2;
            const float mf_v3 = mf_v1 * mf_v2;
            mf_acc2 = mf_acc2 + mf_v3;
        }
    } else if (mf_first < mf_size_D) {
        // the row's end: each element checked
        for (uint mf_k = 0u; mf_k < 8u; ++mf_k) {
            const uint mf_pos = mf_first + mf_k * mf_step;
            if (mf_pos < mf_size_D) {
                const float mf_in_x = float(mf_reg_x[mf_k]);
                const float mf_v1 = mf_in_x - mf_r2;
                const float mf_v2 = mf_in_x - mf_r2;
                const float mf_v3 = mf_v1 * mf_v2;
                mf_acc2 = mf_acc2 + mf_v3;
            }
        }
    }
    // combine the row's lanes (xor butterfly; a fixed trip count, so the compiler unrolls it)
    for (uint mf_off = 1u; mf_off < 32u; mf_off += mf_off) {
        if (mf_off < mf_w) {
            const float mf_o2 = simd_shuffle_xor(mf_acc2, mf_off);
            mf_acc2 = mf_acc2 + mf_o2;
        }
    }
    // epilogue: compute and store the outputs along the row
    const float mf_r3 = float(long(mf_size_D));
    const float mf_r4 = mf_divide(mf_acc2, mf_r3);
    const float mf_r5 = mf_r4 + eps;
    const float mf_r6 = precise::rsqrt(mf_r5);
    // load 8 elements per thread of b, w into registers
    T mf_reg_b[8];
    T mf_reg_w[8];
    if (mf_vec_ok && mf_base + 8u <= mf_size_D) {
        // 8-wide vector loads
        {
            const uint mf_c = 0u;
            const mf_pack8<T> mf_b_v = *reinterpret_cast<device const mf_pack8<T>*>(b + mf_row_b + mf_index_t(mf_base) + mf_c * 8u);
            for (uint mf_l = 0u; mf_l < 8u; ++mf_l) {
                mf_reg_b[mf_c * 8u + mf_l] = mf_lane8(mf_b_v, mf_l);
            }
        }
        {
            const uint mf_c = 0u;
            const mf_pack8<T> mf_w_v = *reinterpret_cast<device const mf_pack8<T>*>(w + mf_row_w + mf_index_t(mf_base) + mf_c * 8u);
            for (uint mf_l = 0u; mf_l < 8u; ++mf_l) {
                mf_reg_w[mf_c * 8u + mf_l] = mf_lane8(mf_w_v, mf_l);
            }
        }
    } else if (mf_first < mf_size_D) {
        // row tail or unaligned rows: scalar, guarded
        for (uint mf_k = 0u; mf_k < 8u; ++mf_k) {
            mf_reg_b[mf_k] = mf_first + mf_k * mf_step < mf_size_D ? b[mf_row_b + mf_index_t(mf_first + mf_k * mf_step)] : T(0.0f);
            mf_reg_w[mf_k] = mf_first + mf_k * mf_step < mf_size_D ? w[mf_row_w + mf_index_t(mf_first + mf_k * mf_step)] : T(0.0f);
        }
    }
    T mf_reg_mf_out[8];
    // each of this thread's 8 elements
    if (mf_last < mf_size_D) {
        // all of them in the row: no per-element check
        for (uint mf_k = 0u; mf_k < 8u; ++mf_k) {
            const float mf_in_x = float(mf_reg_x[mf_k]);
            const float mf_v1 = mf_in_x - mf_r2;
            const float mf_v2 = mf_v1 * mf_r6;
            const float mf_in_w = float(mf_reg_w[mf_k]);
            const float mf_v3 = mf_v2 * mf_in_w;
            const float mf_in_b = float(mf_reg_b[mf_k]);
            const float mf_v4 = mf_v3 + mf_in_b;
            mf_reg_mf_out[mf_k] = T(mf_v4);
        }
    } else if (mf_first < mf_size_D) {
        // the row's end: each element checked
        for (uint mf_k = 0u; mf_k < 8u; ++mf_k) {
            const uint mf_pos = mf_first + mf_k * mf_step;
            if (mf_pos < mf_size_D) {
                const float mf_in_x = float(mf_reg_x[mf_k]);
                const float mf_v1 = mf_in_x - mf_r2;
                const float mf_v2 = mf_v1 * mf_r6;
                const float mf_in_w = float(mf_reg_w[mf_k]);
                const float mf_v3 = mf_v2 * mf_in_w;
                const float mf_in_b = float(mf_reg_b[mf_k]);
                const float mf_v4 = mf_v3 + mf_in_b;
                mf_reg_mf_out[mf_k] = T(mf_v4);
            }
        }
    }
    // store the row's outputs
    if (mf_vec_ok && mf_base + 8u <= mf_size_D) {
        // 8-wide vector stores
        {
            const uint mf_c = 0u;
            *reinterpret_cast<device mf_pack8<T>*>(mf_out + mf_row_mf_out + mf_index_t(mf_base) + mf_c * 8u) = mf_pack8_of(mf_reg_mf_out[mf_c * 8u + 0u], mf_reg_mf_out[mf_c * 8u + 1u], mf_reg_mf_out[mf_c * 8u + 2u], mf_reg_mf_out[mf_c * 8u + 3u], mf_reg_mf_out[mf_c * 8u + 4u], mf_reg_mf_out[mf_c * 8u + 5u], mf_reg_mf_out[mf_c * 8u + 6u], mf_reg_mf_out[mf_c * 8u + 7u]);
        }
    } else if (mf_first < mf_size_D) {
        // row tail or unaligned rows: scalar, guarded
        for (uint mf_k = 0u; mf_k < 8u; ++mf_k) {
            if (mf_first + mf_k * mf_step < mf_size_D) {
                mf_out[mf_row_mf_out + mf_index_t(mf_first + mf_k * mf_step)] = mf_reg_mf_out[mf_k];
            }
        }
    }
}

// one kernel per dtype set and index width
template [[host_name("layer_norm_f16_simd")]] kernel void mf_layer_norm_simd<half, uint>(
    device const half* x [[buffer(0)]],
    device const half* w [[buffer(1)]],
    device const half* b [[buffer(2)]],
    device half* mf_out [[buffer(3)]],
    constant float& eps [[buffer(4)]],
    constant uint& mf_size_D [[buffer(5)]],
    constant uint& mf_size_B [[buffer(6)]],
    uint mf_tid [[thread_position_in_grid]],
    uint mf_lane [[thread_index_in_simdgroup]]);

// layer_norm (simd_exact): reduces 'D' over rows [B] in 2 phase(s); the fewest lanes of a simdgroup per row that hold it, 8 elements per lane in registers, for rows they cover exactly (D = lanes x 8: no row-end checks); 8-wide vector loads/stores where aligned; fp32 accumulation
// generated by metalforge

template <typename T, typename mf_index_t>
kernel void mf_layer_norm_simd_exact(
    device const T* x [[buffer(0)]],
    device const T* w [[buffer(1)]],
    device const T* b [[buffer(2)]],
    device T* mf_out [[buffer(3)]],
    constant float& eps [[buffer(4)]],
    constant mf_index_t& mf_size_D [[buffer(5)]],
    constant mf_index_t& mf_size_B [[buffer(6)]],
    uint mf_tid [[thread_position_in_grid]],
    uint mf_lane [[thread_index_in_simdgroup]])
{
    // mf_w = 1 << mf_wlog lanes per row: the fewest, a power of two up to 32, that hold it at 8 elements each (32 / mf_w rows per simdgroup; threads per threadgroup: set at launch)
    const uint mf_wlog = 32u - clz(max((uint(mf_size_D) + (8u - 1u)) / 8u, 1u) - 1u);
    const uint mf_w = 1u << mf_wlog;
    const uint mf_row = mf_tid >> mf_wlog;
    if (mf_index_t(mf_row) >= mf_size_B) {
        return;
    }
    const uint mf_t = mf_tid & (mf_w - 1u);
    const uint mf_base = mf_t * 8u;
    const mf_index_t mf_row_x = mf_index_t(mf_row) * mf_size_D;
    const mf_index_t mf_row_b = 0u;
    const mf_index_t mf_row_w = 0u;
    const mf_index_t mf_row_mf_out = mf_index_t(mf_row) * mf_size_D;
    // phase 1: sum over D
    float mf_acc1 = 0.0f;
    // load 8 elements per thread of x into registers
    T mf_reg_x[8];
    // 8-wide vector loads (rows of whole blocks)
    {
        const uint mf_c = 0u;
        const mf_pack8<T> mf_x_v = *reinterpret_cast<device const mf_pack8<T>*>(x + mf_row_x + mf_index_t(mf_base) + mf_c * 8u);
        for (uint mf_l = 0u; mf_l < 8u; ++mf_l) {
            mf_reg_x[mf_c * 8u + mf_l] = mf_lane8(mf_x_v, mf_l);
        }
    }
    // each of this thread's 8 elements
    // all of them in the row: no per-element check
    for (uint mf_k = 0u; mf_k < 8u; ++mf_k) {
        const float mf_in_x = float(mf_reg_x[mf_k]);
        mf_acc1 = mf_acc1 + mf_in_x;
    }
    // combine the row's lanes (xor butterfly; a fixed trip count, so the compiler unrolls it)
    for (uint mf_off = 1u; mf_off < 32u; mf_off += mf_off) {
        if (mf_off < mf_w) {
            const float mf_o1 = simd_shuffle_xor(mf_acc1, mf_off);
            mf_acc1 = mf_acc1 + mf_o1;
        }
    }
    // phase 2: sum over D
    const float mf_r1 = float(long(mf_size_D));
    const float mf_r2 = mf_divide(mf_acc1, mf_r1);
    float mf_acc2 = 0.0f;
    // each of this thread's 8 elements
    // all of them in the row: no per-element check
    for (uint mf_k = 0u; mf_k < 8u; ++mf_k) {
        const float mf_in_x = float(mf_reg_x[mf_k]);
        const float mf_v1 = mf_in_x - mf_r2;
        const float mf_v2 = mf_in_x - mf_r2;
        const float mf_v3 = mf_v1 * mf_v2;
        mf_acc2 = mf_acc2 + mf_v3;
    }
    // combine the row's lanes (xor butterfly; a fixed trip count, so the compiler unrolls it)
    for (uint mf_off = 1u; mf_off < 32u; mf_off += mf_off) {
        if (mf_off < mf_w) {
            const float mf_o2 = simd_shuffle_xor(mf_acc2, mf_off);
            mf_acc2 = mf_acc2 + mf_o2;
        }
    }
    // epilogue: compute and store the outputs along the row
    const float mf_r3 = float(long(mf_size_D));
    const float mf_r4 = mf_divide(mf_acc2, mf_r3);
    const float mf_r5 = mf_r4 + eps;
    const float mf_r6 = precise::rsqrt(mf_r5);
    // load 8 elements per thread of b, w into registers
    T mf_reg_b[8];
    T mf_reg_w[8];
    // 8-wide vector loads (rows of whole blocks)
    {
        const uint mf_c = 0u;
        const mf_pack8<T> mf_b_v = *reinterpret_cast<device const mf_pack8<T>*>(b + mf_row_b + mf_index_t(mf_base) + mf_c * 8u);
        for (uint mf_l = 0u; mf_l < 8u; ++mf_l) {
            mf_reg_b[mf_c * 8u + mf_l] = mf_lane8(mf_b_v, mf_l);
        }
    }
    {
        const uint mf_c = 0u;
        const mf_pack8<T> mf_w_v = *reinterpret_cast<device const mf_pack8<T>*>(w + mf_row_w + mf_index_t(mf_base) + mf_c * 8u);
        for (uint mf_l = 0u; mf_l < 8u; ++mf_l) {
            mf_reg_w[mf_c * 8u + mf_l] = mf_lane8(mf_w_v, mf_l);
        }
    }
    T mf_reg_mf_out[8];
    // each of this thread's 8 elements
    // all of them in the row: no per-element check
    for (uint mf_k = 0u; mf_k < 8u; ++mf_k) {
        const float mf_in_x = float(mf_reg_x[mf_k]);
        const float mf_v1 = mf_in_x - mf_r2;
        const float mf_v2 = mf_v1 * mf_r6;
        const float mf_in_w = float(mf_reg_w[mf_k]);
        const float mf_v3 = mf_v2 * mf_in_w;
        const float mf_in_b = float(mf_reg_b[mf_k]);
        const float mf_v4 = mf_v3 + mf_in_b;
        mf_reg_mf_out[mf_k] = T(mf_v4);
    }
    // store the row's outputs, 8-wide
    {
        const uint mf_c = 0u;
        *reinterpret_cast<device mf_pack8<T>*>(mf_out + mf_row_mf_out + mf_index_t(mf_base) + mf_c * 8u) = mf_pack8_of(mf_reg_mf_out[mf_c * 8u + 0u], mf_reg_mf_out[mf_c * 8u + 1u], mf_reg_mf_out[mf_c * 8u + 2u], mf_reg_mf_out[mf_c * 8u + 3u], mf_reg_mf_out[mf_c * 8u + 4u], mf_reg_mf_out[mf_c * 8u + 5u], mf_reg_mf_out[mf_c * 8u + 6u], mf_reg_mf_out[mf_c * 8u + 7u]);
    }
}

// one kernel per dtype set and index width
template [[host_name("layer_norm_f16_simd_exact")]] kernel void mf_layer_norm_simd_exact<half, uint>(
    device const half* x [[buffer(0)]],
    device const half* w [[buffer(1)]],
    device const half* b [[buffer(2)]],
    device half* mf_out [[buffer(3)]],
    constant float& eps [[buffer(4)]],
    constant uint& mf_size_D [[buffer(5)]],
    constant uint& mf_size_B [[buffer(6)]],
    uint mf_tid [[thread_position_in_grid]],
    uint mf_lane [[thread_index_in_simdgroup]]);

// layer_norm (group): reduces 'D' over rows [B] in 2 phase(s); one threadgroup per row, 16 elements per thread in registers, global memory read once; 8-wide vector loads/stores where aligned; fp32 accumulation
// generated by metalforge

template <typename T, typename mf_index_t>
kernel void mf_layer_norm_group(
    device const T* x [[buffer(0)]],
    device const T* w [[buffer(1)]],
    device const T* b [[buffer(2)]],
    device T* mf_out [[buffer(3)]],
    constant float& eps [[buffer(4)]],
    constant mf_index_t& mf_size_D [[buffer(5)]],
    constant mf_index_t& mf_size_B [[buffer(6)]],
    uint mf_group [[threadgroup_position_in_grid]],
    uint mf_lid [[thread_position_in_threadgroup]],
    uint mf_tpg [[threads_per_threadgroup]],
    uint mf_sg [[simdgroup_index_in_threadgroup]],
    uint mf_lane [[thread_index_in_simdgroup]])
{
    threadgroup float mf_tg1[32];
    threadgroup float mf_tg2[32];
    // one threadgroup per row
    const uint mf_row = mf_group;
    const uint mf_t = mf_lid;
    const uint mf_nsg = (mf_tpg + 31u) / 32u;
    const uint mf_base = mf_t * 16u;
    const bool mf_vec_ok = mf_size_D % 8u == 0u;
    // rows that are not a multiple of the vector width move element by element: a thread's slots strided by the row's threads there, a simdgroup's accesses contiguous
    const uint mf_first = mf_vec_ok ? mf_base : mf_t;
    const uint mf_step = mf_vec_ok ? 1u : mf_tpg;
    const uint mf_last = mf_first + 15u * mf_step;
    const mf_index_t mf_row_x = mf_index_t(mf_row) * mf_size_D;
    const mf_index_t mf_row_b = 0u;
    const mf_index_t mf_row_w = 0u;
    const mf_index_t mf_row_mf_out = mf_index_t(mf_row) * mf_size_D;
    // phase 1: sum over D
    float mf_acc1 = 0.0f;
    // load 16 elements per thread of x into registers
    T mf_reg_x[16];
    if (mf_vec_ok && mf_base + 16u <= mf_size_D) {
        // 8-wide vector loads
        for (uint mf_c = 0u; mf_c < 2u; ++mf_c) {
            const mf_pack8<T> mf_x_v = *reinterpret_cast<device const mf_pack8<T>*>(x + mf_row_x + mf_index_t(mf_base) + mf_c * 8u);
            for (uint mf_l = 0u; mf_l < 8u; ++mf_l) {
                mf_reg_x[mf_c * 8u + mf_l] = mf_lane8(mf_x_v, mf_l);
            }
        }
    } else if (mf_first < mf_size_D) {
        // row tail or unaligned rows: scalar, guarded
        for (uint mf_k = 0u; mf_k < 16u; ++mf_k) {
            mf_reg_x[mf_k] = mf_first + mf_k * mf_step < mf_size_D ? x[mf_row_x + mf_index_t(mf_first + mf_k * mf_step)] : T(0.0f);
        }
    }
    // each of this thread's 16 elements
    if (mf_last < mf_size_D) {
        // all of them in the row: no per-element check
        for (uint mf_k = 0u; mf_k < 16u; ++mf_k) {
            const float mf_in_x = float(mf_reg_x[mf_k]);
            mf_acc1 = mf_acc1 + mf_in_x;
        }
    } else if (mf_first < mf_size_D) {
        // the row's end: each element checked
        for (uint mf_k = 0u; mf_k < 16u; ++mf_k) {
            const uint mf_pos = mf_first + mf_k * mf_step;
            if (mf_pos < mf_size_D) {
                const float mf_in_x = float(mf_reg_x[mf_k]);
                mf_acc1 = mf_acc1 + mf_in_x;
            }
        }
    }
    // combine across the simdgroup
    mf_acc1 = simd_sum(mf_acc1);
    // across simdgroups: one partial per simdgroup through threadgroup memory, then a second simd reduction in every simdgroup
    if (mf_lane == 0u) {
        mf_tg1[mf_sg] = mf_acc1;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    mf_acc1 = mf_lane < mf_nsg ? mf_tg1[mf_lane] : 0.0f;
    mf_acc1 = simd_sum(mf_acc1);
    // phase 2: sum over D
    const float mf_r1 = float(long(mf_size_D));
    const float mf_r2 = mf_divide(mf_acc1, mf_r1);
    float mf_acc2 = 0.0f;
    // each of this thread's 16 elements
    if (mf_last < mf_size_D) {
        // all of them in the row: no per-element check
        for (uint mf_k = 0u; mf_k < 16u; ++mf_k) {
            const float mf_in_x = float(mf_reg_x[mf_k]);
            const float mf_v1 = mf_in_x - mf_r2;
            const float mf_v2 = mf_in_x - mf_r2;
            const float mf_v3 = mf_v1 * mf_v2;
            mf_acc2 = mf_acc2 + mf_v3;
        }
    } else if (mf_first < mf_size_D) {
        // the row's end: each element checked
        for (uint mf_k = 0u; mf_k < 16u; ++mf_k) {
            const uint mf_pos = mf_first + mf_k * mf_step;
            if (mf_pos < mf_size_D) {
                const float mf_in_x = float(mf_reg_x[mf_k]);
                const float mf_v1 = mf_in_x - mf_r2;
                const float mf_v2 = mf_in_x - mf_r2;
                const float mf_v3 = mf_v1 * mf_v2;
                mf_acc2 = mf_acc2 + mf_v3;
            }
        }
    }
    // combine across the simdgroup
    mf_acc2 = simd_sum(mf_acc2);
    // across simdgroups: one partial per simdgroup through threadgroup memory, then a second simd reduction in every simdgroup
    if (mf_lane == 0u) {
        mf_tg2[mf_sg] = mf_acc2;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    mf_acc2 = mf_lane < mf_nsg ? mf_tg2[mf_lane] : 0.0f;
    mf_acc2 = simd_sum(mf_acc2);
    // epilogue: compute and store the outputs along the row
    const float mf_r3 = float(long(mf_size_D));
    const float mf_r4 = mf_divide(mf_acc2, mf_r3);
    const float mf_r5 = mf_r4 + eps;
    const float mf_r6 = precise::rsqrt(mf_r5);
    // load 16 elements per thread of b, w into registers
    T mf_reg_b[16];
    T mf_reg_w[16];
    if (mf_vec_ok && mf_base + 16u <= mf_size_D) {
        // 8-wide vector loads
        for (uint mf_c = 0u; mf_c < 2u; ++mf_c) {
            const mf_pack8<T> mf_b_v = *reinterpret_cast<device const mf_pack8<T>*>(b + mf_row_b + mf_index_t(mf_base) + mf_c * 8u);
            for (uint mf_l = 0u; mf_l < 8u; ++mf_l) {
                mf_reg_b[mf_c * 8u + mf_l] = mf_lane8(mf_b_v, mf_l);
            }
        }
        for (uint mf_c = 0u; mf_c < 2u; ++mf_c) {
            const mf_pack8<T> mf_w_v = *reinterpret_cast<device const mf_pack8<T>*>(w + mf_row_w + mf_index_t(mf_base) + mf_c * 8u);
            for (uint mf_l = 0u; mf_l < 8u; ++mf_l) {
                mf_reg_w[mf_c * 8u + mf_l] = mf_lane8(mf_w_v, mf_l);
            }
        }
    } else if (mf_first < mf_size_D) {
        // row tail or unaligned rows: scalar, guarded
        for (uint mf_k = 0u; mf_k < 16u; ++mf_k) {
            mf_reg_b[mf_k] = mf_first + mf_k * mf_step < mf_size_D ? b[mf_row_b + mf_index_t(mf_first + mf_k * mf_step)] : T(0.0f);
            mf_reg_w[mf_k] = mf_first + mf_k * mf_step < mf_size_D ? w[mf_row_w + mf_index_t(mf_first + mf_k * mf_step)] : T(0.0f);
        }
    }
    T mf_reg_mf_out[16];
    // each of this thread's 16 elements
    if (mf_last < mf_size_D) {
        // all of them in the row: no per-element check
        for (uint mf_k = 0u; mf_k < 16u; ++mf_k) {
            const float mf_in_x = float(mf_reg_x[mf_k]);
            const float mf_v1 = mf_in_x - mf_r2;
            const float mf_v2 = mf_v1 * mf_r6;
            const float mf_in_w = float(mf_reg_w[mf_k]);
            const float mf_v3 = mf_v2 * mf_in_w;
            const float mf_in_b = float(mf_reg_b[mf_k]);
            const float mf_v4 = mf_v3 + mf_in_b;
            mf_reg_mf_out[mf_k] = T(mf_v4);
        }
    } else if (mf_first < mf_size_D) {
        // the row's end: each element checked
        for (uint mf_k = 0u; mf_k < 16u; ++mf_k) {
            const uint mf_pos = mf_first + mf_k * mf_step;
            if (mf_pos < mf_size_D) {
                const float mf_in_x = float(mf_reg_x[mf_k]);
                const float mf_v1 = mf_in_x - mf_r2;
                const float mf_v2 = mf_v1 * mf_r6;
                const float mf_in_w = float(mf_reg_w[mf_k]);
                const float mf_v3 = mf_v2 * mf_in_w;
                const float mf_in_b = float(mf_reg_b[mf_k]);
                const float mf_v4 = mf_v3 + mf_in_b;
                mf_reg_mf_out[mf_k] = T(mf_v4);
            }
        }
    }
    // store the row's outputs
    if (mf_vec_ok && mf_base + 16u <= mf_size_D) {
        // 8-wide vector stores
        for (uint mf_c = 0u; mf_c < 2u; ++mf_c) {
            *reinterpret_cast<device mf_pack8<T>*>(mf_out + mf_row_mf_out + mf_index_t(mf_base) + mf_c * 8u) = mf_pack8_of(mf_reg_mf_out[mf_c * 8u + 0u], mf_reg_mf_out[mf_c * 8u + 1u], mf_reg_mf_out[mf_c * 8u + 2u], mf_reg_mf_out[mf_c * 8u + 3u], mf_reg_mf_out[mf_c * 8u + 4u], mf_reg_mf_out[mf_c * 8u + 5u], mf_reg_mf_out[mf_c * 8u + 6u], mf_reg_mf_out[mf_c * 8u + 7u]);
        }
    } else if (mf_first < mf_size_D) {
        // row tail or unaligned rows: scalar, guarded
        for (uint mf_k = 0u; mf_k < 16u; ++mf_k) {
            if (mf_first + mf_k * mf_step < mf_size_D) {
                mf_out[mf_row_mf_out + mf_index_t(mf_first + mf_k * mf_step)] = mf_reg_mf_out[mf_k];
            }
        }
    }
}

// one kernel per dtype set and index width
template [[host_name("layer_norm_f16_group")]] kernel void mf_layer_norm_group<half, uint>(
    device const half* x [[buffer(0)]],
    device const half* w [[buffer(1)]],
    device const half* b [[buffer(2)]],
    device half* mf_out [[buffer(3)]],
    constant float& eps [[buffer(4)]],
    constant uint& mf_size_D [[buffer(5)]],
    constant uint& mf_size_B [[buffer(6)]],
    uint mf_group [[threadgroup_position_in_grid]],
    uint mf_lid [[thread_position_in_threadgroup]],
    uint mf_tpg [[threads_per_threadgroup]],
    uint mf_sg [[simdgroup_index_in_threadgroup]],
    uint mf_lane [[thread_index_in_simdgroup]]);

// layer_norm (looped): reduces 'D' over rows [B] in 1 phase(s); one threadgroup per row (its size set at launch), streamed in chunks of 4 elements per thread per phase, compensated sums; 4-wide vector loads/stores where aligned; fp32 accumulation
// generated by metalforge

template <typename T, typename mf_index_t>
kernel void mf_layer_norm_looped(
    device const T* x [[buffer(0)]],
    device const T* w [[buffer(1)]],
    device const T* b [[buffer(2)]],
    device T* mf_out [[buffer(3)]],
    constant float& eps [[buffer(4)]],
    constant mf_index_t& mf_size_D [[buffer(5)]],
    constant mf_index_t& mf_size_B [[buffer(6)]],
    uint mf_group [[threadgroup_position_in_grid]],
    uint mf_lid [[thread_position_in_threadgroup]],
    uint mf_tpg [[threads_per_threadgroup]],
    uint mf_sg [[simdgroup_index_in_threadgroup]],
    uint mf_lane [[thread_index_in_simdgroup]])
{
    threadgroup float mf_tg1[32];
    threadgroup float mf_tg2[32];
    threadgroup float mf_tgn2[32];
    threadgroup float mf_tgk2[32];
    threadgroup float mf_tgt2[32];
    // one threadgroup per row
    const uint mf_row = mf_group;
    const uint mf_t = mf_lid;
    const uint mf_nsg = (mf_tpg + 31u) / 32u;
    const uint mf_chunks = (uint(mf_size_D) + (mf_tpg * 4u - 1u)) / (mf_tpg * 4u);
    const bool mf_vec_ok = mf_size_D % 4u == 0u;
    const mf_index_t mf_row_x = mf_index_t(mf_row) * mf_size_D;
    const mf_index_t mf_row_b = 0u;
    const mf_index_t mf_row_w = 0u;
    const mf_index_t mf_row_mf_out = mf_index_t(mf_row) * mf_size_D;
    // phase 1: sum over D and (centered) its squares around a value of it
    float mf_acc1 = 0.0f;
    float mf_cmp1 = 0.0f;
    float mf_acc2 = 0.0f;
    float mf_n2 = 0.0f;
    float mf_k2 = 0.0f;
    float mf_t2 = 0.0f;
    for (uint mf_j = 0u; mf_j < mf_chunks; ++mf_j) {
        const uint mf_base = (mf_j * mf_tpg + mf_t) * 4u;
        const uint mf_first = mf_vec_ok ? mf_base : mf_j * mf_tpg * 4u + mf_t;
        const uint mf_step = mf_vec_ok ? 1u : mf_tpg;
        const uint mf_last = mf_first + 3u * mf_step;
        // load 4 elements per thread of x into registers
        T mf_reg_x[4];
        if (mf_vec_ok && mf_base + 4u <= mf_size_D) {
            // 4-wide vector loads
            {
                const uint mf_c = 0u;
                const vec<T, 4> mf_x_v = *reinterpret_cast<device const vec<T, 4>*>(x + mf_row_x + mf_index_t(mf_base) + mf_c * 4u);
                for (uint mf_l = 0u; mf_l < 4u; ++mf_l) {
                    mf_reg_x[mf_c * 4u + mf_l] = mf_x_v[mf_l];
                }
            }
        } else if (mf_first < mf_size_D) {
            // row tail or unaligned rows: scalar, guarded
            for (uint mf_k = 0u; mf_k < 4u; ++mf_k) {
                mf_reg_x[mf_k] = mf_first + mf_k * mf_step < mf_size_D ? x[mf_row_x + mf_index_t(mf_first + mf_k * mf_step)] : T(0.0f);
            }
        }
        // each of this thread's 4 elements
        if (mf_last < mf_size_D) {
            // all of them in the row: no per-element check
            float mf_on1[4];
            for (uint mf_k = 0u; mf_k < 4u; ++mf_k) {
                const float mf_in_x = float(mf_reg_x[mf_k]);
                mf_on1[mf_k] = mf_in_x;
            }
            // fold the chunk into the running count, sum and squares around the mean at once
            mf_acc2 = mf_centered_add_chunk(mf_n2, mf_k2, mf_t2, mf_acc1, mf_cmp1, mf_acc2, mf_on1, 4u);
        } else if (mf_first < mf_size_D) {
            // the row's end: each element checked
            for (uint mf_k = 0u; mf_k < 4u; ++mf_k) {
                const uint mf_pos = mf_first + mf_k * mf_step;
                if (mf_pos < mf_size_D) {
                    const float mf_in_x = float(mf_reg_x[mf_k]);
                    mf_acc2 = mf_centered_add(mf_n2, mf_k2, mf_t2, mf_acc1, mf_cmp1, mf_acc2, mf_in_x);
                }
            }
        }
    }
    // add the rounding errors the compensated sums collected
    mf_acc1 = mf_acc1 + mf_cmp1;
    // the squared distances from the thread's first element as the squares around its mean
    mf_acc2 = mf_centered_done(mf_n2, mf_t2, mf_acc2);
    // combine across the simdgroup
    mf_acc1 = simd_sum(mf_acc1);
    mf_acc2 = mf_simd_centered(mf_n2, mf_k2, mf_t2, mf_acc2);
    // across simdgroups: one partial per simdgroup through threadgroup memory, then a second simd reduction in every simdgroup
    if (mf_lane == 0u) {
        mf_tg1[mf_sg] = mf_acc1;
        mf_tg2[mf_sg] = mf_acc2;
        mf_tgn2[mf_sg] = mf_n2;
        mf_tgk2[mf_sg] = mf_k2;
        mf_tgt2[mf_sg] = mf_t2;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    mf_acc1 = mf_lane < mf_nsg ? mf_tg1[mf_lane] : 0.0f;
    mf_acc2 = mf_lane < mf_nsg ? mf_tg2[mf_lane] : 0.0f;
    mf_n2 = mf_lane < mf_nsg ? mf_tgn2[mf_lane] : 0.0f;
    mf_k2 = mf_lane < mf_nsg ? mf_tgk2[mf_lane] : 0.0f;
    mf_t2 = mf_lane < mf_nsg ? mf_tgt2[mf_lane] : 0.0f;
    mf_acc1 = simd_sum(mf_acc1);
    mf_acc2 = mf_simd_centered(mf_n2, mf_k2, mf_t2, mf_acc2);
    // the squares around the center: those around the mean plus n (mean - center)^2
    const float mf_r1 = float(long(mf_size_D));
    const float mf_r2 = mf_divide(mf_acc1, mf_r1);
    const float mf_sq2_d = mf_k2 - mf_r2 + mf_t2 / mf_n2;
    const float mf_sq2 = mf_n2 == 0.0f ? mf_acc2 : mf_acc2 + mf_n2 * (mf_sq2_d * mf_sq2_d);
    // epilogue: compute and store the outputs along the row
    const float mf_r3 = float(long(mf_size_D));
    const float mf_r4 = mf_divide(mf_sq2, mf_r3);
    const float mf_r5 = mf_r4 + eps;
    const float mf_r6 = precise::rsqrt(mf_r5);
    for (uint mf_j = 0u; mf_j < mf_chunks; ++mf_j) {
        const uint mf_base = (mf_j * mf_tpg + mf_t) * 4u;
        const uint mf_first = mf_vec_ok ? mf_base : mf_j * mf_tpg * 4u + mf_t;
        const uint mf_step = mf_vec_ok ? 1u : mf_tpg;
        const uint mf_last = mf_first + 3u * mf_step;
        // load 4 elements per thread of b, w, x into registers
        T mf_reg_b[4];
        T mf_reg_w[4];
        T mf_reg_x[4];
        if (mf_vec_ok && mf_base + 4u <= mf_size_D) {
            // 4-wide vector loads
            {
                const uint mf_c = 0u;
                const vec<T, 4> mf_b_v = *reinterpret_cast<device const vec<T, 4>*>(b + mf_row_b + mf_index_t(mf_base) + mf_c * 4u);
                for (uint mf_l = 0u; mf_l < 4u; ++mf_l) {
                    mf_reg_b[mf_c * 4u + mf_l] = mf_b_v[mf_l];
                }
            }
            {
                const uint mf_c = 0u;
                const vec<T, 4> mf_w_v = *reinterpret_cast<device const vec<T, 4>*>(w + mf_row_w + mf_index_t(mf_base) + mf_c * 4u);
                for (uint mf_l = 0u; mf_l < 4u; ++mf_l) {
                    mf_reg_w[mf_c * 4u + mf_l] = mf_w_v[mf_l];
                }
            }
            {
                const uint mf_c = 0u;
                const vec<T, 4> mf_x_v = *reinterpret_cast<device const vec<T, 4>*>(x + mf_row_x + mf_index_t(mf_base) + mf_c * 4u);
                for (uint mf_l = 0u; mf_l < 4u; ++mf_l) {
                    mf_reg_x[mf_c * 4u + mf_l] = mf_x_v[mf_l];
                }
            }
        } else if (mf_first < mf_size_D) {
            // row tail or unaligned rows: scalar, guarded
            for (uint mf_k = 0u; mf_k < 4u; ++mf_k) {
                mf_reg_b[mf_k] = mf_first + mf_k * mf_step < mf_size_D ? b[mf_row_b + mf_index_t(mf_first + mf_k * mf_step)] : T(0.0f);
                mf_reg_w[mf_k] = mf_first + mf_k * mf_step < mf_size_D ? w[mf_row_w + mf_index_t(mf_first + mf_k * mf_step)] : T(0.0f);
                mf_reg_x[mf_k] = mf_first + mf_k * mf_step < mf_size_D ? x[mf_row_x + mf_index_t(mf_first + mf_k * mf_step)] : T(0.0f);
            }
        }
        T mf_reg_mf_out[4];
        // each of this thread's 4 elements
        if (mf_last < mf_size_D) {
            // all of them in the row: no per-element check
            for (uint mf_k = 0u; mf_k < 4u; ++mf_k) {
                const float mf_in_x = float(mf_reg_x[mf_k]);
                const float mf_v1 = mf_in_x - mf_r2;
                const float mf_v2 = mf_v1 * mf_r6;
                const float mf_in_w = float(mf_reg_w[mf_k]);
                const float mf_v3 = mf_v2 * mf_in_w;
                const float mf_in_b = float(mf_reg_b[mf_k]);
                const float mf_v4 = mf_v3 + mf_in_b;
                mf_reg_mf_out[mf_k] = T(mf_v4);
            }
        } else if (mf_first < mf_size_D) {
            // the row's end: each element checked
            for (uint mf_k = 0u; mf_k < 4u; ++mf_k) {
                const uint mf_pos = mf_first + mf_k * mf_step;
                if (mf_pos < mf_size_D) {
                    const float mf_in_x = float(mf_reg_x[mf_k]);
                    const float mf_v1 = mf_in_x - mf_r2;
                    const float mf_v2 = mf_v1 * mf_r6;
                    const float mf_in_w = float(mf_reg_w[mf_k]);
                    const float mf_v3 = mf_v2 * mf_in_w;
                    const float mf_in_b = float(mf_reg_b[mf_k]);
                    const float mf_v4 = mf_v3 + mf_in_b;
                    mf_reg_mf_out[mf_k] = T(mf_v4);
                }
            }
        }
        // store the row's outputs
        if (mf_vec_ok && mf_base + 4u <= mf_size_D) {
            // 4-wide vector stores
            {
                const uint mf_c = 0u;
                *reinterpret_cast<device vec<T, 4>*>(mf_out + mf_row_mf_out + mf_index_t(mf_base) + mf_c * 4u) = vec<T, 4>(mf_reg_mf_out[mf_c * 4u + 0u], mf_reg_mf_out[mf_c * 4u + 1u], mf_reg_mf_out[mf_c * 4u + 2u], mf_reg_mf_out[mf_c * 4u + 3u]);
            }
        } else if (mf_first < mf_size_D) {
            // row tail or unaligned rows: scalar, guarded
            for (uint mf_k = 0u; mf_k < 4u; ++mf_k) {
                if (mf_first + mf_k * mf_step < mf_size_D) {
                    mf_out[mf_row_mf_out + mf_index_t(mf_first + mf_k * mf_step)] = mf_reg_mf_out[mf_k];
                }
            }
        }
    }
}

// one kernel per dtype set and index width
template [[host_name("layer_norm_f16_looped")]] kernel void mf_layer_norm_looped<half, uint>(
    device const half* x [[buffer(0)]],
    device const half* w [[buffer(1)]],
    device const half* b [[buffer(2)]],
    device half* mf_out [[buffer(3)]],
    constant float& eps [[buffer(4)]],
    constant uint& mf_size_D [[buffer(5)]],
    constant uint& mf_size_B [[buffer(6)]],
    uint mf_group [[threadgroup_position_in_grid]],
    uint mf_lid [[thread_position_in_threadgroup]],
    uint mf_tpg [[threads_per_threadgroup]],
    uint mf_sg [[simdgroup_index_in_threadgroup]],
    uint mf_lane [[thread_index_in_simdgroup]]);
