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

#include "mf_tensor.h"
#include "mf_layout.h"
#include "mf_matmul.h"

#endif  // MF_SIM_MPP_H
