// metalforge.sim — the threadgroup-memory race detector (engine side; included by engine.cpp).
//
// What it finds: two threads of one threadgroup touch the same threadgroup-memory granule (an
// element's scalar: 4 bytes of a float or float4 array, 2 of a half array) and at least one
// of them writes, with nothing between them that orders the two accesses.  On a GPU the
// outcome then depends on scheduling (a thread reads the old or the new value; one of two
// writes wins); in the simulator it would depend on the fiber order, so a missing barrier
// could pass unnoticed.  The detector reports it whatever the order: the launch fails with a
// KernelError naming the array, the element, both threads and the kind of hazard (read after
// write, write after read, write after write).
//
// How accesses are seen: kernel libraries are compiled with -fsanitize=thread (compiler.py)
// but without its runtime: the compiler calls __tsan_read4(addr), __tsan_write8(addr),
// __tsan_read_range(addr, n), __tsan_atomic32_fetch_add(...) ... for every memory access it
// cannot prove thread-private, and the engine defines those functions (engine.cpp).  Plain
// accesses go through `access()` below, which ignores every address outside the threadgroup
// arrays this worker has registered; atomics are performed (sequentially consistent) and never
// checked: atomics on threadgroup memory do not race.  Arrays register themselves: rewrite.py
// puts ::mf::tg_note(buf, "buf", __FILE__, __LINE__) after every threadgroup declaration, so
// every way of reaching the array is covered (indexing, pointers into it, steel tiles, helper
// functions taking `threadgroup T*`), as long as the access is a load or store the compiler
// emits: calls to memcpy/memset on threadgroup memory are not seen.
//
// What orders two accesses (happens-before):
// - the same thread (program order);
// - a threadgroup_barrier that both threads pass, whatever its mem_flags (every thread of the
//   group: a barrier starts a new epoch and accesses of an earlier epoch never race).  The MSL
//   specification makes mem_flags::mem_none an execution barrier only; MLX relies on it to
//   order threadgroup memory (gemv.h writes partial sums, meets threadgroup_barrier(mem_none)
//   and reads them), and Apple GPUs' threadgroup memory is coherent inside the group, so the
//   detector accepts it;
// - between lanes of one simdgroup: a simdgroup_barrier, or a simd/quad collective
//   (simd_sum, simd_shuffle*, simd_ballot, quad_*, simdgroup_load/store/multiply_accumulate,
//   ...), at which both lanes meet (transitively, through vector clocks: lane a meets b at one
//   collective, b meets c at a later one, so a's earlier access is ordered before c's later
//   one).  A collective is one instruction of the simdgroup on the GPU: its lanes pass it
//   together, so what a lane did before it is done when another lane goes on after it.  Lanes
//   of the simdgroup that have returned count as present (what they did is finished).
// Nothing else orders: threads of different simdgroups are ordered only by threadgroup
// barriers; lanes that diverge (an `if` on the lane id) are not ordered by the collectives the
// others meet meanwhile.
//
// Reads of what no thread wrote: a read of a granule that no thread of the threadgroup has
// written since the group started (kind UNINIT) fails the launch too.  Threadgroup memory starts
// undefined on a GPU (whatever the group before left there); the engine fills it with NaN or
// large values (tg_fill), which shows such a read only when the value reaches an output, in a
// sum, or a max or min that the fill moves.  The first such read is held (`uninit`) until the
// next threadgroup barrier or the group's end, where the engine reports it: a thread that reads
// what another thread writes later with no barrier between them (in the simulator's order) is a
// race, reported as one at that write.  Atomic writes count as writes (atomic_written).
//
// Shadow state per granule: the last write (thread, epoch, simd clock) and the reads of the
// current epoch (the first reader, a reader in another simdgroup if any, the lanes of the first
// reader's simdgroup that read, and the two latest clocks).  Exact for accesses ordered by
// barriers and by collectives every lane of the simdgroup takes part in; with collectives only
// some lanes take part, several lanes' reads of one granule are compared with the latest of
// their clocks, which can only over-report (not met in any kernel of the test suite or MLX).
#ifndef MF_SIM_RACE_H
#define MF_SIM_RACE_H

#include <stdint.h>
#include <string.h>

#include <string>
#include <vector>

namespace mf_race {

constexpr unsigned kLanes = 32;
constexpr unsigned kMaxThreads = 1024;
constexpr unsigned kMaxSimd = kMaxThreads / kLanes;
constexpr uint16_t kNone = 0xFFFF;
constexpr unsigned kMaxDims = 4;

enum Kind { RAW = 0, WAR = 1, WAW = 2, UNINIT = 3 };

struct Cell {
  uint32_t w_epoch = 0, w_clk = 0;       // last write: epoch and the writer's simd clock
  uint32_t w_group = 0;                  // the group (Detector::group) of the last write
  uint32_t r_epoch = 0;                  // reads below are of this epoch (others are stale)
  uint32_t r_mask = 0;                   // lanes of simdgroup r_sg that read
  uint32_t r_max = 0, r_other_max = 0;   // latest read clock (by r_max_tid), latest by others
  uint16_t w_tid = kNone, r_tid = kNone, r_tid2 = kNone, r_max_tid = kNone;
  uint16_t r_sg = 0;
  const void* w_pc = nullptr;            // where the write and the first read happened
  const void* r_pc = nullptr;
  const void* r_pc2 = nullptr;
};

struct Array {
  uintptr_t base = 0, end = 0;           // [base, end): this worker thread's copy
  unsigned granule = 1, elem = 1;        // bytes per shadow cell, per element
  unsigned ndims = 0;
  unsigned dims[kMaxDims] = {0};
  const char* name = "";
  const char* file = "";
  unsigned line = 0;
  std::vector<Cell> cells;
};

// The lanes' simd clocks in the current epoch (reset lazily when the epoch moves on).
struct Clocks {
  uint32_t epoch[kMaxThreads] = {0};
  uint32_t vc[kMaxThreads][kLanes];      // vc[t][l]: last event of lane l that t has seen
  uint32_t sg_epoch[kMaxSimd] = {0};
  uint32_t events[kMaxSimd] = {0};       // events so far in the simdgroup
  uint32_t full[kMaxSimd] = {0};         // the last event every lane took part in
};

// What a race report needs about the access being made.
struct Access {
  unsigned tid;
  bool write;
  const void* pc;
};

struct Race {
  Kind kind;
  const Array* array;
  size_t cell;
  unsigned first_tid, second_tid;        // the earlier access's thread, the current one's
  const void* first_pc;
  const void* second_pc;
};

class Detector {
 public:
  std::vector<Array> arrays;
  uintptr_t lo = 0, hi = 0;               // hull of the arrays
  uint32_t epoch = 1;                     // moves on at every group start and barrier
  uint32_t group = 1;                     // moves on at every group start
  bool uninit_read = false;               // a read of a granule no thread wrote, held in
  Race uninit{};                          // `uninit` until the next barrier or the group's end
  unsigned nthreads = 0;
  Clocks* clocks = nullptr;

  void start_launch() {
    arrays.clear();
    lo = hi = 0;
    if (!clocks) clocks = new Clocks();
  }
  void start_group(unsigned n) {
    nthreads = n;
    ++epoch;
    ++group;
    uninit_read = false;
  }
  void barrier() { ++epoch; }

  void note(uintptr_t base, size_t bytes, unsigned granule, unsigned elem, const unsigned* dims,
            unsigned ndims, const char* name, const char* file, unsigned line) {
    for (const Array& a : arrays)
      if (a.base == base) return;
    Array a;
    a.base = base;
    a.end = base + bytes;
    a.granule = granule ? granule : 1;
    a.elem = elem ? elem : 1;
    a.ndims = ndims < kMaxDims ? ndims : kMaxDims;
    for (unsigned d = 0; d < a.ndims; ++d) a.dims[d] = dims[d];
    a.name = name;
    a.file = file;
    a.line = line;
    a.cells.resize((bytes + a.granule - 1) / a.granule);
    if (arrays.empty() || base < lo) lo = base;
    if (arrays.empty() || a.end > hi) hi = a.end;
    arrays.push_back(std::move(a));
  }

  bool covers(uintptr_t p, size_t n) const { return p < hi && p + n > lo; }

  // An atomic write of [p, p + n): not checked for races (atomics do not race), but what it
  // wrote is written for the UNINIT check.
  void atomic_written(uintptr_t p, size_t n) {
    each_cell(p, n, [&](Array& arr, size_t c) {
      arr.cells[c].w_group = group;
      return true;
    });
  }

  // A simd event: the lanes in `mask` (of simdgroup `sg`, which has `lanes` lanes) meet.
  void simd_event(unsigned sg, uint32_t mask, unsigned lanes) {
    sg_fresh(sg);
    const uint32_t e = ++clocks->events[sg];
    const uint32_t all = lanes >= 32 ? 0xFFFFFFFFu : ((1u << lanes) - 1);
    if ((mask & all) == all) {
      clocks->full[sg] = e;
      return;
    }
    uint32_t join[kLanes];
    memset(join, 0, sizeof join);
    for (unsigned l = 0; l < kLanes; ++l) {
      if (!(mask >> l & 1)) continue;
      const uint32_t* v = vc(sg * kLanes + l);
      for (unsigned k = 0; k < kLanes; ++k) join[k] = v[k] > join[k] ? v[k] : join[k];
    }
    for (unsigned l = 0; l < kLanes; ++l)
      if (mask >> l & 1) join[l] = e;
    for (unsigned l = 0; l < kLanes; ++l)
      if (mask >> l & 1) memcpy(vc(sg * kLanes + l), join, sizeof join);
  }

  // Check and record an access of [p, p + n) by thread `a.tid`; false (and `*out` filled) on
  // the first race found.
  bool access(uintptr_t p, size_t n, const Access& a, Race* out) {
    return each_cell(p, n, [&](Array& arr, size_t c) { return cell_access(arr, c, a, out); });
  }

 private:
  // f(array, cell) for every shadow cell that [p, p + n) touches, until f returns false.
  template <typename F>
  bool each_cell(uintptr_t p, size_t n, F f) {
    for (Array& arr : arrays) {
      if (p >= arr.end || p + n <= arr.base) continue;
      const uintptr_t from = p > arr.base ? p : arr.base;
      const uintptr_t to = p + n < arr.end ? p + n : arr.end;
      for (size_t c = (from - arr.base) / arr.granule; c <= (to - 1 - arr.base) / arr.granule; ++c)
        if (!f(arr, c)) return false;
    }
    return true;
  }

  void sg_fresh(unsigned sg) {
    if (clocks->sg_epoch[sg] != epoch) {
      clocks->sg_epoch[sg] = epoch;
      clocks->events[sg] = 0;
      clocks->full[sg] = 0;
    }
  }
  uint32_t* vc(unsigned t) {
    if (clocks->epoch[t] != epoch) {
      clocks->epoch[t] = epoch;
      memset(clocks->vc[t], 0, sizeof clocks->vc[t]);
    }
    return clocks->vc[t];
  }
  uint32_t now(unsigned t) {
    sg_fresh(t / kLanes);
    return clocks->events[t / kLanes];
  }
  // Whether an access by thread t at simd clock k (this epoch) happens before thread u's now.
  bool ordered(unsigned t, uint32_t k, unsigned u) {
    if (t == u) return true;
    if (t / kLanes != u / kLanes) return false;
    sg_fresh(u / kLanes);
    return clocks->full[u / kLanes] > k || vc(u)[t % kLanes] > k;
  }

  bool report(Kind kind, const Array& arr, size_t c, unsigned first, const void* first_pc,
              const Access& a, Race* out) {
    *out = Race{kind, &arr, c, first, a.tid, first_pc, a.pc};
    return false;
  }

  bool cell_access(Array& arr, size_t c, const Access& a, Race* out) {
    Cell& s = arr.cells[c];
    const unsigned u = a.tid, sg = u / kLanes, lane = u % kLanes;
    const uint32_t k = now(u);
    if (!a.write && s.w_group != group && !uninit_read) {
      uninit_read = true;
      uninit = Race{UNINIT, &arr, c, u, u, a.pc, a.pc};
    }
    if (s.w_epoch == epoch && !ordered(s.w_tid, s.w_clk, u))
      return report(a.write ? WAW : RAW, arr, c, s.w_tid, s.w_pc, a, out);
    if (!a.write) {
      if (s.r_epoch != epoch) {
        s.r_epoch = epoch;
        s.r_tid = s.r_max_tid = (uint16_t)u;
        s.r_tid2 = kNone;
        s.r_sg = (uint16_t)sg;
        s.r_mask = 1u << lane;
        s.r_max = k;
        s.r_other_max = 0;
        s.r_pc = a.pc;
        return true;
      }
      if (sg == s.r_sg) {
        s.r_mask |= 1u << lane;
      } else if (s.r_tid2 == kNone) {
        s.r_tid2 = (uint16_t)u;
        s.r_pc2 = a.pc;
      }
      if (u != s.r_max_tid) {
        if (k >= s.r_max) {
          s.r_other_max = s.r_max;
          s.r_max = k;
          s.r_max_tid = (uint16_t)u;
        } else if (k > s.r_other_max) {
          s.r_other_max = k;
        }
      } else {
        s.r_max = k;
      }
      return true;
    }
    if (s.r_epoch == epoch) {
      if (s.r_tid2 != kNone) {   // readers in two simdgroups: one of them is not u's
        const bool first_other = s.r_sg != sg;
        return report(WAR, arr, c, first_other ? s.r_tid : s.r_tid2,
                      first_other ? s.r_pc : s.r_pc2, a, out);
      }
      if (s.r_sg != sg) return report(WAR, arr, c, s.r_tid, s.r_pc, a, out);
      const uint32_t latest = s.r_max_tid != u ? s.r_max : s.r_other_max;
      const uint32_t others = s.r_mask & ~(1u << lane);
      for (unsigned l = 0; l < kLanes; ++l) {
        if (!(others >> l & 1)) continue;
        const unsigned t = sg * kLanes + l;
        if (!ordered(t, latest, u))
          return report(WAR, arr, c, t, t == s.r_tid ? s.r_pc : nullptr, a, out);
      }
    }
    s.w_epoch = epoch;
    s.w_group = group;
    s.w_tid = (uint16_t)u;
    s.w_clk = k;
    s.w_pc = a.pc;
    s.r_epoch = 0;
    return true;
  }
};

}  // namespace mf_race

#endif  // MF_SIM_RACE_H
