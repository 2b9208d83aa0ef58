// metalforge.sim — metal::matrix<T, C, R> and floatCxR / halfCxR (C columns of R rows, column
// major, each column a vec<T, R>: the sizes and layout of MSL's), with the MSL operators
// (m[c] is column c; m * v, v * m, m * m, +, -, scalar *) and transpose / determinant.
#ifndef MF_SIM_MATRICES_H
#define MF_SIM_MATRICES_H

#include "vec.h"

namespace metal {

template <class T, int C, int R>
struct matrix {
  vec<T, R> columns[C];

  matrix() = default;
  // a diagonal matrix: `float3x3(1.0f)` is the identity
  MF_INLINE constexpr explicit matrix(T d) : columns{} {
    for (int i = 0; i < (C < R ? C : R); ++i) columns[i][i] = d;
  }
  // from C columns
  template <class... V, std::enable_if_t<sizeof...(V) == C && (C > 1) &&
                                         (std::is_convertible<V, vec<T, R>>::value && ...),
                                         int> = 0>
  MF_INLINE constexpr matrix(const V&... c) : columns{vec<T, R>(c)...} {}
  // from C * R scalars, column by column
  template <class... S, std::enable_if_t<sizeof...(S) == C * R && (C * R > 2) &&
                                         (std::is_arithmetic<S>::value && ...), int> = 0>
  MF_INLINE constexpr matrix(S... s) : columns{} {
    const T v[] = {T(s)...};
    for (int i = 0; i < C * R; ++i) columns[i / R][i % R] = v[i];
  }
  MF_INLINE constexpr vec<T, R>& operator[](int c) { return columns[MF_CHECKED(c, C)]; }
  MF_INLINE constexpr const vec<T, R>& operator[](int c) const { return columns[MF_CHECKED(c, C)]; }
};

template <class T, int C, int R>
MF_INLINE matrix<T, C, R> operator+(const matrix<T, C, R>& a, const matrix<T, C, R>& b) {
  matrix<T, C, R> m;
  for (int c = 0; c < C; ++c) m.columns[c] = a.columns[c] + b.columns[c];
  return m;
}
template <class T, int C, int R>
MF_INLINE matrix<T, C, R> operator-(const matrix<T, C, R>& a, const matrix<T, C, R>& b) {
  matrix<T, C, R> m;
  for (int c = 0; c < C; ++c) m.columns[c] = a.columns[c] - b.columns[c];
  return m;
}
template <class T, int C, int R>
MF_INLINE matrix<T, C, R> operator*(const matrix<T, C, R>& a, T s) {
  matrix<T, C, R> m;
  for (int c = 0; c < C; ++c) m.columns[c] = a.columns[c] * s;
  return m;
}
template <class T, int C, int R>
MF_INLINE matrix<T, C, R> operator*(T s, const matrix<T, C, R>& a) { return a * s; }
// matrix * column vector: a vec<T, R>
template <class T, int C, int R>
MF_INLINE vec<T, R> operator*(const matrix<T, C, R>& a, const vec<T, C>& v) {
  vec<T, R> r(T(0));
  for (int c = 0; c < C; ++c) r = r + a.columns[c] * v[c];
  return r;
}
// row vector * matrix: a vec<T, C>
template <class T, int C, int R>
MF_INLINE vec<T, C> operator*(const vec<T, R>& v, const matrix<T, C, R>& a) {
  vec<T, C> r;
  for (int c = 0; c < C; ++c) r[c] = dot(v, a.columns[c]);
  return r;
}
template <class T, int K, int C, int R>
MF_INLINE matrix<T, C, R> operator*(const matrix<T, K, R>& a, const matrix<T, C, K>& b) {
  matrix<T, C, R> m;
  for (int c = 0; c < C; ++c) m.columns[c] = a * b.columns[c];
  return m;
}

template <class T, int C, int R>
MF_INLINE matrix<T, R, C> transpose(const matrix<T, C, R>& a) {
  matrix<T, R, C> m;
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < R; ++r) m.columns[r][c] = a.columns[c][r];
  return m;
}

namespace detail {
template <class T, int N>
MF_INLINE T mf_minor(const matrix<T, N, N>& a, int col, int row) {
  matrix<T, N - 1, N - 1> m;
  for (int c = 0, mc = 0; c < N; ++c) {
    if (c == col) continue;
    for (int r = 0, mr = 0; r < N; ++r)
      if (r != row) m.columns[mc][mr++] = a.columns[c][r];
    ++mc;
  }
  return determinant(m);
}
}  // namespace detail

template <class T>
MF_INLINE T determinant(const matrix<T, 2, 2>& a) {
  return a.columns[0][0] * a.columns[1][1] - a.columns[1][0] * a.columns[0][1];
}
template <class T, int N, std::enable_if_t<(N > 2), int> = 0>
MF_INLINE T determinant(const matrix<T, N, N>& a) {
  T d = T(0);
  for (int c = 0; c < N; ++c) {
    const T term = a.columns[c][0] * detail::mf_minor(a, c, 0);
    d = (c % 2) ? T(d - term) : T(d + term);
  }
  return d;
}

#define MF_SIM_MATRIX_TYPEDEFS(T)                                                                \
  typedef matrix<T, 2, 2> T##2x2; typedef matrix<T, 2, 3> T##2x3; typedef matrix<T, 2, 4> T##2x4; \
  typedef matrix<T, 3, 2> T##3x2; typedef matrix<T, 3, 3> T##3x3; typedef matrix<T, 3, 4> T##3x4; \
  typedef matrix<T, 4, 2> T##4x2; typedef matrix<T, 4, 3> T##4x3; typedef matrix<T, 4, 4> T##4x4;
MF_SIM_MATRIX_TYPEDEFS(float)
MF_SIM_MATRIX_TYPEDEFS(half)
#undef MF_SIM_MATRIX_TYPEDEFS

}  // namespace metal

#define MF_SIM_MATRIX_USING(T)                                                                   \
  using metal::T##2x2; using metal::T##2x3; using metal::T##2x4; using metal::T##3x2;            \
  using metal::T##3x3; using metal::T##3x4; using metal::T##4x2; using metal::T##4x3;            \
  using metal::T##4x4;
MF_SIM_MATRIX_USING(float)
MF_SIM_MATRIX_USING(half)
#undef MF_SIM_MATRIX_USING

#endif  // MF_SIM_MATRICES_H
