"""CUDA code generation: one emitter per kernel op (`codegen.kernels.EMITTERS`) and the build of
the emitted source into a fatbin (nvcc) or cubins (NVRTC) per GPU arch (`codegen.build`)."""
