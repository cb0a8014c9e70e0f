// ${KERNEL}: (activations ${ACT_T}, arithmetic fp32) softmax(q k^T * scale, key-padding mask) v for one (query row i, head h, batch b)
// per block. q/k/v rows live in (B, T, stride) tensors at column offset + h * ${D}; out (B, T,
// ${HEADS} * ${D}). A padded key gets probability 0; a row with no valid key gives zeros.
// CPU twin: anvil_kernels.attention over the (B, H, T, D) views of the same tensors.
extern "C" __global__ void __launch_bounds__(${THREADS}) ${KERNEL}(
    const ${ACT_T}* __restrict__ q, const ${ACT_T}* __restrict__ k, const ${ACT_T}* __restrict__ v,
    const ${MASK_T}* __restrict__ mask, ${ACT_T}* __restrict__ out, int T) {
  constexpr int D = ${D}, H = ${HEADS}, MAXT = ${MAX_T};
  constexpr int QS = ${Q_STRIDE}, KS = ${K_STRIDE}, VS = ${V_STRIDE};
  __shared__ float qs[D];
  __shared__ float p[MAXT];
  __shared__ float red[32];
  const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const ${ACT_T}* qrow = q + ((long)b * T + i) * QS + ${Q_OFF} + h * D;
  for (int d = threadIdx.x; d < D; d += blockDim.x) qs[d] = anvil_ld(qrow, d);
  __syncthreads();
  float mx = -ANVIL_INF;
  for (int j = threadIdx.x; j < T; j += blockDim.x) {
    float s = -ANVIL_INF;
    if (${HAS_MASK} == 0 || mask[(long)b * T + j] != 0) {
      const ${ACT_T}* krow = k + ((long)b * T + j) * KS + ${K_OFF} + h * D;
      float dot = 0.f;
      for (int d = 0; d < D; ++d) dot += qs[d] * anvil_ld(krow, d);
      s = dot * ${SCALE}f;
    }
    p[j] = s;
    mx = fmaxf(mx, s);
  }
  mx = anvil_block_max(mx, red);
  float total = 0.f;
  for (int j = threadIdx.x; j < T; j += blockDim.x) {
    const float e = (mx == -ANVIL_INF || p[j] == -ANVIL_INF) ? 0.f : __expf(p[j] - mx);
    p[j] = e;
    total += e;
  }
  total = anvil_block_sum(total, red);  // synchronizes, so p[] is complete
  const float inv = total > 0.f ? 1.f / total : 0.f;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.f;
    for (int j = 0; j < T; ++j) acc += p[j] * anvil_ld(v, ((long)b * T + j) * VS + ${V_OFF} + h * D + d);
    anvil_st(out, ((long)b * T + i) * (H * D) + h * D + d, acc * inv);
  }
}
