// metalforge.sim — Metal's address-space and function-kind keywords.
//
// Included LAST by <metal_stdlib> so that no C++ standard header sees these
// macros.  On the CPU every address space is ordinary memory, so they expand to
// nothing, except `constant`, which is read-only memory in Metal: it becomes
// `const` (rewrite.py blanks a `constant` written next to `const`).
// Kernel-scope `threadgroup` variable declarations are
// turned into group-shared storage by metalforge/sim/rewrite.py before the
// compiler sees the text; every other `threadgroup` (pointer and reference
// parameters, local pointers) is just a pointer to that storage.
#ifndef MF_SIM_KEYWORDS_H
#define MF_SIM_KEYWORDS_H

#define kernel
#define device
#define constant const
#define thread
#define threadgroup
#define threadgroup_imageblock
#define ray_data
#define object_data
// Metal 3.2's coherent(scope) qualifier of device memory: CPU memory is coherent already (what
// orders other groups' accesses is the fences and atomics, real ones here)
#define coherent(scope)

// Metal's own spelling for an always-inlined helper function (used throughout MLX).
#define METAL_FUNC MF_INLINE

#endif  // MF_SIM_KEYWORDS_H
