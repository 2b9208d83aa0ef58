// Metal helper functions of metalforge's generated kernels. A kernel's source includes the
// ones it calls, each once, above the kernel (metalforge/codegen/msl.py reads this file:
// each helper is the text from its `// helper: NAME` line to the next such line).
#include <metal_stdlib>
using namespace metal;

// helper: mf_erf
// erf (MSL has none), within 2e-7 of the exact value (a few float ulps), no loop:
// - |x| < 1: x * sum_n c_n x^(2n), c_n = 2/sqrt(pi) (-1)^n / (n! (2n + 1)), 12 terms (the
//   first left out is below 1e-10);
// - 1 <= |x| < 4: 1 - erfc(|x|), erfc(a) = exp(-a^2) g(a), g a degree-10 polynomial in
//   a - 2.5 (a Chebyshev fit of erfc(a) exp(a^2) on [1, 4] in float64, rounded to float);
// - |x| >= 4: +-1 (erfc(4) = 1.5e-8 is below half a float ulp of 1); NaN stays NaN.
inline float mf_erf(float x) {
    if (isnan(x)) {
        return x;
    }
    const float mf_a = abs(x);
    if (mf_a >= 4.0f) {
        return copysign(1.0f, x);
    }
    if (mf_a < 1.0f) {
        const float mf_s = x * x;
        float mf_p = -1.22905552e-09f;
        mf_p = fma(mf_p, mf_s, 1.48071928e-08f);
        mf_p = fma(mf_p, mf_s, -1.63658441e-07f);
        mf_p = fma(mf_p, mf_s, 1.64621144e-06f);
        mf_p = fma(mf_p, mf_s, -1.49256502e-05f);
        mf_p = fma(mf_p, mf_s, 0.000120553326f);
        mf_p = fma(mf_p, mf_s, -0.000854832702f);
        mf_p = fma(mf_p, mf_s, 0.00522397785f);
        mf_p = fma(mf_p, mf_s, -0.0268661715f);
        mf_p = fma(mf_p, mf_s, 0.112837918f);
        mf_p = fma(mf_p, mf_s, -0.376126379f);
        mf_p = fma(mf_p, mf_s, 1.12837923f);
        return x * mf_p;
    }
    const float mf_t = mf_a - 2.5f;
    float mf_g = 1.67180178e-06f;
    mf_g = fma(mf_g, mf_t, -6.38608572e-06f);
    mf_g = fma(mf_g, mf_t, 1.43536627e-05f);
    mf_g = fma(mf_g, mf_t, -5.35858089e-05f);
    mf_g = fma(mf_g, mf_t, 0.000212972081f);
    mf_g = fma(mf_g, mf_t, -0.000738997594f);
    mf_g = fma(mf_g, mf_t, 0.00246598246f);
    mf_g = fma(mf_g, mf_t, -0.00799934566f);
    mf_g = fma(mf_g, mf_t, 0.0249382034f);
    mf_g = fma(mf_g, mf_t, -0.0743476003f);
    mf_g = fma(mf_g, mf_t, 0.210806355f);
    return copysign(1.0f - precise::exp(-x * x) * mf_g, x);
}

// helper: mf_maximum
// maximum/minimum propagating NaN, as torch does
// (one select, no branches: `a` where it is the greater or NaN, else `b`, a NaN `b` taken)
template <typename F>
inline F mf_maximum(F a, F b) {
    return (a > b || a != a) ? a : b;
}

// helper: mf_minimum
template <typename F>
inline F mf_minimum(F a, F b) {
    return (a < b || a != a) ? a : b;
}

// helper: mf_divide
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

// helper: mf_pow
// pow with torch's sign for a negative base and an integral exponent
inline float mf_pow(float a, float b) {
    if (a < 0.0f && b == floor(b)) {
        const float mf_r = precise::pow(-a, b);
        return fmod(b, 2.0f) != 0.0f ? -mf_r : mf_r;
    }
    return precise::pow(a, b);
}

// helper: mf_ipow
// integer power by squaring (exponent >= 0), wrapping at I's width as torch does (the products
// are taken in ulong: signed overflow is undefined in MSL)
template <typename I>
inline I mf_ipow(I a, I b) {
    I mf_r = 1;
    while (b > 0) {
        if (b & 1) {
            mf_r = I(ulong(mf_r) * ulong(a));
        }
        a = I(ulong(a) * ulong(a));
        b >>= 1;
    }
    return mf_r;
}

// helper: mf_shl
// a << b as torch computes it: 0 when b is negative or at least I's width (undefined in MSL);
// the shift is taken in ulong (shifting a negative value is undefined too), wrapped to I
template <typename I>
inline I mf_shl(I a, I b) {
    if (b < I(0) || b >= I(sizeof(I) * 8)) {
        return I(0);
    }
    return I(ulong(a) << ulong(b));
}

// helper: mf_shr
// a >> b as torch computes it: arithmetic for signed I; a shift by a negative amount or by I's
// width or more gives -1 for a negative a and 0 otherwise (undefined in MSL)
template <typename I>
inline I mf_shr(I a, I b) {
    if (b < I(0) || b >= I(sizeof(I) * 8)) {
        return a < I(0) ? I(-1) : I(0);
    }
    return I(a >> b);
}

// helper: mf_remainder
// integer remainder with the sign of the divisor (torch.remainder)
template <typename I>
inline I mf_remainder(I a, I b) {
    if (I(-1) < I(0) && b == I(-1)) {
        // anything % -1 is 0 (min % -1 overflows the hardware division)
        return I(0);
    }
    const I mf_r = a % b;
    return (mf_r != 0 && ((mf_r < 0) != (b < 0))) ? mf_r + b : mf_r;
}

// helper: mf_fremainder
// float remainder with the sign of the divisor (torch.remainder)
inline float mf_fremainder(float a, float b) {
    const float mf_r = fmod(a, b);
    return (mf_r != 0.0f && ((mf_r < 0.0f) != (b < 0.0f))) ? mf_r + b : mf_r;
}

// helper: mf_floordiv
// integer division rounding toward -infinity (torch.floor_divide)
template <typename I>
inline I mf_floordiv(I a, I b) {
    if (I(-1) < I(0) && b == I(-1)) {
        // a // -1 is -a, wrapping: min // -1 == min as in torch (the hardware division overflows)
        return I(0ul - ulong(a));
    }
    const I mf_q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? mf_q - 1 : mf_q;
}

// helper: mf_simd_max
// simdgroup max/min propagating NaN, as torch.amax/amin do (Metal's simd_max/min skip NaN)
inline float mf_simd_max(float x) {
    const bool mf_nan = simd_any(x != x);
    const float mf_m = simd_max(x);
    return mf_nan ? NAN : mf_m;
}

// helper: mf_simd_min
inline float mf_simd_min(float x) {
    const bool mf_nan = simd_any(x != x);
    const float mf_m = simd_min(x);
    return mf_nan ? NAN : mf_m;
}

// helper: mf_simd_argmax
// simdgroup argmax/argmin: returns the smallest index holding the extreme value (a NaN counts as
// the extreme, as in torch.argmax/argmin); v becomes that value, in every lane
inline uint mf_simd_argmax(thread float& v, uint i) {
    const bool mf_nan = simd_any(v != v);
    const float mf_m = simd_max(v);
    const bool mf_hit = mf_nan ? v != v : v == mf_m;
    v = mf_nan ? NAN : mf_m;
    return simd_min(mf_hit ? i : 0xFFFFFFFFu);
}

// helper: mf_simd_argmin
inline uint mf_simd_argmin(thread float& v, uint i) {
    const bool mf_nan = simd_any(v != v);
    const float mf_m = simd_min(v);
    const bool mf_hit = mf_nan ? v != v : v == mf_m;
    v = mf_nan ? NAN : mf_m;
    return simd_min(mf_hit ? i : 0xFFFFFFFFu);
}

// helper: mf_simd_iargmax
// integer argmax/argmin over a simdgroup: the smallest index holding the extreme value
template <typename V>
inline uint mf_simd_iargmax(thread V& v, uint i) {
    const V mf_m = simd_max(v);
    const bool mf_hit = v == mf_m;
    v = mf_m;
    return simd_min(mf_hit ? i : 0xFFFFFFFFu);
}

// helper: mf_simd_iargmin
template <typename V>
inline uint mf_simd_iargmin(thread V& v, uint i) {
    const V mf_m = simd_min(v);
    const bool mf_hit = v == mf_m;
    v = mf_m;
    return simd_min(mf_hit ? i : 0xFFFFFFFFu);
}

// helper: mf_sum_add
// compensated (Neumaier) summation: returns s + x and adds that addition's rounding error to c,
// so a long sequential sum stays accurate to a few ulp (plain fp32 addition loses ~n ulp);
// the caller adds c to the sum at the end. Written for IEEE arithmetic (safe math mode): fast
// math may reassociate (s - t) + x to 0. An inf or NaN sum collects no error term.
inline float mf_sum_add(thread float& c, float s, float x) {
    const float mf_t = s + x;
    if (isfinite(mf_t)) {
        c += abs(s) >= abs(x) ? (s - mf_t) + x : (x - mf_t) + s;
    }
    return mf_t;
}

// helper: mf_online_add
// online softmax: fold x into a running max m and running sum s of exp(x_i - m), rescaling the
// sum (and its compensation term c, see the compensated sum below) when the max grows; returns
// the new sum. The terms are those of the two-pass sum(exp(x - max(x))): a -inf element adds
// nothing while the max is -inf (if the max stays -inf the whole sum is NaN, fixed after the
// combine), +inf and NaN give NaN, as in torch. Each term is added with Neumaier compensation:
// the rounding error of s + e goes to c, which the caller adds to s at the end.
inline float mf_online_add(thread float& m, thread float& c, float s, float x) {
    float mf_e;
    if (x > m || x != x) {
        const float mf_scale = precise::exp(m - x);
        s = s * mf_scale;
        c = c * mf_scale;
        mf_e = precise::exp(x - x);
        m = x;
    } else if (x == m && x == -INFINITY) {
        return s;
    } else {
        mf_e = precise::exp(x - m);
    }
    const float mf_t = s + mf_e;
    if (isfinite(mf_t)) {
        c += abs(s) >= abs(mf_e) ? (s - mf_t) + mf_e : (mf_e - mf_t) + s;
    }
    return mf_t;
}

// helper: mf_online_add_chunk
// online softmax over a chunk of n elements x[0..n) (a thread's chunk, all in the row): the same
// terms as n calls of mf_online_add, with one max test, one rescale and one compensated add per
// chunk instead of per element. The chunk's max (NaN wins) rescales the running sum s and its
// compensation c when it grows; the chunk's terms exp(x_i - m) are summed plainly (n is a few)
// and that partial is added to s with Neumaier compensation. While the max is -inf nothing is
// added; +inf and NaN give NaN, as in mf_online_add.
inline float mf_online_add_chunk(thread float& m, thread float& c, float s, thread const float* x,
                                 uint n) {
    float mf_cm = x[0];
    for (uint mf_i = 1u; mf_i < n; ++mf_i) {
        if (x[mf_i] > mf_cm || x[mf_i] != x[mf_i]) {
            mf_cm = x[mf_i];
        }
    }
    if (mf_cm > m || mf_cm != mf_cm) {
        const float mf_scale = precise::exp(m - mf_cm);
        s = s * mf_scale;
        c = c * mf_scale;
        m = mf_cm;
    }
    if (m == -INFINITY) {
        return s;
    }
    float mf_p = 0.0f;
    for (uint mf_i = 0u; mf_i < n; ++mf_i) {
        mf_p += precise::exp(x[mf_i] - m);
    }
    const float mf_t = s + mf_p;
    if (isfinite(mf_t)) {
        c += abs(s) >= abs(mf_p) ? (s - mf_t) + mf_p : (mf_p - mf_t) + s;
    }
    return mf_t;
}

// helper: mf_online_merge
// merge running (max, sum of exp(x - max)) pairs: returns s * exp(m - M) + s2 * exp(m2 - M)
// (an empty sum adds nothing) and sets m to M = max(m, m2), NaN-propagating
inline float mf_online_merge(thread float& m, float s, float m2, float s2) {
    const float mf_m = (m != m || m2 != m2) ? NAN : max(m, m2);
    s = (s == 0.0f ? 0.0f : s * precise::exp(m - mf_m)) +
        (s2 == 0.0f ? 0.0f : s2 * precise::exp(m2 - mf_m));
    m = mf_m;
    return s;
}

// helper: mf_simd_online
// merge running (max, sum of exp(x - max)) pairs across a simdgroup; returns the sum, sets m
inline float mf_simd_online(thread float& m, float s) {
    const bool mf_nan = simd_any(m != m);
    const float mf_top = simd_max(m);
    const float mf_m = mf_nan ? NAN : mf_top;
    s = simd_sum(s == 0.0f ? 0.0f : s * precise::exp(m - mf_m));
    m = mf_m;
    return s;
}

// helper: mf_centered_add
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

// helper: mf_centered_add_chunk
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

// helper: mf_centered_done
// after a thread's loop: its sum u of squared distances from its shift k as the squares around
// its mean, u - t^2 / n (0 for no element; a rounding below 0 is 0; NaN stays NaN)
inline float mf_centered_done(float n, float t, float u) {
    if (n == 0.0f) {
        return 0.0f;
    }
    const float mf_q = u - t * (t / n);
    return mf_q < 0.0f ? 0.0f : mf_q;
}

// helper: mf_centered_merge
// merge running (count n, shift k, sum t of x - k, squares q around the mean) states (Chan et
// al.; a split row's slices, in order): returns q + q2 + d^2 n n2 / (n + n2), d the distance
// between the two means, taken as (k2 - k) + t2 / n2 - t / n, and sets n and t to the merged
// state's, still shifted by k; an empty state (n 0) adds nothing.
inline float mf_centered_merge(thread float& n, thread float& k, thread float& t, float q,
                               float n2, float k2, float t2, float q2) {
    if (n2 == 0.0f) {
        return q;
    }
    if (n == 0.0f) {
        n = n2;
        k = k2;
        t = t2;
        return q2;
    }
    const float mf_e = k2 - k;
    const float mf_d = (mf_e + t2 / n2) - t / n;
    q = (q + q2) + mf_d * mf_d * (n * n2 / (n + n2));
    t = t + (t2 + n2 * mf_e);
    n = n + n2;
    return q;
}

// helper: mf_simd_centered
// merge (count, shift, shifted sum, squares) states across a simdgroup: every lane's moments
// about one shift K, the largest of the lanes' means, summed by simd_sum; the squares are
// those sums' u - t^2 / n. K is a mean of one lane's elements, so the subtraction loses at most
// log10(1 + n / that lane's count) digits (1.5 for 32 equal lanes); a lane's distance from K is
// taken as (k - K) + t / n, not as its mean's rounding minus K, which would lose the digits a
// mean far from 0 takes. Returns the squares and sets n, k (K) and t in every lane, alike; an
// inf or NaN mean makes them NaN.
inline float mf_simd_centered(thread float& n, thread float& k, thread float& t, float q) {
    const bool mf_has = n > 0.0f;
    const float mf_m = mf_has ? k + t / n : -INFINITY;
    float mf_k = simd_max(mf_m);
    mf_k = mf_k == -INFINITY ? 0.0f : mf_k;
    const float mf_d = mf_has ? (k - mf_k) + t / n : 0.0f;    // k - K exact near the mean
    const float mf_t = simd_sum(n * mf_d);
    const float mf_u = simd_sum(mf_has ? q + n * (mf_d * mf_d) : 0.0f);
    n = simd_sum(n);
    k = mf_k;
    t = mf_t;
    if (n == 0.0f) {
        return 0.0f;
    }
    const float mf_q = mf_u - mf_t * (mf_t / n);
    return mf_q < 0.0f ? 0.0f : mf_q;
}

// helper: mf_pack8_of
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

// helper: mf_place_weight
// 2^-s (s < 16; a literal once the loop is unrolled): a packed value masked where it sits,
// `(word >> half) & (mask << s)`, is the value times 2^s; an x pre-scaled by 2^-s multiplies it
// as the value itself, so unpacking takes no shift per value (as MLX's quantized kernels do)
inline float mf_place_weight(uint s) {
    return as_type<float>((127u - s) << 23u);
}

// helper: mf_mma
// d = a x b + c over 8x8 float matrices, each passed as the calling lane's two elements
// (thread_elements(): row ((lane / 4) & 4) + (lane / 2) % 4, columns ((lane / 4) & 2) * 2 +
// (lane % 2) * 2 and the next); a simdgroup_matrix product, so every lane of the simdgroup
// calls it together
inline float2 mf_mma(float2 a, float2 b, float2 c) {
    simdgroup_float8x8 mf_a, mf_b, mf_c;
    mf_a.thread_elements() = a;
    mf_b.thread_elements() = b;
    mf_c.thread_elements() = c;
    simdgroup_multiply_accumulate(mf_c, mf_a, mf_b, mf_c);
    return mf_c.thread_elements();
}

// helper: mf_mat_load
// the calling lane's two elements (thread_elements()) of the 8x8 float matrix at column x, row
// y of a threadgroup array with `stride` floats a row: a simdgroup_load, so every lane of the
// simdgroup calls it together
inline float2 mf_mat_load(const threadgroup float* p, uint stride, uint x, uint y) {
    simdgroup_float8x8 mf_m;
    simdgroup_load(mf_m, p, ulong(stride), ulong2(x, y));
    return mf_m.thread_elements();
}

// helper: mf_mat_elements
// the calling lane's two elements (thread_elements()) of an 8x8 float simdgroup matrix, by
// value: row ((lane / 4) & 4) + (lane / 2) % 4, columns ((lane / 4) & 2) * 2 + (lane % 2) * 2
// and the next (Apple's layout)
inline float2 mf_mat_elements(simdgroup_float8x8 m) {
    return m.thread_elements();
}

// helper: mf_atomic_add
// *p += v as one relaxed atomic read-modify-write on device memory (mf.scatter_add's adds):
// Metal's atomic_float (MSL 3.0), atomic_int and atomic_uint; relaxed is the only memory order
// Metal's atomic functions take
inline void mf_atomic_add(device float* p, float v) {
    atomic_fetch_add_explicit(reinterpret_cast<device atomic_float*>(p), v, memory_order_relaxed);
}
inline void mf_atomic_add(device int* p, int v) {
    atomic_fetch_add_explicit(reinterpret_cast<device atomic_int*>(p), v, memory_order_relaxed);
}
inline void mf_atomic_add(device uint* p, uint v) {
    atomic_fetch_add_explicit(reinterpret_cast<device atomic_uint*>(p), v, memory_order_relaxed);
}

// helper: mf_ticket
// A threadgroup's arrival at a word of the counter buffer (zero between launches: the runtime
// makes it zeroed, the last group to arrive puts it back): how many groups arrived before it.
// Relaxed, the only order Metal's atomic functions take; the caller fences first
// (mf_device_fence) so that what it stored is visible to the group that arrives last.
inline uint mf_ticket(device uint* word) {
    return atomic_fetch_add_explicit(reinterpret_cast<device atomic_uint*>(word), 1u,
                                     memory_order_relaxed);
}
inline void mf_ticket_reset(device uint* word) {
    atomic_store_explicit(reinterpret_cast<device atomic_uint*>(word), 0u, memory_order_relaxed);
}

// helper: mf_device_fence
// Orders this thread's device-memory accesses at device scope (Metal 3.2): its stores before
// the fence are visible to any thread of another threadgroup that fences after seeing a later
// atomic of this thread (release before a ticket, acquire after it)
inline void mf_device_fence() {
    atomic_thread_fence(mem_flags::mem_device, memory_order_seq_cst, thread_scope_device);
}

// helper: mf_coherent
// element i of a device float buffer read or written through a coherent(device) pointer
// (Metal 3.2): other threadgroups' stores are seen once ordered by fences and atomics, where a
// plain device access may be served by a cache not coherent across threadgroups
template <typename I>
inline float mf_coherent_load(device float* p, I i) {
    return (reinterpret_cast<coherent(device) device float*>(p))[i];
}
template <typename I>
inline void mf_coherent_store(device float* p, I i, float v) {
    (reinterpret_cast<coherent(device) device float*>(p))[i] = v;
}

// helper: mf_lower_bound
// the first position of keys[0, n) (sorted ascending) whose key is not below v; n if none
// (mf.scatter_add's deterministic mode: the bounds of an output element's segment)
template <typename I>
inline I mf_lower_bound(device const long* keys, I n, long v) {
    I lo = 0;
    I hi = n;
    while (lo < hi) {
        const I mid = lo + (hi - lo) / 2;
        if (keys[mid] < v) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

// helper: mf_logaddexp
// log(exp(a) + exp(b)) without overflow, as torch.logcumsumexp combines: the larger plus
// log1p(exp(smaller - larger)); both -inf (or both +inf) give that infinity, a NaN gives NaN.
// MSL has no log1p: log1p(t) = log(u) * t / (u - 1) with u = 1 + t (accurate to a few ulp;
// t itself where u rounds to 1)
inline float mf_logaddexp(float a, float b) {
    if (a != a || b != b) {
        return a + b;
    }
    const float mf_hi = max(a, b);
    const float mf_lo = min(a, b);
    if (mf_lo == mf_hi && isinf(mf_hi)) {
        return mf_hi;
    }
    const float mf_t = precise::exp(mf_lo - mf_hi);
    const float mf_u = 1.0f + mf_t;
    const float mf_l = mf_u == 1.0f ? mf_t : precise::log(mf_u) * (mf_t / (mf_u - 1.0f));
    return mf_hi + mf_l;
}

// helper: mf_philox
// Philox-4x32-10 (Salmon et al., SC'11; Random123's philox4x32, 10 rounds): the counter ctr
// mixed under the key; ten rounds of two 32x32->64-bit multiplications (mulhi for the high
// words), the key bumped by the Weyl constants before every round but the first.
inline uint4 mf_philox(uint4 ctr, uint2 key) {
    for (int r = 0; r < 10; ++r) {
        if (r > 0) {
            key.x += 0x9E3779B9u;
            key.y += 0xBB67AE85u;
        }
        const uint hi0 = mulhi(0xD2511F53u, ctr.x);
        const uint lo0 = 0xD2511F53u * ctr.x;
        const uint hi1 = mulhi(0xCD9E8D57u, ctr.z);
        const uint lo1 = 0xCD9E8D57u * ctr.z;
        ctr = uint4(hi1 ^ ctr.y ^ key.x, lo1, hi0 ^ ctr.w ^ key.y, lo0);
    }
    return ctr;
}

// helper: mf_rand_bits
// mf.rand: the 32 random bits of an element of the stream (seed, offset): word `word` (the
// element's linear position i % 4) of Philox block `block` (i / 4), the offset the counter's
// upper half, the seed the key (metalforge/philox.py has the whole mapping). Lanes of a chunk
// passing the same block share one Philox computation once inlined.
inline uint mf_rand_bits(ulong seed, ulong offset, ulong block, uint word) {
    const uint4 w = mf_philox(uint4(uint(block), uint(block >> 32), uint(offset),
                                    uint(offset >> 32)), uint2(uint(seed), uint(seed >> 32)));
    return word < 2u ? (word == 0u ? w.x : w.y) : (word == 2u ? w.z : w.w);
}

// helper: mf_randn
// mf.randn: an element's standard normal, Box-Muller on words 2 pair and 2 pair + 1 of Philox
// block `block` (element i: block i / 2, pair i % 2): u1 = ((a >> 8) + 1) 2^-24 in (0, 1]
// (so log(u1) is finite), u2 = (b >> 8) 2^-24 in [0, 1); sqrt(-2 log u1) cos(2 pi u2),
// |value| <= 5.77
inline float mf_randn(ulong seed, ulong offset, ulong block, uint pair) {
    const uint4 w = mf_philox(uint4(uint(block), uint(block >> 32), uint(offset),
                                    uint(offset >> 32)), uint2(uint(seed), uint(seed >> 32)));
    const bool odd = pair != 0u;
    const float u1 = float(((odd ? w.z : w.x) >> 8) + 1u) * 5.9604644775390625e-08f;
    const float u2 = float((odd ? w.w : w.y) >> 8) * 5.9604644775390625e-08f;
    return precise::sqrt(-2.0f * precise::log(u1)) * precise::cos(6.2831855f * u2);
}

// helper: mf_tensor_ops
// Metal 4 tensor operations (MetalPerformancePrimitives: matmul2d over tensors and
// cooperative tensors; MSL 4.0, macOS 26)
#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>
using namespace mpp::tensor_ops;

// helper: mf_mma16
// acc += A x B over 16 values of K for one simdgroup's 16 x 16 block of outputs, as 8x8
// simdgroup_matrix products with T operands (half, bfloat or float) and float accumulators:
// A's 16 rows at `a` (`astride` elements a row, K contiguous); B at `b` (`bstride` elements a
// row), KInner:
// B's rows are the block's columns, K contiguous (loaded transposed), else its rows are K.
// acc: the lane's elements (thread_elements()) of the block's four 8x8 fragments, row-major.
// Every lane of the simdgroup calls it together
template <typename T, bool KInner>
inline void mf_mma16(thread float2* acc, const threadgroup T* a, uint astride,
                     const threadgroup T* b, uint bstride) {
    for (uint k = 0; k < 16; k += 8) {
        simdgroup_matrix<T, 8, 8> fa[2], fb[2];
        for (uint i = 0; i < 2; ++i) {
            simdgroup_load(fa[i], a, ulong(astride), ulong2(k, i * 8), false);
            if (KInner) simdgroup_load(fb[i], b, ulong(bstride), ulong2(k, i * 8), true);
            else simdgroup_load(fb[i], b, ulong(bstride), ulong2(i * 8, k), false);
        }
        for (uint f = 0; f < 4; ++f) {
            simdgroup_float8x8 c;
            c.thread_elements() = acc[f];
            simdgroup_multiply_accumulate(c, fa[f / 2], fb[f % 2], c);
            acc[f] = c.thread_elements();
        }
    }
}

// helper: mf_strides
// the strides of a row-major matrix of `stride` elements a row as a Metal 4 tensor takes them
// (dimension 0 innermost): {1, stride}
inline array<int32_t, 2> mf_strides(int32_t stride) {
    return array<int32_t, 2>{1, stride};
}

// helper: mf_segsum
// The combine of the segmented cumsum (cummax's gradient): a (the earlier elements) then b
// (the later ones), each a pair (flags, sum) over a run of elements: flags bit 0 says the
// run's last element ends a segment, bit 1 that an element before its last does; sum, the
// elements after the run's last end before its last element, through the last. The later
// run's sum continues the earlier one's unless a segment ends between them (the earlier
// run's last element) or inside the later run. Associative; (0, 0) its left identity (every
// scan combines its running value on the left).
inline float2 mf_segsum(float2 a, float2 b) {
    const bool mf_inside = b[0] >= 2.0f;
    const bool mf_after = (uint(a[0]) & 1u) != 0u;
    const float mf_sum = (mf_inside || mf_after) ? b[1] : a[1] + b[1];
    const uint mf_any = (mf_inside || a[0] != 0.0f) ? 2u : 0u;
    return float2(float((uint(b[0]) & 1u) | mf_any), mf_sum);
}
