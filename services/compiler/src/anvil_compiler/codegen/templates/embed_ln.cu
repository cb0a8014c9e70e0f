// ${KERNEL}: (out ${ACT_T}, fp32 statistics) out[b, t] = LN?(table[ids[b, t]] + pos[t]) for one token per block, H = ${H}.
// CPU twin: anvil_kernels.embedding, + pos rows, then anvil_kernels.layer_norm when LN.
extern "C" __global__ void __launch_bounds__(${THREADS}) ${KERNEL}(
    const ${IDS_T}* __restrict__ ids, const ${TABLE_T}* __restrict__ table, const float* __restrict__ pos,
    const float* __restrict__ gamma, const float* __restrict__ beta, ${ACT_T}* __restrict__ out, int T) {
  constexpr int H = ${H}, POS_ROWS = ${POS_ROWS};
  __shared__ float red[32];
  __shared__ float row[H];
  const long r = blockIdx.x;
  const int t = (int)(r % T);
  const long id = (long)ids[r];
  const float* prow = pos + (POS_ROWS == 1 ? 0 : t) * H;
  float sum = 0.f;
  for (int i = threadIdx.x; i < H; i += blockDim.x) {
    const float e = anvil_ld(table, id * H + i) + prow[i];
    row[i] = e;
    sum += e;
  }
  if (${LN}) {
    const float mean = anvil_block_sum(sum, red) * (1.f / H);
    float sq = 0.f;
    for (int i = threadIdx.x; i < H; i += blockDim.x) sq += (row[i] - mean) * (row[i] - mean);
    const float rstd = rsqrtf(anvil_block_sum(sq, red) * (1.f / H) + ${EPS}f);
    for (int i = threadIdx.x; i < H; i += blockDim.x) anvil_st(out, r * H + i, (row[i] - mean) * rstd * gamma[i] + beta[i]);
  } else {
    for (int i = threadIdx.x; i < H; i += blockDim.x) anvil_st(out, r * H + i, row[i]);
  }
}
