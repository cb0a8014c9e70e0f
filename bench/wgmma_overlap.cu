// Does dequantization-like integer / bf16x2 work on the SM's warps overlap with wgmma? (issue #17,
// bench/wgmma_overlap.py). The wgs tiles' ablations (bench/wgs_ablate.py) measured their consumer
// loop at about the SUM of its instruction issue and its tensor-core time; this kernel isolates the
// question from the copies, the mbarriers and the epilogue.
//
// One block a SM of NWG warpgroups. Each warp runs ITER "chunks" of the wgs consumer's shape
// (w4a16_wgs.cu): one 16-byte word from shared memory, then two halves, each: (MODE & 1) dequantize
// eight A registers from the word the way MtcScales::dequant does (shift, lop3 with the magic
// number, fma and mul on bf16x2), wgmma.fence, (MODE & 2) two wgmma m64n64k16 (A: those registers
// (SS = 0) or a descriptor into shared memory (SS = 1); B: a 64 x 64 x tile through a descriptor,
// as the wgs stages), commit, wait_group 1. R repeats the dequantization (R times the ALU work on
// the same words). The contents are zeros and random words: only the time means anything.
// Thread 0 of each block stamps clock64 around the loop (after a block barrier on both sides).

#include <cstdint>

namespace {

constexpr int ITER = 512;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// no-swizzle K-major descriptor: start, LBO, SBO (bytes), in 16-byte units
__device__ __forceinline__ uint64_t desc(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
    return static_cast<uint64_t>(((saddr & 0x3FFFFu) >> 4) | ((lbo >> 4) << 16)) |
           (static_cast<uint64_t>(sbo >> 4) << 32);
}

// one A register: the nibble pair j of w as MAGIC + q, then (x - (128 + z)) * s on bf16x2
__device__ __forceinline__ uint32_t deq(uint32_t w, int j, uint32_t nz, uint32_t s) {
    uint32_t t, u, v;
    asm("shr.b32 %0, %1, %2;" : "=r"(t) : "r"(w), "r"(4 * j));
    asm("lop3.b32 %0, %1, 0x000F000F, 0x43004300, 0xEA;" : "=r"(u) : "r"(t));
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(v) : "r"(u), "r"(0x3F803F80u), "r"(nz));
    asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(t) : "r"(v), "r"(s));
    return t;
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

#define D32 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
#define O32                                                                                               \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),       \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),          \
        "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),        \
        "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),        \
        "+f"(d[29]), "+f"(d[30]), "+f"(d[31])

__device__ __forceinline__ void mma_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" D32 "}, {%32,%33,%34,%35}, %36, 1, 1, 1, 0;"
                 : O32
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

__device__ __forceinline__ void mma_ss(float (&d)[32], uint64_t a, uint64_t b) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" D32 "}, %32, %33, 1, 1, 1, 0, 0;"
                 : O32
                 : "l"(a), "l"(b));
}

__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int n) {
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory");
}

// one half (H) of a chunk: dequantize a[2H], a[2H+1] from two words, then their two wgmmas.
// SS = 2: the warpgroup's own dequantized registers go through shared memory (sa: this warpgroup's
// 4 KB for this half; eight 4-byte stores a thread, a warp's 128 contiguous bytes each, then a proxy
// fence and the warpgroup's named barrier), and the wgmmas read A from there.
// PP (two warpgroups): the wgmma issue alternates between them (a named barrier pair, as
// FlashAttention-3's ping-pong): a warpgroup waits for its turn before its fence and passes the
// turn on after its commit, unless last (the final half of the last chunk).
template <int H, int MODE, int R, int SS, int PP = 0>
__device__ __forceinline__ void half(float (&d)[32], uint32_t (&a)[4][4], uint4 w, uint32_t nz, uint32_t s,
                                     uint64_t da, uint64_t db, uint32_t& sink, uint32_t sa = 0, bool last = false) {
    const int wgi = threadIdx.x >> 7;
    if constexpr ((MODE & 1) != 0) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const uint32_t w0 = (H == 0 ? w.x : w.z) ^ r, w1 = (H == 0 ? w.y : w.w) ^ r;
#pragma unroll
            for (int j = 0; j < 4; ++j) {  // repetitions past the first fold in (each stays live)
                a[2 * H][j] = r == 0 ? deq(w0, j, nz, s) : a[2 * H][j] ^ deq(w0, j, nz, s);
                a[2 * H + 1][j] = r == 0 ? deq(w1, j, nz, s) : a[2 * H + 1][j] ^ deq(w1, j, nz, s);
            }
        }
        if constexpr ((MODE & 2) == 0 || SS == 1) {  // nothing reads them: keep them live
#pragma unroll
            for (int j = 0; j < 4; ++j) sink ^= a[2 * H][j] ^ a[2 * H + 1][j];
        }
        if constexpr (SS == 2) {
            const uint32_t o = sa + ((threadIdx.x >> 5) & 3) * 1024 + (threadIdx.x & 31) * 4;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                asm volatile("st.shared.u32 [%0], %1;" ::"r"(o + j * 128), "r"(a[2 * H][j]) : "memory");
                asm volatile("st.shared.u32 [%0], %1;" ::"r"(o + 512 + j * 128), "r"(a[2 * H + 1][j]) : "memory");
            }
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            bar_sync(8 + wgi, 128);
        }
    }
    if constexpr (PP) bar_sync(1 + wgi, 256);
    wg_fence();
    if constexpr ((MODE & 2) != 0) {
#pragma unroll
        for (int st = 2 * H; st < 2 * H + 2; ++st) {
            if constexpr (SS == 2) {
                mma_ss(d, desc(sa + (st & 1) * 2048, 128, 256), db + 16 * st);
            } else if constexpr (SS == 1) {
                mma_ss(d, da + 16 * st, db + 16 * st);  // A and B: 256 B further a k16 step
            } else {
                mma_rs(d, a[st], db + 16 * st);
            }
        }
    }
    wg_commit();
    if constexpr (PP) {
        if (!last) bar_arrive(1 + (wgi ^ 1), 256);
    }
}

}  // namespace

template <int NWG, int MODE, int R, int SS, int PP>
__device__ __forceinline__ void body(const uint4* __restrict__ wg, unsigned long long* __restrict__ cyc,
                                     float* __restrict__ out) {
    static_assert(!PP || NWG == 2, "ping-pong between two warpgroups");
    // B: 64 x 64 (8 KB, the wgs stage layout); A for SS: 8 KB of zeros read as [8 row groups, 256 B
    // apart][2 k pieces, 128 B apart][8 rows][16 B] from a step's start; the words: 16 B a lane
    __shared__ __align__(1024) uint4 sB[512];
    __shared__ __align__(1024) uint4 sA[SS == 2 ? 512 * NWG : 512];  // SS = 2: 8 KB a warpgroup
    __shared__ uint4 sW[32 * 4 * NWG];
    for (int i = threadIdx.x; i < 512; i += blockDim.x) sB[i] = make_uint4(0, 0, 0, 0);
    for (int i = threadIdx.x; i < (SS == 2 ? 512 * NWG : 512); i += blockDim.x) sA[i] = make_uint4(0, 0, 0, 0);
    for (int i = threadIdx.x; i < 32 * 4 * NWG; i += blockDim.x) sW[i] = wg[i];
    __syncthreads();
    const uint64_t db = desc(smem_u32(sB), 128, 1024);
    const uint64_t da = desc(smem_u32(sA), 128, 256);  // SS: every step reads zeros from here
    float d[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) d[i] = 0.0f;
    uint32_t a[4][4];
    const uint4 w0 = sW[threadIdx.x];
#pragma unroll
    for (int j = 0; j < 4; ++j) {  // MODE without dequantization: the raw words
        a[0][j] = w0.x ^ j;
        a[1][j] = w0.y ^ j;
        a[2][j] = w0.z ^ j;
        a[3][j] = w0.w ^ j;
    }
    uint32_t sink = 0;
    const uint32_t nz = 0xC300C300u ^ (threadIdx.x & 7), s = 0x3C003C00u;
    const int wgi = threadIdx.x >> 7;
    const uint32_t sa0 = smem_u32(sA) + (SS == 2 ? wgi * 8192 : 0);  // SS = 2: this warpgroup's two halves
    if (PP && wgi == 1) bar_arrive(1, 256);  // warpgroup 0 issues first
    unsigned long long t0 = 0;
    if (threadIdx.x == 0) t0 = clock64();
    for (int i = 0; i < ITER; ++i) {
        uint4 w;  // a shared load each chunk, as the wgs consumer's
        asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(w.x), "=r"(w.y), "=r"(w.z), "=r"(w.w)
                     : "r"(smem_u32(sW + (threadIdx.x ^ (i & 1)))));
        wg_wait<1>();
        half<0, MODE, R, SS, PP>(d, a, w, nz, s, da, db, sink, sa0);
        wg_wait<1>();
        half<1, MODE, R, SS, PP>(d, a, w, nz, s, da, db, sink, sa0 + 4096, PP && i == ITER - 1 && wgi == 1);
    }
    wg_wait<0>();
#pragma unroll
    for (int i = 0; i < 32; ++i) asm volatile("" : "+f"(d[i])::"memory");
    __syncthreads();
    if (threadIdx.x == 0) cyc[blockIdx.x] = (clock64() - t0);
    float acc = static_cast<float>(sink & 1);
#pragma unroll
    for (int i = 0; i < 32; ++i) acc += d[i];
    out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

#define WO_KERNEL(NWG, MODE, R, SS, PP)                                                                    \
    extern "C" __global__ void __launch_bounds__(128 * NWG, 1)                                              \
        wo_g##NWG##_m##MODE##_r##R##_s##SS##_p##PP(const uint4* wg, unsigned long long* cyc, float* out) {  \
        body<NWG, MODE, R, SS, PP>(wg, cyc, out);                                                           \
    }

// per (warpgroups, repeats): the dequantization alone, the wgmmas alone (A from registers, then from
// shared memory) and both (A from registers, from shared memory, from shared memory the warpgroup
// wrote)
#define WO_SET(NWG, R)        \
    WO_KERNEL(NWG, 1, R, 0, 0) \
    WO_KERNEL(NWG, 2, R, 0, 0) \
    WO_KERNEL(NWG, 3, R, 0, 0) \
    WO_KERNEL(NWG, 2, R, 1, 0) \
    WO_KERNEL(NWG, 3, R, 1, 0) \
    WO_KERNEL(NWG, 3, R, 2, 0)

WO_SET(1, 1)
WO_SET(2, 1)
WO_SET(4, 1)
WO_SET(2, 2)
WO_SET(4, 2)
// two warpgroups taking turns at the wgmma issue: A from registers, and through shared memory
WO_KERNEL(2, 3, 1, 0, 1)
WO_KERNEL(2, 3, 1, 2, 1)
WO_KERNEL(2, 3, 2, 0, 1)
