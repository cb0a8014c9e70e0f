// Anvil W4A16 "wg" kernel: the mtc kernel's work on Hopper's warpgroup tensor cores (wgmma, sm_90a),
// out = act(x @ W + bias) + residual. Appended after w4a16_mtc.cu (reuses its weight layout, loader
// and scales, and tile_finish: split-K and epilogue).
//
// Same formulation: out^T (N x M) = W^T . x^T, now on wgmma.mma_async m64nBMk16 (BM = 8*MT rows of
// x: 64 or 128), fp32 accumulation. A = 64 weight columns x 16 k from registers: a
// warpgroup's warp w holds 16 of them, in the layout of the mma.m16n8k16 A fragment, which is the
// mtc layout's (each lane's 16-byte word of a strip dequantized to a0..a3 per k16 step, scaled:
// SA only). B = x^T, 16 k x BM rows, from shared memory through a matrix descriptor.
//
// Block: WN warps (WN/4 warpgroups); warp w owns strips [NS*w, NS*w + NS) of the block's BS = NS*WN
// strips and all BM rows (accumulators acc[NS][MT][4], the mtc fragment order: the same
// epilogue and split-K). Per chunk and warp: the NS words of its strips; steps 0-1 of its NS
// fragments dequantized, wgmma.fence, 2*NS wgmmas, commit; steps 2-3 the same: two groups a chunk.
// Before a half's registers are dequantized again, wait_group 1 retires every group but the one
// issued last, which has other registers: so each warp dequantizes one half while the tensor cores
// run its previous one. (ptxas serializes register-A wgmmas when input registers of a pending group
// are redefined, as a group left pending across the loop did in the tenth session's tries; its
// kernel waited for each chunk's one group at once: no overlap within a warp.) A stage is refilled two chunks after it was read (ST - 2 chunks
// of copies in flight), when its groups are retired in every warp. x stage layout (no swizzle,
// K-major core matrices of 8 rows x 16 bytes):
//   [BM/8 row groups: 1024 B apart (SBO)][8 k pieces of 8: 128 B apart (LBO)][8 rows][16 B]
// so step s's descriptor starts at piece 2s (256*s bytes) and spans pieces 2s, 2s+1 of every group.
// The copies are cp.async (generic proxy), read by wgmma (async proxy): each thread fences its
// landed copies to the async proxy before the barrier.

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define ANVIL_HAS_WGMMA 1
#else
#define ANVIL_HAS_WGMMA 0
#endif

namespace anvil_w4a16 {

__device__ __forceinline__ void wg_fence() {
#if ANVIL_HAS_WGMMA
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}

__device__ __forceinline__ void wg_commit() {
#if ANVIL_HAS_WGMMA
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}

template <int N>
__device__ __forceinline__ void wg_wait() {
#if ANVIL_HAS_WGMMA
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
#endif
}

__device__ __forceinline__ void fence_async_shared() {
#if ANVIL_HAS_WGMMA
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

// Pin the accumulators at this point of the program (no read or write of them moves across it):
// wgmma writes them asynchronously, the compiler does not know when.
template <int R>
__device__ __forceinline__ void wg_pin(float (&d)[R]) {
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Shared memory matrix descriptor, no swizzle: start, LBO (k direction) and SBO (8-row groups), in
// 16-byte units. The stages' x is always LBO 128, SBO 1024: its descriptors are the low word
// wg_desc_lo(start) (start / 16 in bits 0-13, LBO in 16-29) over the constant high word SBO / 16,
// so a step's or a stage's descriptor is a 32-bit add to the low word (shared addresses stay below
// 2^18: the start field never carries into LBO's).
constexpr uint32_t WG_LBO = 128, WG_SBO = 1024;
__device__ __forceinline__ uint32_t wg_desc_lo(uint32_t saddr) {
    return ((saddr & 0x3FFFFu) >> 4) | ((WG_LBO >> 4) << 16);
}
__device__ __forceinline__ uint64_t wg_desc(uint32_t lo) {
    return static_cast<uint64_t>(lo) | (static_cast<uint64_t>(WG_SBO >> 4) << 32);
}
// The same for x as a tx tile's TMA wrote it: K-major with the 128-byte swizzle (rows of 64 values,
// 128 bytes, 8-row groups 1024 bytes apart: SBO 1024; LBO unused, 1), layout type 1 in bits 62-63;
// a k16 step starts 32 bytes further (2 in the low word)
__device__ __forceinline__ uint32_t wg_desc_sw_lo(uint32_t saddr) {
    return ((saddr & 0x3FFFFu) >> 4) | (1u << 16);
}
__device__ __forceinline__ uint64_t wg_desc_sw(uint32_t lo) {
    return static_cast<uint64_t>(lo) | (static_cast<uint64_t>((1024u >> 4) | (1u << 30)) << 32);
}

}  // namespace anvil_w4a16

// The accumulator operands of an m64nNk16 wgmma (N / 2 fp32 registers d[] a thread): their list
// in the instruction (%0 ..) and the matching outputs, for N = 32, 64, 128
#define ANVIL_WG_D16 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15"
#define ANVIL_WG_D32 ANVIL_WG_D16 ",%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
#define ANVIL_WG_D64                                                                                     \
    ANVIL_WG_D32 ",%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47"                      \
    ",%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
#define ANVIL_WG_O16                                                                                     \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),                  \
    "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),              \
    "+f"(d[14]), "+f"(d[15])
#define ANVIL_WG_O32                                                                                     \
    ANVIL_WG_O16,                                                                                        \
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),                        \
    "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),                        \
    "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define ANVIL_WG_O64                                                                                     \
    ANVIL_WG_O32,                                                                                        \
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]),                        \
    "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),                        \
    "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),                        \
    "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),                        \
    "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]),                        \
    "+f"(d[62]), "+f"(d[63])

// One wgmma.mma_async (SHAPE "m64nNk16", TY "bf16" or "f16", fp32 accumulators DREGS / DOUT): OPS
// is the rest of the instruction (A, B, scale-d predicate p, scales, transposes) as PTX text, the
// variadic arguments its inputs; P names the last input, the scale-d flag (1: accumulate)
#define ANVIL_WGMMA_ASM(SHAPE, TY, DREGS, DOUT, P, OPS, ...)                                             \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " P ", 0;\n"                                          \
                 "wgmma.mma_async.sync.aligned." SHAPE ".f32." TY "." TY " {" DREGS "}, " OPS ";\n}\n"   \
                 : DOUT                                                                                  \
                 : __VA_ARGS__)

// D (64 x N, fp32) += A (registers a[]) . B (descriptor desc), TY "bf16" or "f16" (N = 32: the wgs
// tiles of 32 rows of x)
#define ANVIL_WG_RS_IN "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1)
#define ANVIL_WGMMA_M64N32K16(TY)                                                                        \
    ANVIL_WGMMA_ASM("m64n32k16", TY, ANVIL_WG_D16, ANVIL_WG_O16, "%21",                                  \
                    "{%16,%17,%18,%19}, %20, p, 1, 1, 0", ANVIL_WG_RS_IN)
#define ANVIL_WGMMA_M64N64K16(TY)                                                                        \
    ANVIL_WGMMA_ASM("m64n64k16", TY, ANVIL_WG_D32, ANVIL_WG_O32, "%37",                                  \
                    "{%32,%33,%34,%35}, %36, p, 1, 1, 0", ANVIL_WG_RS_IN)
#define ANVIL_WGMMA_M64N128K16(TY)                                                                       \
    ANVIL_WGMMA_ASM("m64n128k16", TY, ANVIL_WG_D64, ANVIL_WG_O64, "%69",                                 \
                    "{%64,%65,%66,%67}, %68, p, 1, 1, 0", ANVIL_WG_RS_IN)

// OP(NN, TY): the wgmma of the enclosing template's N and DT (0: bf16, 1: fp16)
#define ANVIL_WGMMA_SELECT(OP)                                                                           \
    if constexpr (N == 32 && DT == 0) {                                                                  \
        OP(32, "bf16");                                                                                  \
    } else if constexpr (N == 32) {                                                                      \
        OP(32, "f16");                                                                                   \
    } else if constexpr (N == 64 && DT == 0) {                                                           \
        OP(64, "bf16");                                                                                  \
    } else if constexpr (N == 64) {                                                                      \
        OP(64, "f16");                                                                                   \
    } else if constexpr (DT == 0) {                                                                      \
        OP(128, "bf16");                                                                                 \
    } else {                                                                                             \
        OP(128, "f16");                                                                                  \
    }
#define ANVIL_WGMMA_RS(NN, TY) ANVIL_WGMMA_M64N##NN##K16(TY)


namespace anvil_w4a16 {

// D (64 x N, fp32, the thread's N/2 registers) += A (64 x 16, registers) . B (16 x N, descriptor);
// DT 0: bf16, 1: fp16. Traps where wgmma does not exist (a build for sm_90 without the a).
template <int DT, int N>
struct Wgmma {
    static_assert(N == 32 || N == 64 || N == 128, "m64n{32,64,128}k16");
    static __device__ __forceinline__ void run(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc) {
#if ANVIL_HAS_WGMMA
        ANVIL_WGMMA_SELECT(ANVIL_WGMMA_RS)
#else
        __trap();
#endif
    }
};

// Timing ablations of the wgs kernels (their template argument AB; 0 in every kernel the library
// builds: only bench/wgs_ablate.py instantiates others, whose outputs are wrong by design): x
// copies, the dequantization (the raw words go to the tensor cores), the wgmmas, weight copies;
// WGS_AB_TRACE leaves out nothing and stamps a per-block timeline (w4a16_wgs.cu, wgs_stamp).
enum WgsAblation : int { WGS_AB_X = 1, WGS_AB_DEQUANT = 2, WGS_AB_MMA = 4, WGS_AB_W = 8, WGS_AB_TRACE = 16 };

// One half of a chunk's wgmma work, H = 0 (k16 steps 0-1: A registers a[0..1], dequantized from the
// words w.x, w.y, which this half first loads from the stage, sW[j * 32] for strip j) or H = 1
// (steps 2-3: a[2..3] from w.z, w.w): dequantize the half into its registers, then one wgmma group
// over the two steps (B at 256-byte steps of the stage's x, whose descriptor's low word is dlo: step
// s's is dlo + 16 s; TX: x with the 128-byte swizzle, step s at dlo + 2 s, wg_desc_sw). The caller
// waits, before it, for the group that last read those registers
// (wg_wait<1>). AB: timing ablations (WGS_AB_* bits; 0: none).
template <int H, int DT, int MT, int NS, int AB = 0, int TX = 0>
__device__ __forceinline__ void wg_half(float (&acc)[NS][MT][4], uint32_t (&a)[4][NS][4], uint4 (&w)[NS],
                                        const uint4* sW, const MtcScales<DT, NS>& sc, uint32_t one,
                                        uint32_t dlo) {
#pragma unroll
    for (int j = 0; j < NS; ++j) {
        if constexpr (H == 0) w[j] = sW[j * 32];  // interleaved with the dequantization, as ptxas had it
        if constexpr ((AB & WGS_AB_DEQUANT) != 0) {  // the raw words
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                a[2 * H][j][r] = (H == 0 ? w[j].x : w[j].z) ^ r;
                a[2 * H + 1][j][r] = (H == 0 ? w[j].y : w[j].w) ^ r;
            }
        } else {
            sc.template dequant<true>(a[2 * H][j], H == 0 ? w[j].x : w[j].z, j, one);
            sc.template dequant<true>(a[2 * H + 1][j], H == 0 ? w[j].y : w[j].w, j, one);
        }
    }
    wg_fence();
#pragma unroll
    for (int s = 2 * H; s < 2 * H + 2; ++s)
#pragma unroll
        for (int j = 0; j < NS; ++j)
            if constexpr ((AB & WGS_AB_MMA) == 0)
                Wgmma<DT, 8 * MT>::run(reinterpret_cast<float(&)[4 * MT]>(acc[j]), a[s][j],
                                       TX ? wg_desc_sw(dlo + 2 * s) : wg_desc(dlo + 16 * s));
    wg_commit();
}

// blockDim.x = 32*WN (WN a multiple of 4); dynamic shared memory ST * STAGE bytes.
template <int DT, int MT, int NS, int WN, int ST, int CPG>
__device__ __forceinline__ void w4a16_wg_body(const uint4* __restrict__ W, const uint4* __restrict__ SZ,
                                              const uint16_t* __restrict__ X, uint16_t* __restrict__ Y,
                                              const uint16_t* __restrict__ bias,
                                              const uint16_t* __restrict__ res, float* __restrict__ ws,
                                              int* __restrict__ counters, int M, int N, int K, int act,
                                              int flags) {
    static_assert(WN % 4 == 0, "whole warpgroups");
    static_assert(MT == 8 || MT == 16, "wgmma N = 8*MT: 64 or 128");
    static_assert(ST >= 4, "2+ chunks of copies in flight, and the stage of the chunk in the tensor cores");
    constexpr int PF = ST - 2;  // chunks of copies in flight (a stage more holds the chunk being multiplied)
    using T = MtcTile<MT, NS, 1, WN, true>;
    extern __shared__ uint4 smem4[];
    unsigned char* smem = reinterpret_cast<unsigned char*>(smem4);
    const int lane = threadIdx.x & 31;
    const int wn = threadIdx.x >> 5;
    const int g8 = lane >> 2;
    const int m0 = blockIdx.x * T::BM;
    const int strip0 = blockIdx.y * T::BS;
    const int strips = N >> 4;
    const int2 chunks = mtc_split_chunks<CPG>(K);
    const int c0 = chunks.x;
    const int nck = chunks.y;

    float acc[NS][MT][4];
    tile_zero(acc);

    MtcLoader<MT, NS, 1, WN, CPG, true> ld(W, SZ, X, strip0, strips, m0, M, K, c0);
    const uint32_t smem_s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    ld.template prologue<PF, T::STAGE>(smem_s, nck);

    const uint32_t one = Dt<DT>::pack2(1.0f);
    MtcScales<DT, NS> sc;
    int rd = 0;   // stage read this iteration: i % ST
    int wr = PF;  // stage written this iteration: (i + PF) % ST
    // Two wgmma groups a chunk (steps 0-1: registers a[0..1], steps 2-3: a[2..3]), each waited for
    // only when its registers are about to be redefined: a warp dequantizes one half while the
    // tensor cores run its other half (its previous group). wait_group 1 retires all but the
    // group issued last, so the half about to be dequantized is free and ptxas need not serialize.
    uint32_t a[4][NS][4];
    for (int i = 0; i < nck; ++i) {
        cp_async_wait<PF - 1>();  // chunk i has landed (this thread's copies) ...
        fence_async_shared();     // ... visible to wgmma's proxy ...
        wg_wait<1>();             // ... (steps 0-1 of chunk i - 1 retired: a[0..1] free) ...
        __syncthreads();          // ... everyone's; chunk i - 2's groups are retired everywhere
        if (i + PF < nck) ld.issue(smem_s + wr * T::STAGE);  // the stage of chunk i - 2
        cp_async_commit();
        const uint32_t st_s = smem_s + rd * T::STAGE;
        const unsigned char* st = smem + rd * T::STAGE;
        rd = rd == ST - 1 ? 0 : rd + 1;
        wr = wr == ST - 1 ? 0 : wr + 1;
        if (i % CPG == 0) sc.load(reinterpret_cast<const uint2*>(st + T::W_BYTES), wn * NS, g8, flags);
        const uint4* sW = reinterpret_cast<const uint4*>(st) + wn * NS * 32 + lane;  // this warp's strips
        const uint32_t dx = wg_desc_lo(st_s + T::W_BYTES + T::SZ_BYTES);
        uint4 w[NS];
        wg_half<0>(acc, a, w, sW, sc, one, dx);
        wg_wait<1>();  // steps 2-3 of chunk i - 1 retired: a[2..3] free
        wg_half<1>(acc, a, w, sW, sc, one, dx);
    }
    wg_wait<0>();
#pragma unroll
    for (int j = 0; j < NS; ++j) wg_pin(reinterpret_cast<float(&)[4 * MT]>(acc[j]));
    cp_async_wait<0>();
    tile_finish<DT, MT, NS, 1, WN>(acc, Y, bias, res, ws, counters, M, N, m0, strip0, act);
}

}  // namespace anvil_w4a16

#define ANVIL_W4A16_WG_KERNEL(NAME, DT, MT, NS, WN, ST, CPG, MINB)                                      \
    extern "C" __global__ void __launch_bounds__(32 * WN, MINB)                                         \
        NAME(const uint4* __restrict__ W, const uint4* __restrict__ SZ, const uint16_t* __restrict__ X, \
             uint16_t* __restrict__ Y, const uint16_t* __restrict__ bias,                              \
             const uint16_t* __restrict__ res, float* __restrict__ ws, int* __restrict__ counters,     \
             int M, int N, int K, int act, int flags) {                                                \
        anvil_w4a16::w4a16_wg_body<DT, MT, NS, WN, ST, CPG>(W, SZ, X, Y, bias, res, ws, counters, M, N, \
                                                            K, act, flags);                            \
    }
