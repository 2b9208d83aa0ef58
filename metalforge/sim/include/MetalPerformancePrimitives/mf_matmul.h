// metalforge.sim — how mpp::tensor_ops::matmul2d runs here (mf_mpp::engine, which matmul2d
// derives from; the descriptor, the factories and the checks are the surface shared with the
// cuda shim, mf_surface.h) and the cooperative tensor: Metal 4's matrix product over tensors
// and cooperative tensors, run by one simdgroup (execution_simdgroup) or S of them
// (execution_simdgroups<S>).
//
// Semantics modelled: destination (M x N) = left (M x K) * right (K x N), plus the destination's
// previous value in mode::multiply_accumulate; a transposed operand is stored K x M / N x K.
// Products and sums are in float, in k order, rounded once to the destination's type; float
// operands with relaxed_precision are first rounded to TF32 (10 mantissa bits), as MLX says the
// hardware does.  `run` is a collective: every thread of the executing simdgroup(s) reaches it
// at the same call site (a simdgroup / threadgroup barrier checks that; anything else is
// reported as divergence).  Tensor operands outside their views' extents read as zero and
// destination elements outside them are not stored.  Cooperative tensors start filled with NaN,
// so an accumulator used before it is set shows.
// Refused at compile time (static_assert), as Apple's compiler does: M or N not a multiple of
// 16 (an (8, 8) descriptor), half mixed with bfloat, unsupported element types.  The
// simulator's own limits: cooperative-tensor operands only with execution_simdgroup; int8 and
// narrower operand types are not modelled.
#ifndef MF_SIM_MPP_MATMUL_H
#define MF_SIM_MPP_MATMUL_H

namespace mf {
namespace mpp {

using ::mf_mpp::bare;
using ::mf_mpp::check_types;
using ::mf_mpp::elem_t;
using ::mf_mpp::is_coop;
using ::mf_mpp::is_tensor;

// An operand's value as the matrix unit multiplies it.
template <class T, bool Relaxed>
MF_INLINE float operand(T v) {
  float f = float(v);
  if constexpr (std::is_same<T, float>::value && Relaxed) {   // TF32: 10 mantissa bits, RNE
    uint32_t u = __builtin_bit_cast(uint32_t, f);
    if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0xfffu + ((u >> 13) & 1u)) & ~0x1fffu;
    f = __builtin_bit_cast(float, u);
  }
  return f;
}

// A cooperative tensor: R x C elements (Geometry) of type T spread over the threads of S
// simdgroups; this thread's share in mf_e.
template <class T, int R, int C, int S>
struct coop {
  using Geo = Geometry<R, C, S>;
  using value_type = T;
  using element_type = T;
  static constexpr bool mf_is_coop = true;
  T mf_e[Geo::kCapacity];

  coop() {
    for (int i = 0; i < Geo::kCapacity; ++i) mf_e[i] = T(__builtin_nanf(""));
  }
  MF_INLINE T& operator[](int i) { return mf_e[MF_CHECKED(i, Geo::kCapacity)]; }
  MF_INLINE const T& operator[](int i) const { return mf_e[MF_CHECKED(i, Geo::kCapacity)]; }
  static constexpr uint16_t get_capacity() { return uint16_t(Geo::kCapacity); }
  MF_INLINE Elem mf_at(int i) const {
    return Geo::at(group_sg_now<S>(), lane_now(), int(MF_CHECKED(i, Geo::kCapacity)));
  }
  MF_INLINE bool is_valid_element(int i) const { return mf_at(i).valid; }
  // (column, row) of element i in the matrix, as tensor coordinates (dimension 0 innermost).
  MF_INLINE ::metal::array<int, 2> get_multidimensional_index(int i) const {
    const Elem e = mf_at(i);
    return ::metal::array<int, 2>{{e.col, e.row}};
  }
  template <class Tn>
  void load(const Tn& t) {
    for (int i = 0; i < Geo::kCapacity; ++i) {
      const Elem e = mf_at(i);
      mf_e[i] = e.valid ? T(t.mf_get(e.col, e.row)) : T(0);
    }
  }
  template <class Tn>
  void store(const Tn& t) const {
    for (int i = 0; i < Geo::kCapacity; ++i) {
      const Elem e = mf_at(i);
      if (e.valid) t.mf_set(e.col, e.row, mf_e[i]);
    }
  }
};

// What one lane brings to the collective product: its shares of the three matrices.
struct RunIn {
  const void* a;
  const void* b;
  void* c;
};

// The product over the lanes of one simdgroup (execution_simdgroup with cooperative tensors):
// gather every lane's left and right elements, multiply, and write each lane's destination
// elements back into its cooperative tensor.
template <class CA, class CB, class CC, int M, int N, int K, bool TL, bool TR, bool Relaxed,
          bool Acc>
void product(CollSlot* const* l, unsigned) {
  using A = typename CA::value_type;
  using B = typename CB::value_type;
  float* a = new float[M * K]();
  float* b = new float[K * N]();
  for (unsigned lane = 0; lane < 32; ++lane) {
    if (!l[lane]) continue;
    const RunIn& in = *static_cast<const RunIn*>(l[lane]->in);
    const CA& ca = *static_cast<const CA*>(in.a);
    const CB& cb = *static_cast<const CB*>(in.b);
    for (int i = 0; i < CA::Geo::kCapacity; ++i) {
      const Elem e = CA::Geo::at(0, lane, i);
      if (e.valid) a[TL ? e.col * K + e.row : e.row * K + e.col] = operand<A, Relaxed>(ca.mf_e[i]);
    }
    for (int i = 0; i < CB::Geo::kCapacity; ++i) {
      const Elem e = CB::Geo::at(0, lane, i);
      if (e.valid) b[TR ? e.col * N + e.row : e.row * N + e.col] = operand<B, Relaxed>(cb.mf_e[i]);
    }
  }
  for (unsigned lane = 0; lane < 32; ++lane) {
    if (!l[lane]) continue;
    CC& cc = *static_cast<CC*>(static_cast<const RunIn*>(l[lane]->in)->c);
    for (int i = 0; i < CC::Geo::kCapacity; ++i) {
      const Elem e = CC::Geo::at(0, lane, i);
      if (!e.valid) continue;
      float acc = Acc ? float(cc.mf_e[i]) : 0.0f;
      for (int k = 0; k < K; ++k) acc += a[e.row * K + k] * b[k * N + e.col];
      cc.mf_e[i] = typename CC::value_type(acc);
    }
  }
  delete[] a;
  delete[] b;
}

}  // namespace mpp
}  // namespace mf

#define MF_MPP_SITE_PARAMS                                                  \
  ::mf::Loc mf_file = __builtin_FILE(), unsigned mf_line = __builtin_LINE(), \
            unsigned mf_col = MF_COLUMN()

namespace mf_mpp {

// matmul2d's execution here (mpp::tensor_ops::matmul2d derives from it: mf_surface.h).
template <int M, int N, int K, bool TL, bool TR, bool Relaxed, bool Acc, int S>
struct engine {
  template <class A> using left_coop = ::mf::mpp::coop<A, TL ? K : M, TL ? M : K, S>;
  template <class B> using right_coop = ::mf::mpp::coop<B, TR ? N : K, TR ? K : N, S>;
  template <class C> using dest_coop = ::mf::mpp::coop<C, M, N, S>;

  template <class L, class R, class Dst>
  void run(L&& left, R&& right, Dst&& dest, MF_MPP_SITE_PARAMS) const {
    using namespace ::mf::mpp;
    static_assert(check_types<elem_t<L>, elem_t<R>, elem_t<Dst>>());
    if constexpr (S == 1)
      ::metal::simdgroup_barrier(::metal::mem_flags::mem_none, mf_file.file, mf_line, mf_col);
    else
      ::metal::threadgroup_barrier(::metal::mem_flags::mem_none, mf_file.file, mf_line, mf_col);
    if constexpr (is_tensor<L>::value && is_tensor<R>::value) {
      direct(left, right, dest);
    } else {
      static_assert(check_coop_run<S>());
      collective(left, right, dest, mf_file, mf_line, mf_col);
    }
  }

 private:
  // Both operands in memory: each thread computes its own destination elements.
  template <class L, class R, class Dst>
  static void direct(const L& left, const R& right, Dst& dest) {
    using namespace ::mf::mpp;
    using A = elem_t<L>;
    using B = elem_t<R>;
    using C = elem_t<Dst>;
    const int k_len = K > 0 ? K : int(left.get_extent(TL ? 1 : 0));
    coop<C, M, N, S> out;
    if constexpr (is_coop<Dst>::value) out = dest;
    else if constexpr (Acc) out.load(dest);
    for (int i = 0; i < out.get_capacity(); ++i) {
      const Elem e = out.mf_at(i);
      if (!e.valid) continue;
      float acc = Acc ? float(out.mf_e[i]) : 0.0f;
      for (int k = 0; k < k_len; ++k) {
        const float a = operand<A, Relaxed>(TL ? left.mf_get(e.row, k) : left.mf_get(k, e.row));
        const float b = operand<B, Relaxed>(TR ? right.mf_get(k, e.col) : right.mf_get(e.col, k));
        acc += a * b;
      }
      out.mf_e[i] = C(acc);
    }
    if constexpr (is_coop<Dst>::value) dest = out;
    else out.store(dest);
  }

  // Some operand is a cooperative tensor: one simdgroup collective computes the product.
  template <class L, class R, class Dst>
  void collective(const L& left, const R& right, Dst& dest, ::mf::Loc file, unsigned line,
                  unsigned col) const {
    using namespace ::mf::mpp;
    using A = elem_t<L>;
    using B = elem_t<R>;
    using C = elem_t<Dst>;
    static_assert(check_coop_input<true, K, A, B, C>());
    static_assert(check_coop_input<false, K, A, B, C>());
    auto a = left_coop<A>();
    auto b = right_coop<B>();
    coop<C, M, N, 1> c;
    if constexpr (is_coop<L>::value) a = left; else a.load(left);
    if constexpr (is_coop<R>::value) b = right; else b.load(right);
    if constexpr (is_coop<Dst>::value) c = dest; else if constexpr (Acc) c.load(dest);
    RunIn in{&a, &b, &c};
    ::mf::simd::run<int>(in, &product<decltype(a), decltype(b), decltype(c), M, N, K, TL, TR,
                                      Relaxed, Acc>, 0, "matmul2d::run", file, line, col);
    if constexpr (is_coop<Dst>::value) dest = c; else c.store(dest);
  }
};

}  // namespace mf_mpp

#undef MF_MPP_SITE_PARAMS

#endif  // MF_SIM_MPP_MATMUL_H
