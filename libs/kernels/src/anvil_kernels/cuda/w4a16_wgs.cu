// Anvil W4A16 "wgs" kernel: the wg kernel (w4a16_wg.cu) with its copies taken off the tensor-core
// warps (issue #17). Appended after w4a16_gv.cu (reuses the mbarrier and bulk-copy helpers there,
// and the wg kernel's wg_half, MtcTile, MtcScales and tile_finish).
//
// Same math, weight layout, stage layout and accumulators as wg: out^T = W^T . x^T on
// wgmma.mma_async m64nBMk16, A = 64 dequantized weight columns from registers, B = x^T from a stage
// through a descriptor. What differs is who copies and how the warps wait:
//   - PW more warps, the producer (warp WN's lane 0 copies; PW = 4 makes it a warpgroup, so that
//     setmaxnreg can move its registers to the consumers), which fills each stage with three bulk copies
//     (cp.async.bulk, no tensor map): the chunk's weight words (BS strips x 512 B, one contiguous
//     run of the mtc layout), with a group's first chunk its scale/zero words (BS x 64 B), and the
//     chunk's x tile (BM/8 x 1024 B);
//   - x is that tile contiguous in global memory because the launcher first runs w4a16_tile_x,
//     which writes x in the stage's own order: XT [K/64 chunks][Mpad/8 row groups][8 k pieces]
//     [8 rows][8 values], Mpad = gridDim.x * BM, rows past M zero. A stage is then one slice of XT;
//   - per stage two mbarriers: full (the producer's expect_tx, completed by the copies' bytes) and
//     empty (every consumer thread arrives once the wgmma groups that read the stage are retired).
//     No __syncthreads in the loop: each consumer warp waits only for the chunk it multiplies, and
//     the producer only for the stage it refills, ST chunks ahead of the slowest warp.
// The copies are async-proxy writes completed on the mbarrier, which the wgmmas (async proxy) and
// the scale/weight loads (generic) read after waiting on it: no proxy fence is needed.
// Cluster (CL = 2, `__cluster_dims__(1, 2, 1)`): two column tiles of the same rows; rank 0's producer
// multicasts each x chunk into both CTAs' stages (x is what every column tile re-reads from L2), each
// CTA copies its own weights; rank 0 refills a stage once its consumers and rank 1's producer (after
// rank 1's consumers) have released it. Both CTAs meet at cluster barriers after the barriers' init
// and before the epilogue, so nothing reaches a CTA that has left.
// The producer warps leave after the last copy; the consumers' split-K barriers in tile_finish are
// a named barrier over the 32*WN consumer threads (BAR = 1).

namespace anvil_w4a16 {

__device__ __forceinline__ void mbar_init_n(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count));
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

// The same barrier (CTA-relative address bar) in the cluster's CTA `rank`: arrive, release at
// cluster scope (what this thread read of its stage happens before the peer's producer refills it).
__device__ __forceinline__ void mbar_arrive_peer(uint32_t bar, uint32_t rank) {
    asm volatile(
        "{\n.reg .b32 r;\n"
        "mapa.shared::cluster.u32 r, %0, %1;\n"
        "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [r];\n}" ::"r"(bar),
        "r"(rank)
        : "memory");
}

// mbar_wait with acquire at cluster scope (arrivals from the peer CTA).
__device__ __forceinline__ void mbar_wait_cluster(uint32_t bar, uint32_t parity) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "WAITC_%=:\n"
        "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%0], %1;\n"
        "@!p bra WAITC_%=;\n"
        "}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}

// bulk_g2s to the same CTA-relative offsets (dst, bar) in every CTA of the cluster in mask.
__device__ __forceinline__ void bulk_g2s_multicast(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar,
                                                   uint16_t mask) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster "
        "[%0], [%1], %2, [%3], %4;" ::"r"(dst),
        "l"(src), "r"(bytes), "r"(bar), "h"(mask)
        : "memory");
}

__device__ __forceinline__ uint32_t cluster_rank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}

__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// blockDim.x = 32*(WN + PW); dynamic shared memory ST * STAGE bytes, then 2*ST mbarriers (8 B each).
template <int DT, int MT, int NS, int WN, int ST, int CPG, int PW, int CL>
__device__ __forceinline__ void w4a16_wgs_body(const uint4* __restrict__ W, const uint4* __restrict__ SZ,
                                               const uint16_t* __restrict__ XT, uint16_t* __restrict__ Y,
                                               const uint16_t* __restrict__ bias,
                                               const uint16_t* __restrict__ res, float* __restrict__ ws,
                                               int* __restrict__ counters, int M, int N, int K, int act,
                                               int flags) {
    static_assert(WN % 4 == 0, "whole warpgroups");
    static_assert(MT == 8 || MT == 16, "wgmma N = 8*MT: 64 or 128");
    static_assert(ST >= 2, "a stage being multiplied and one being filled");
    static_assert(PW == 1 || PW == 4, "a producer warp, or a producer warpgroup that gives its registers away");
    static_assert(CL == 1 || CL == 2, "alone, or a cluster of two column tiles sharing x");
    using T = MtcTile<MT, NS, 1, WN, true>;
    extern __shared__ uint4 smem4[];
    unsigned char* smem = reinterpret_cast<unsigned char*>(smem4);
    const uint32_t smem_s = smem_u32(smem);
    const uint32_t full0 = smem_s + ST * T::STAGE;  // full[s] = full0 + 8 s, empty[s] = full0 + 8 (ST + s)
    const uint32_t empty0 = full0 + 8 * ST;
    const int lane = threadIdx.x & 31;
    const int wn = threadIdx.x >> 5;
    const int m0 = blockIdx.x * T::BM;
    const int strip0 = blockIdx.y * T::BS;
    const int strips = N >> 4;
    const int2 chunks = mtc_split_chunks<CPG>(K);
    const int c0 = chunks.x;
    const int nck = chunks.y;

    // CL = 2: the cluster's two CTAs are column tiles blockIdx.y = 2j, 2j + 1 of the same rows; rank 0
    // copies each x chunk into both (multicast), so it refills a stage only when the consumers of
    // both have released it: rank 1's producer, having waited for its own consumers, arrives on rank
    // 0's empty barrier too (one arrival more there). The consumers' loop is the same as alone (a
    // remote arrival there made ptxas serialize the wgmmas).
    const uint32_t rank = CL == 2 ? cluster_rank() : 0u;
    if (threadIdx.x == 0) {
#pragma unroll
        for (int s = 0; s < ST; ++s) {
            mbar_init_n(full0 + 8 * s, 1);    // the producer's arrive (with the bytes expected)
            // every consumer thread arrives; in a cluster's rank 0 also the peer's producer
            mbar_init_n(empty0 + 8 * s, 32 * WN + (CL == 2 && rank == 0 ? 1 : 0));
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    if constexpr (CL == 2) {
        cluster_sync();  // the peer's barriers exist before any multicast or remote arrival
    } else {
        __syncthreads();
    }

    if (wn >= WN) {  // the producer
        // PW = 4: the producer warpgroup keeps 40 registers a thread and the consumers take the
        // rest (232: a 128 x 256 tile's 128 accumulators a thread without spilling)
        if constexpr (PW == 4) asm volatile("setmaxnreg.dec.sync.aligned.u32 40;" ::: "memory");
        if (wn == WN && lane == 0 && nck > 0) {
            // strips of this tile inside N (none for a cluster's padding tile past N: it only takes x)
            const int vs = max(0, min(T::BS, strips - strip0));
            const uint32_t wbytes = vs * 512, szbytes = vs * 64, xbytes = T::X_BYTES;
            const int mpad = gridDim.x * T::BM;
            const uint4* w = W + (static_cast<size_t>(c0) * strips + strip0) * 32;
            const uint4* sz = SZ + (static_cast<size_t>(c0 / CPG) * strips + strip0) * 4;
            const uint16_t* xt = XT + (static_cast<size_t>(c0) * mpad + m0) * 64;
            const size_t wstep = static_cast<size_t>(strips) * 32, szstep = static_cast<size_t>(strips) * 4;
            const size_t xstep = static_cast<size_t>(mpad) * 64;
            for (int i = 0; i < nck; ++i) {
                const int s = i % ST;
                // pass i / ST over the ring: wait for the consumers' release of pass i / ST - 1
                if (i >= ST) {
                    const uint32_t parity = static_cast<uint32_t>((i / ST + 1) & 1);
                    if constexpr (CL == 2) {
                        mbar_wait_cluster(empty0 + 8 * s, parity);
                        if (rank == 1) mbar_arrive_peer(empty0 + 8 * s, 0);  // rank 0 may refill x
                    } else {
                        mbar_wait(empty0 + 8 * s, parity);
                    }
                }
                const uint32_t st = smem_s + s * T::STAGE;
                const uint32_t full = full0 + 8 * s;
                const bool first = i % CPG == 0;  // c0 is a multiple of CPG
                mbar_expect_tx(full, wbytes + xbytes + (first ? szbytes : 0u));
                if (vs > 0) bulk_g2s(st, w, wbytes, full);
                if (first) {
                    if (vs > 0) bulk_g2s(st + T::W_BYTES, sz, szbytes, full);
                    sz += szstep;
                }
                if constexpr (CL == 2) {
                    if (rank == 0) bulk_g2s_multicast(st + T::W_BYTES + T::SZ_BYTES, xt, xbytes, full, 0x3);
                } else {
                    bulk_g2s(st + T::W_BYTES + T::SZ_BYTES, xt, xbytes, full);
                }
                w += wstep;
                xt += xstep;
            }
        }
        if constexpr (CL == 2) {
            __syncwarp();   // lane 0 of warp WN rejoins its warp (the barrier is .aligned)
            cluster_sync();  // the peer's arrivals and copies into this CTA are over
        }
        return;
    }

    if constexpr (PW == 4) asm volatile("setmaxnreg.inc.sync.aligned.u32 232;" ::: "memory");
    float acc[NS][MT][4];
    tile_zero(acc);
    const uint32_t one = Dt<DT>::pack2(1.0f);
    MtcScales<DT, NS> sc;
    uint32_t a[4][NS][4];
    for (int i = 0; i < nck; ++i) {
        const int s = i % ST;
        mbar_wait(full0 + 8 * s, static_cast<uint32_t>((i / ST) & 1));  // chunk i's bytes have landed
        const uint32_t st_s = smem_s + s * T::STAGE;
        const unsigned char* st = smem + s * T::STAGE;
        if (i % CPG == 0) sc.load(reinterpret_cast<const uint2*>(st + T::W_BYTES), wn * NS, lane >> 2, flags);
        const uint4* sW = reinterpret_cast<const uint4*>(st) + wn * NS * 32 + lane;  // this warp's strips
        const uint32_t sx = st_s + T::W_BYTES + T::SZ_BYTES;
        uint4 w[NS];
        wg_wait<1>();  // steps 0-1 of chunk i - 1 retired: a[0..1] free (its steps 2-3 may still run)
        wg_half<0>(acc, a, w, sW, sc, one, sx);
        wg_wait<1>();  // chunk i - 1's groups retired (a[2..3] free): its stage may be refilled
        // every consumer thread arrives (a branch on the lane between the groups made ptxas
        // serialize the wgmmas: C7513)
        if (i > 0) mbar_arrive(empty0 + 8 * ((i - 1) % ST));
        wg_half<1>(acc, a, w, sW, sc, one, sx);
    }
    wg_wait<0>();
#pragma unroll
    for (int j = 0; j < NS; ++j) wg_pin(reinterpret_cast<float(&)[4 * MT]>(acc[j]));
    if constexpr (CL == 2) cluster_sync();  // with the producers: no arrival reaches an exited peer
    tile_finish<DT, MT, NS, 1, WN, 1>(acc, Y, bias, res, ws, counters, M, N, m0, strip0, act);
}

}  // namespace anvil_w4a16

// CL = 2: a compile-time cluster of two column tiles (a kernel of CL = 1 stays a plain launch)
#define ANVIL_WGS_CLUSTER_1
#define ANVIL_WGS_CLUSTER_2 __cluster_dims__(1, 2, 1)

#define ANVIL_W4A16_WGS_KERNEL(NAME, DT, MT, NS, WN, ST, CPG, PW, CL, MINB)                             \
    extern "C" __global__ void __launch_bounds__(32 * (WN + PW), MINB) ANVIL_WGS_CLUSTER_##CL           \
        NAME(const uint4* __restrict__ W, const uint4* __restrict__ SZ, const uint16_t* __restrict__ X, \
             uint16_t* __restrict__ Y, const uint16_t* __restrict__ bias,                              \
             const uint16_t* __restrict__ res, float* __restrict__ ws, int* __restrict__ counters,     \
             int M, int N, int K, int act, int flags) {                                                \
        anvil_w4a16::w4a16_wgs_body<DT, MT, NS, WN, ST, CPG, PW, CL>(W, SZ, X, Y, bias, res, ws,       \
                                                                     counters, M, N, K, act, flags);   \
    }

// x (M x K, 16-bit values) -> XT, the wgs stages' order: [K/64][mpad/8][8 k pieces][8 rows][8 values],
// rows M .. mpad - 1 zero. One thread a 16-byte piece, in XT order (the stores coalesce; a warp
// reads 4 pieces of 8 rows).
#define ANVIL_W4A16_TILE_X_KERNEL()                                                                     \
    extern "C" __global__ void __launch_bounds__(256) w4a16_tile_x(                                     \
        const uint4* __restrict__ X, uint4* __restrict__ XT, int M, int mpad, int K) {                 \
        const long long p = static_cast<long long>(blockIdx.x) * 256 + threadIdx.x;                    \
        const long long total = static_cast<long long>(mpad) * (K >> 3);                               \
        if (p >= total) return;                                                                        \
        const long long blk = p >> 6; /* (chunk, row group): 64 pieces, 1024 bytes */                  \
        const int groups = mpad >> 3;                                                                  \
        const int r = static_cast<int>(blk % groups) * 8 + static_cast<int>(p & 7);                    \
        const int piece = static_cast<int>(blk / groups) * 8 + static_cast<int>((p >> 3) & 7);         \
        XT[p] = r < M ? X[static_cast<long long>(r) * (K >> 3) + piece] : make_uint4(0, 0, 0, 0);     \
    }
