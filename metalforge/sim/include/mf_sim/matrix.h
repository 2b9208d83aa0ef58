// metalforge.sim — <metal_simdgroup_matrix>: simdgroup_matrix<T, 8, 8> and its operations.
//
// A simdgroup_matrix is owned by the 32 lanes of a simdgroup together: each lane holds two
// elements (thread_elements()), and every operation is a simdgroup collective that all lanes
// reach together, as on Metal.  The element <-> lane mapping is the one Apple GPUs use (and
// that MLX's steel kernels rely on when they touch thread_elements() directly):
//
//     q = lane / 4
//     row = (q & 4) + (lane / 2) % 4          // 0..7
//     col = (q & 2) * 2 + (lane % 2) * 2      // 0, 2, 4, 6
//     thread_elements() = { M[row][col], M[row][col + 1] }
//
// Lane bits: bit 0 -> column bit 1, bits 1-2 -> row bits 0-1, bit 3 -> column bit 2, bit 4 ->
// row bit 2, so the 32 lanes cover the 64 elements exactly once.  Products accumulate in float
// (in row-major k order) and are rounded once to the destination's element type.  Only 8x8
// matrices exist (Metal's only shape).
#ifndef MF_SIM_MATRIX_H
#define MF_SIM_MATRIX_H

#include "simd.h"

namespace mf {
namespace simd {

MF_INLINE constexpr int mat_row(unsigned lane) { return int(((lane / 4) & 4) + (lane / 2) % 4); }
MF_INLINE constexpr int mat_col(unsigned lane) { return int(((lane / 4) & 2) * 2 + (lane % 2) * 2); }

// The calling lane's index in its simdgroup, as a collective (every lane learns its own).
inline void lane_ids(CollSlot* const* l, unsigned) {
  for (unsigned i = 0; i < 32; ++i)
    if (l[i]) put(l[i], uint16_t(i));
}

template <class A, class B, class C>
struct MmaIn {
  A a[2];
  B b[2];
  C c[2];
};

// D = A * B + C over the 8x8 matrices spread across the lanes.  Lanes that do not take part
// contribute zeros (Metal requires all 32; the result is then undefined there).
template <class D, class A, class B, class C>
void mma(CollSlot* const* l, unsigned) {
  float a[8][8] = {}, b[8][8] = {}, c[8][8] = {};
  for (unsigned i = 0; i < 32; ++i) {
    if (!l[i]) continue;
    const auto& v = in<MmaIn<A, B, C>>(l[i]);
    const int r = mat_row(i), k = mat_col(i);
    for (int e = 0; e < 2; ++e) {
      a[r][k + e] = float(v.a[e]);
      b[r][k + e] = float(v.b[e]);
      c[r][k + e] = float(v.c[e]);
    }
  }
  for (unsigned i = 0; i < 32; ++i) {
    if (!l[i]) continue;
    const int r = mat_row(i), k = mat_col(i);
    ::metal::vec<D, 2> out;
    for (int e = 0; e < 2; ++e) {
      float acc = c[r][k + e];
      for (int j = 0; j < 8; ++j) acc += a[r][j] * b[j][k + e];
      out[e] = D(acc);
    }
    put(l[i], out);
  }
}

}  // namespace simd
}  // namespace mf

#include "site.h"  // MF_SITE_PARAMS, MF_SITE (#undef below)

namespace metal {

template <class T, int Cols, int Rows>
struct simdgroup_matrix {
  static_assert(Cols == 8 && Rows == 8, "metalforge.sim: simdgroup_matrix is 8x8 only (as Metal)");
  typedef T value_type;
  vec<T, 2> mf_elems;

  simdgroup_matrix() = default;
  // A diagonal matrix with `d` on the diagonal (Metal's converting constructor).
  explicit simdgroup_matrix(T d, MF_SITE_PARAMS) {
    const uint16_t lane = ::mf::simd::run<uint16_t>(0, &::mf::simd::lane_ids, 0,
                                                    "simdgroup_matrix", MF_SITE);
    const int r = ::mf::simd::mat_row(lane), c = ::mf::simd::mat_col(lane);
    mf_elems[0] = r == c ? d : T(0);
    mf_elems[1] = r == c + 1 ? d : T(0);
  }
  MF_INLINE vec<T, 2>& thread_elements() { return mf_elems; }
  MF_INLINE const vec<T, 2>& thread_elements() const { return mf_elems; }
};

typedef simdgroup_matrix<half, 8, 8> simdgroup_half8x8;
typedef simdgroup_matrix<bfloat, 8, 8> simdgroup_bfloat8x8;
typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;

template <class T, int C, int R>
inline simdgroup_matrix<T, C, R> make_filled_simdgroup_matrix(T value) {
  simdgroup_matrix<T, C, R> m;
  m.mf_elems = vec<T, 2>(value);
  return m;
}

// Element (row, col) of a matrix stored at `p` with `elements_per_row`, starting at
// matrix_origin (x = column, y = row); transposed: element (col, row) of the stored matrix.
template <class T>
MF_INLINE size_t mf_mat_offset(int row, int col, ulong stride, ulong2 origin, bool transpose) {
  const ulong y = origin.y + ulong(transpose ? col : row);
  const ulong x = origin.x + ulong(transpose ? row : col);
  return size_t(y * stride + x);
}

template <class T, class U, int C, int R>
inline void simdgroup_load(simdgroup_matrix<T, C, R>& d, const U* src,
                           ulong elements_per_row = C, ulong2 matrix_origin = ulong2(0, 0),
                           bool transpose_matrix = false, MF_SITE_PARAMS) {
  const uint16_t lane = ::mf::simd::run<uint16_t>(0, &::mf::simd::lane_ids, 0, "simdgroup_load",
                                                  MF_SITE);
  const int r = ::mf::simd::mat_row(lane), c = ::mf::simd::mat_col(lane);
  for (int e = 0; e < 2; ++e)
    d.mf_elems[e] = T(src[mf_mat_offset<T>(r, c + e, elements_per_row, matrix_origin,
                                           transpose_matrix)]);
}

template <class T, class U, int C, int R>
inline void simdgroup_store(const simdgroup_matrix<T, C, R>& a, U* dst,
                            ulong elements_per_row = C, ulong2 matrix_origin = ulong2(0, 0),
                            bool transpose_matrix = false, MF_SITE_PARAMS) {
  const uint16_t lane = ::mf::simd::run<uint16_t>(0, &::mf::simd::lane_ids, 0,
                                                  "simdgroup_store", MF_SITE);
  const int r = ::mf::simd::mat_row(lane), c = ::mf::simd::mat_col(lane);
  for (int e = 0; e < 2; ++e)
    dst[mf_mat_offset<T>(r, c + e, elements_per_row, matrix_origin, transpose_matrix)] =
        U(a.mf_elems[e]);
}

template <class D, class A, class B, class C, int N>
inline void simdgroup_multiply_accumulate(simdgroup_matrix<D, N, N>& d,
                                          const simdgroup_matrix<A, N, N>& a,
                                          const simdgroup_matrix<B, N, N>& b,
                                          const simdgroup_matrix<C, N, N>& c, MF_SITE_PARAMS) {
  ::mf::simd::MmaIn<A, B, C> in;
  for (int e = 0; e < 2; ++e) {
    in.a[e] = a.mf_elems[e];
    in.b[e] = b.mf_elems[e];
    in.c[e] = c.mf_elems[e];
  }
  d.mf_elems = ::mf::simd::run<vec<D, 2>>(in, &::mf::simd::mma<D, A, B, C>, 0,
                                          "simdgroup_multiply_accumulate", MF_SITE);
}

template <class D, class A, class B, int N>
inline void simdgroup_multiply(simdgroup_matrix<D, N, N>& d,
                               const simdgroup_matrix<A, N, N>& a,
                               const simdgroup_matrix<B, N, N>& b, MF_SITE_PARAMS) {
  simdgroup_multiply_accumulate(d, a, b, make_filled_simdgroup_matrix<D, N, N>(D(0)), MF_SITE);
}

template <class T, int N>
inline simdgroup_matrix<T, N, N> operator*(const simdgroup_matrix<T, N, N>& a,
                                           const simdgroup_matrix<T, N, N>& b) {
  simdgroup_matrix<T, N, N> d;
  simdgroup_multiply(d, a, b);
  return d;
}

template <class T, int N>
inline simdgroup_matrix<T, N, N> operator+(const simdgroup_matrix<T, N, N>& a,
                                           const simdgroup_matrix<T, N, N>& b) {
  simdgroup_matrix<T, N, N> d;
  d.mf_elems = a.mf_elems + b.mf_elems;
  return d;
}

}  // namespace metal

#undef MF_SITE_PARAMS
#undef MF_SITE

#endif  // MF_SIM_MATRIX_H
