// ${KERNEL}: (x ${ACT_T}, out fp32 whatever the plan's precision) out[b] = mean of x[b, t] over valid t (mask != 0), then / max(||.||, 1e-12) when
// NORMALIZE; one block per batch row, H = ${H}. CPU twin: anvil_kernels.mean_pool_l2.
extern "C" __global__ void __launch_bounds__(${THREADS}) ${KERNEL}(
    const ${ACT_T}* __restrict__ x, const ${MASK_T}* __restrict__ mask, float* __restrict__ out, int T) {
  constexpr int H = ${H};
  __shared__ float red[32];
  const int b = blockIdx.x;
  int count = 0;
  for (int t = 0; t < T; ++t) count += mask[(long)b * T + t] != 0;
  const float inv = count > 0 ? 1.f / count : 0.f;
  float ss = 0.f;
  for (int i = threadIdx.x; i < H; i += blockDim.x) {
    float s = 0.f;
    for (int t = 0; t < T; ++t)
      if (mask[(long)b * T + t] != 0) s += anvil_ld(x, ((long)b * T + t) * H + i);
    s *= inv;
    out[(long)b * H + i] = s;
    ss += s * s;
  }
  if (${NORMALIZE}) {
    const float scale = 1.f / fmaxf(sqrtf(anvil_block_sum(ss, red)), 1e-12f);
    for (int i = threadIdx.x; i < H; i += blockDim.x) out[(long)b * H + i] *= scale;
  }
}
