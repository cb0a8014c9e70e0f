// Anvil W4A16 tiled tensor-core GEMM (M >= ~32): out = act(x @ W + bias) + residual.
// Appended after w4a16.cu (reuses Dt<>, deq<>, activate, FLAG_*); same prepacked weights, so one
// copy of the weights serves both this kernel and the GEMV-like one (docs/kernels_gpu.md).
//
// Formulation as w4a16.cu: out^T (N x M) = W^T . x^T on mma.sync m16n8k16, A = dequantized weights
// (16 columns n x 16 k, from registers), B = activations (16 k x 8 rows of x, from shared memory).
//
// Block tile: BM = 8*MT*WM rows of x by BN = 16*NS*WN columns; NT = 32*WM*WN threads. Warp
// (wm, wn) = (warp / WN, warp % WN) owns rows [8*MT*wm, 8*MT*(wm+1)) and strips
// [NS*wn, NS*(wn+1)) of the block tile. One pipeline stage = one 64-k chunk:
//   sW  [BS strips][32 lanes] uint4   the prepacked qweight words of (strip, chunk): 512 B/strip
//   sSZ [BS strips][8][2]     uint32  scale | zero << 16 of (strip, group of the chunk)
//   sX  [BM rows][72]         uint16  x[m, 64c .. 64c+64), rows padded by 16 B (no bank conflicts
//                                     for the lanes' 16-byte reads)
// filled by cp.async.cg (16 B per thread per piece, zero-fill past M or past N), ST stages deep.
// A lane's A fragments for the chunk's four k16 steps are one 16-byte shared load per strip; its
// B fragments (the permuted k order of prepack) are 32 consecutive bytes of one x row: two
// 16-byte shared loads per 8-row tile.
//
// grid = (M tiles, N tiles, S): split z sums whole groups [G*z/S, G*(z+1)/S). With S > 1 each block
// writes its fp32 partials to ws in fragment order ([tile][z][reg][thread], coalesced), and the
// last block of a tile to arrive (atomic counter, which it resets to 0) adds the S partials in z
// order (deterministic), then runs the epilogue. ws: M tiles * N tiles * S * BM * BN floats;
// counters: M tiles * N tiles ints, zero before the first launch. One layer must not run on two
// streams at once when S > 1 (the counters are shared).

namespace anvil_w4a16 {

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
    const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    const int n = valid ? 16 : 0;  // src-size 0: the 16 bytes are zero-filled, nothing is read
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(n));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::); }

template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

template <int MT, int NS, int WM, int WN>
struct TcTile {
    static constexpr int BM = 8 * MT * WM;
    static constexpr int BS = NS * WN;  // 16-column strips per block
    static constexpr int BN = 16 * BS;
    static constexpr int NT = 32 * WM * WN;
    static constexpr int XROW = 144;  // bytes per x row in shared memory (128 + 16 pad)
    static constexpr int W_BYTES = BS * 512;
    static constexpr int SZ_BYTES = BS * 64;
    static constexpr int X_BYTES = BM * XROW;
    static constexpr int STAGE = W_BYTES + SZ_BYTES + X_BYTES;
    static constexpr int REGS = NS * MT * 4;  // accumulators per thread
};

// Issue the cp.async copies of chunk c (group grp) into one stage.
template <int MT, int NS, int WM, int WN>
__device__ __forceinline__ void tc_load_stage(unsigned char* st, const uint4* __restrict__ W,
                                              const uint4* __restrict__ SZ, const uint16_t* __restrict__ X,
                                              int strip0, int strips, int m0, int M, int K, int KC, int G,
                                              int c, int grp) {
    using T = TcTile<MT, NS, WM, WN>;
    const int tid = threadIdx.x;
#pragma unroll
    for (int p = tid; p < T::BS * 32; p += T::NT) {
        const int strip = strip0 + (p >> 5);
        const bool ok = strip < strips;
        const uint4* src = ok ? W + ((static_cast<size_t>(strip) * KC + c) * 32 + (p & 31)) : W;
        cp_async16(st + p * 16, src, ok);
    }
    if (tid < T::BS * 4) {
        const int strip = strip0 + (tid >> 2);
        const bool ok = strip < strips;
        const uint4* src = ok ? SZ + ((static_cast<size_t>(strip) * G + grp) * 4 + (tid & 3)) : SZ;
        cp_async16(st + T::W_BYTES + tid * 16, src, ok);
    }
#pragma unroll
    for (int p = tid; p < T::BM * 8; p += T::NT) {
        const int r = p >> 3;
        const int m = m0 + r;
        const bool ok = m < M;
        const uint16_t* src = ok ? X + (static_cast<size_t>(m) * K + static_cast<size_t>(c) * 64 + (p & 7) * 8) : X;
        cp_async16(st + T::W_BYTES + T::SZ_BYTES + r * T::XROW + (p & 7) * 16, src, ok);
    }
}

// C fragment (16 n x 8 m) q -> n = 16*strip + g8 + 8*(q >> 1), m = 2*t4 + (q & 1); ACT -1: the
// runtime code ``act``.
// KC > 1 (the wgs cluster's split-K, w4a16_wgs.cu): only the accumulator quads (j, mt) with
// (j * MT + mt) % KC == rank
template <int DT, int MT, int NS, int WM, int WN, int ACT, int KC = 1>
__device__ __forceinline__ void tc_epilogue(const float (&acc)[NS][MT][4], uint16_t* __restrict__ Y,
                                            const uint16_t* __restrict__ bias,
                                            const uint16_t* __restrict__ res, int M, int N, int m0,
                                            int strip0, int act, int rank = 0) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int wm = warp / WN;
    const int wn = warp % WN;
    const int g8 = lane >> 2;
    const int t4 = lane & 3;
    const int strips = N >> 4;
#pragma unroll
    for (int j = 0; j < NS; ++j) {
        const int strip = strip0 + wn * NS + j;
        if (strip >= strips) continue;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int n = strip * 16 + g8 + 8 * (q >> 1);
            const float bn = bias != nullptr ? Dt<DT>::to_f(bias[n]) : 0.0f;
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                if (KC > 1 && (j * MT + mt) % KC != rank) continue;
                const int m = m0 + (wm * MT + mt) * 8 + 2 * t4 + (q & 1);
                if (m >= M) continue;
                float v = acc[j][mt][q] + bn;
                v = ACT == ACT_NONE ? v : ACT == ACT_RELU ? (v > 0.0f ? v : 0.0f) : activate(v, act);
                const size_t o = static_cast<size_t>(m) * N + n;
                if (res != nullptr) v += Dt<DT>::to_f(res[o]);
                Y[o] = Dt<DT>::from_f(v);
            }
        }
    }
}

// acc = 0
template <int NS, int MT>
__device__ __forceinline__ void tile_zero(float (&acc)[NS][MT][4]) {
#pragma unroll
    for (int j = 0; j < NS; ++j)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[j][mt][q] = 0.0f;
}

// Split-K (S = gridDim.z > 1): the partials of every split go to ws in fragment order
// ([tile][z][reg][thread], coalesced) and the last block of a tile to arrive (atomic counter, reset
// to 0 by that block) adds them in z order (deterministic); then the epilogue (bias, activation,
// residual, one rounding) by the block that holds the sum. BAR 0: the block's threads are the
// tile's NT (__syncthreads); BAR > 0: named barrier BAR over the NT threads 0 .. NT - 1 (a block
// with other warps besides them, the wgs kernel's producer).
template <int BAR, int NT>
__device__ __forceinline__ void tile_sync() {
    if constexpr (BAR == 0) {
        __syncthreads();
    } else {
        asm volatile("bar.sync %0, %1;" ::"n"(BAR), "n"(NT) : "memory");
    }
}

// The epilogue, one straight-line copy per common activation (the runtime switch stays for the
// rest: inlined at each of up to 128 accumulators, it is most of the kernel's code). KC > 1: only
// the quads this cluster rank owns (tc_epilogue).
template <int DT, int MT, int NS, int WM, int WN, int KC = 1>
__device__ __forceinline__ void tile_epilogue(const float (&acc)[NS][MT][4], uint16_t* __restrict__ Y,
                                              const uint16_t* __restrict__ bias, const uint16_t* __restrict__ res,
                                              int M, int N, int m0, int strip0, int act, int rank = 0) {
    switch (act) {
        case ACT_NONE:
            tc_epilogue<DT, MT, NS, WM, WN, ACT_NONE, KC>(acc, Y, bias, res, M, N, m0, strip0, act, rank);
            break;
        case ACT_RELU:
            tc_epilogue<DT, MT, NS, WM, WN, ACT_RELU, KC>(acc, Y, bias, res, M, N, m0, strip0, act, rank);
            break;
        default:
            tc_epilogue<DT, MT, NS, WM, WN, -1, KC>(acc, Y, bias, res, M, N, m0, strip0, act, rank);
    }
}

template <int DT, int MT, int NS, int WM, int WN, int BAR = 0>
__device__ __forceinline__ void tile_finish(float (&acc)[NS][MT][4], uint16_t* __restrict__ Y,
                                           const uint16_t* __restrict__ bias,
                                           const uint16_t* __restrict__ res, float* __restrict__ ws,
                                           int* __restrict__ counters, int M, int N, int m0, int strip0,
                                           int act) {
    using T = TcTile<MT, NS, WM, WN>;
    const int tid = threadIdx.x;
    const int S = gridDim.z;
    const int z = blockIdx.z;
    if (S > 1) {
        __shared__ int last;
        const int tile = blockIdx.y * gridDim.x + blockIdx.x;
        float* wt = ws + static_cast<size_t>(tile) * S * T::REGS * T::NT;
#pragma unroll
        for (int j = 0; j < NS; ++j)
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int q = 0; q < 4; ++q)
                    __stcg(wt + (static_cast<size_t>(z) * T::REGS + (j * MT + mt) * 4 + q) * T::NT + tid,
                           acc[j][mt][q]);
        __threadfence();  // partials visible device-wide before the counter moves
        tile_sync<BAR, T::NT>();
        if (tid == 0) last = atomicAdd(counters + tile, 1) == S - 1;
        tile_sync<BAR, T::NT>();
        if (!last) return;
        __threadfence();
        // ZB splits' partials per round trip (at least 32 loads in flight per thread: the reduction
        // is the launch's tail), added in z order whichever block arrives last (deterministic)
        constexpr int ZB = T::REGS >= 32 ? 1 : 32 / T::REGS;
        tile_zero(acc);
        for (int z0 = 0; z0 < S; z0 += ZB) {
            float v[ZB][NS][MT][4];
#pragma unroll
            for (int zb = 0; zb < ZB; ++zb)
#pragma unroll
                for (int j = 0; j < NS; ++j)
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                        for (int q = 0; q < 4; ++q) {
                            const size_t o = (static_cast<size_t>(z0 + zb) * T::REGS + (j * MT + mt) * 4 + q) * T::NT;
                            v[zb][j][mt][q] = z0 + zb < S ? __ldcg(wt + o + tid) : 0.0f;
                        }
#pragma unroll
            for (int zb = 0; zb < ZB; ++zb)
#pragma unroll
                for (int j = 0; j < NS; ++j)
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                        for (int q = 0; q < 4; ++q) acc[j][mt][q] += v[zb][j][mt][q];
        }
        if (tid == 0) counters[tile] = 0;  // ready for the next launch
    }

    tile_epilogue<DT, MT, NS, WM, WN>(acc, Y, bias, res, M, N, m0, strip0, act);
}

// blockDim.x = NT; dynamic shared memory ST * STAGE bytes.
template <int DT, int MT, int NS, int WM, int WN, int ST, int CPG, bool SA>
__device__ __forceinline__ void w4a16_tc_body(const uint4* __restrict__ W, const uint4* __restrict__ SZ,
                                              const uint16_t* __restrict__ X, uint16_t* __restrict__ Y,
                                              const uint16_t* __restrict__ bias,
                                              const uint16_t* __restrict__ res, float* __restrict__ ws,
                                              int* __restrict__ counters, int M, int N, int K, int act,
                                              int flags) {
    using T = TcTile<MT, NS, WM, WN>;
    extern __shared__ uint4 smem4[];
    unsigned char* smem = reinterpret_cast<unsigned char*>(smem4);
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int wm = warp / WN;
    const int wn = warp % WN;
    const int g8 = lane >> 2;
    const int t4 = lane & 3;
    const int S = gridDim.z;
    const int z = blockIdx.z;
    const int m0 = blockIdx.x * T::BM;
    const int strip0 = blockIdx.y * T::BS;
    const int strips = N >> 4;
    const int KC = K >> 6;
    const int G = KC / CPG;
    const int gb = static_cast<int>((static_cast<long long>(G) * z) / S);
    const int ge = static_cast<int>((static_cast<long long>(G) * (z + 1)) / S);
    const int c0 = gb * CPG;
    const int nck = (ge - gb) * CPG;

    float acc[NS][MT][4];
    float cg[SA ? 1 : NS][SA ? 1 : MT][4];  // per-group sums (exact path only)
#pragma unroll
    for (int j = 0; j < NS; ++j)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[j][mt][i] = 0.0f;

#pragma unroll
    for (int s = 0; s < ST - 1; ++s) {
        if (s < nck)
            tc_load_stage<MT, NS, WM, WN>(smem + s * T::STAGE, W, SZ, X, strip0, strips, m0, M, K, KC, G,
                                          c0 + s, (c0 + s) / CPG);
        cp_async_commit();  // an empty group when s >= nck keeps the wait count uniform
    }

    const uint32_t one = Dt<DT>::pack2(1.0f);
    float slo[NS], shi[NS];
    uint32_t zlo[NS], zhi[NS], s2lo[NS], s2hi[NS];
    for (int i = 0; i < nck; ++i) {
        cp_async_wait<ST - 2>();  // chunk i has landed (this thread's copies) ...
        __syncthreads();          // ... and everyone's; everyone is done with chunk i - 1's stage
        {
            const int nx = i + ST - 1;
            if (nx < nck)
                tc_load_stage<MT, NS, WM, WN>(smem + (nx % ST) * T::STAGE, W, SZ, X, strip0, strips, m0, M, K,
                                              KC, G, c0 + nx, (c0 + nx) / CPG);
            cp_async_commit();
        }
        const unsigned char* st = smem + (i % ST) * T::STAGE;
        const uint4* sW = reinterpret_cast<const uint4*>(st);
        const uint2* sSZ = reinterpret_cast<const uint2*>(st + T::W_BYTES);
        const unsigned char* sX = st + T::W_BYTES + T::SZ_BYTES;
        const int cc = i % CPG;  // c0 is a multiple of CPG
        if (cc == 0) {
#pragma unroll
            for (int j = 0; j < NS; ++j) {
                const uint2 v = sSZ[(wn * NS + j) * 8 + g8];
                if (flags & FLAG_SCALE_BF16) {
                    slo[j] = Dt<0>::to_f(static_cast<uint16_t>(v.x & 0xFFFFu));
                    shi[j] = Dt<0>::to_f(static_cast<uint16_t>(v.y & 0xFFFFu));
                } else {
                    slo[j] = Dt<1>::to_f(static_cast<uint16_t>(v.x & 0xFFFFu));
                    shi[j] = Dt<1>::to_f(static_cast<uint16_t>(v.y & 0xFFFFu));
                }
                zlo[j] = Dt<DT>::pack2(-(Dt<DT>::MAGIC_F + static_cast<float>(v.x >> 16)));
                zhi[j] = Dt<DT>::pack2(-(Dt<DT>::MAGIC_F + static_cast<float>(v.y >> 16)));
                s2lo[j] = Dt<DT>::pack2(slo[j]);
                s2hi[j] = Dt<DT>::pack2(shi[j]);
                if (!SA) {
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                        for (int q = 0; q < 4; ++q) cg[SA ? 0 : j][SA ? 0 : mt][q] = 0.0f;
                }
            }
        }
        uint4 w[NS];
#pragma unroll
        for (int j = 0; j < NS; ++j) w[j] = sW[(wn * NS + j) * 32 + lane];
        uint4 xa[MT], xb[MT];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            const uint4* xr = reinterpret_cast<const uint4*>(sX + ((wm * MT + mt) * 8 + g8) * T::XROW + t4 * 32);
            xa[mt] = xr[0];
            xb[mt] = xr[1];
        }
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            const int sh = (s & 1) * 4;
#pragma unroll
            for (int j = 0; j < NS; ++j) {
                const uint32_t wa = (s < 2) ? w[j].x : w[j].z;
                const uint32_t wb = (s < 2) ? w[j].y : w[j].w;
                uint32_t a0 = deq<DT>(wa, sh, zlo[j], one);
                uint32_t a1 = deq<DT>(wa, sh + 8, zhi[j], one);
                uint32_t a2 = deq<DT>(wb, sh, zlo[j], one);
                uint32_t a3 = deq<DT>(wb, sh + 8, zhi[j], one);
                if (SA) {  // (q - z) * s rounded once to bf16/fp16; rows g8 use slo, rows g8 + 8 shi
                    a0 = Dt<DT>::mul2(a0, s2lo[j]);
                    a1 = Dt<DT>::mul2(a1, s2hi[j]);
                    a2 = Dt<DT>::mul2(a2, s2lo[j]);
                    a3 = Dt<DT>::mul2(a3, s2hi[j]);
                }
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    const uint32_t b0 = s == 0 ? xa[mt].x : s == 1 ? xa[mt].z : s == 2 ? xb[mt].x : xb[mt].z;
                    const uint32_t b1 = s == 0 ? xa[mt].y : s == 1 ? xa[mt].w : s == 2 ? xb[mt].y : xb[mt].w;
                    Dt<DT>::mma(SA ? acc[j][mt] : cg[SA ? 0 : j][SA ? 0 : mt], a0, a1, a2, a3, b0, b1);
                }
            }
        }
        if (!SA && cc == CPG - 1) {
#pragma unroll
            for (int j = 0; j < NS; ++j)
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    const int jj = SA ? 0 : j, mm = SA ? 0 : mt;
                    acc[j][mt][0] = fmaf(slo[j], cg[jj][mm][0], acc[j][mt][0]);
                    acc[j][mt][1] = fmaf(slo[j], cg[jj][mm][1], acc[j][mt][1]);
                    acc[j][mt][2] = fmaf(shi[j], cg[jj][mm][2], acc[j][mt][2]);
                    acc[j][mt][3] = fmaf(shi[j], cg[jj][mm][3], acc[j][mt][3]);
                }
        }
    }
    cp_async_wait<0>();
    tile_finish<DT, MT, NS, WM, WN>(acc, Y, bias, res, ws, counters, M, N, m0, strip0, act);
}

}  // namespace anvil_w4a16

#define ANVIL_W4A16_TC_KERNEL(NAME, DT, MT, NS, WM, WN, ST, CPG, SA)                                        \
    extern "C" __global__ void __launch_bounds__(32 * WM * WN, 1)                                      \
        NAME(const uint4* __restrict__ W, const uint4* __restrict__ SZ, const uint16_t* __restrict__ X, \
             uint16_t* __restrict__ Y, const uint16_t* __restrict__ bias,                              \
             const uint16_t* __restrict__ res, float* __restrict__ ws, int* __restrict__ counters,     \
             int M, int N, int K, int act, int flags) {                                                \
        anvil_w4a16::w4a16_tc_body<DT, MT, NS, WM, WN, ST, CPG, SA>(W, SZ, X, Y, bias, res, ws,       \
                                                                    counters, M, N, K, act, flags);    \
    }
