// ${KERNEL}: (activations ${ACT_T}, staged and computed in fp32) softmax(q k^T * scale, key-padding
// mask) v for one (head h, batch b) per blockIdx (x, y), one warp per query row. A short batch
// spreads the rows of (b, h) over ZS <= gridDim.z blocks (row i on block i / WARPS % ZS), ZS as many
// as it takes to launch ${MIN_BLOCKS} working blocks; the z blocks past ZS return at once (a big
// batch fills the SMs with its (h, b) blocks, and every split block stages K and V again). Each
// block stages the sequence's K and V (T x ${D} each) in shared memory, so each key is read from
// global memory once per (b, h, block) instead of once per query row (the per-row kernel,
// attention.cu, read them T times). K rows are padded to ${D} + 1 floats so the 32 lanes, each on
// its own key, hit 32 different banks. Semantics as attention.cu: a padded key gets probability 0;
// a row with no valid key gives zeros. Dynamic shared memory: ${SMEM_FLOATS} floats (sized for
// MAX_T = ${MAX_T}). CPU twin: anvil_kernels.attention over the (B, H, T, D) views.
// Latency, which is what a short batch's few blocks are made of: the staging loop is unrolled so a
// thread has several K/V loads in flight (one at a time, each an L2 round trip, they were most of a
// lone sentence's attention), the key mask is staged once (not re-read from global memory per query
// row), and a warp loads its next query row while it computes the current one.
extern "C" __global__ void __launch_bounds__(${THREADS}) ${KERNEL}(
    const ${ACT_T}* __restrict__ q, const ${ACT_T}* __restrict__ k, const ${ACT_T}* __restrict__ v,
    const ${MASK_T}* __restrict__ mask, ${ACT_T}* __restrict__ out, int T) {
  constexpr int D = ${D}, H = ${HEADS}, MAXT = ${MAX_T}, DP = D + 1, WARPS = ${THREADS} / 32;
  constexpr int QS = ${Q_STRIDE}, KS = ${K_STRIDE}, VS = ${V_STRIDE};
  extern __shared__ float smem[];
  float* ks = smem;              // (MAXT, D + 1)
  float* vs = ks + MAXT * DP;    // (MAXT, D)
  float* qs = vs + MAXT * D;     // (WARPS, D): the warp's query row, pre-scaled
  float* ps = qs + WARPS * D;    // (WARPS, MAXT): the warp's scores, then probabilities
  float* ms = ps + WARPS * MAXT; // (MAXT): 1 for a valid key, 0 for a padded one
  const int h = blockIdx.x, b = blockIdx.y;
  const int per_z = gridDim.x * gridDim.y;  // (h, b) blocks
  int zs = (${MIN_BLOCKS} + per_z - 1) / per_z;  // in [1, gridDim.z]
  if (zs > (int)gridDim.z) zs = gridDim.z;
  if (zs < 1) zs = 1;
  if (blockIdx.z >= zs) return;  // the whole block: before any barrier
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const long seq0 = (long)b * T;  // the sequence's first row
#pragma unroll 4
  for (int idx = threadIdx.x; idx < T * D; idx += blockDim.x) {
    const int j = idx / D, d = idx - j * D;
    const long row = seq0 + j;
    ks[j * DP + d] = anvil_ld(k, row * KS + ${K_OFF} + h * D + d);
    vs[j * D + d] = anvil_ld(v, row * VS + ${V_OFF} + h * D + d);
  }
  for (int j = threadIdx.x; j < T; j += blockDim.x)
    ms[j] = (${HAS_MASK} == 0 || mask[seq0 + j] != 0) ? 1.f : 0.f;
  __syncthreads();
  constexpr int QR = (D + 31) / 32;  // query elements per lane
  float* qw = qs + warp * D;
  float* pw = ps + warp * MAXT;
  const int step = WARPS * zs;
  int i = blockIdx.z * WARPS + warp;
  float qn[QR];  // the warp's next query row, loaded ahead
#pragma unroll
  for (int r = 0; r < QR; ++r) {
    const int d = lane + 32 * r;
    qn[r] = (i < T && d < D) ? anvil_ld(q, (seq0 + i) * QS + ${Q_OFF} + h * D + d) : 0.f;
  }
  for (; i < T; i += step) {
#pragma unroll
    for (int r = 0; r < QR; ++r) {
      const int d = lane + 32 * r;
      if (d < D) qw[d] = qn[r] * ${SCALE}f;
    }
    const int next = i + step;
#pragma unroll
    for (int r = 0; r < QR; ++r) {
      const int d = lane + 32 * r;
      if (next < T && d < D) qn[r] = anvil_ld(q, (seq0 + next) * QS + ${Q_OFF} + h * D + d);
    }
    __syncwarp();
    float mx = -ANVIL_INF;
    for (int j = lane; j < T; j += 32) {
      float s = -ANVIL_INF;
      if (ms[j] != 0.f) {
        float dot = 0.f;
#pragma unroll
        for (int d = 0; d < D; ++d) dot += qw[d] * ks[j * DP + d];
        s = dot;
      }
      pw[j] = s;
      mx = fmaxf(mx, s);
    }
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float total = 0.f;
    for (int j = lane; j < T; j += 32) {
      const float e = (mx == -ANVIL_INF || pw[j] == -ANVIL_INF) ? 0.f : __expf(pw[j] - mx);
      pw[j] = e;
      total += e;
    }
    for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
    __syncwarp();  // every lane's probabilities are written before any lane reads them
    const float inv = total > 0.f ? 1.f / total : 0.f;
    for (int d = lane; d < D; d += 32) {
      float acc = 0.f;
#pragma unroll 4
      for (int j = 0; j < T; ++j) acc += pw[j] * vs[j * D + d];
      anvil_st(out, (seq0 + i) * (H * D) + h * D + d, acc * inv);
    }
    __syncwarp();  // the next row overwrites qw and pw
  }
}
