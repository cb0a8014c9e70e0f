// ${KERNEL}: (x ${ACT_T}, out fp32 whatever the plan's precision) out[b] = mean of x[b, t] over valid t (mask != 0), then / max(||.||, 1e-12) when
// NORMALIZE; one block per batch row, H = ${H}. CPU twin: anvil_kernels.mean_pool_l2.
// The block's warps take every WARPS-th token and each lane a column every 32, TILE columns a lane
// held in registers at once: a token's loads are issued together and nothing branches on the mask
// (a masked token adds 0 through a select, so a padded row's values, whatever they are, never enter),
// then the warps' partial sums are added in shared memory.
extern "C" __global__ void __launch_bounds__(${THREADS}) ${KERNEL}(
    const ${ACT_T}* __restrict__ x, const ${MASK_T}* __restrict__ mask, float* __restrict__ out, int T) {
  constexpr int H = ${H};
  constexpr int WARPS = ${THREADS} / 32;
  constexpr int PER = (H + 31) / 32;  // columns of one lane
  constexpr int TILE = PER < 16 ? PER : 16;  // of those, held in registers at once
  __shared__ float part[WARPS][32 * TILE];
  __shared__ float red[32];
  const int b = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const ${MASK_T}* m = mask + (long)b * T;
  const ${ACT_T}* xb = x + (long)b * T * H;
  float c = 0.f;
  for (int t = threadIdx.x; t < T; t += blockDim.x) c += m[t] != 0 ? 1.f : 0.f;
  const float count = anvil_block_sum(c, red);
  const float inv = count > 0.f ? 1.f / count : 0.f;
  float ss = 0.f;
  for (int c0 = 0; c0 < H; c0 += 32 * TILE) {
    float acc[TILE];
#pragma unroll
    for (int k = 0; k < TILE; ++k) acc[k] = 0.f;
#pragma unroll 2
    for (int t = warp; t < T; t += WARPS) {
      const bool on = m[t] != 0;
      const long row = (long)t * H + c0 + lane;
#pragma unroll
      for (int k = 0; k < TILE; ++k) {
        const float v = c0 + lane + 32 * k < H ? anvil_ld(xb, row + 32 * k) : 0.f;
        acc[k] += on ? v : 0.f;
      }
    }
#pragma unroll
    for (int k = 0; k < TILE; ++k) part[warp][lane + 32 * k] = acc[k];
    __syncthreads();
    for (int j = threadIdx.x; j < 32 * TILE && c0 + j < H; j += blockDim.x) {
      float s = 0.f;
#pragma unroll
      for (int w = 0; w < WARPS; ++w) s += part[w][j];
      s *= inv;
      out[(long)b * H + c0 + j] = s;
      ss += s * s;
    }
    __syncthreads();
  }
  if (${NORMALIZE}) {
    const float scale = 1.f / fmaxf(sqrtf(anvil_block_sum(ss, red)), 1e-12f);
    for (int i = threadIdx.x; i < H; i += blockDim.x) out[(long)b * H + i] *= scale;
  }
}
