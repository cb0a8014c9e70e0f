// Anvil W4A16 "mtc" kernel: a Marlin-like tensor-core GEMM for every M, out = act(x @ W + bias) +
// residual. Appended after w4a16.cu and w4a16_tc.cu (reuses Dt<>, activate, cp_async16,
// cp_async_commit, cp_async_wait, tile_zero, tile_finish (split-K and epilogue) and the ACT_/FLAG_
// constants).
//
// Formulation as the other kernels: out^T (N x M) = W^T . x^T on mma.sync m16n8k16, A = the
// dequantized weights (16 columns n x 16 k, in registers), B = activations (16 k x 8 rows of x,
// from shared memory through ldmatrix), C = out^T, fp32 accumulation.
//
// Weights: its own prepacked layout (w4a16_mtc.py: prepack_mtc), K-major so that the blocks that
// work on the same k range at the same time read one contiguous window of memory:
//   mq  (uint32, (K/64, N/16, 32 lanes, 4 words)): [chunk, strip, lane, step] holds the 8 nibbles
//       lane needs for k16 step `step` of the 64-k chunk and the 16-column strip: nibble p
//       (bits 4p..4p+3): j = p & 3 (the A register), e = p >> 2 (its half)
//         n = 16*strip + (lane >> 2) + 8*(j & 1)
//         k = 64*chunk + 16*step + 2*(lane & 3) + e + 8*(j >> 1)
//       i.e. natural k order (the PTX A layout), so x needs no permutation and ldmatrix reads it.
//       ((w >> 4j) & 0x000F000F) | MAGIC is A register j as a pair MAGIC + q, exactly.
//   msz (uint32, (K/g, N/16, 8, 2)): [group, strip, r, rowhi] = scale bits | zero << 16 for
//       n = 16*strip + r + 8*rowhi (the GEMV layout's words, K-major).
//
// Block tile BM = 8*MT*WM rows of x by BN = 16*NS*WN columns, NT = 32*WM*WN threads; warp
// (wm, wn) = (warp / WN, warp % WN) owns rows [8*MT*wm, +8*MT) and strips [NS*wn, +NS).
// Pipeline: ST stages of one 64-k chunk each, filled by cp.async.cg (16 B per piece; zero-fill
// past M and past N):
//   sW  [BS strips][32 lanes] uint4    the mq words of (chunk, strip0 .. strip0+BS): one contiguous
//                                      BS*512-byte run of global memory
//   sSZ [BS strips][8][2]     uint32   msz of (group, strips): copied only with a group's first chunk
//   sX  [BM rows][72]         uint16   x[m, 64c .. 64c+64) + 16 B pad: ldmatrix phases of 8 rows
//                                      144 B apart hit 8 distinct 16-byte bank groups
// Loop over the block's chunks: wait for chunk i (cp.async.wait_group ST-2), __syncthreads (it also
// retires the stage the next copy overwrites), issue chunk i+ST-1, then compute chunk i: per warp
// NS LDS.128 of weights (a lane's A words for the 4 steps), 2*MT ldmatrix.x4 of x (2 steps of one
// 8-row tile each), 4 steps x NS dequantizations x MT HMMA.
//
// SA false (exact): the tensor cores multiply the integers (q - z); each group's sum is scaled in
// fp32 into the total (as the GEMV-like kernel). SA true (scaled A): A = (q - z) * s rounded once to
// bf16/fp16, one accumulator set (the error of a bf16 GEMM on the dequantized weights).
//
// grid = (M tiles, N tiles, S). Split z sums whole groups [G*z/S, G*(z+1)/S); with S > 1 the
// partials go to ws in fragment order ([tile][z][reg][thread], coalesced) and the last block of a
// tile to arrive (atomic counter, reset to 0 by that block) adds them in z order (deterministic)
// and runs the epilogue (tc_epilogue: bias, activation, residual, one rounding).

namespace anvil_w4a16 {

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* smem) {
    const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

// (MAGIC + q) pairs of A register j from a step's word: j = 0..3, shift 4j.
template <int DT>
__device__ __forceinline__ uint32_t mtc_pair(uint32_t w, int j) {
    uint32_t d;
    const uint32_t v = w >> (4 * j);
    // d = (v & 0x000F000F) | MAGIC in one LOP3 (immLut 0xEA = (a & b) | c)
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(v), "r"(0x000F000Fu), "r"(Dt<DT>::MAGIC));
    return d;
}

// WG: the x tile in the wgmma kernel's layout (w4a16_wg.cu): 8-row x 16-byte core matrices, 128
// contiguous bytes each, [BM/8 row groups][8 k pieces][8 rows][16 B]; otherwise rows of XROW bytes.
template <int MT, int NS, int WM, int WN, bool WG = false>
struct MtcTile {
    static constexpr int BM = 8 * MT * WM;
    static constexpr int BS = NS * WN;  // 16-column strips per block
    static constexpr int BN = 16 * BS;
    static constexpr int NT = 32 * WM * WN;
    static constexpr int XROW = WG ? 128 : 144;  // bytes per x row in a stage (128 + 16 pad)
    static constexpr int W_BYTES = BS * 512;
    static constexpr int SZ_BYTES = BS * 64;
    static constexpr int X_BYTES = BM * XROW;
    // x piece (row r, 16-byte piece p) of a stage, bytes past the x tile's start
    static __device__ __forceinline__ int x_off(int r, int p) {
        return WG ? (r >> 3) * 1024 + p * 128 + (r & 7) * 16 : r * XROW + p * 16;
    }
    // The x piece thread tid copies on its first trip (each trip NT/8 rows further): 8 threads a
    // row; for WG a warp takes 8 rows x 4 pieces, 4 whole core matrices (512 contiguous bytes, no
    // bank conflict; 8 rows x 64 bytes of global memory)
    static __device__ __forceinline__ int x_row(int tid) { return WG ? 8 * (tid >> 6) + (tid & 7) : tid >> 3; }
    static __device__ __forceinline__ int x_piece(int tid) {
        return WG ? 4 * ((tid >> 5) & 1) + ((tid >> 3) & 3) : tid & 7;
    }
    static constexpr int STAGE = W_BYTES + SZ_BYTES + X_BYTES;
    static constexpr int REGS = NS * MT * 4;  // accumulators per thread
};

__device__ __forceinline__ void cp_async16s(uint32_t s, const void* gmem, bool valid) {
    const int n = valid ? 16 : 0;  // src-size 0: the 16 bytes are zero-filled, nothing is read
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(n));
}

// The cp.async copies of one chunk into one stage. Thread tid copies pieces tid + it*NT of each
// array (a fixed trip count; whether a piece is past N or past M is the same for every chunk, so
// it is decided once): W pieces p < BS*32 (16 B of strip p >> 5, lane p & 31), x pieces p < BM*8
// (row p >> 3, 16-byte piece p & 7), and with a group's first chunk the sz pieces tid < BS*4.
// The source pointers are those of the next chunk to copy and advance by one chunk per issue.
template <int MT, int NS, int WM, int WN, int CPG, bool WG = false>
struct MtcLoader {
    using T = MtcTile<MT, NS, WM, WN, WG>;
    static constexpr int WIT = (T::BS * 32 + T::NT - 1) / T::NT;
    static constexpr int XIT = (T::BM * 8 + T::NT - 1) / T::NT;
    static_assert(T::NT % 8 == 0, "x pieces: NT must be a multiple of 8");
    static_assert(!WG || (T::BM * 8 % T::NT == 0 && T::NT % 64 == 0), "WG: whole trips of whole row groups");
    const uint4* w;     // next chunk's piece tid
    const uint4* sz;    // next group's piece tid
    const uint16_t* x;  // next chunk's piece tid (row m0 + (tid >> 3))
    size_t wstride;     // uint4 per chunk (strips * 32)
    size_t szstride;    // uint4 per group (strips * 4)
    size_t xrows;       // elements per NT/8 rows (the x stride of one trip)
    uint32_t wok, xok;  // bit it: piece tid + it*NT is valid
    bool szok;
    uint32_t xdst;      // this thread's first x piece in a stage (bytes)
    int c;              // next chunk

    __device__ __forceinline__ MtcLoader(const uint4* __restrict__ W, const uint4* __restrict__ SZ,
                                         const uint16_t* __restrict__ X, int strip0, int strips, int m0,
                                         int M, int K, int c0) {
        const int tid = threadIdx.x;
        wstride = static_cast<size_t>(strips) * 32;
        szstride = static_cast<size_t>(strips) * 4;
        xrows = static_cast<size_t>(T::NT / 8) * K;
        w = W + (static_cast<size_t>(c0) * strips + strip0) * 32 + tid;
        sz = SZ + (static_cast<size_t>(c0 / CPG) * strips + strip0) * 4 + tid;
        const int xr = min(m0 + T::x_row(tid), M - 1);  // a row in bounds (its copy may be off)
        x = X + static_cast<size_t>(xr) * K + static_cast<size_t>(c0) * 64 + T::x_piece(tid) * 8;
        xdst = T::W_BYTES + T::SZ_BYTES + T::x_off(T::x_row(tid), T::x_piece(tid));
        c = c0;
        wok = 0;
        xok = 0;
#pragma unroll
        for (int it = 0; it < WIT; ++it) {
            const int p = tid + it * T::NT;
            if (p < T::BS * 32 && strip0 + (p >> 5) < strips) wok |= 1u << it;
        }
#pragma unroll
        for (int it = 0; it < XIT; ++it) {
            const int p = tid + it * T::NT;
            if (p < T::BM * 8 && m0 + T::x_row(tid) + it * (T::NT / 8) < M) xok |= 1u << it;
        }
        szok = tid < T::BS * 4 && strip0 + (tid >> 2) < strips;
        if (!szok) sz = SZ;
    }

    // The pipeline's first copies: chunks c0 .. c0+PF-1 into stages 0 .. PF-1 (of STAGE bytes), one
    // commit group each (an empty group past the block's nck chunks keeps the wait counts uniform).
    template <int PF, int STAGE>
    __device__ __forceinline__ void prologue(uint32_t smem_s, int nck) {
#pragma unroll
        for (int s = 0; s < PF; ++s) {
            if (s < nck) issue(smem_s + s * STAGE);
            cp_async_commit();
        }
    }

    // Copy chunk c into the stage at shared address st, then move on to chunk c + 1.
    __device__ __forceinline__ void issue(uint32_t st) {
        const int tid = threadIdx.x;
#pragma unroll
        for (int it = 0; it < WIT; ++it) {
            if (T::BS * 32 % T::NT == 0 || tid + it * T::NT < T::BS * 32) {
                const bool ok = (wok >> it) & 1u;
                cp_async16s(st + (tid + it * T::NT) * 16, ok ? w + it * T::NT : w - tid, ok);
            }
        }
        if (c % CPG == 0) {
            if (tid < T::BS * 4) cp_async16s(st + T::W_BYTES + tid * 16, sz, szok);
            if (szok) sz += szstride;
        }
#pragma unroll
        for (int it = 0; it < XIT; ++it) {
            if (T::BM * 8 % T::NT == 0 || tid + it * T::NT < T::BM * 8) {
                const bool ok = (xok >> it) & 1u;
                cp_async16s(st + xdst + T::x_off(it * (T::NT / 8), 0), ok ? x + it * xrows : x, ok);
            }
        }
        w += wstride;
        x += 64;
        ++c;
    }
};

// The scales and zero points of NS consecutive strips (from strip s0 of the stage's sz words) for
// one group, as the dequantization uses them: lane row g8 (lo) and g8 + 8 (hi).
template <int DT, int NS>
struct MtcScales {
    float slo[NS], shi[NS];  // fp32 scales (exact path)
    uint32_t zlo[NS], zhi[NS], s2lo[NS], s2hi[NS];  // -(MAGIC + z) and scale pairs

    __device__ __forceinline__ void load(const uint2* __restrict__ sSZ, int s0, int g8, int flags) {
#pragma unroll
        for (int j = 0; j < NS; ++j) {
            const uint2 v = sSZ[(s0 + j) * 8 + g8];
            if (flags & FLAG_SCALE_BF16) {
                slo[j] = Dt<0>::to_f(static_cast<uint16_t>(v.x & 0xFFFFu));
                shi[j] = Dt<0>::to_f(static_cast<uint16_t>(v.y & 0xFFFFu));
            } else {
                slo[j] = Dt<1>::to_f(static_cast<uint16_t>(v.x & 0xFFFFu));
                shi[j] = Dt<1>::to_f(static_cast<uint16_t>(v.y & 0xFFFFu));
            }
            // -(MAGIC + z) as a pair, built from bits: MAGIC's exponent with z in the mantissa
            // (z <= 64 fits bf16's 7 and fp16's 10 mantissa bits; ulp 1 there), sign set
            zlo[j] = (Dt<DT>::MAGIC | 0x80008000u) | ((v.x >> 16) * 0x00010001u);
            zhi[j] = (Dt<DT>::MAGIC | 0x80008000u) | ((v.y >> 16) * 0x00010001u);
            s2lo[j] = Dt<DT>::pack2(slo[j]);
            s2hi[j] = Dt<DT>::pack2(shi[j]);
        }
    }

    // A fragment (a0..a3) of strip j from a step's word: (q - z), times the scale when SA
    template <bool SA>
    __device__ __forceinline__ void dequant(uint32_t (&a)[4], uint32_t wd, int j, uint32_t one) const {
        a[0] = Dt<DT>::fma2(mtc_pair<DT>(wd, 0), one, zlo[j]);  // row g8,     k 2t4+e
        a[1] = Dt<DT>::fma2(mtc_pair<DT>(wd, 1), one, zhi[j]);  // row g8 + 8, k 2t4+e
        a[2] = Dt<DT>::fma2(mtc_pair<DT>(wd, 2), one, zlo[j]);  // row g8,     k 8+2t4+e
        a[3] = Dt<DT>::fma2(mtc_pair<DT>(wd, 3), one, zhi[j]);  // row g8 + 8, k 8+2t4+e
        if (SA) {
            a[0] = Dt<DT>::mul2(a[0], s2lo[j]);
            a[1] = Dt<DT>::mul2(a[1], s2hi[j]);
            a[2] = Dt<DT>::mul2(a[2], s2lo[j]);
            a[3] = Dt<DT>::mul2(a[3], s2hi[j]);
        }
    }
};

// The 64-k chunks of split z = blockIdx.z of S = gridDim.z: whole groups [G z/S, G (z+1)/S), as
// (first chunk, chunk count).
template <int CPG>
__device__ __forceinline__ int2 mtc_split_chunks(int K) {
    const int S = gridDim.z;
    const int z = blockIdx.z;
    const int G = (K >> 6) / CPG;
    const int gb = static_cast<int>((static_cast<long long>(G) * z) / S);
    const int ge = static_cast<int>((static_cast<long long>(G) * (z + 1)) / S);
    return make_int2(gb * CPG, (ge - gb) * CPG);
}

// blockDim.x = NT; dynamic shared memory ST * STAGE bytes.
template <int DT, int MT, int NS, int WM, int WN, int ST, int CPG, bool SA>
__device__ __forceinline__ void w4a16_mtc_body(const uint4* __restrict__ W, const uint4* __restrict__ SZ,
                                               const uint16_t* __restrict__ X, uint16_t* __restrict__ Y,
                                               const uint16_t* __restrict__ bias,
                                               const uint16_t* __restrict__ res, float* __restrict__ ws,
                                               int* __restrict__ counters, int M, int N, int K, int act,
                                               int flags) {
    using T = MtcTile<MT, NS, WM, WN>;
    extern __shared__ uint4 smem4[];
    unsigned char* smem = reinterpret_cast<unsigned char*>(smem4);
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int wm = warp / WN;
    const int wn = warp % WN;
    const int g8 = lane >> 2;
    const int m0 = blockIdx.x * T::BM;
    const int strip0 = blockIdx.y * T::BS;
    const int strips = N >> 4;
    const int2 chunks = mtc_split_chunks<CPG>(K);
    const int c0 = chunks.x;
    const int nck = chunks.y;
    // ldmatrix row address of this lane within an 8-row x tile: row lane & 7, 8-k piece lane >> 3
    const int ldsm_off = (wm * MT * 8 + (lane & 7)) * T::XROW + (lane >> 3) * 16;

    float acc[NS][MT][4];
    float cg[SA ? 1 : NS][SA ? 1 : MT][4];  // per-group sums (exact path only)
    tile_zero(acc);

    MtcLoader<MT, NS, WM, WN, CPG> ld(W, SZ, X, strip0, strips, m0, M, K, c0);
    const uint32_t smem_s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    ld.template prologue<ST - 1, T::STAGE>(smem_s, nck);

    const uint32_t one = Dt<DT>::pack2(1.0f);
    MtcScales<DT, NS> sc;
    int rd = 0;       // stage read this iteration: i % ST
    int wr = ST - 1;  // stage written this iteration: (i + ST - 1) % ST
    for (int i = 0; i < nck; ++i) {
        cp_async_wait<ST - 2>();  // chunk i has landed (this thread's copies) ...
        __syncthreads();          // ... and everyone's; everyone is done with chunk i - 1's stage
        if (i + ST - 1 < nck) ld.issue(smem_s + wr * T::STAGE);
        cp_async_commit();
        const unsigned char* st = smem + rd * T::STAGE;
        rd = rd == ST - 1 ? 0 : rd + 1;
        wr = wr == ST - 1 ? 0 : wr + 1;
        const uint4* sW = reinterpret_cast<const uint4*>(st);
        const unsigned char* sX = st + T::W_BYTES + T::SZ_BYTES;
        const int cc = i % CPG;  // c0 is a multiple of CPG
        if (cc == 0) {
            sc.load(reinterpret_cast<const uint2*>(st + T::W_BYTES), wn * NS, g8, flags);
            if (!SA) {
#pragma unroll
                for (int j = 0; j < (SA ? 1 : NS); ++j)
#pragma unroll
                    for (int mt = 0; mt < (SA ? 1 : MT); ++mt)
#pragma unroll
                        for (int q = 0; q < 4; ++q) cg[j][mt][q] = 0.0f;
            }
        }
        uint4 w[NS];
#pragma unroll
        for (int j = 0; j < NS; ++j) w[j] = sW[(wn * NS + j) * 32 + lane];
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // steps 2h, 2h + 1
            uint32_t b[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) ldsm_x4(b[mt], sX + ldsm_off + mt * 8 * T::XROW + h * 64);
#pragma unroll
            for (int ss = 0; ss < 2; ++ss) {
                const int s = 2 * h + ss;
#pragma unroll
                for (int j = 0; j < NS; ++j) {
                    const uint32_t wd = s == 0 ? w[j].x : s == 1 ? w[j].y : s == 2 ? w[j].z : w[j].w;
                    uint32_t a[4];
                    sc.template dequant<SA>(a, wd, j, one);
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt)
                        Dt<DT>::mma(SA ? acc[j][mt] : cg[SA ? 0 : j][SA ? 0 : mt], a[0], a[1], a[2], a[3],
                                    b[mt][2 * ss], b[mt][2 * ss + 1]);
                }
            }
        }
        if (!SA && cc == CPG - 1) {
#pragma unroll
            for (int j = 0; j < NS; ++j)
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    const int jj = SA ? 0 : j, mm = SA ? 0 : mt;
                    acc[j][mt][0] = fmaf(sc.slo[j], cg[jj][mm][0], acc[j][mt][0]);
                    acc[j][mt][1] = fmaf(sc.slo[j], cg[jj][mm][1], acc[j][mt][1]);
                    acc[j][mt][2] = fmaf(sc.shi[j], cg[jj][mm][2], acc[j][mt][2]);
                    acc[j][mt][3] = fmaf(sc.shi[j], cg[jj][mm][3], acc[j][mt][3]);
                }
        }
    }
    cp_async_wait<0>();
    tile_finish<DT, MT, NS, WM, WN>(acc, Y, bias, res, ws, counters, M, N, m0, strip0, act);
}

}  // namespace anvil_w4a16

#define ANVIL_W4A16_MTC_KERNEL(NAME, DT, MT, NS, WM, WN, ST, CPG, SA, MINB)                              \
    extern "C" __global__ void __launch_bounds__(32 * WM * WN, MINB)                                     \
        NAME(const uint4* __restrict__ W, const uint4* __restrict__ SZ, const uint16_t* __restrict__ X, \
             uint16_t* __restrict__ Y, const uint16_t* __restrict__ bias,                              \
             const uint16_t* __restrict__ res, float* __restrict__ ws, int* __restrict__ counters,     \
             int M, int N, int K, int act, int flags) {                                                \
        anvil_w4a16::w4a16_mtc_body<DT, MT, NS, WM, WN, ST, CPG, SA>(W, SZ, X, Y, bias, res, ws,      \
                                                                     counters, M, N, K, act, flags);   \
    }
