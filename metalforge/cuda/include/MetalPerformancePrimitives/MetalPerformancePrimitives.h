// metalforge.cuda — <MetalPerformancePrimitives/MetalPerformancePrimitives.h>: Metal 4's
// matmul2d over tensors and cooperative tensors, on tensor cores.  The surface (extents,
// tensor and its slices, execution_simdgroups, matmul2d_descriptor, matmul2d's factories and
// checks) is the one the simulator uses too: mf_surface.h beside this file, see
// docs/reference/simulator.md; what is here is the hardware underneath (mf_mpp::engine, the
// `run` matmul2d derives) and the cooperative-tensor layout.
//
// - half x half and bfloat x bfloat products run as mma.sync.aligned.m16n8k16.row.col.f32
//   (exact products, float accumulation), one m16n8k16 step per 16 x 8 x 16 block; float
//   operands multiply in float on the ALUs (exact fp32), tensor operands only, except under
//   a descriptor's relaxed_precision: then as mma.sync.aligned.m16n8k8 with TF32 operands
//   (each value rounded to 10 mantissa bits, cvt.rna), float accumulation.
// - Cooperative-tensor layout (CUDA's own "GPU family"): each 16 x 16 fragment of an operand
//   holds 8 elements a lane in mma.sync's register order; with g = lane / 4, t = lane % 4,
//   element e is at row g + 8 * ((e / 2) % 2), column 2t + e % 2 + 8 * (e / 4) of the
//   fragment, where the rows are M for the left operand and the destination and N for the
//   right one (so a right cooperative tensor is laid out on B transposed), the columns K or N.
//   Fragments are numbered row-major and dealt to the executing warps as in the simulator.
//   get_multidimensional_index reports positions in the stored tensor, as on Metal, so code
//   that uses it (or load / store) is right everywhere; code that assumes M5's layout is not.
// - A run is a warp-collective (mma.sync): every lane of the executing warp(s) reaches it.
// - Fast path (`ldsm_run`): a run by one warp (execution_simdgroup) on half/bfloat tensors in
//   threadgroup memory, each with its K or its rows contiguous (stride 1), the other stride a
//   multiple of 8 elements, 16-byte aligned, the whole M x K / N x K inside the views: each
//   16 values of K, every 16 x 16 operand fragment is read once with ldmatrix (.x4; .trans
//   where the rows are the contiguous dimension) and multiplied with every fragment of the
//   other operand, into the destination's registers (a destination cooperative tensor of the
//   op's own type is used in place). Bank conflicts are the staged layout's business: 8
//   rows read by one ldmatrix phase hit distinct banks where the row stride in bytes is an
//   odd multiple of 16 (metalforge pads its staged rows: schedule/matrix/tile.py). Anything
//   else (partial views, device memory, float operands) takes the element-wise path.
// - Fast path (`coop_ldsm_run`): a run by one warp whose left operand is a half/bfloat
//   cooperative tensor (registers kept across runs: mma.sync's A fragments as they are, in
//   frag_coord order) and whose right one is a threadgroup tensor as above (ldmatrix), into a
//   destination cooperative tensor of the op's own type.
// - Cooperative-tensor operands with execution_simdgroups<N> (N > 1) and float cooperative
//   operands are refused (static_assert).
#pragma once

#if __METAL_VERSION__ < 400
#error "MetalPerformancePrimitives needs Metal 4.0 (macOS 26): this source is compiled for an older Metal (__METAL_VERSION__ < 400)"
#endif
#if __cplusplus < 202002L
#error "metalforge.cuda: MetalPerformancePrimitives needs C++20 (matmul2d takes its descriptor as a template argument): compile with --std=c++20"
#endif

// Every loop over a cooperative tensor's elements or fragments is unrolled (compile-time trip
// counts): an element array indexed at run time would live in local memory, and with it the
// destination the kernel keeps across K.
#if defined(MF_CUDA_HOST_CHECK)
#define MF_UNROLL
#else
#define MF_UNROLL _Pragma("unroll")
#endif

// The shared surface (extents, tensor, execution_simdgroups, matmul2d_descriptor, matmul2d's
// factories and checks): mf_surface.h, in this backend's spelling.
#define MF_MPP_FN MF_D
#define MF_MPP_HOT MF_D
#define MF_MPP_AT(i, n) (i)
#define MF_MPP_WHO "metalforge.cuda"
namespace mf_mpp {
template <class T, ::metal::size_t N> using index_array = T[N];
}  // namespace mf_mpp
#include <MetalPerformancePrimitives/mf_surface.h>
#undef MF_MPP_FN
#undef MF_MPP_HOT
#undef MF_MPP_AT
#undef MF_MPP_WHO

namespace mf_mpp {
using ::metal::enable_if;
using ::metal::is_same;

MF_D unsigned lane() { return ::metal::mf_simd::lane(); }
MF_D unsigned warp() {
  return (threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) >> 5;
}
// element e (0..7) of a 16 x 16 fragment in lane l: mma.sync's A / C register order
MF_D void frag_coord(unsigned l, int e, int& row, int& col) {
  row = int(l >> 2) + 8 * ((e >> 1) & 1);
  col = 2 * int(l & 3u) + (e & 1) + 8 * (e >> 2);
}

// A cooperative tensor over a Rows x Cols matrix (rows M or N, columns K or N), S warps;
// Swap: the stored tensor's dimension 0 is the row (a transposed left, an untransposed right).
template <class T, int Rows, int Cols, int S, bool Swap>
struct coop {
  static_assert(Rows % 16 == 0 && Cols % 16 == 0 && Rows > 0 && Cols > 0, "16 x 16 fragments");
  static constexpr int kFragCols = Cols / 16;
  static constexpr int kFrags = (Rows / 16) * kFragCols;
  static constexpr int kSlots = (kFrags + S - 1) / S;
  static constexpr int kCapacity = kSlots * 8;
  static constexpr bool mf_is_coop = true;
  typedef T value_type;
  typedef T element_type;
  T mf_e[kCapacity];

  MF_D T& operator[](int i) { return mf_e[i]; }
  MF_D const T& operator[](int i) const { return mf_e[i]; }
  static constexpr unsigned short get_capacity() { return (unsigned short)kCapacity; }
  MF_D Elem mf_at(int i) const {
    const int f = (i / 8) * S + int(S == 1 ? 0u : warp() % unsigned(S));
    Elem r{0, 0, f < kFrags};
    frag_coord(lane(), i % 8, r.row, r.col);
    r.row += (f / kFragCols) * 16;
    r.col += (f % kFragCols) * 16;
    return r;
  }
  MF_D bool is_valid_element(int i) const { return mf_at(i).valid; }
  struct index2 {
    int v[2];
    MF_D int operator[](int d) const { return v[d]; }
  };
  MF_D index2 get_multidimensional_index(int i) const {
    const Elem e = mf_at(i);
    return Swap ? index2{{e.row, e.col}} : index2{{e.col, e.row}};
  }
  template <class Tn>
  MF_D void load(const Tn& t) {
    MF_UNROLL for (int i = 0; i < kCapacity; ++i) {
      const Elem e = mf_at(i);
      mf_e[i] = !e.valid ? T(0) : Swap ? T(t.mf_get(e.row, e.col)) : T(t.mf_get(e.col, e.row));
    }
  }
  template <class Tn>
  MF_D void store(const Tn& t) const {
    MF_UNROLL for (int i = 0; i < kCapacity; ++i) {
      const Elem e = mf_at(i);
      if (!e.valid) continue;
      if (Swap) t.mf_set(e.row, e.col, mf_e[i]);
      else t.mf_set(e.col, e.row, mf_e[i]);
    }
  }
};

template <class T> MF_D unsigned pack(T lo, T hi) {
  union { T t[2]; unsigned u; } c;
  c.t[0] = lo;
  c.t[1] = hi;
  return c.u;
}
MF_D void mma(float* d, const unsigned* a, unsigned b0, unsigned b1, half) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
               "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
MF_D void mma(float* d, const unsigned* a, unsigned b0, unsigned b1, bfloat) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
               "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// a float rounded to TF32 (10 mantissa bits, to nearest, ties away), as mma.sync reads it
MF_D unsigned to_tf32(float x) {
  unsigned u;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(u) : "f"(x));
  return u;
}
MF_D void mma_tf32(float* d, const unsigned* a, unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, "
               "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// whether p points into shared (threadgroup) memory
MF_D bool is_shared(const void* p) {
  unsigned r;
  asm("{\n .reg .pred q;\n isspacep.shared q, %1;\n selp.u32 %0, 1, 0, q;\n}"
      : "=r"(r) : "l"(p));
  return r != 0u;
}
MF_D unsigned shared_address(const void* p) {
  unsigned a;
  asm("{\n .reg .u64 s;\n cvta.to.shared.u64 s, %1;\n cvt.u32.u64 %0, s;\n}"
      : "=r"(a) : "l"(p));
  return a;
}
// four 8 x 8 matrices of 16-bit values; lane l gives the address of row l % 8 of matrix l / 8.
// Trans: the rows in memory are the matrices' columns.
template <bool Trans>
MF_D void ldsm4(unsigned* r, unsigned addr) {
  if constexpr (Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// One 16 x 16 destination fragment += (16 x 16 of A) * (16 x 16 of B^T): 8 elements a lane
// each, in frag_coord order; two m16n8k16 steps (the two 8-column halves).
template <class T>
MF_D void frag_mma(float* acc, const T* a, const T* b) {
  const unsigned ar[4] = {pack(a[0], a[1]), pack(a[2], a[3]), pack(a[4], a[5]), pack(a[6], a[7])};
  MF_UNROLL for (int h = 0; h < 2; ++h) {
    float d[4] = {acc[4 * h], acc[4 * h + 1], acc[4 * h + 2], acc[4 * h + 3]};
    mma(d, ar, pack(b[2 * h], b[2 * h + 1]), pack(b[4 + 2 * h], b[5 + 2 * h]), T());
    MF_UNROLL for (int j = 0; j < 4; ++j) acc[4 * h + j] = d[j];
  }
}

// matmul2d's execution here (mpp::tensor_ops::matmul2d derives from it: mf_surface.h).
template <int M, int N, int K, bool TL, bool TR, bool Relaxed, bool Acc, int S>
struct engine {
  typedef coop<float, M, N, S, false> acc_t;
  template <class A> using left_coop = coop<A, M, (K > 0 ? K : 16), S, TL>;
  template <class B> using right_coop = coop<B, N, (K > 0 ? K : 16), S, !TR>;
  template <class C> using dest_coop = coop<C, M, N, S, false>;

  template <class L, class R, class Dst>
  MF_D void run(L&& left, R&& right, Dst&& dest) const {
    using namespace mf_mpp;
    typedef elem_t<L> A;
    typedef elem_t<R> B;
    typedef elem_t<Dst> C;
    static_assert(check_types<A, B, C>());
    if constexpr (is_tensor<L>::value && is_tensor<R>::value && S == 1 &&
                  mf_mpp::is_f16<A> && is_same<A, B>::value) {
      if (ldsm_ok(left, right)) {
        if constexpr (is_same<bare<Dst>, acc_t>::value) {
          if constexpr (!Acc) {
            MF_UNROLL for (int i = 0; i < acc_t::kCapacity; ++i) dest.mf_e[i] = 0.0f;
          }
          ldsm_run(dest.mf_e, left, right);
        } else {
          acc_t acc;
          start(acc, dest);
          ldsm_run(acc.mf_e, left, right);
          finish(acc, dest);
        }
        return;
      }
    }
    if constexpr (is_coop<L>::value && is_tensor<R>::value && S == 1 && K > 0 &&
                  mf_mpp::is_f16<A> && is_same<A, B>::value &&
                  is_same<bare<Dst>, acc_t>::value) {
      if (ldsm_view(right, RightKIn, N, K)) {
        if constexpr (!Acc) {
          MF_UNROLL for (int i = 0; i < acc_t::kCapacity; ++i) dest.mf_e[i] = 0.0f;
        }
        coop_ldsm_run(dest.mf_e, left, right);
        return;
      }
    }
    acc_t acc;
    start(acc, dest);
    if constexpr (is_tensor<L>::value && is_tensor<R>::value) {
      if constexpr (mf_mpp::is_f16<A> && is_same<A, B>::value) tensor_mma(acc, left, right);
      else if constexpr (Relaxed && is_same<A, float>::value && is_same<B, float>::value)
        tensor_tf32(acc, left, right);
      else scalar(acc, left, right);
    } else {
      static_assert(check_coop_run<S>());
      static_assert(mf_mpp::is_f16<A> && is_same<A, B>::value,
                    "metalforge.cuda: cooperative-tensor operands are half or bfloat");
      static_assert(check_coop_input<true, K, A, B, C>());
      static_assert(check_coop_input<false, K, A, B, C>());
      auto a = left_coop<A>();
      auto b = right_coop<B>();
      if constexpr (is_coop<L>::value) a = left; else a.load(left);
      if constexpr (is_coop<R>::value) b = right; else b.load(right);
      __syncwarp(0xffffffffu);
      MF_UNROLL for (int f = 0; f < acc_t::kFrags; ++f) {
        const int fi = f / acc_t::kFragCols, fj = f % acc_t::kFragCols;
        MF_UNROLL for (int kb = 0; kb < K / 16; ++kb)
          frag_mma(&acc.mf_e[f * 8], &a.mf_e[(fi * (K / 16) + kb) * 8],
                   &b.mf_e[(fj * (K / 16) + kb) * 8]);
      }
    }
    finish(acc, dest);
  }

 private:
  template <class Dst>
  MF_D static void start(acc_t& acc, const Dst& dest) {
    using namespace mf_mpp;
    MF_UNROLL for (int i = 0; i < acc_t::kCapacity; ++i) acc.mf_e[i] = 0.0f;
    if constexpr (!Acc) return;
    if constexpr (is_coop<Dst>::value) {
      MF_UNROLL for (int i = 0; i < acc_t::kCapacity; ++i) acc.mf_e[i] = float(dest.mf_e[i]);
    } else {
      acc.load(dest);
    }
  }
  template <class Dst>
  MF_D static void finish(const acc_t& acc, Dst& dest) {
    using namespace mf_mpp;
    if constexpr (is_coop<Dst>::value) {
      MF_UNROLL for (int i = 0; i < acc_t::kCapacity; ++i)
        dest.mf_e[i] = typename bare<Dst>::value_type(acc.mf_e[i]);
    } else {
      acc.store(dest);
    }
  }
  // left value (m, k) and right value (k, n), zero outside the views
  template <class L> MF_D static auto lv(const L& t, int m, int k) {
    return TL ? t.mf_get(m, k) : t.mf_get(k, m);
  }
  template <class R> MF_D static auto rv(const R& t, int k, int n) {
    return TR ? t.mf_get(k, n) : t.mf_get(n, k);
  }
  // The stored tensor's dimensions: a left operand (k, m) (TL: (m, k)), a right one (k, n)
  // (TR; else (n, k)). KIn: K is dimension 0, the contiguous one.
  static constexpr bool LeftKIn = !TL, RightKIn = TR;
  template <class T>
  MF_D static bool ldsm_view(const T& t, bool k_in, int rows, int k_len) {
    const int k_dim = k_in ? 0 : 1;
    const long lead = long(t.mf_stride[1]);
    return mf_mpp::is_shared(t.mf_data) && t.mf_stride[0] == 1 && lead % 8 == 0 &&
           (reinterpret_cast<unsigned long long>(t.mf_data) & 15ull) == 0 &&
           long(t.mf_lim[k_dim]) >= k_len && long(t.mf_lim[1 - k_dim]) >= rows;
  }
  template <class L, class R>
  MF_D static bool ldsm_ok(const L& left, const R& right) {
    const int k_len = K > 0 ? K : int(left.get_extent(TL ? 1 : 0));
    return k_len % 16 == 0 && ldsm_view(left, LeftKIn, M, k_len) &&
           ldsm_view(right, RightKIn, N, k_len);
  }
  // The shared address lane l gives ldmatrix for the 16 x 16 fragment at rows r0 (M or N),
  // values k0 of K: matrix j = l / 8 is rows r0 + 8 (j % 2), values k0 + 8 (j / 2) (the
  // register order of mma.sync's A fragment); for a right operand (`b_order`) rows
  // r0 + 8 (j / 2), values k0 + 8 (j % 2): registers {0, 1} and {2, 3} are then the B
  // operands of its two 8-column halves as they are, in adjacent registers (no moves).
  template <class T>
  MF_D static unsigned ldsm_address(const T& t, bool k_in, unsigned base, int r0, int k0,
                                    bool b_order = false) {
    const unsigned l = mf_mpp::lane();
    const int i = int(l & 7u);
    const int j = b_order ? int(((l >> 3) & 1u) << 1 | (l >> 4)) : int(l >> 3);
    const long lead = long(t.mf_stride[1]);
    const long at = k_in ? long(r0 + 8 * (j & 1) + i) * lead + (k0 + 8 * (j >> 1))
                         : long(k0 + 8 * (j >> 1) + i) * lead + (r0 + 8 * (j & 1));
    return base + unsigned(at) * 2u;
  }
  // acc (the destination's registers, fragments row-major, frag_coord order) += left x right
  template <class L, class R>
  MF_D static void ldsm_run(float* acc, const L& left, const R& right) {
    typedef mf_mpp::elem_t<L> A;
    constexpr int FM = M / 16, FN = N / 16;
    const int k_len = K > 0 ? K : int(left.get_extent(TL ? 1 : 0));
    const unsigned lb = mf_mpp::shared_address(left.mf_data);
    const unsigned rb = mf_mpp::shared_address(right.mf_data);
    for (int k0 = 0; k0 < k_len; k0 += 16) {
      unsigned a[FM][4], b[2][4];
      MF_UNROLL for (int i = 0; i < FM; ++i)
        mf_mpp::ldsm4<!LeftKIn>(a[i], ldsm_address(left, LeftKIn, lb, 16 * i, k0));
      mf_mpp::ldsm4<!RightKIn>(b[0], ldsm_address(right, RightKIn, rb, 0, k0, true));
      MF_UNROLL for (int j = 0; j < FN; ++j) {
        if (j + 1 < FN)
          mf_mpp::ldsm4<!RightKIn>(b[(j + 1) & 1],
                                   ldsm_address(right, RightKIn, rb, 16 * (j + 1), k0, true));
        MF_UNROLL for (int i = 0; i < FM; ++i) {
          MF_UNROLL for (int h = 0; h < 2; ++h)
            mf_mpp::mma(&acc[(i * FN + j) * 8 + 4 * h], a[i], b[j & 1][2 * h],
                        b[j & 1][2 * h + 1], A());
        }
      }
    }
  }
  // acc += left (a cooperative tensor: its fragments' registers are mma.sync's A operands
  // as they are) x right (threadgroup memory, read with ldmatrix as in ldsm_run)
  template <class L, class R>
  MF_D static void coop_ldsm_run(float* acc, const L& left, const R& right) {
    typedef mf_mpp::elem_t<L> A;
    constexpr int FM = M / 16, FN = N / 16, KB = K / 16;
    static_assert(!TL, "metalforge.cuda: a cooperative left operand of a transposed left");
    const unsigned rb = mf_mpp::shared_address(right.mf_data);
    MF_UNROLL for (int kb = 0; kb < KB; ++kb) {
      unsigned ar[FM][4], b[2][4];
      MF_UNROLL for (int i = 0; i < FM; ++i) {
        const A* a = &left.mf_e[(i * KB + kb) * 8];
        MF_UNROLL for (int p = 0; p < 4; ++p) ar[i][p] = mf_mpp::pack(a[2 * p], a[2 * p + 1]);
      }
      mf_mpp::ldsm4<!RightKIn>(b[0], ldsm_address(right, RightKIn, rb, 0, 16 * kb, true));
      MF_UNROLL for (int j = 0; j < FN; ++j) {
        if (j + 1 < FN)
          mf_mpp::ldsm4<!RightKIn>(b[(j + 1) & 1],
                                   ldsm_address(right, RightKIn, rb, 16 * (j + 1), 16 * kb, true));
        MF_UNROLL for (int i = 0; i < FM; ++i) {
          MF_UNROLL for (int h = 0; h < 2; ++h)
            mf_mpp::mma(&acc[(i * FN + j) * 8 + 4 * h], ar[i], b[j & 1][2 * h],
                        b[j & 1][2 * h + 1], A());
        }
      }
    }
  }
  template <class L, class R>
  MF_D static void tensor_mma(acc_t& acc, const L& left, const R& right) {
    typedef mf_mpp::elem_t<L> A;
    const int k_len = K > 0 ? K : int(left.get_extent(TL ? 1 : 0));
    const unsigned l = mf_mpp::lane();
    MF_UNROLL for (int s = 0; s < acc_t::kSlots; ++s) {
      const mf_mpp::Elem base = acc.mf_at(s * 8);
      if (!base.valid) continue;                       // the same for the whole warp
      const int m0 = base.row - int(l >> 2), n0 = base.col - 2 * int(l & 3u);
      for (int k0 = 0; k0 < k_len; k0 += 16) {
        A a[8], b[8];
        MF_UNROLL for (int e = 0; e < 8; ++e) {
          int r, c;
          mf_mpp::frag_coord(l, e, r, c);
          a[e] = A(lv(left, m0 + r, k0 + c));
          b[e] = A(rv(right, k0 + c, n0 + r));
        }
        mf_mpp::frag_mma(&acc.mf_e[s * 8], a, b);
      }
    }
  }
  // float tensors under relaxed_precision: per 8 values of K, mma.sync m16n8k8's TF32 A
  // fragment of each 16 rows (rows g, g + 8; values t, t + 4) and B fragment of each 8
  // columns (values t, t + 4; column g), read element by element (zero outside the views),
  // rounded to TF32, each read once a step where one warp runs the op (fragments row-major,
  // as ldsm_run's), else per destination fragment
  template <class L, class R>
  MF_D static void tensor_tf32(acc_t& acc, const L& left, const R& right) {
    using mf_mpp::to_tf32;
    const int k_len = K > 0 ? K : int(left.get_extent(TL ? 1 : 0));
    const unsigned l = mf_mpp::lane();
    const int g = int(l >> 2), t = int(l & 3u);
    if constexpr (S == 1 && M % 16 == 0 && N % 16 == 0) {
      constexpr int FM = M / 16, FN = 2 * (N / 16);
      for (int k0 = 0; k0 < k_len; k0 += 8) {
        unsigned a[FM][4], b[FN][2];
        MF_UNROLL for (int i = 0; i < FM; ++i) {
          MF_UNROLL for (int q = 0; q < 4; ++q)
            a[i][q] = to_tf32(float(lv(left, 16 * i + g + 8 * (q & 1), k0 + t + 4 * (q >> 1))));
        }
        MF_UNROLL for (int j = 0; j < FN; ++j) {
          MF_UNROLL for (int q = 0; q < 2; ++q)
            b[j][q] = to_tf32(float(rv(right, k0 + t + 4 * q, 8 * j + g)));
        }
        MF_UNROLL for (int i = 0; i < FM; ++i) {
          MF_UNROLL for (int j = 0; j < FN; ++j)
            mf_mpp::mma_tf32(&acc.mf_e[(i * (FN / 2) + j / 2) * 8 + 4 * (j % 2)], a[i],
                             b[j][0], b[j][1]);
        }
      }
      return;
    }
    MF_UNROLL for (int s = 0; s < acc_t::kSlots; ++s) {
      const mf_mpp::Elem base = acc.mf_at(s * 8);
      if (!base.valid) continue;                       // the same for the whole warp
      const int m0 = base.row - g, n0 = base.col - 2 * t;
      for (int k0 = 0; k0 < k_len; k0 += 8) {
        unsigned a[4];
        MF_UNROLL for (int q = 0; q < 4; ++q)
          a[q] = to_tf32(float(lv(left, m0 + g + 8 * (q & 1), k0 + t + 4 * (q >> 1))));
        MF_UNROLL for (int h = 0; h < 2; ++h)
          mf_mpp::mma_tf32(&acc.mf_e[s * 8 + 4 * h], a,
                           to_tf32(float(rv(right, k0 + t, n0 + 8 * h + g))),
                           to_tf32(float(rv(right, k0 + t + 4, n0 + 8 * h + g))));
      }
    }
  }
  template <class L, class R>
  MF_D static void scalar(acc_t& acc, const L& left, const R& right) {
    const int k_len = K > 0 ? K : int(left.get_extent(TL ? 1 : 0));
    MF_UNROLL for (int i = 0; i < acc_t::kCapacity; ++i) {
      const mf_mpp::Elem e = acc.mf_at(i);
      if (!e.valid) continue;
      float sum = acc.mf_e[i];
      for (int k = 0; k < k_len; ++k)
        sum += float(lv(left, e.row, k)) * float(rv(right, k, e.col));
      acc.mf_e[i] = sum;
    }
  }
};

}  // namespace mf_mpp
