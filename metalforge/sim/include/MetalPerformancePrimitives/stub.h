// metalforge.sim — what <MetalPerformancePrimitives/MetalPerformancePrimitives.h> is while the
// kernel's text is preprocessed alone (metalforge/sim/compiler.py): the Metal 4 check, then a
// marker line; a source that keeps the marker is compiled with the real header
// (MetalPerformancePrimitives.h next to this file) included after <metal_stdlib>.
#if __METAL_VERSION__ < 400
#error "MetalPerformancePrimitives needs Metal 4.0 (macOS 26): this source is compiled for an older Metal (__METAL_VERSION__ < 400); choose a Metal 4 target (e.g. mf.target(\"apple10\"), or metal_version=400 on the simulator)"
#endif
#pragma metalforge_sim_mpp
