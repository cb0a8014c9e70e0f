// The epilogues of a half plan's linears (gpu_linear.py): out = LN?(act(tmp + bias) + res) with tmp,
// res and out fp16 or bf16 (their bits as unsigned short: no CUDA header, NVRTC from pip has none),
// bias, gamma and beta fp32, every operation in fp32 (LayerNorm statistics included). Same semantics
// and order as the fp32 epilogue (cublas_linear.py) and the CPU twin (ops.linear). PLAN_COMMON's
// helpers (anvil_h2f, anvil_f2h, anvil_b2f, anvil_f2b, anvil_act, anvil_block_sum) come first in the
// translation unit. Each kernel is a template over the half format, instantiated as anvil_f16_* and
// anvil_bf16_* (same arguments, same launch).

// The two formats: one value <-> float, and two values of one 32-bit word (low half = lower index).
struct AnvilF16 {
  static __device__ __forceinline__ float ld(unsigned short h) { return anvil_h2f(h); }
  static __device__ __forceinline__ unsigned short st(float f) { return anvil_f2h(f); }
  static __device__ __forceinline__ void ld2(unsigned int w, float& a, float& b) {
    a = anvil_h2f((unsigned short)(w & 0xffffu));
    b = anvil_h2f((unsigned short)(w >> 16));
  }
};
struct AnvilBF16 {
  static __device__ __forceinline__ float ld(unsigned short h) { return anvil_b2f(h); }
  static __device__ __forceinline__ unsigned short st(float f) { return anvil_f2b(f); }
  static __device__ __forceinline__ void ld2(unsigned int w, float& a, float& b) {
    a = __uint_as_float(w << 16);
    b = __uint_as_float(w & 0xffff0000u);
  }
};
template <class H>
__device__ __forceinline__ unsigned int anvil_st2(float a, float b) {
  return (unsigned int)H::st(a) | ((unsigned int)H::st(b) << 16);
}

// No LayerNorm: 8 values per thread and step (16-byte loads and stores), grid-stride over m * n / 8
// (n % 8 == 0 and every pointer 16-byte aligned: epilogue_f16_launch checks).
template <class H>
__device__ __forceinline__ void anvil_epilogue_v8(const uint4* tmp, const float* bias, const uint4* res,
    uint4* out, long octs, int n8, int act) {
  for (long q = (long)blockIdx.x * blockDim.x + threadIdx.x; q < octs; q += (long)gridDim.x * blockDim.x) {
    const uint4 t = tmp[q];
    uint4 r = {0u, 0u, 0u, 0u};
    if (res) r = res[q];  // loaded before the activation's branches, not after them
    float v[8];
    H::ld2(t.x, v[0], v[1]); H::ld2(t.y, v[2], v[3]);
    H::ld2(t.z, v[4], v[5]); H::ld2(t.w, v[6], v[7]);
    if (bias) {
      const float4* b4 = reinterpret_cast<const float4*>(bias) + 2 * (q % n8);
      const float4 b0 = b4[0], b1 = b4[1];
      v[0] += b0.x; v[1] += b0.y; v[2] += b0.z; v[3] += b0.w;
      v[4] += b1.x; v[5] += b1.y; v[6] += b1.z; v[7] += b1.w;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = anvil_act(v[i], act);
    if (res) {
      float w[8];
      H::ld2(r.x, w[0], w[1]); H::ld2(r.y, w[2], w[3]);
      H::ld2(r.z, w[4], w[5]); H::ld2(r.w, w[6], w[7]);
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] += w[i];
    }
    uint4 o;
    o.x = anvil_st2<H>(v[0], v[1]); o.y = anvil_st2<H>(v[2], v[3]);
    o.z = anvil_st2<H>(v[4], v[5]); o.w = anvil_st2<H>(v[6], v[7]);
    out[q] = o;
  }
}

// With LayerNorm, rows of n <= 64 * ANVIL_F16_LN_PAIRS (n even): one warp per row, each lane holding
// pairs (2 lane + 64 k, + 1) in registers, mean and variance by shuffles (two-pass, fp32).
#define ANVIL_F16_LN_PAIRS 8
template <class H>
__device__ __forceinline__ void anvil_epilogue_ln_warp(const unsigned int* tmp, const float* bias,
    const unsigned int* res, const float* gamma, const float* beta, unsigned int* out, long rows, int n,
    int act, float eps) {
  const long row = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const int half_n = n >> 1;
  const long base = row * half_n;  // in pairs
  float v[2 * ANVIL_F16_LN_PAIRS];
  // Every load of the row (tmp, bias, residual, gamma, beta) is issued before any arithmetic: a small
  // batch's epilogue is a chain of memory round trips, and loads placed after the activation's
  // branches waited for them, one pair at a time
  unsigned int tw[ANVIL_F16_LN_PAIRS], rw[ANVIL_F16_LN_PAIRS];
  float bi[2 * ANVIL_F16_LN_PAIRS], ga[2 * ANVIL_F16_LN_PAIRS], be[2 * ANVIL_F16_LN_PAIRS];
#pragma unroll
  for (int k = 0; k < ANVIL_F16_LN_PAIRS; ++k) {
    const int p = lane + 32 * k;  // pair index: elements 2p, 2p + 1
    const bool in = p < half_n;
    tw[k] = in ? tmp[base + p] : 0u;
    rw[k] = (in && res) ? res[base + p] : 0u;
    bi[2 * k] = (in && bias) ? bias[2 * p] : 0.f;
    bi[2 * k + 1] = (in && bias) ? bias[2 * p + 1] : 0.f;
    ga[2 * k] = in ? gamma[2 * p] : 0.f;
    ga[2 * k + 1] = in ? gamma[2 * p + 1] : 0.f;
    be[2 * k] = in ? beta[2 * p] : 0.f;
    be[2 * k + 1] = in ? beta[2 * p + 1] : 0.f;
  }
  float sum = 0.f;
#pragma unroll
  for (int k = 0; k < ANVIL_F16_LN_PAIRS; ++k) {
    float a = 0.f, b = 0.f;
    if (lane + 32 * k < half_n) {
      H::ld2(tw[k], a, b);
      if (bias) { a += bi[2 * k]; b += bi[2 * k + 1]; }
      a = anvil_act(a, act); b = anvil_act(b, act);
      if (res) { float ra, rb; H::ld2(rw[k], ra, rb); a += ra; b += rb; }
    }
    v[2 * k] = a; v[2 * k + 1] = b;
    sum += a + b;
  }
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  const float mean = sum / n;
  float sq = 0.f;
#pragma unroll
  for (int k = 0; k < ANVIL_F16_LN_PAIRS; ++k) {
    if (lane + 32 * k < half_n) {
      const float da = v[2 * k] - mean, db = v[2 * k + 1] - mean;
      sq += da * da + db * db;
    }
  }
  for (int o = 16; o > 0; o >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, o);
  const float inv = rsqrtf(sq / n + eps);
#pragma unroll
  for (int k = 0; k < ANVIL_F16_LN_PAIRS; ++k) {
    const int p = lane + 32 * k;
    if (p < half_n) {
      const float a = (v[2 * k] - mean) * inv * ga[2 * k] + be[2 * k];
      const float b = (v[2 * k + 1] - mean) * inv * ga[2 * k + 1] + be[2 * k + 1];
      out[base + p] = anvil_st2<H>(a, b);
    }
  }
}

// Any n, LayerNorm or not: one block per row, the row in n floats of dynamic shared memory when ln.
// buf: n floats of dynamic shared memory when ln; red: 32 floats of shared memory
template <class H>
__device__ __forceinline__ void anvil_epilogue_row(const unsigned short* tmp, const float* bias,
    const unsigned short* res, const float* gamma, const float* beta, unsigned short* out, int n, int act,
    int ln, float eps, float* buf, float* red) {
  const long base = (long)blockIdx.x * n;
  float sum = 0.f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    float v = H::ld(tmp[base + i]) + (bias ? bias[i] : 0.f);
    v = anvil_act(v, act);
    if (res) v += H::ld(res[base + i]);
    if (ln) buf[i] = v; else out[base + i] = H::st(v);
    sum += v;
  }
  if (!ln) return;
  const float mean = anvil_block_sum(sum, red) / n;
  float sq = 0.f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) { const float d = buf[i] - mean; sq += d * d; }
  const float inv = rsqrtf(anvil_block_sum(sq, red) / n + eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x)
    out[base + i] = H::st((buf[i] - mean) * inv * gamma[i] + beta[i]);
}

// The kernels: each template for fp16 (anvil_f16_*) and for bf16 (anvil_bf16_*), same arguments.
extern "C" __global__ void anvil_f16_epilogue_v8(const uint4* tmp, const float* bias, const uint4* res,
    uint4* out, long octs, int n8, int act) {
  anvil_epilogue_v8<AnvilF16>(tmp, bias, res, out, octs, n8, act);
}
extern "C" __global__ void anvil_f16_epilogue_ln_warp(const unsigned int* tmp, const float* bias,
    const unsigned int* res, const float* gamma, const float* beta, unsigned int* out, long rows, int n,
    int act, float eps) {
  anvil_epilogue_ln_warp<AnvilF16>(tmp, bias, res, gamma, beta, out, rows, n, act, eps);
}
extern "C" __global__ void anvil_f16_epilogue(const unsigned short* tmp, const float* bias,
    const unsigned short* res, const float* gamma, const float* beta, unsigned short* out, int n, int act,
    int ln, float eps) {
  extern __shared__ float buf[];
  __shared__ float red[32];
  anvil_epilogue_row<AnvilF16>(tmp, bias, res, gamma, beta, out, n, act, ln, eps, buf, red);
}

extern "C" __global__ void anvil_bf16_epilogue_v8(const uint4* tmp, const float* bias, const uint4* res,
    uint4* out, long octs, int n8, int act) {
  anvil_epilogue_v8<AnvilBF16>(tmp, bias, res, out, octs, n8, act);
}
extern "C" __global__ void anvil_bf16_epilogue_ln_warp(const unsigned int* tmp, const float* bias,
    const unsigned int* res, const float* gamma, const float* beta, unsigned int* out, long rows, int n,
    int act, float eps) {
  anvil_epilogue_ln_warp<AnvilBF16>(tmp, bias, res, gamma, beta, out, rows, n, act, eps);
}
extern "C" __global__ void anvil_bf16_epilogue(const unsigned short* tmp, const float* bias,
    const unsigned short* res, const float* gamma, const float* beta, unsigned short* out, int n, int act,
    int ln, float eps) {
  extern __shared__ float buf[];
  __shared__ float red[32];
  anvil_epilogue_row<AnvilBF16>(tmp, bias, res, gamma, beta, out, n, act, ln, eps, buf, red);
}
