// metalforge.sim — <MetalPerformancePrimitives/MetalPerformancePrimitives.h>: Metal 4's tensor
// operations (matmul2d over tensors and cooperative tensors), for MSL compiled as C++20 and run
// on the CPU.  Comes in after <metal_stdlib> (compiler.py includes it for a source whose text
// includes this header; stub.h is what the source sees while it is preprocessed alone).
// The element layout of cooperative tensors follows MF_SIM_GPU_FAMILY (mf_layout.h).
#ifndef MF_SIM_MPP_H
#define MF_SIM_MPP_H

#if __METAL_VERSION__ < 400
#error "MetalPerformancePrimitives needs Metal 4.0 (macOS 26): this source is compiled for an older Metal (__METAL_VERSION__ < 400)"
#endif

// The surface shared with the cuda shim (extents, tensor, execution_simdgroups,
// matmul2d_descriptor, matmul2d's factories and checks), in this backend's spelling; it lives
// in the cuda tree (see its head) and is part of the compile cache's key (toolchain.py).
#define MF_MPP_FN
#define MF_MPP_HOT MF_INLINE
#define MF_MPP_AT(i, n) MF_CHECKED(i, n)
#define MF_MPP_WHO "metalforge.sim"
namespace mf_mpp {
template <class T, size_t N>
using index_array = ::metal::array<T, N>;
}  // namespace mf_mpp
#include "../../../cuda/include/MetalPerformancePrimitives/mf_surface.h"
#undef MF_MPP_FN
#undef MF_MPP_HOT
#undef MF_MPP_AT
#undef MF_MPP_WHO

#include "mf_layout.h"
#include "mf_matmul.h"

#endif  // MF_SIM_MPP_H
