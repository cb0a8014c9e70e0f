// Anvil W4A16 GEMV-like kernel, shared-memory ring variants ("gv", issue #17): the same prepacked
// weights, launch geometry, math (the same bits; the dequantization's mask and MAGIC in one lop3,
// gv_deq) and output as w4a16_stream_body (w4a16.cu), but the weights and
// scales reach each warp through a per-warp ring of NST stages in shared memory instead of a
// register ring, so the bytes a warp keeps in flight no longer cost registers.
//
// Why: the register ring of w4a16_stream_body holds 4 chunks (2 KiB) per warp (8 chunks took 120
// registers and lost, bench/results/w4a16_probe.md), about 32 KiB in flight per SM at 16 warps;
// by Little's law that sustains ~2.3-2.9 TB/s at ~1.5 us of loaded DRAM latency, about what the
// H200 measured (15.4 us for 34 MiB at 8192^2, M = 1) against 10.1 us for a plain streaming read.
// With the ring in shared memory a warp can keep 8-16 chunks (4-8 KiB) in flight. (A hypothesis:
// built, not yet measured; the bench times these configs next to the register ring.)
//
// Stage s of a warp = SC consecutive 64-k chunks of its strip (whole groups, SC % CPG == 0) and
// those groups' scale/zero words: [SC x 512 B weights][SC/CPG x 64 B sz]. Both are contiguous in
// global memory (prepack's layout is strip-major, chunk after chunk; sz is (strip, group, 8, 2)).
// Two loaders (template LOAD):
//   LOAD_CPASYNC: every lane copies its own 16 B of each chunk with cp.async.cg (L1 bypass), lanes
//     0..4*SC/CPG-1 copy the scale words; one commit group per stage, cp.async.wait_group NST-1,
//     then __syncwarp (the scale words were copied by other lanes).
//   LOAD_BULK: lane 0 issues two cp.async.bulk copies (TMA, no tensor map: weights SC x 512 B and
//     scales) per stage, completing on the stage's mbarrier (expect_tx); every lane waits on its
//     parity. One instruction per stage instead of one per lane and chunk.
// A stage is refilled (stage index + NST) only after the warp has consumed it: the lanes' shared
// loads of that stage have returned (their values fed the mma) and a __syncwarp orders them
// before the refill. Warps never share a ring: no block barrier until the split-K reduction.
//
// Shared memory (dynamic): [NST mbarriers per warp (LOAD_BULK), padded to 128 B]
// [warp rings: warps x NST x STAGE_BYTES] [split-K reduction: SK*SN*MT*512 B, as w4a16.cu].
// anvil_kernels.cuda.w4a16_gv.GvConfig.smem mirrors this, gv_model.py replays it.

namespace anvil_w4a16 {

enum { LOAD_CPASYNC = 0, LOAD_BULK = 1 };

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// (cp_async_commit and cp_async_wait<N> come from w4a16_tc.cu, earlier in the same source)
__device__ __forceinline__ void gv_cp16(uint32_t dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}

// an mbarrier expecting COUNT arrivals a phase (1: one arrive.expect_tx, as the bulk loader's)
template <uint32_t COUNT = 1>
__device__ __forceinline__ void mbar_init(uint32_t bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "n"(COUNT));
}

__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "WAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
        "@!p bra WAIT_%=;\n"
        "}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}

__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
        "l"(src), "r"(bytes), "r"(bar)
        : "memory");
}

// deq of w4a16.cu with the mask and the MAGIC bits in one lop3 ((a & b) | c: 0xEA): ptxas splits
// deq's `& 0x000F000F | MAGIC` into two LOP3s, both constants being immediates (SASS of the
// register-ring body); here MAGIC sits in a register. Same bits, one instruction less per pair.
template <int DT>
__device__ __forceinline__ uint32_t gv_deq(uint32_t w, int sh, uint32_t zc, uint32_t one, uint32_t magic) {
    uint32_t t;
    asm("lop3.b32 %0, %1, 0x000F000F, %2, 0xEA;" : "=r"(t) : "r"(w >> sh), "r"(magic));
    return Dt<DT>::fma2(t, one, zc);
}

// One stage's copies: chunks [c0, c0 + nc) of the warp's strip and groups [c0, c0 + nc) / CPG.
template <int LOAD, int CPG>
__device__ __forceinline__ void gv_fill(uint32_t dst, uint32_t bar, const uint4* wq, const uint4* sq, int nc,
                                        int sc, int lane) {
    const int ngr = nc / CPG;
    if constexpr (LOAD == LOAD_BULK) {
        if (lane == 0) {
            mbar_expect_tx(bar, static_cast<uint32_t>(nc * 512 + ngr * 64));
            bulk_g2s(dst, wq, static_cast<uint32_t>(nc * 512), bar);
            bulk_g2s(dst + sc * 512, sq, static_cast<uint32_t>(ngr * 64), bar);
        }
    } else {
        for (int c = 0; c < nc; ++c) gv_cp16(dst + c * 512 + lane * 16, wq + c * 32 + lane);
        if (lane < 4 * ngr) gv_cp16(dst + sc * 512 + lane * 16, sq + lane);
        cp_async_commit();
    }
}

// blockDim.x = 32 * SN * SK, one strip per warp (NS = 1); SC chunks per stage, NST stages.
template <int DT, int MT, int CPG, int LOAD, int SC, int NST>
__device__ __forceinline__ void w4a16_gv_body(const uint4* __restrict__ W, const uint2* __restrict__ SZ,
                                              const uint16_t* __restrict__ X, uint16_t* __restrict__ Y,
                                              const uint16_t* __restrict__ bias,
                                              const uint16_t* __restrict__ res, int M, int N, int K, int SN,
                                              int SK, int act, int flags) {
    static_assert(SC % CPG == 0, "a stage holds whole groups");
    constexpr int GPS = SC / CPG;                   // groups per stage
    constexpr int STAGE_BYTES = SC * 512 + GPS * 64;  // mirrored by w4a16_gv.py
    extern __shared__ __align__(128) unsigned char gv_smem[];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int nwarps = blockDim.x >> 5;
    const int wn = warp % SN;
    const int wk = warp / SN;
    const int g8 = lane >> 2;
    const int t4 = lane & 3;
    const int m0 = blockIdx.x * (8 * MT);
    const int strip = blockIdx.y * SN + wn;
    const int KC = K >> 6;
    const int G = KC / CPG;
    const int gb = static_cast<int>((static_cast<long long>(G) * wk) / SK);
    const int ge = static_cast<int>((static_cast<long long>(G) * (wk + 1)) / SK);
    const int ng = ge - gb;
    const int nch = ng * CPG;
    const int nstage = (nch + SC - 1) / SC;

    const int bar_bytes = LOAD == LOAD_BULK ? ((nwarps * NST * 8 + 127) & ~127) : 0;
    unsigned char* ring = gv_smem + bar_bytes + warp * (NST * STAGE_BYTES);
    const uint32_t ring_s = smem_u32(ring);
    const uint32_t bar_s = smem_u32(gv_smem) + warp * (NST * 8);
    float4* red4 = reinterpret_cast<float4*>(gv_smem + bar_bytes + nwarps * (NST * STAGE_BYTES));

    float acc[1][MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[0][mt][i] = 0.0f;

    const bool active = strip < (N >> 4) && ng > 0;  // uniform across the warp
    if constexpr (LOAD == LOAD_BULK) {
        if (lane == 0) {
#pragma unroll
            for (int s = 0; s < NST; ++s) mbar_init(bar_s + s * 8);
            // make the initialized barriers visible to the async proxy (the bulk copies)
            asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        }
        __syncwarp();
    }
    if (active) {
        const bool sbf = (flags & FLAG_SCALE_BF16) != 0;
        const uint32_t one = Dt<DT>::pack2(1.0f);
        // MAGIC through an opaque move, so that it stays in a register for gv_deq's lop3
        uint32_t magic;
        asm("mov.b32 %0, %1;" : "=r"(magic) : "n"(Dt<DT>::MAGIC));
        const uint4* wq = W + ((static_cast<size_t>(strip) * KC + static_cast<size_t>(gb) * CPG) * 32);
        // sz as 16-byte pieces: a group's 8 x 2 words are 64 B, 4 pieces
        const uint4* sq = reinterpret_cast<const uint4*>(SZ) + (static_cast<size_t>(strip) * G + gb) * 4;
        const uint4* xq[MT];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {  // rows past M read row m0 (as w4a16_stream_body)
            const int m = m0 + mt * 8 + g8;
            xq[mt] = reinterpret_cast<const uint4*>(
                X + (static_cast<size_t>(m < M ? m : m0) * K + static_cast<size_t>(gb) * CPG * 64 + t4 * 16));
        }
#pragma unroll
        for (int s = 0; s < NST; ++s) {
            if (s < nstage) {
                const int nc = min(SC, nch - s * SC);
                gv_fill<LOAD, CPG>(ring_s + s * STAGE_BYTES, bar_s + s * 8, wq + s * SC * 32,
                                   sq + s * GPS * 4, nc, SC, lane);
            } else if (LOAD == LOAD_CPASYNC) {
                cp_async_commit();  // empty groups keep wait_group's count uniform
            }
        }
        pdl_launch_dependents();
        pdl_wait();  // the ring's first stages are on their way; x is the previous kernel's output

        for (int s0 = 0; s0 < nstage; s0 += NST) {
#pragma unroll
            for (int si = 0; si < NST; ++si) {
                const int s = s0 + si;
                if (s < nstage) {  // uniform
                    if constexpr (LOAD == LOAD_BULK) {
                        mbar_wait(bar_s + si * 8, static_cast<uint32_t>((s / NST) & 1));
                    } else {
                        cp_async_wait<NST - 1>();
                        __syncwarp();
                    }
                    const unsigned char* st = ring + si * STAGE_BYTES;
                    const int ngs = min(GPS, ng - s * GPS);
#pragma unroll
                    for (int gi = 0; gi < GPS; ++gi) {
                        if (gi < ngs) {
                            const uint2 v = *reinterpret_cast<const uint2*>(st + SC * 512 + gi * 64 + g8 * 8);
                            const float slo = scale_f(v.x, sbf);
                            const float shi = scale_f(v.y, sbf);
                            const uint32_t zlo = neg_magic_z2<DT>(v.x >> 16);
                            const uint32_t zhi = neg_magic_z2<DT>(v.y >> 16);
                            float cg[MT][4];
#pragma unroll
                            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                                for (int i = 0; i < 4; ++i) cg[mt][i] = 0.0f;
                            // two chunks at a time: g256's four fully unrolled spill at 64 registers
#pragma unroll 2
                            for (int cc = 0; cc < CPG; ++cc) {
                                const uint4 w =
                                    *reinterpret_cast<const uint4*>(st + (gi * CPG + cc) * 512 + lane * 16);
                                uint4 xa[MT], xb[MT];
#pragma unroll
                                for (int mt = 0; mt < MT; ++mt) {
                                    xa[mt] = __ldg(xq[mt]);
                                    xb[mt] = __ldg(xq[mt] + 1);
                                    xq[mt] += 8;
                                }
#pragma unroll
                                for (int q = 0; q < 4; ++q) {
                                    const int sh = (q & 1) * 4;
                                    const uint32_t wa = (q < 2) ? w.x : w.z;
                                    const uint32_t wb = (q < 2) ? w.y : w.w;
                                    const uint32_t a0 = gv_deq<DT>(wa, sh, zlo, one, magic);
                                    const uint32_t a1 = gv_deq<DT>(wa, sh + 8, zhi, one, magic);
                                    const uint32_t a2 = gv_deq<DT>(wb, sh, zlo, one, magic);
                                    const uint32_t a3 = gv_deq<DT>(wb, sh + 8, zhi, one, magic);
#pragma unroll
                                    for (int mt = 0; mt < MT; ++mt) {
                                        const uint4& xs = q < 2 ? xa[mt] : xb[mt];
                                        const uint32_t b0 = (q & 1) ? xs.z : xs.x;
                                        const uint32_t b1 = (q & 1) ? xs.w : xs.y;
                                        Dt<DT>::mma(cg[mt], a0, a1, a2, a3, b0, b1);
                                    }
                                }
                            }
#pragma unroll
                            for (int mt = 0; mt < MT; ++mt) {
                                acc[0][mt][0] = fmaf(slo, cg[mt][0], acc[0][mt][0]);
                                acc[0][mt][1] = fmaf(slo, cg[mt][1], acc[0][mt][1]);
                                acc[0][mt][2] = fmaf(shi, cg[mt][2], acc[0][mt][2]);
                                acc[0][mt][3] = fmaf(shi, cg[mt][3], acc[0][mt][3]);
                            }
                        }
                    }
                    // the stage is consumed (its values fed the mma above): refill it with stage s + NST
                    __syncwarp();
                    const int sn = s + NST;
                    if (sn < nstage) {
                        const int nc = min(SC, nch - sn * SC);
                        gv_fill<LOAD, CPG>(ring_s + si * STAGE_BYTES, bar_s + si * 8, wq + sn * SC * 32,
                                           sq + sn * GPS * 4, nc, SC, lane);
                    } else if (LOAD == LOAD_CPASYNC) {
                        cp_async_commit();
                    }
                }
            }
        }
    }
    pdl_wait();  // a no-op where the warp waited already
    reduce_and_store<DT, MT, 1>(acc, red4, Y, bias, res, M, N, SN, SK, wn, wk, lane, act);
}

}  // namespace anvil_w4a16

// MINB: blocks of 512 threads per SM asked of ptxas (1: up to 128 registers; 2: up to 64).
#define ANVIL_W4A16_GV_KERNEL(NAME, DT, MT, CPG, LOAD, SC, NST, MINB)                                    \
    extern "C" __global__ void __launch_bounds__(512, MINB)                                          \
        NAME(const uint4* __restrict__ W, const uint2* __restrict__ SZ, const uint16_t* __restrict__ X, \
             uint16_t* __restrict__ Y, const uint16_t* __restrict__ bias,                              \
             const uint16_t* __restrict__ res, int M, int N, int K, int SN, int SK, int act,            \
             int flags) {                                                                              \
        anvil_w4a16::w4a16_gv_body<DT, MT, CPG, LOAD, SC, NST>(W, SZ, X, Y, bias, res, M, N, K, SN, SK,  \
                                                               act, flags);                           \
    }
