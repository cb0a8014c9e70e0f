// Shared device helpers (no system headers: NVRTC-compatible), defined once for the compiler's generated
// kernels (anvil_compiler.codegen.build puts this first in every kernels.cu) and the executor's GPU
// epilogue (anvil_executor.plan_runtime.cublas_linear). Activation codes as anvil_kernels.activations.
#ifndef ANVIL_COMMON_CUH
#define ANVIL_COMMON_CUH
// fp16 is read as its 16-bit pattern and converted with one PTX instruction, so no CUDA header is
// needed (NVRTC from pip has none).
__device__ __forceinline__ float anvil_h2f(unsigned short h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ unsigned short anvil_f2h(float f) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
// Loads and stores in fp32 arithmetic whatever the storage: fp32 (float), fp16 (its bits, as
// unsigned short) or bf16 (anvil_bf16, below). The compiler's templates take the activation type as ACT_T, so one template gives
// the fp32 plan's kernel and the fp16 plan's (the GPU precision, docs/executor_gpu.md).
__device__ __forceinline__ float anvil_ld(const float* p, long i) { return p[i]; }
__device__ __forceinline__ float anvil_ld(const unsigned short* p, long i) { return anvil_h2f(p[i]); }
__device__ __forceinline__ void anvil_st(float* p, long i, float v) { p[i] = v; }
__device__ __forceinline__ void anvil_st(unsigned short* p, long i, float v) { p[i] = anvil_f2h(v); }

// bf16 (a bf16 plan's activations): its bits in a struct of its own, so the overloads above and below
// tell the two 16-bit formats apart. bf16 -> fp32 is exact (the bits shifted up); fp32 -> bf16 rounds
// to nearest even in integer arithmetic (no cvt.bf16, which needs sm_80 and PTX 7.0), NaN stays NaN.
struct anvil_bf16 {
  unsigned short bits;
};
__device__ __forceinline__ float anvil_b2f(unsigned short b) { return __uint_as_float((unsigned int)b << 16); }
__device__ __forceinline__ unsigned short anvil_f2b(float f) {
  const unsigned int u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);  // quiet NaN
  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
__device__ __forceinline__ float anvil_ld(const anvil_bf16* p, long i) { return anvil_b2f(p[i].bits); }
__device__ __forceinline__ void anvil_st(anvil_bf16* p, long i, float v) { p[i].bits = anvil_f2b(v); }

#define ANVIL_INF __int_as_float(0x7f800000)

__device__ __forceinline__ float anvil_act(float v, int act) {
  // codes as anvil_kernels.activations, plus 5 = sigmoid, 6 = tanh
  switch (act) {
    case 1: return v > 0.f ? v : 0.f;
    case 2: return 0.5f * v * (1.f + erff(v * 0.70710678118654752f));
    case 3: return 0.5f * v * (1.f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
    case 4: return v / (1.f + expf(-v));
    case 5: return 1.f / (1.f + expf(-v));
    case 6: return tanhf(v);
    default: return v;
  }
}

// Sum (or max) over the block; every thread gets the result. scratch: >= 32 floats of smem.
__device__ __forceinline__ float anvil_block_sum(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = 0.f;
  for (int w = 0; w < warps; ++w) t += scratch[w];
  return t;
}

__device__ __forceinline__ float anvil_block_max(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = -ANVIL_INF;
  for (int w = 0; w < warps; ++w) t = fmaxf(t, scratch[w]);
  return t;
}
#endif
