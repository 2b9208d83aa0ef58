// metalforge — the surface of Metal 4's tensor operations that the simulator
// (metalforge/sim/include/MetalPerformancePrimitives/) and the cuda shim (this folder) share,
// so that its semantics are one: extents / dextents, tensor<T, Extents, tensor_inline> (a view
// of device or threadgroup memory: a pointer, extents and strides) with its indexing and
// slicing, execution_simdgroups<N>, matmul2d_descriptor, matmul2d's cooperative-tensor
// factories, and the compile-time checks with their messages.  What differs stays with each
// backend: the cooperative tensor (its element layout) and the execution of `run`, given as
// mf_mpp::engine<M, N, K, transpose_left, transpose_right, relaxed_precision, accumulate, S>
// (declared here, defined by the backend after including this header), which matmul2d derives
// from; `engine<...>::left_coop<A>`, `right_coop<B>`, `dest_coop<C>` are its cooperative types.
//
// It lives in the cuda tree so that NVRTC finds it as <MetalPerformancePrimitives/mf_surface.h>
// through its one include path; the simulator includes it by relative path and hashes it into
// its compile cache's key (sim/toolchain.py: KEY_HEADERS).
//
// Dimension 0 is the innermost (contiguous) one: a row-major M x K matrix is a tensor of
// extents (K, M).  Beyond Metal, every view remembers how far the memory it was made from
// reaches (`mf_lim`, = its extents, cut by each slice): a slice that reaches past its parent's
// extents (a partial tile at the edge of a matrix) reads zeros there and stores nothing there.
// Not modelled: tensor_handle (an MTLTensor bound from the host), tensor_offset, and element
// access t[i, j] (C++23 syntax).
//
// Written in the form both backends accept: no std:: (NVRTC has none; metal::'s traits are in
// both), no address-space keywords (the element type T carries the caller's).  The backend
// defines, before including it:
//   MF_MPP_FN          what precedes every function here (cuda: MF_D; sim: nothing)
//   MF_MPP_HOT         what precedes the element accessors (cuda: MF_D; sim: MF_INLINE)
//   MF_MPP_AT(i, n)    index i of n, checked where the backend checks (sim: MF_CHECKED)
//   MF_MPP_WHO         the backend's name in its own messages ("metalforge.sim")
//   mf_mpp::index_array<T, N>  a tensor's strides and limits (sim: metal::array, checked)
#ifndef MF_MPP_SURFACE_H
#define MF_MPP_SURFACE_H

namespace metal {

constexpr size_t dynamic_extent = size_t(-1);

namespace mf_mpp_detail {
template <size_t... S> struct seq {};
template <size_t N, size_t... S> struct make_seq : make_seq<N - 1, N - 1, S...> {};
template <size_t... S> struct make_seq<0, S...> { using type = seq<S...>; };
// an index type's unsigned counterpart (std::make_unsigned, which NVRTC lacks)
template <class I> struct unsigned_of { using type = I; };
template <> struct unsigned_of<char> { using type = unsigned char; };
template <> struct unsigned_of<signed char> { using type = unsigned char; };
template <> struct unsigned_of<short> { using type = unsigned short; };
template <> struct unsigned_of<int> { using type = unsigned int; };
template <> struct unsigned_of<long> { using type = unsigned long; };
template <> struct unsigned_of<long long> { using type = unsigned long long; };
}  // namespace mf_mpp_detail

template <class I, size_t... E>
struct extents {
  using index_type = I;
  using size_type = typename mf_mpp_detail::unsigned_of<I>::type;
  using rank_type = size_t;
  static constexpr size_t mf_rank = sizeof...(E);
  static constexpr size_t mf_ndyn = (size_t(E == dynamic_extent) + ... + size_t(0));
  I mf_e[mf_rank > 0 ? mf_rank : 1];

  MF_MPP_FN static constexpr size_t rank() { return mf_rank; }
  MF_MPP_FN static constexpr size_t rank_dynamic() { return mf_ndyn; }
  MF_MPP_FN static constexpr size_t static_extent(size_t r) {
    constexpr size_t s[] = {E..., 0};
    return s[r];
  }
  MF_MPP_FN constexpr extents() : mf_e{I(E == dynamic_extent ? 0 : E)...} {}
  // Either every extent or only the dynamic ones, in order (as std::extents).
  template <class... J, class = typename enable_if<(sizeof...(J) > 0) &&
                                                   (sizeof...(J) == mf_rank ||
                                                    sizeof...(J) == mf_ndyn)>::type>
  MF_MPP_FN constexpr extents(J... v) : mf_e{} {
    const I vals[] = {I(v)...};
    size_t d = 0;
    for (size_t r = 0; r < mf_rank; ++r) {
      if (sizeof...(J) == mf_rank) mf_e[r] = vals[r];
      else mf_e[r] = static_extent(r) == dynamic_extent ? vals[d++] : I(static_extent(r));
    }
  }
  MF_MPP_FN constexpr I extent(size_t r) const { return mf_e[MF_MPP_AT(r, mf_rank)]; }
};

namespace mf_mpp_detail {
template <class I, class Seq> struct dext;
template <class I, size_t... S> struct dext<I, seq<S...>> {
  using type = extents<I, ((void)S, dynamic_extent)...>;
};
}  // namespace mf_mpp_detail

template <class I, size_t R>
using dextents = typename mf_mpp_detail::dext<I, typename mf_mpp_detail::make_seq<R>::type>::type;

struct tensor_inline {};
struct tensor_handle {};
struct tensor_offset {};

template <class T, class Ext, class Kind = tensor_handle, class... Tags>
struct tensor {
  static_assert(is_same<Kind, tensor_inline>::value,
                MF_MPP_WHO ": only tensor_inline tensors (views of device or threadgroup "
                "memory made in the kernel) are supported; tensor_handle (an MTLTensor bound "
                "from the host) and tensor_offset are not");
  using element_type = T;
  using value_type = typename remove_cv<T>::type;
  using extents_type = Ext;
  using index_type = typename Ext::index_type;
  using data_handle_type = T*;
  static constexpr size_t mf_rank = Ext::rank();
  static constexpr bool mf_is_tensor = true;

  T* mf_data;
  Ext mf_ext;
  ::mf_mpp::index_array<index_type, mf_rank> mf_stride;
  ::mf_mpp::index_array<index_type, mf_rank> mf_lim;

  MF_MPP_FN tensor(T* p, Ext e) : mf_data(p), mf_ext(e) {
    index_type s = 1;
    for (size_t r = 0; r < mf_rank; ++r) {
      mf_stride[r] = s;
      s *= e.extent(r);
      mf_lim[r] = e.extent(r);
    }
  }
  template <class J>
  MF_MPP_FN tensor(T* p, Ext e, array<J, mf_rank> strides) : mf_data(p), mf_ext(e) {
    for (size_t r = 0; r < mf_rank; ++r) {
      mf_stride[r] = index_type(strides[r]);
      mf_lim[r] = e.extent(r);
    }
  }

  MF_MPP_FN static constexpr size_t get_rank() { return mf_rank; }
  MF_MPP_FN index_type get_extent(size_t r) const { return mf_ext.extent(r); }
  MF_MPP_FN index_type get_stride(size_t r) const { return mf_stride[r]; }
  MF_MPP_FN const Ext& get_extents() const { return mf_ext; }
  MF_MPP_FN T* get_data_pointer() const { return mf_data; }

  // Element (i0, i1) of a 2-D tensor: zero outside the memory the view reaches.
  MF_MPP_HOT value_type mf_get(long i0, long i1) const {
    if (i0 < 0 || i1 < 0 || i0 >= long(mf_lim[0]) || i1 >= long(mf_lim[1])) return value_type(0);
    return mf_data[i0 * long(mf_stride[0]) + i1 * long(mf_stride[1])];
  }
  template <class V>
  MF_MPP_HOT void mf_set(long i0, long i1, V v) const {
    if (i0 < 0 || i1 < 0 || i0 >= long(mf_lim[0]) || i1 >= long(mf_lim[1])) return;
    mf_data[i0 * long(mf_stride[0]) + i1 * long(mf_stride[1])] = value_type(v);
  }

  template <class Out, class... O>
  MF_MPP_FN Out mf_slice(Out out, O... offs) const {
    const long o[] = {long(offs)...};
    long shift = 0;
    for (size_t r = 0; r < mf_rank; ++r) {
      shift += o[r] * long(mf_stride[r]);
      out.mf_stride[r] = mf_stride[r];
      const long rest = long(mf_lim[r]) - o[r];
      const long want = long(out.mf_ext.extent(r));
      out.mf_lim[r] = index_type(rest < 0 ? 0 : (rest < want ? rest : want));
    }
    out.mf_data = mf_data + shift;
    return out;
  }
  // slice(o0, o1, ...): the view from those offsets to the end of each extent.
  template <class... O, class = typename enable_if<sizeof...(O) == mf_rank>::type>
  MF_MPP_FN auto slice(O... offs) const {
    using Out = tensor<T, dextents<index_type, mf_rank>, tensor_inline>;
    const long o[] = {long(offs)...};
    index_type e[mf_rank];
    for (size_t r = 0; r < mf_rank; ++r) {
      const long rest = long(mf_ext.extent(r)) - o[r];
      e[r] = index_type(rest < 0 ? 0 : rest);
    }
    return mf_slice(mf_make<Out>(e, typename mf_mpp_detail::make_seq<mf_rank>::type{}), offs...);
  }
  // slice<E0, E1, ...>(o0, o1, ...): a view of static extents E from those offsets.
  template <size_t E0, size_t... Es, class... O,
            class = typename enable_if<sizeof...(O) == mf_rank &&
                                       1 + sizeof...(Es) == mf_rank>::type>
  MF_MPP_FN auto slice(O... offs) const {
    using Out = tensor<T, extents<index_type, E0, Es...>, tensor_inline>;
    return mf_slice(Out(mf_data, extents<index_type, E0, Es...>()), offs...);
  }

 private:
  template <class Out, size_t... R>
  MF_MPP_FN Out mf_make(const index_type* e, mf_mpp_detail::seq<R...>) const {
    return Out(mf_data, typename Out::extents_type(e[R]...));
  }
  template <class, class, class, class...>
  friend struct tensor;
};

template <int N>
struct execution_simdgroups {
  static_assert(N > 0, "execution_simdgroups<N>: N > 0");
  static constexpr int mf_count = N;
};
using execution_simdgroup = execution_simdgroups<1>;

}  // namespace metal

namespace mf_mpp {

template <class T>
using bare = typename ::metal::remove_cv<typename ::metal::remove_reference<T>::type>::type;
template <class...> struct voider { using type = void; };

template <class X, class = void> struct is_tensor { static constexpr bool value = false; };
template <class X> struct is_tensor<X, typename voider<decltype(bare<X>::mf_is_tensor)>::type> {
  static constexpr bool value = true;
};
template <class X, class = void> struct is_coop { static constexpr bool value = false; };
template <class X> struct is_coop<X, typename voider<decltype(bare<X>::mf_is_coop)>::type> {
  static constexpr bool value = true;
};
// The element type of an operand given as a type: a tensor, a cooperative tensor or a scalar.
template <class X, class = void> struct elem_of { using type = bare<X>; };
template <class X> struct elem_of<X, typename voider<typename bare<X>::value_type>::type> {
  using type = typename bare<X>::value_type;
};
template <class X> using elem_t = typename elem_of<X>::type;

template <class T>
constexpr bool is_f16 = ::metal::is_same<T, half>::value || ::metal::is_same<T, bfloat>::value;
template <class T> constexpr bool is_operand = is_f16<T> || ::metal::is_same<T, float>::value;

// The element types of a product: left A, right B, destination C.
template <class A, class B, class C>
constexpr bool check_types() {
  using ::metal::is_same;
  static_assert(!((is_same<A, half>::value && is_same<B, bfloat>::value) ||
                  (is_same<A, bfloat>::value && is_same<B, half>::value)),
                "matmul2d: the left operand is half and the right bfloat (or the reverse): "
                "both operands of a tensor op are one 16-bit float type; convert one of them");
  static_assert(is_operand<A> && is_operand<B>,
                "matmul2d: operands are half, bfloat or float here (" MF_MPP_WHO " does not "
                "model int8 or narrower operand types)");
  static_assert(is_operand<C>, "matmul2d: the destination is float, half or bfloat");
  return true;
}

// A cooperative input operand (Left: the left one) of a product with K values of K.
template <bool Left, int K, class A, class B, class C>
constexpr bool check_coop_input() {
  static_assert(check_types<A, B, C>());
  static_assert(!Left || K > 0, "matmul2d: a cooperative left operand needs a static K");
  static_assert(Left || K > 0, "matmul2d: a cooperative right operand needs a static K");
  return true;
}

// A run whose operands are not both tensors, by S simdgroups.
template <int S>
constexpr bool check_coop_run() {
  static_assert(S == 1, MF_MPP_WHO ": cooperative-tensor operands need execution_simdgroup; "
                        "give execution_simdgroups<N> tensors");
  return true;
}

// Where element i of a cooperative tensor is: (row, column) of its matrix, and whether the
// element exists (the fragments need not divide evenly among the simdgroups).
struct Elem {
  int row, col;
  bool valid;
};

template <int M, int N, int K, bool TL, bool TR, bool Relaxed, bool Acc, int S>
struct engine;

}  // namespace mf_mpp

namespace mpp {
namespace tensor_ops {

struct matmul2d_descriptor {
  enum class mode { multiply, multiply_accumulate };
  int m, n, k;
  bool transpose_left, transpose_right, relaxed_precision;
  mode matmul_mode;
  constexpr matmul2d_descriptor(int m_, int n_, int k_ = int(::metal::dynamic_extent),
                                bool transpose_left_ = false, bool transpose_right_ = false,
                                bool relaxed_precision_ = false, mode mode_ = mode::multiply)
      : m(m_), n(n_), k(k_), transpose_left(transpose_left_),
        transpose_right(transpose_right_), relaxed_precision(relaxed_precision_),
        matmul_mode(mode_) {}
};

// destination (M x N) = left (M x K) * right (K x N) (+ the destination, multiply_accumulate);
// a transposed operand is stored K x M / N x K.  `run` is the backend's (mf_mpp::engine).
template <matmul2d_descriptor D, class Exec>
struct matmul2d
    : ::mf_mpp::engine<D.m, D.n, D.k, D.transpose_left, D.transpose_right, D.relaxed_precision,
                       D.matmul_mode == matmul2d_descriptor::mode::multiply_accumulate,
                       Exec::mf_count> {
  static constexpr int S = Exec::mf_count;
  static constexpr int M = D.m, N = D.n, K = D.k;
  static constexpr bool TL = D.transpose_left, TR = D.transpose_right;
  static constexpr bool Relaxed = D.relaxed_precision;
  static constexpr bool Acc = D.matmul_mode == matmul2d_descriptor::mode::multiply_accumulate;
  using mf_engine = ::mf_mpp::engine<M, N, K, TL, TR, Relaxed, Acc, S>;
  static_assert(M > 0 && N > 0 && M % 16 == 0 && N % 16 == 0,
                "matmul2d_descriptor: M and N must be multiples of 16 (an 8 x 8 descriptor "
                "does not compile on Metal; use (16, 32, 16)-style tiles)");
  static_assert(K == -1 || (K > 0 && K % 16 == 0),
                "matmul2d_descriptor: K is a multiple of 16, or dynamic_extent");

  template <class A, class B, class C>
  MF_MPP_FN auto get_left_input_cooperative_tensor() const {
    static_assert(::mf_mpp::check_coop_input<true, K, A, B, C>());
    return typename mf_engine::template left_coop<A>();
  }
  template <class A, class B, class C>
  MF_MPP_FN auto get_right_input_cooperative_tensor() const {
    static_assert(::mf_mpp::check_coop_input<false, K, A, B, C>());
    return typename mf_engine::template right_coop<B>();
  }
  template <class L, class R, class C>
  MF_MPP_FN auto get_destination_cooperative_tensor() const {
    static_assert(::mf_mpp::check_types<::mf_mpp::elem_t<L>, ::mf_mpp::elem_t<R>, C>());
    return typename mf_engine::template dest_coop<C>();
  }
  // The form that names the op's type first: get_destination_cooperative_tensor<decltype(op),
  // L, R, C>().
  template <class Op, class L, class R, class C>
  MF_MPP_FN auto get_destination_cooperative_tensor() const {
    return get_destination_cooperative_tensor<L, R, C>();
  }
};

}  // namespace tensor_ops
}  // namespace mpp

#endif  // MF_MPP_SURFACE_H
