// Anvil W4A16 "wgd" kernel (issue #17): the wgs tile with the dequantization taken off the
// tensor-core warps. Appended after w4a16_wgs.cu (reuses its producer, wgs_produce, the mbarrier
// and bulk-copy helpers, MtcTile, MtcScales, wg_desc_lo / wg_desc and tile_finish).
//
// In wgs the consumer warps dequantize into registers and issue register-A wgmmas: a warpgroup's
// wgmma starts only once its four warps have dequantized, and a warp dequantizes only into
// registers its earlier groups no longer read, so dequantization, arrive and tensor cores form one
// chain a warpgroup (docs/kernels_gpu.md: ~940 cycles a chunk at M = 64 against ~256 of
// tensor-core work and ~234 of issue). Here three kinds of warps, each with its own ring:
//   - warp 2 WN, the producer (wgs_produce, as in wgs): weights, scale words and x of chunk i into
//     stage i % ST on full[s]; a stage is refilled once empty[s] has every MMA thread's and every
//     dequantizing thread's arrival.
//   - warps WN .. 2 WN - 1 dequantize, one 16-column strip each (NS = 1): a chunk's weight words
//     and scale words from the stage (then they release it), the same bits as wgs, stored as
//     16-bit A tiles into A stage i % AST in the canonical no-swizzle K-major layout wgmma reads,
//     per warpgroup of 4 strips (64 columns): [8 row groups: 1024 B apart (SBO)][8 k pieces:
//     128 B apart (LBO)][8 rows][16 B], the x stages' layout, so one descriptor scheme serves both
//     operands. Register j of the m16n8k16 A fragment of lane (g, t) in step s is row group
//     2 (strip % 4) + (j & 1), k piece 2 s + (j >> 1), bytes 16 g + 4 t: one warp's store of one
//     register fills one core matrix, 128 contiguous bytes (no bank conflict). Then
//     fence.proxy.async (generic-proxy stores that wgmma, the async proxy, reads) and afull[a].
//   - warps 0 .. WN - 1 (WN / 4 warpgroups) only multiply: wgmma with both operands in shared
//     memory (A: the warpgroup's 64 columns of the A stage, B: x^T from the stage, wgs's
//     descriptors), one group a chunk (4 k16 steps); once the next chunk's group is committed,
//     wait_group 1 retires this one and they release its stage and A stage. Their accumulators,
//     split-K partials and epilogue are wgs's (tile_finish over the 32 WN threads, BAR 1).
// Barriers (8 B each, after the rings; one arrival a warp, mbar_arrive_warp): full[ST] (the
// producer's expect_tx), empty[ST] (2 WN: MMA and dequantizing warps), afull[AST] (WN dequantizing
// warps), aempty[AST] (WN MMA warps).
// The price: each chunk's A goes through shared memory (stored once, read by every wgmma), which
// the register-A kernels avoid; what it buys is that no warp waits on another's dequantization.

// D (64 x N, fp32) += A (descriptor da) . B (descriptor db), both in shared memory, K-major
// (ANVIL_WGMMA_ASM and the accumulator operands: w4a16_wg.cu); TY "bf16" or "f16"
#define ANVIL_WG_SS_IN "l"(da), "l"(db), "r"(1)
#define ANVIL_WGMMA_SS_M64N32K16(TY)                                                                     \
    ANVIL_WGMMA_ASM("m64n32k16", TY, ANVIL_WG_D16, ANVIL_WG_O16, "%18", "%16, %17, p, 1, 1, 0, 0",       \
                    ANVIL_WG_SS_IN)
#define ANVIL_WGMMA_SS_M64N64K16(TY)                                                                     \
    ANVIL_WGMMA_ASM("m64n64k16", TY, ANVIL_WG_D32, ANVIL_WG_O32, "%34", "%32, %33, p, 1, 1, 0, 0",       \
                    ANVIL_WG_SS_IN)
#define ANVIL_WGMMA_SS_M64N128K16(TY)                                                                    \
    ANVIL_WGMMA_ASM("m64n128k16", TY, ANVIL_WG_D64, ANVIL_WG_O64, "%66", "%64, %65, p, 1, 1, 0, 0",      \
                    ANVIL_WG_SS_IN)
#define ANVIL_WGMMA_SS(NN, TY) ANVIL_WGMMA_SS_M64N##NN##K16(TY)

namespace anvil_w4a16 {

template <int DT, int N>
struct WgmmaSS {
    static_assert(N == 32 || N == 64 || N == 128, "m64n{32,64,128}k16");
    static __device__ __forceinline__ void run(float (&d)[N / 2], uint64_t da, uint64_t db) {
#if ANVIL_HAS_WGMMA
        ANVIL_WGMMA_SELECT(ANVIL_WGMMA_SS)
#else
        __trap();
#endif
    }
};

__device__ __forceinline__ void sts32(uint32_t addr, uint32_t v) {
    asm volatile("st.shared.b32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}

// blockDim.x = 32 * (2 WN + 1); dynamic shared memory AST A stages of WN * 2048 bytes, ST stages
// (wgs's), then 2 (ST + AST) mbarriers.
template <int DT, int MT, int WN, int ST, int AST, int CPG>
__device__ __forceinline__ void w4a16_wgd_body(const uint4* __restrict__ W, const uint4* __restrict__ SZ,
                                               const uint16_t* __restrict__ XT, uint16_t* __restrict__ Y,
                                               const uint16_t* __restrict__ bias,
                                               const uint16_t* __restrict__ res, float* __restrict__ ws,
                                               int* __restrict__ counters, int M, int N, int K, int act,
                                               int flags) {
    static_assert(WN % 4 == 0, "whole warpgroups");
    static_assert(MT == 4 || MT == 8 || MT == 16, "wgmma N = 8*MT: 32, 64 or 128");
    static_assert(ST >= 2 && AST >= 2, "a stage being multiplied and one being filled, each ring");
    using T = MtcTile<MT, 1, 1, WN, true>;
    constexpr uint32_t A_STAGE = WN * 2048;  // WN strips x 16 columns x 64 k x 2 bytes
    constexpr uint32_t A_GROUP = 8192;       // one warpgroup's 64 columns
    extern __shared__ uint4 smem4[];
    unsigned char* smem = reinterpret_cast<unsigned char*>(smem4);
    const uint32_t a_s = smem_u32(smem);             // the A stages
    const uint32_t st_s = a_s + AST * A_STAGE;       // the stages
    const uint32_t full0 = st_s + ST * T::STAGE;     // full[s] = full0 + 8 s
    const uint32_t empty0 = full0 + 8 * ST;
    const uint32_t afull0 = empty0 + 8 * ST;
    const uint32_t aempty0 = afull0 + 8 * AST;
    const auto [lane, wn, m0, strip0, c0, nck] = WgsBlock::of<T, CPG>(K);

    if (threadIdx.x == 0) {
        mbar_ring_init<ST, 1, 2 * WN>(full0, empty0);  // empty: every MMA and dequantizing warp
        mbar_ring_init<AST, WN, WN>(afull0, aempty0);  // every dequantizing / every MMA warp
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    if (wn >= 2 * WN) {  // the producer
        if (lane == 0 && nck > 0)
            wgs_produce<T, ST, CPG>(W, SZ, XT, st_s, full0, empty0, N, c0, nck, m0, strip0, nullptr, flags);
        return;
    }

    if (wn >= WN) {  // a dequantizing warp: strip d of the tile
        const int d = wn - WN;
        // this lane's bytes in an A stage: warpgroup d / 4, the two row groups of strip d % 4
        const uint32_t lane_off = (d >> 2) * A_GROUP + 2 * (d & 3) * 1024 + (lane >> 2) * 16 + (lane & 3) * 4;
        const uint32_t one = Dt<DT>::pack2(1.0f);
        MtcScales<DT, 1> sc;
        RingPos<ST> s;   // the stage and its pass's parity
        RingPos<AST> a;  // the A stage likewise
        for (int i0 = 0; i0 < nck; i0 += CPG) {
#pragma unroll
            for (int c = 0; c < CPG; ++c) {
                mbar_wait(full0 + 8 * s.i, s.ph);
                const unsigned char* st = smem + AST * A_STAGE + s.i * T::STAGE;
                if (c == 0) sc.load(reinterpret_cast<const uint2*>(st + T::W_BYTES), d, lane >> 2, flags);
                const uint4 w = reinterpret_cast<const uint4*>(st)[d * 32 + lane];
                mbar_arrive_warp(empty0 + 8 * s.i);  // done with the stage's weights and scale words
                // pass i / AST of the A ring: the MMA warps' release of pass i / AST - 1
                if (i0 + c >= AST) mbar_wait(aempty0 + 8 * a.i, a.ph ^ 1u);
                const uint32_t ab = a_s + a.i * A_STAGE + lane_off;
#pragma unroll
                for (int step = 0; step < 4; ++step) {
                    uint32_t r[4];
                    sc.template dequant<true>(r, step == 0 ? w.x : step == 1 ? w.y : step == 2 ? w.z : w.w, 0, one);
#pragma unroll
                    for (int j = 0; j < 4; ++j) sts32(ab + (j & 1) * 1024 + (2 * step + (j >> 1)) * 128, r[j]);
                }
                fence_async_shared();  // the stores, visible to wgmma (the async proxy)
                mbar_arrive_warp(afull0 + 8 * a.i);
                s.next();
                a.next();
            }
        }
        return;
    }

    // an MMA warp: warpgroup wn / 4 multiplies its 64 columns by the chunk's x
    float acc[1][MT][4];
    tile_zero(acc);
    static_assert(T::STAGE % 16 == 0 && A_STAGE % 16 == 0, "stage descriptors step by STAGE / 16");
    const uint32_t dx0 = wg_desc_lo(st_s + T::W_BYTES + T::SZ_BYTES);
    const uint32_t da0 = wg_desc_lo(a_s + (wn >> 2) * A_GROUP);
    RingPos<ST> s;
    RingPos<AST> a;
    int sp = 0, ap = 0;  // the stage and A stage of the chunk before
    for (int i = 0; i < nck; ++i) {
        mbar_wait(full0 + 8 * s.i, s.ph);    // x has landed
        mbar_wait(afull0 + 8 * a.i, a.ph);  // A is stored
        const uint32_t dx = dx0 + s.i * (T::STAGE >> 4), da = da0 + a.i * (A_STAGE >> 4);
        wg_fence();
#pragma unroll
        for (int step = 0; step < 4; ++step)
            WgmmaSS<DT, 8 * MT>::run(reinterpret_cast<float(&)[4 * MT]>(acc[0]), wg_desc(da + 16 * step),
                                     wg_desc(dx + 16 * step));
        wg_commit();
        wg_wait<1>();  // chunk i - 1's group retired: its stage and A stage are free
        if (i > 0) {
            mbar_arrive_warp(empty0 + 8 * sp);
            mbar_arrive_warp(aempty0 + 8 * ap);
        }
        sp = s.i;
        ap = a.i;
        s.next();
        a.next();
    }
    wg_wait<0>();
    wg_pin(reinterpret_cast<float(&)[4 * MT]>(acc[0]));
    pdl_wait();  // before bias, residual, output, workspace and counters (a no-op: see wgs)
    tile_finish<DT, MT, 1, 1, WN, 1>(acc, Y, bias, res, ws, counters, M, N, m0, strip0, act);
}

}  // namespace anvil_w4a16

#define ANVIL_W4A16_WGD_KERNEL(NAME, DT, MT, WN, ST, AST, CPG, MINB)                                    \
    extern "C" __global__ void __launch_bounds__(32 * (2 * WN + 1), MINB)                               \
        NAME(const uint4* __restrict__ W, const uint4* __restrict__ SZ, const uint16_t* __restrict__ X, \
             uint16_t* __restrict__ Y, const uint16_t* __restrict__ bias,                              \
             const uint16_t* __restrict__ res, float* __restrict__ ws, int* __restrict__ counters,     \
             int M, int N, int K, int act, int flags) {                                                \
        anvil_w4a16::w4a16_wgd_body<DT, MT, WN, ST, AST, CPG>(W, SZ, X, Y, bias, res, ws, counters, M, N, \
                                                              K, act, flags);                          \
    }
