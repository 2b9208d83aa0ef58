// metalforge.sim — simdgroup and quadgroup collectives.
//
// Every collective is a template over the value type T (scalars and
// metal::vec<T, N>), blocks the calling lane in the engine, and is resolved by a
// Resolver instantiated here once no lane of the simdgroup can still run.  The
// participants are the lanes waiting at the same call site; every other lane
// (finished, or waiting elsewhere) is inactive, as on the GPU.
//
// Inactive source lanes (a shuffle reading a lane that does not take part) give
// an all-zero value, which is what Apple GPUs produce in practice (the note in
// torch's c10/metal/reduction_utils.h says so); Metal leaves it undefined.  A
// source lane outside the simdgroup (quadgroup) altogether fails the launch:
// Metal leaves that undefined too and CUDA's shuffles wrap it to another lane,
// so a kernel reading it gives different answers on different GPUs.
#ifndef MF_SIM_SIMD_H
#define MF_SIM_SIMD_H

#include <stdint.h>
#include <string.h>

#include "runtime.h"

namespace mf {

// The file of a call site.  A class type (not const char*) so that a literal 0
// given for a `modulo` argument can never bind to it.
struct Loc {
  const char* file;
  Loc(const char* f) : file(f) {}
};

namespace simd {

template <class T>
inline T zero() {
  T r;
  memset((void*)&r, 0, sizeof r);
  return r;
}
template <class T>
inline const T& in(const CollSlot* s) {
  return *static_cast<const T*>(s->in);
}
template <class T>
inline void put(const CollSlot* s, const T& v) {
  memcpy(s->out, (const void*)&v, sizeof(T));
}

struct Sum { template <class T> static T op(const T& a, const T& b) { return T(a + b); } };
struct Prod { template <class T> static T op(const T& a, const T& b) { return T(a * b); } };
struct Max { template <class T> static T op(const T& a, const T& b) { return T(::metal::max(a, b)); } };
struct Min { template <class T> static T op(const T& a, const T& b) { return T(::metal::min(a, b)); } };
struct And { template <class T> static T op(const T& a, const T& b) { return T(a & b); } };
struct Or { template <class T> static T op(const T& a, const T& b) { return T(a | b); } };
struct Xor { template <class T> static T op(const T& a, const T& b) { return T(a ^ b); } };

// Reduce over the active lanes of each segment (width 32 = simdgroup, 4 = quad).
template <class T, class Op>
void reduce(CollSlot* const* l, unsigned w) {
  for (unsigned base = 0; base < 32; base += w) {
    const CollSlot* first = nullptr;
    T acc = zero<T>();
    for (unsigned i = base; i < base + w; ++i) {
      if (!l[i]) continue;
      acc = first ? Op::op(acc, in<T>(l[i])) : in<T>(l[i]);
      if (!first) first = l[i];
    }
    for (unsigned i = base; i < base + w; ++i)
      if (l[i]) put(l[i], acc);
  }
}

// Prefix over the active lanes with a lower (exclusive) or lower-or-equal
// (inclusive) lane id.  The exclusive prefix of the first active lane is the
// identity (0 for sums, 1 for products).
template <class T, class Op, bool Inclusive, int Identity>
void prefix(CollSlot* const* l, unsigned w) {
  for (unsigned base = 0; base < 32; base += w) {
    T acc = T(Identity);
    for (unsigned i = base; i < base + w; ++i) {
      if (!l[i]) continue;
      T v = in<T>(l[i]);
      if (Inclusive) {
        acc = Op::op(acc, v);
        put(l[i], acc);
      } else {
        put(l[i], acc);
        acc = Op::op(acc, v);
      }
    }
  }
}

template <class T>
inline T lane_value(CollSlot* const* l, int src) {
  if (src < 0 || src >= 32 || !l[src]) return zero<T>();
  return in<T>(l[src]);
}

enum ShuffleKind { BROADCAST, SHUFFLE, XOR, UP, DOWN, ROTATE_UP, ROTATE_DOWN };

template <class T, int Kind>
void shuffle(CollSlot* const* l, unsigned w) {
  for (unsigned i = 0; i < 32; ++i) {
    if (!l[i]) continue;
    unsigned base = i - i % w;
    unsigned own = i % w;
    int64_t a = l[i]->arg;
    T r;
    switch (Kind) {
      case BROADCAST:
      case SHUFFLE:
        if (a >= 0 && a < (int64_t)w) {
          r = lane_value<T>(l, (int)(base + a));
        } else {            // no such lane: undefined on Metal (and CUDA wraps): an error
          r = zero<T>();
          l[i]->stray = a;
        }
        break;
      case XOR: {
        int64_t s = (int64_t)own ^ a;
        r = (s >= 0 && s < (int64_t)w) ? lane_value<T>(l, (int)(base + s)) : in<T>(l[i]);
        break;
      }
      case UP: {  // the lower `delta` lanes keep their own value
        int64_t s = (int64_t)own - a;
        r = s >= 0 ? lane_value<T>(l, (int)(base + s)) : in<T>(l[i]);
        break;
      }
      case ROTATE_UP:
      case ROTATE_DOWN: {  // lane i reads lane (i -/+ delta) mod width
        const int64_t d = ((Kind == ROTATE_UP ? -a : a) % (int64_t)w + w) % w;
        r = lane_value<T>(l, (int)(base + (own + d) % w));
        break;
      }
      default: {  // DOWN: the upper `delta` lanes keep their own value
        int64_t s = (int64_t)own + a;
        r = s < (int64_t)w ? lane_value<T>(l, (int)(base + s)) : in<T>(l[i]);
        break;
      }
    }
    put(l[i], r);
  }
}

// simd_shuffle_and_fill_{up,down}: a funnel shift of `data` and `filling_data`
// within segments of `modulo` lanes (default: the whole simdgroup).  Down:
// lane i reads data from lane i+delta; past the segment's end it reads
// filling_data from lane i+delta-modulo.  Up: lane i reads data from lane
// i-delta; before the segment's start it reads filling_data from lane
// i-delta+modulo.
template <class T, bool Down>
void fill_shuffle(CollSlot* const* l, unsigned w) {
  for (unsigned i = 0; i < 32; ++i) {
    if (!l[i]) continue;
    int64_t m = l[i]->modulo > 0 ? l[i]->modulo : (int64_t)w;
    if (m > 32) m = 32;
    int64_t base = i - i % m, own = i % m, d = l[i]->arg;
    int64_t s = Down ? own + d : own - d;
    T r;
    if (s >= 0 && s < m) {
      r = lane_value<T>(l, (int)(base + s));
    } else {
      int64_t fs = Down ? s - m : s + m;
      int src = (int)(base + fs);
      r = (fs >= 0 && fs < m && l[src]) ? *static_cast<const T*>(l[src]->fill) : zero<T>();
    }
    put(l[i], r);
  }
}

struct VoteBits {
  uint64_t votes, active;
};

inline void ballot(CollSlot* const* l, unsigned w) {
  for (unsigned base = 0; base < 32; base += w) {
    VoteBits b = {0, 0};
    for (unsigned i = base; i < base + w; ++i) {
      if (!l[i]) continue;
      b.active |= uint64_t(1) << i;
      if (in<bool>(l[i])) b.votes |= uint64_t(1) << i;
    }
    for (unsigned i = base; i < base + w; ++i)
      if (l[i]) put(l[i], b);
  }
}

inline void is_first(CollSlot* const* l, unsigned w) {
  for (unsigned base = 0; base < 32; base += w) {
    bool first = true;
    for (unsigned i = base; i < base + w; ++i)
      if (l[i]) {
        put(l[i], first);
        first = false;
      }
  }
}

template <class T>
void broadcast_first(CollSlot* const* l, unsigned w) {
  for (unsigned base = 0; base < 32; base += w) {
    const CollSlot* first = nullptr;
    for (unsigned i = base; i < base + w; ++i)
      if (l[i] && !first) first = l[i];
    for (unsigned i = base; i < base + w; ++i)
      if (l[i]) put(l[i], in<T>(first));
  }
}

template <class R, class T>
inline R run(const T& v, Resolver res, int quad, const char* what, const Loc& loc,
             unsigned line, unsigned col, int64_t arg = 0, const void* fill = nullptr,
             int64_t modulo = 0) {
  R out;
  CollSlot s;
  s.in = &v;
  s.out = &out;
  s.fill = fill;
  s.arg = arg;
  s.modulo = modulo;
  s.resolve = res;
  s.stray = kNoStray;
  mf_rt_collective(&s, quad, what, loc.file, line, col);
  if (s.stray != kNoStray) mf_rt_stray_lane(what, (long long)s.stray, quad ? 4 : 32, loc.file, line);
  return out;
}

}  // namespace simd
}  // namespace mf

#include "site.h"  // MF_SITE_PARAMS, MF_SITE (#undef below)

namespace metal {

// The result of simd_ballot / simd_active_threads_mask: a lane mask.
class simd_vote {
 public:
  typedef uint64_t vote_t;
  constexpr simd_vote() : v_(0), active_(0) {}
  constexpr explicit simd_vote(vote_t v) : v_(v), active_(~vote_t(0)) {}
  constexpr simd_vote(vote_t v, vote_t active) : v_(v), active_(active) {}
  constexpr explicit operator vote_t() const { return v_; }
  constexpr explicit operator bool() const { return v_ != 0; }
  // any(): some active lane voted true; all(): every active lane voted true.
  constexpr bool any() const { return v_ != 0; }
  constexpr bool all() const { return (v_ & active_) == active_; }

 private:
  vote_t v_, active_;
};

// Each collective comes as a simdgroup one (simd_NAME, QUAD 0) and a quadgroup one (quad_NAME,
// QUAD 1): M's two instances.
#define MF_SIMD_QUAD(M, NAME, ...) M(simd_##NAME, __VA_ARGS__, 0) M(quad_##NAME, __VA_ARGS__, 1)

// A collective of one value, `NAME`(data), resolved by the resolver given after QUAD (the
// variadic tail: its template arguments may hold commas)
#define MF_COLLECTIVE(NAME, QUAD, ...)                                                       \
  template <class T>                                                                        \
  inline T NAME(T data, MF_SITE_PARAMS) {                                                   \
    return ::mf::simd::run<T>(data, &__VA_ARGS__, QUAD, #NAME, MF_SITE);                    \
  }

#define MF_REDUCE(NAME, OP, QUAD) MF_COLLECTIVE(NAME, QUAD, ::mf::simd::reduce<T, ::mf::simd::OP>)
MF_SIMD_QUAD(MF_REDUCE, sum, Sum)
MF_SIMD_QUAD(MF_REDUCE, product, Prod)
MF_SIMD_QUAD(MF_REDUCE, max, Max)
MF_SIMD_QUAD(MF_REDUCE, min, Min)
MF_SIMD_QUAD(MF_REDUCE, and, And)
MF_SIMD_QUAD(MF_REDUCE, or, Or)
MF_SIMD_QUAD(MF_REDUCE, xor, Xor)
#undef MF_REDUCE

#define MF_PREFIX(NAME, OP, INCL, ID, QUAD) \
  MF_COLLECTIVE(NAME, QUAD, ::mf::simd::prefix<T, ::mf::simd::OP, INCL, ID>)
MF_SIMD_QUAD(MF_PREFIX, prefix_inclusive_sum, Sum, true, 0)
MF_SIMD_QUAD(MF_PREFIX, prefix_exclusive_sum, Sum, false, 0)
MF_SIMD_QUAD(MF_PREFIX, prefix_inclusive_product, Prod, true, 1)
MF_SIMD_QUAD(MF_PREFIX, prefix_exclusive_product, Prod, false, 1)
#undef MF_PREFIX

#define MF_SHUFFLE(NAME, KIND, QUAD)                                                         \
  template <class T>                                                                        \
  inline T NAME(T data, ushort arg, MF_SITE_PARAMS) {                                     \
    return ::mf::simd::run<T>(data, &::mf::simd::shuffle<T, ::mf::simd::KIND>, QUAD, #NAME, \
                              MF_SITE, arg);                                                \
  }
MF_SIMD_QUAD(MF_SHUFFLE, broadcast, BROADCAST)
MF_SIMD_QUAD(MF_SHUFFLE, shuffle, SHUFFLE)
MF_SIMD_QUAD(MF_SHUFFLE, shuffle_xor, XOR)
MF_SIMD_QUAD(MF_SHUFFLE, shuffle_up, UP)
MF_SIMD_QUAD(MF_SHUFFLE, shuffle_down, DOWN)
MF_SIMD_QUAD(MF_SHUFFLE, shuffle_rotate_up, ROTATE_UP)
MF_SIMD_QUAD(MF_SHUFFLE, shuffle_rotate_down, ROTATE_DOWN)
#undef MF_SHUFFLE

#define MF_FILL(NAME, DOWN, QUAD)                                                            \
  template <class T>                                                                        \
  inline T NAME(T data, T filling_data, ushort delta, MF_SITE_PARAMS) {                   \
    return ::mf::simd::run<T>(data, &::mf::simd::fill_shuffle<T, DOWN>, QUAD, #NAME,        \
                              MF_SITE, delta, &filling_data, 0);                            \
  }                                                                                         \
  template <class T>                                                                        \
  inline T NAME(T data, T filling_data, ushort delta, ushort modulo, MF_SITE_PARAMS) {   \
    return ::mf::simd::run<T>(data, &::mf::simd::fill_shuffle<T, DOWN>, QUAD, #NAME,        \
                              MF_SITE, delta, &filling_data, (int64_t)modulo);              \
  }
MF_SIMD_QUAD(MF_FILL, shuffle_and_fill_up, false)
MF_SIMD_QUAD(MF_FILL, shuffle_and_fill_down, true)
#undef MF_FILL

MF_COLLECTIVE(simd_broadcast_first, 0, ::mf::simd::broadcast_first<T>)
MF_COLLECTIVE(quad_broadcast_first, 1, ::mf::simd::broadcast_first<T>)
#undef MF_COLLECTIVE

inline simd_vote simd_ballot(bool expr, MF_SITE_PARAMS) {
  auto b = ::mf::simd::run<::mf::simd::VoteBits>(expr, &::mf::simd::ballot, 0, "simd_ballot",
                                                  MF_SITE);
  return simd_vote(b.votes, b.active);
}
inline simd_vote simd_active_threads_mask(MF_SITE_PARAMS) {
  auto b = ::mf::simd::run<::mf::simd::VoteBits>(true, &::mf::simd::ballot, 0,
                                                  "simd_active_threads_mask", MF_SITE);
  return simd_vote(b.votes, b.active);
}
// simd_all / simd_any and the quad ones: the And / Or of the participating lanes' `expr`
#define MF_VOTE(NAME, OP, QUAD)                                                              \
  inline bool NAME(bool expr, MF_SITE_PARAMS) {                                             \
    return ::mf::simd::run<bool>(expr, &::mf::simd::reduce<bool, ::mf::simd::OP>, QUAD, #NAME, \
                                 MF_SITE);                                                  \
  }
MF_SIMD_QUAD(MF_VOTE, all, And)
MF_SIMD_QUAD(MF_VOTE, any, Or)
#undef MF_VOTE
inline bool simd_is_first(MF_SITE_PARAMS) {
  return ::mf::simd::run<bool>(true, &::mf::simd::is_first, 0, "simd_is_first", MF_SITE);
}

}  // namespace metal

#undef MF_SIMD_QUAD
#undef MF_SITE_PARAMS
#undef MF_SITE

#endif  // MF_SIM_SIMD_H
