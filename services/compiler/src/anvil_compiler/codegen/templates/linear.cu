// ${KERNEL}: out = LN?(act(x @ W + bias) + residual), x (M, ${K}) f32, out (M, ${N}) f32.
// W: INT4 (${K}/2, ${N}) u8 packed (low nibble = even k), scales/zeros (${K}/${GROUP}, ${N}) f16,
// or (QUANT == 0) f32 (${K}, ${N}). CPU twin: anvil_kernels.int4_linear (+ layer_norm when LN).
// Tiling: a block owns ${BM} rows x (${THREADS} * ${NPT}) columns; x is staged through shared
// memory ${KC} inputs at a time; each thread keeps ${BM} x ${NPT} accumulators in registers.
// With LN the block spans all N columns of its rows, so the row statistics stay in the block.
extern "C" __global__ void __launch_bounds__(${THREADS}) ${KERNEL}(
    const float* __restrict__ x, const void* __restrict__ w, const unsigned short* __restrict__ scales,
    const unsigned short* __restrict__ zeros, const float* __restrict__ bias, const float* __restrict__ residual,
    const float* __restrict__ gamma, const float* __restrict__ beta, float* __restrict__ out, int M) {
  constexpr int K = ${K}, N = ${N}, BM = ${BM}, KC = ${KC}, NPT = ${NPT}, THREADS = ${THREADS};
  constexpr int QUANT = ${QUANT}, GROUP = ${GROUP}, ACT = ${ACT}, LN = ${LN};
  __shared__ float xs[BM][KC];
  __shared__ float red[32];
  const int m0 = blockIdx.y * BM;
  const int n0 = blockIdx.x * THREADS * NPT + threadIdx.x;
  float acc[BM][NPT];
#pragma unroll
  for (int r = 0; r < BM; ++r)
#pragma unroll
    for (int j = 0; j < NPT; ++j) acc[r][j] = 0.f;
  for (int k0 = 0; k0 < K; k0 += KC) {
    __syncthreads();
    for (int i = threadIdx.x; i < BM * KC; i += THREADS) {
      const int r = i / KC, c = i % KC, m = m0 + r;
      xs[r][c] = (m < M && k0 + c < K) ? x[(long)m * K + k0 + c] : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < NPT; ++j) {
      const int n = n0 + j * THREADS;
      if (n >= N) continue;
      if (QUANT) {
        const unsigned char* wq = (const unsigned char*)w;
        const float s = anvil_h2f(scales[(k0 / GROUP) * N + n]);  // KC == GROUP: one group
        const float z = anvil_h2f(zeros[(k0 / GROUP) * N + n]);
        for (int kk = 0; kk < KC; kk += 2) {
          const unsigned char b = wq[(long)((k0 + kk) >> 1) * N + n];
          const float w0 = ((float)(b & 15) - z) * s, w1 = ((float)(b >> 4) - z) * s;
#pragma unroll
          for (int r = 0; r < BM; ++r) acc[r][j] += xs[r][kk] * w0 + xs[r][kk + 1] * w1;
        }
      } else {
        const float* wf = (const float*)w;
        for (int kk = 0; kk < KC && k0 + kk < K; ++kk) {
          const float wv = wf[(long)(k0 + kk) * N + n];
#pragma unroll
          for (int r = 0; r < BM; ++r) acc[r][j] += xs[r][kk] * wv;
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < BM; ++r) {
    const int m = m0 + r;
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < NPT; ++j) {
      const int n = n0 + j * THREADS;
      if (n >= N) continue;
      float v = acc[r][j] + (bias ? bias[n] : 0.f);
      v = anvil_act(v, ACT);
      if (residual && m < M) v += residual[(long)m * N + n];
      acc[r][j] = v;
      sum += v;
    }
    if (LN) {  // uniform branch: every thread of the block takes it, m < M or not
      const float mean = anvil_block_sum(sum, red) * (1.f / N);
      float sq = 0.f;
#pragma unroll
      for (int j = 0; j < NPT; ++j) {
        const int n = n0 + j * THREADS;
        if (n < N) sq += (acc[r][j] - mean) * (acc[r][j] - mean);
      }
      const float rstd = rsqrtf(anvil_block_sum(sq, red) * (1.f / N) + ${EPS}f);
#pragma unroll
      for (int j = 0; j < NPT; ++j) {
        const int n = n0 + j * THREADS;
        if (n < N) acc[r][j] = (acc[r][j] - mean) * rstd * gamma[n] + beta[n];
      }
    }
    if (m < M) {
#pragma unroll
      for (int j = 0; j < NPT; ++j) {
        const int n = n0 + j * THREADS;
        if (n < N) out[(long)m * N + n] = acc[r][j];
      }
    }
  }
}
