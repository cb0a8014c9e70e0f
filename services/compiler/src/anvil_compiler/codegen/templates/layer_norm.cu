// ${KERNEL}: (x, residual, out ${ACT_T}; fp32 statistics) out = LN(x + residual) over the last dim ${H}; one block per row.
// CPU twin: anvil_kernels.layer_norm (two-pass mean / variance).
extern "C" __global__ void __launch_bounds__(${THREADS}) ${KERNEL}(
    const ${ACT_T}* __restrict__ x, const ${ACT_T}* __restrict__ residual, const float* __restrict__ gamma,
    const float* __restrict__ beta, ${ACT_T}* __restrict__ out) {
  constexpr int H = ${H};
  __shared__ float red[32];
  const long row = blockIdx.x;
  float sum = 0.f;
  for (int i = threadIdx.x; i < H; i += blockDim.x)
    sum += anvil_ld(x, row * H + i) + (residual ? anvil_ld(residual, row * H + i) : 0.f);
  const float mean = anvil_block_sum(sum, red) * (1.f / H);
  float sq = 0.f;
  for (int i = threadIdx.x; i < H; i += blockDim.x) {
    const float d = anvil_ld(x, row * H + i) + (residual ? anvil_ld(residual, row * H + i) : 0.f) - mean;
    sq += d * d;
  }
  const float rstd = rsqrtf(anvil_block_sum(sq, red) * (1.f / H) + ${EPS}f);
  for (int i = threadIdx.x; i < H; i += blockDim.x) {
    const float d = anvil_ld(x, row * H + i) + (residual ? anvil_ld(residual, row * H + i) : 0.f) - mean;
    anvil_st(out, row * H + i, d * rstd * gamma[i] + beta[i]);
  }
}
