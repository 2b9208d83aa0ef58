// metalforge.sim — MSL 4's tensor types, as far as Metal 4 tensor operations use them:
// extents / dextents, and tensor<T, Extents, tensor_inline>, a view of device or threadgroup
// memory (a pointer, extents and strides).  Dimension 0 is the innermost (contiguous) one: a
// row-major M x K matrix is a tensor of extents (K, M).
//
// Beyond Metal, every view remembers how far the memory it was made from reaches (`mf_lim`,
// = its extents, cut by each slice): a slice that reaches past its parent's extents (a partial
// tile at the edge of a matrix) reads zeros there and stores nothing there.
// Not modelled: tensor_handle (an MTLTensor bound from the host), tensor_offset, and element
// access t[i, j] (C++23 syntax).
#ifndef MF_SIM_MPP_TENSOR_H
#define MF_SIM_MPP_TENSOR_H

namespace metal {

constexpr size_t dynamic_extent = size_t(-1);

template <class I, size_t... E>
struct extents {
  using index_type = I;
  using size_type = std::make_unsigned_t<I>;
  using rank_type = size_t;
  static constexpr size_t mf_rank = sizeof...(E);
  static constexpr size_t mf_ndyn = (size_t(E == dynamic_extent) + ... + size_t(0));
  I mf_e[mf_rank > 0 ? mf_rank : 1];

  static constexpr size_t rank() { return mf_rank; }
  static constexpr size_t rank_dynamic() { return mf_ndyn; }
  static constexpr size_t static_extent(size_t r) {
    constexpr size_t s[] = {E..., 0};
    return s[r];
  }
  constexpr extents() : mf_e{I(E == dynamic_extent ? 0 : E)...} {}
  // Either every extent or only the dynamic ones, in order (as std::extents).
  template <class... J, class = std::enable_if_t<(sizeof...(J) > 0) &&
                                                 (sizeof...(J) == mf_rank ||
                                                  sizeof...(J) == mf_ndyn)>>
  constexpr extents(J... v) : mf_e{} {
    const I vals[] = {I(v)...};
    size_t d = 0;
    for (size_t r = 0; r < mf_rank; ++r) {
      if (sizeof...(J) == mf_rank) mf_e[r] = vals[r];
      else mf_e[r] = static_extent(r) == dynamic_extent ? vals[d++] : I(static_extent(r));
    }
  }
  constexpr I extent(size_t r) const { return mf_e[MF_CHECKED(r, mf_rank)]; }
};

namespace mf_tensor_detail {
template <class I, class Seq>
struct dext;
template <class I, size_t... S>
struct dext<I, std::index_sequence<S...>> {
  using type = extents<I, ((void)S, dynamic_extent)...>;
};
}  // namespace mf_tensor_detail

template <class I, size_t R>
using dextents = typename mf_tensor_detail::dext<I, std::make_index_sequence<R>>::type;

struct tensor_inline {};
struct tensor_handle {};
struct tensor_offset {};

template <class T, class Ext, class Kind = tensor_handle, class... Tags>
struct tensor {
  static_assert(std::is_same<Kind, tensor_inline>::value,
                "metalforge.sim: only tensor_inline tensors (views of device or threadgroup "
                "memory made in the kernel) are modelled; tensor_handle (an MTLTensor bound "
                "from the host) and tensor_offset are not");
  using element_type = T;
  using value_type = std::remove_cv_t<T>;
  using extents_type = Ext;
  using index_type = typename Ext::index_type;
  using data_handle_type = T*;
  static constexpr size_t mf_rank = Ext::rank();
  static constexpr bool mf_is_tensor = true;

  T* mf_data;
  Ext mf_ext;
  array<index_type, mf_rank> mf_stride;
  array<index_type, mf_rank> mf_lim;

  tensor(T* p, Ext e) : mf_data(p), mf_ext(e) {
    index_type s = 1;
    for (size_t r = 0; r < mf_rank; ++r) {
      mf_stride[r] = s;
      s *= e.extent(r);
      mf_lim[r] = e.extent(r);
    }
  }
  template <class J>
  tensor(T* p, Ext e, array<J, mf_rank> strides) : mf_data(p), mf_ext(e) {
    for (size_t r = 0; r < mf_rank; ++r) {
      mf_stride[r] = index_type(strides[r]);
      mf_lim[r] = e.extent(r);
    }
  }

  static constexpr size_t get_rank() { return mf_rank; }
  index_type get_extent(size_t r) const { return mf_ext.extent(r); }
  index_type get_stride(size_t r) const { return mf_stride[r]; }
  const Ext& get_extents() const { return mf_ext; }
  T* get_data_pointer() const { return mf_data; }

  // Element (i0, i1) of a 2-D tensor: zero outside the memory the view reaches.
  MF_INLINE value_type mf_get(long i0, long i1) const {
    if (i0 < 0 || i1 < 0 || i0 >= long(mf_lim[0]) || i1 >= long(mf_lim[1])) return value_type(0);
    return mf_data[i0 * long(mf_stride[0]) + i1 * long(mf_stride[1])];
  }
  template <class V>
  MF_INLINE void mf_set(long i0, long i1, V v) const {
    if (i0 < 0 || i1 < 0 || i0 >= long(mf_lim[0]) || i1 >= long(mf_lim[1])) return;
    mf_data[i0 * long(mf_stride[0]) + i1 * long(mf_stride[1])] = value_type(v);
  }

  template <class Out, class... O>
  Out mf_slice(Out out, O... offs) const {
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
  template <class... O, class = std::enable_if_t<sizeof...(O) == mf_rank>>
  auto slice(O... offs) const {
    using Out = tensor<T, dextents<index_type, mf_rank>, tensor_inline>;
    const long o[] = {long(offs)...};
    index_type e[mf_rank];
    for (size_t r = 0; r < mf_rank; ++r) {
      const long rest = long(mf_ext.extent(r)) - o[r];
      e[r] = index_type(rest < 0 ? 0 : rest);
    }
    return mf_slice(mf_make<Out>(e, std::make_index_sequence<mf_rank>{}), offs...);
  }
  // slice<E0, E1, ...>(o0, o1, ...): a view of static extents E from those offsets.
  template <size_t E0, size_t... Es, class... O,
            class = std::enable_if_t<sizeof...(O) == mf_rank && 1 + sizeof...(Es) == mf_rank>>
  auto slice(O... offs) const {
    using Out = tensor<T, extents<index_type, E0, Es...>, tensor_inline>;
    return mf_slice(Out(mf_data, extents<index_type, E0, Es...>()), offs...);
  }

 private:
  template <class Out, size_t... R>
  Out mf_make(const index_type* e, std::index_sequence<R...>) const {
    return Out(mf_data, typename Out::extents_type(e[R]...));
  }
  template <class, class, class, class...>
  friend struct tensor;
};

}  // namespace metal

#endif  // MF_SIM_MPP_TENSOR_H
