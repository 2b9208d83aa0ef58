// metalforge.sim — where the elements of a cooperative tensor live: the element layout of each
// Apple GPU family (MF_SIM_GPU_FAMILY, set by the compile's target; see compiler.py).
//
// A cooperative tensor holds a matrix of R x C elements (R, C multiples of 16; the matrix as
// it is stored: a transposed operand is held in its stored orientation) spread over the
// threads of the executing simdgroup(s).  The matrix is cut into 16 x 16 fragments, numbered
// row-major; with S simdgroups executing, fragment f belongs to simdgroup f % S, where it is
// slot f / S.  Each lane holds 8 elements of each of its fragments: element i of a thread is
// element i % 8 of slot i / 8 (capacity = 8 x slots; an element whose fragment does not exist,
// when the fragments do not divide evenly among the simdgroups, is not valid).
//
// Inside a fragment, element e (0..7) of lane l is at:
//   family >= 10 (M5, the neural accelerators; MLX's BaseNAXFrag):
//       row = ((l / 4) & 4 | (l / 2) % 4) + (e / 4) * 8,  col = ((l / 4) & 2 | l % 2) * 4 + e % 4
//       (2 rows x 4 columns a lane, rows 8 apart)
//   family 0 (the cuda target: the cuda backend's shim, mma.sync's A / C register order):
//       row = l / 4 + 8 * ((e / 2) % 2),  col = 2 * (l % 4) + e % 2 + 8 * (e / 4)
//   other families < 10 (tensor ops on the ALUs): row = l / 2, col = (l % 2) * 8 + e  (half a
//       row a lane)
// So code that hard-codes M5's layout (fills ct[i] from its own idea of where element i is)
// computes a different product on other families, as on a real M4.
#ifndef MF_SIM_MPP_LAYOUT_H
#define MF_SIM_MPP_LAYOUT_H

#ifndef MF_SIM_GPU_FAMILY
#define MF_SIM_GPU_FAMILY 9
#endif

namespace mf {
namespace mpp {

constexpr int kGpuFamily = MF_SIM_GPU_FAMILY;

using ::mf_mpp::Elem;

MF_INLINE constexpr void frag_coord(unsigned lane, int e, int& row, int& col) {
  if constexpr (kGpuFamily >= 10) {
    const int q = int(lane >> 2);
    row = ((q & 4) | int((lane >> 1) & 3)) + (e >> 2) * 8;
    col = ((q & 2) | int(lane & 1)) * 4 + (e & 3);
  } else if constexpr (kGpuFamily == 0) {
    row = int(lane >> 2) + 8 * ((e >> 1) & 1);
    col = 2 * int(lane & 3u) + (e & 1) + 8 * (e >> 2);
  } else {
    row = int(lane >> 1);
    col = int(lane & 1) * 8 + e;
  }
}

template <int Rows, int Cols, int S>
struct Geometry {
  static_assert(Rows % 16 == 0 && Cols % 16 == 0 && Rows > 0 && Cols > 0,
                "metalforge.sim: cooperative tensors hold whole 16 x 16 fragments");
  static constexpr int kRows = Rows, kCols = Cols;
  static constexpr int kFragCols = Cols / 16;
  static constexpr int kFrags = (Rows / 16) * (Cols / 16);
  static constexpr int kSlots = (kFrags + S - 1) / S;
  static constexpr int kCapacity = kSlots * 8;

  // Element i of the thread that is simdgroup `sg` of the executing group, lane `lane`.
  static MF_INLINE Elem at(unsigned sg, unsigned lane, int i) {
    const int f = (i / 8) * S + int(sg);
    Elem r{0, 0, f < kFrags};
    frag_coord(lane, i % 8, r.row, r.col);
    r.row += (f / kFragCols) * 16;
    r.col += (f % kFragCols) * 16;
    return r;
  }
};

// The calling thread's lane, and its simdgroup within a group of S executing simdgroups.
MF_INLINE unsigned lane_now() { return mf_rt_position()->thread_index_in_simdgroup[0]; }
template <int S>
MF_INLINE unsigned group_sg_now() {
  return S == 1 ? 0u : mf_rt_position()->simdgroup_index_in_threadgroup[0] % unsigned(S);
}

}  // namespace mpp
}  // namespace mf

#endif  // MF_SIM_MPP_LAYOUT_H
