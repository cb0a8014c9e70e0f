// Anvil W4A16 GEMM/GEMV: out = act(x @ W + bias) + residual, x (M, K) bf16/fp16, W INT4 (K, N).
// The weights come pre-permuted by anvil_kernels.cuda.w4a16.prepack; see docs/kernels_gpu.md.
//
// Formulation: out^T (N x M) = W^T (N x K) . x^T (K x M) on mma.sync m16n8k16 (A = weights,
// 16 output columns x 16 k; B = activations, 16 k x 8 rows of x), fp32 accumulation.
//
// qweight (uint32, (N/16, K/64, 32 lanes, 4 words)): one 16-byte load per lane gives that lane's
//   A fragments for four k16 steps of one 16-column strip. Word wi = 2*jj + h, nibble p:
//     odd = p & 1, rowhi = (p >> 1) & 1, e = p >> 2, step s = 2*jj + odd
//     n = 16*strip + (lane >> 2) + 8*rowhi
//     k = 64*kc + 16*(lane & 3) + 4*s + 2*h + e
//   so a lane's B fragments (x) for the four steps are the 16 consecutive k values starting at
//   64*kc + 16*(lane & 3): two 16-byte loads of x per chunk and row.
// sz (uint32, (N/16, K/g, 8, 2)): [strip, group, r, rowhi] = scale bits (fp16 or bf16, low half)
//   | integer zero point << 16, for n = 16*strip + r + 8*rowhi.
//
// Dequantization: (w >> sh) & 0x000F000F | MAGIC makes a pair of half values MAGIC + q exactly
// (MAGIC = 128 for bf16, 1024 for fp16); one fma2 with -(MAGIC + z) gives q - z exactly, an
// integer the tensor cores multiply exactly. The scale is applied once per group in fp32:
// acc += s * sum_group (q - z) x.
//
// Work split: warp (wn, wk) of a block owns NS strips and the wk-th of SK contiguous K slices
// (whole groups); the SK partial sums are added through shared memory, then the block applies
// bias, activation and residual and writes out. grid.x = M blocks of 8*MT rows (fastest, so the
// blocks that share a weight tile run together and hit L2), grid.y = N / (16*NS*SN).
// Weights are streamed with a register ring D = GD*CPG chunks deep (16-byte loads, L1 bypass,
// optional L2 evict_first policy); x is read through L1 (ld.global.nc).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace anvil_w4a16 {

enum { ACT_NONE = 0, ACT_RELU = 1, ACT_GELU_ERF = 2, ACT_GELU_TANH = 3, ACT_SILU = 4 };
// FLAG_LATE_TRIGGER (wgs and wgd kernels): the producer lets the next kernel be scheduled
// (launch_dependents) only after its own wait, not before it (w4a16_wgs.cu, wgs_produce)
enum { FLAG_SCALE_BF16 = 1, FLAG_EVICT_FIRST = 2, FLAG_LATE_TRIGGER = 4 };

template <int DT>
struct Dt;

template <>
struct Dt<0> {  // bfloat16
    static constexpr uint32_t MAGIC = 0x43004300u;  // (128.0, 128.0)
    static constexpr float MAGIC_F = 128.0f;
    static __device__ __forceinline__ uint32_t pack2(float v) {
        uint32_t r;
        asm("cvt.rn.bf16x2.f32 %0, %1, %1;" : "=r"(r) : "f"(v));
        return r;
    }
    static __device__ __forceinline__ uint32_t fma2(uint32_t a, uint32_t b, uint32_t c) {
        uint32_t d;
        asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
        return d;
    }
    static __device__ __forceinline__ uint32_t mul2(uint32_t a, uint32_t b) {
        uint32_t d;
        asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
        return d;
    }
    static __device__ __forceinline__ void mma(float* c, uint32_t a0, uint32_t a1, uint32_t a2,
                                               uint32_t a3, uint32_t b0, uint32_t b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
            "{%8,%9}, {%0,%1,%2,%3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
    static __device__ __forceinline__ float to_f(uint16_t b) {
        return __uint_as_float(static_cast<uint32_t>(b) << 16);
    }
    static __device__ __forceinline__ uint16_t from_f(float f) {
        return __bfloat16_as_ushort(__float2bfloat16_rn(f));
    }
};

template <>
struct Dt<1> {  // float16
    static constexpr uint32_t MAGIC = 0x64006400u;  // (1024.0, 1024.0)
    static constexpr float MAGIC_F = 1024.0f;
    static __device__ __forceinline__ uint32_t pack2(float v) {
        uint32_t r;
        asm("cvt.rn.f16x2.f32 %0, %1, %1;" : "=r"(r) : "f"(v));
        return r;
    }
    static __device__ __forceinline__ uint32_t fma2(uint32_t a, uint32_t b, uint32_t c) {
        uint32_t d;
        asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
        return d;
    }
    static __device__ __forceinline__ uint32_t mul2(uint32_t a, uint32_t b) {
        uint32_t d;
        asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
        return d;
    }
    static __device__ __forceinline__ void mma(float* c, uint32_t a0, uint32_t a1, uint32_t a2,
                                               uint32_t a3, uint32_t b0, uint32_t b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
            "{%8,%9}, {%0,%1,%2,%3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
    static __device__ __forceinline__ float to_f(uint16_t b) {
        return __half2float(__ushort_as_half(b));
    }
    static __device__ __forceinline__ uint16_t from_f(float f) {
        return __half_as_ushort(__float2half_rn(f));
    }
};

__device__ __forceinline__ uint64_t make_policy(bool evict_first) {
    uint64_t p;
    if (evict_first) {
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    } else {
        asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(p));
    }
    return p;
}

__device__ __forceinline__ uint4 ld_stream4(const uint4* ptr, uint64_t pol) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(ptr), "l"(pol));
    return v;
}

__device__ __forceinline__ uint2 ld_stream2(const uint2* ptr, uint64_t pol) {
    uint2 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v2.u32 {%0,%1}, [%2], %3;"
                 : "=r"(v.x), "=r"(v.y)
                 : "l"(ptr), "l"(pol));
    return v;
}

// Programmatic dependent launch (PDL, sm_90). A kernel launched with the programmatic stream
// serialization attribute (W4A16Linear(pdl=True)) may start while the kernel before it on the
// stream still runs; griddepcontrol.wait then blocks until that kernel has completed and its writes
// are visible. So a GEMV-like kernel issues the first loads of its weights (never written by any
// kernel) and only then waits, before it reads x, bias or the residual or writes out: the next
// layer's weight stream starts while the previous layer drains. launch_dependents lets the kernel
// after this one be scheduled (its blocks take SM room as it frees up; it waits likewise). Both are
// no-ops in a launch without the attribute, and absent below sm_90.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ float activate(float v, int act) {
    switch (act) {
        case ACT_RELU:
            return v > 0.0f ? v : 0.0f;
        case ACT_GELU_ERF:
            return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
        case ACT_GELU_TANH:
            return 0.5f * v * (1.0f + tanhf(0.79788456080286536f * (v + 0.044715f * v * v * v)));
        case ACT_SILU:
            return v / (1.0f + expf(-v));
        default:
            return v;
    }
}

template <int DT>
__device__ __forceinline__ uint32_t deq(uint32_t w, int sh, uint32_t zc, uint32_t one) {
    return Dt<DT>::fma2(((w >> sh) & 0x000F000Fu) | Dt<DT>::MAGIC, one, zc);
}

// The SK warps' partial sums of a block added through shared memory (in wk order), then bias,
// activation and residual, and the block's rows x columns written out.
template <int DT, int MT, int NS>
__device__ __forceinline__ void reduce_and_store(const float (&acc)[NS][MT][4], float4* red4,
                                                 uint16_t* __restrict__ Y,
                                                 const uint16_t* __restrict__ bias,
                                                 const uint16_t* __restrict__ res, int M, int N, int SN,
                                                 int SK, int wn, int wk, int lane, int act) {
    const int m0 = blockIdx.x * (8 * MT);
    // partial sums -> shared memory: red4[(((wk*SN + wn)*NS + j)*MT + mt)*32 + lane].
#pragma unroll
    for (int j = 0; j < NS; ++j)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
            red4[(((wk * SN + wn) * NS + j) * MT + mt) * 32 + lane] =
                make_float4(acc[j][mt][0], acc[j][mt][1], acc[j][mt][2], acc[j][mt][3]);
    __syncthreads();

    const float* red = reinterpret_cast<const float*>(red4);
    const int cols = 16 * NS * SN;
    const int rows = 8 * MT;
    const int n_base = blockIdx.y * cols;
    const int stride_wk = SN * NS * MT * 32 * 4;
    for (int idx = threadIdx.x; idx < rows * cols; idx += blockDim.x) {
        const int ml = idx / cols;
        const int nl = idx - ml * cols;
        const int m = m0 + ml;
        const int n = n_base + nl;
        if (m >= M || n >= N) continue;
        const int wn_ = nl / (16 * NS);
        const int j = (nl >> 4) % NS;
        const int r = nl & 15;
        const int mt = ml >> 3;
        const int mm = ml & 7;
        const int ln = (r & 7) * 4 + (mm >> 1);
        const int i = (r >> 3) * 2 + (mm & 1);
        const float* p = red + ((((wn_ * NS + j) * MT + mt) * 32 + ln) * 4 + i);
        float v = 0.0f;
        for (int q = 0; q < SK; ++q) v += p[q * stride_wk];
        if (bias != nullptr) v += Dt<DT>::to_f(bias[n]);
        v = activate(v, act);
        const size_t o = static_cast<size_t>(m) * N + n;
        if (res != nullptr) v += Dt<DT>::to_f(res[o]);
        Y[o] = Dt<DT>::from_f(v);
    }
}

// -(MAGIC + z) as a pair of DT halves, from the zero point z (0..64) with integer operations:
// MAGIC + z is exact in both types (bf16 128 + z: bits 0x4300 | z; fp16 1024 + z: 0x6400 | z).
template <int DT>
__device__ __forceinline__ uint32_t neg_magic_z2(uint32_t z) {
    constexpr uint32_t NEG = DT == 0 ? 0xC300u : 0xE400u;
    return (NEG | z) * 0x00010001u;
}

// A group's scale bits (the low half of an sz word) as fp32, bf16 or fp16 by `sbf`, branch-free.
__device__ __forceinline__ float scale_f(uint32_t word, bool sbf) {
    const uint16_t b = static_cast<uint16_t>(word & 0xFFFFu);
    return sbf ? Dt<0>::to_f(b) : Dt<1>::to_f(b);
}

// The GEMV-like kernel with one strip per warp (NS = 1), the M <= 16 default: the same layout,
// math and output as w4a16_body, written for few instructions per 64-k chunk (the H200's ncu run of
// w4a16_body at M = 1 counted ~124 warp instructions per chunk against ~65 of dequantize, mma and
// loads, and 44% issue-slot use: it was issue-bound, not memory-bound). The weight, scale and x
// pointers advance by constants (nothing is recomputed from the thread index per chunk), the rings
// are indexed by compile-time constants, the zero points become -(MAGIC + z) pairs with integer
// operations, and the scale kind is selected without a branch. D chunks in flight per warp.
template <int DT, int MT, int CPG, int D>
__device__ __forceinline__ void w4a16_stream_body(const uint4* __restrict__ W, const uint2* __restrict__ SZ,
                                                  const uint16_t* __restrict__ X, uint16_t* __restrict__ Y,
                                                  const uint16_t* __restrict__ bias,
                                                  const uint16_t* __restrict__ res, int M, int N, int K,
                                                  int SN, int SK, int act, int flags) {
    static_assert(D % CPG == 0, "the ring holds whole groups");
    constexpr int GD = D / CPG;  // groups in flight
    extern __shared__ float4 red4[];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
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

    float acc[1][MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[0][mt][i] = 0.0f;

    if (strip < (N >> 4) && ng > 0) {
        const uint64_t pol = make_policy((flags & FLAG_EVICT_FIRST) != 0);
        const bool sbf = (flags & FLAG_SCALE_BF16) != 0;
        const uint32_t one = Dt<DT>::pack2(1.0f);
        const uint4* wq = W + ((static_cast<size_t>(strip) * KC + static_cast<size_t>(gb) * CPG) * 32 + lane);
        const uint2* sq = SZ + ((static_cast<size_t>(strip) * G + gb) * 8 + g8);
        // Rows past M read row m0's x instead (always valid memory, no per-chunk predicate): a row of
        // x reaches only its own output column of the mma, and columns past M are never stored.
        const uint4* xq[MT];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            const int m = m0 + mt * 8 + g8;
            xq[mt] = reinterpret_cast<const uint4*>(
                X + (static_cast<size_t>(m < M ? m : m0) * K + static_cast<size_t>(gb) * CPG * 64 + t4 * 16));
        }
        uint4 wr[D];
        uint2 sr[GD];
#pragma unroll
        for (int i = 0; i < D; ++i)
            if (i < nch) wr[i] = ld_stream4(wq + i * 32, pol);
#pragma unroll
        for (int i = 0; i < GD; ++i)
            if (i < ng) sr[i] = ld_stream2(sq + i * 8, pol);
        wq += D * 32;  // the next chunk to load
        sq += GD * 8;  // the next group's scales to load
        pdl_launch_dependents();
        pdl_wait();  // the weights are on their way; x is the previous kernel's output

        for (int g0 = 0; g0 < ng; g0 += GD) {
#pragma unroll
            for (int gi = 0; gi < GD; ++gi) {
                if (g0 + gi < ng) {  // uniform across the warp
                    const uint2 v = sr[gi];
                    if (g0 + gi + GD < ng) sr[gi] = ld_stream2(sq, pol);
                    sq += 8;
                    const float slo = scale_f(v.x, sbf);
                    const float shi = scale_f(v.y, sbf);
                    const uint32_t zlo = neg_magic_z2<DT>(v.x >> 16);
                    const uint32_t zhi = neg_magic_z2<DT>(v.y >> 16);
                    float cg[MT][4];
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                        for (int i = 0; i < 4; ++i) cg[mt][i] = 0.0f;
#pragma unroll
                    for (int cc = 0; cc < CPG; ++cc) {
                        const int slot = gi * CPG + cc;  // compile-time ring index
                        const uint4 w = wr[slot];
                        uint4 xa[MT], xb[MT];
#pragma unroll
                        for (int mt = 0; mt < MT; ++mt) {
                            xa[mt] = __ldg(xq[mt]);
                            xb[mt] = __ldg(xq[mt] + 1);
                            xq[mt] += 8;
                        }
#pragma unroll
                        for (int s = 0; s < 4; ++s) {
                            const int sh = (s & 1) * 4;
                            const uint32_t wa = (s < 2) ? w.x : w.z;
                            const uint32_t wb = (s < 2) ? w.y : w.w;
                            const uint32_t a0 = deq<DT>(wa, sh, zlo, one);
                            const uint32_t a1 = deq<DT>(wa, sh + 8, zhi, one);
                            const uint32_t a2 = deq<DT>(wb, sh, zlo, one);
                            const uint32_t a3 = deq<DT>(wb, sh + 8, zhi, one);
#pragma unroll
                            for (int mt = 0; mt < MT; ++mt) {
                                const uint4& xs = s < 2 ? xa[mt] : xb[mt];  // steps 0-1 | 2-3
                                const uint32_t b0 = (s & 1) ? xs.z : xs.x;
                                const uint32_t b1 = (s & 1) ? xs.w : xs.y;
                                Dt<DT>::mma(cg[mt], a0, a1, a2, a3, b0, b1);
                            }
                        }
                        // the slot's next chunk, once this one is dequantized (no copy of the slot)
                        if ((g0 + gi) * CPG + cc + D < nch) wr[slot] = ld_stream4(wq, pol);
                        wq += 32;
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
        }
    }
    pdl_wait();  // a no-op where the warp waited already
    reduce_and_store<DT, MT, 1>(acc, red4, Y, bias, res, M, N, SN, SK, wn, wk, lane, act);
}

// One launch: blockDim.x = 32 * SN * SK. Dynamic shared memory: SK*SN*NS*MT*512 bytes.
template <int DT, int MT, int NS, int CPG, int GD>
__device__ __forceinline__ void w4a16_body(const uint4* __restrict__ W, const uint2* __restrict__ SZ,
                                           const uint16_t* __restrict__ X, uint16_t* __restrict__ Y,
                                           const uint16_t* __restrict__ bias,
                                           const uint16_t* __restrict__ res, int M, int N, int K, int SN,
                                           int SK, int act, int flags) {
    constexpr int D = GD * CPG;  // chunks in flight per warp
    extern __shared__ float4 red4[];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int wn = warp % SN;
    const int wk = warp / SN;
    const int g8 = lane >> 2;
    const int t4 = lane & 3;
    const int m0 = blockIdx.x * (8 * MT);
    const int strips = N >> 4;
    const int strip0 = (blockIdx.y * SN + wn) * NS;
    const int KC = K >> 6;
    const int G = KC / CPG;
    const int gb = static_cast<int>((static_cast<long long>(G) * wk) / SK);
    const int ge = static_cast<int>((static_cast<long long>(G) * (wk + 1)) / SK);
    const int ng = ge - gb;
    const int nchunks = ng * CPG;

    float acc[NS][MT][4];
#pragma unroll
    for (int j = 0; j < NS; ++j)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[j][mt][i] = 0.0f;

    if (strip0 < strips && ng > 0) {
        const uint64_t pol = make_policy((flags & FLAG_EVICT_FIRST) != 0);
        const uint32_t one = Dt<DT>::pack2(1.0f);
        const uint4* wp[NS];
        const uint2* sp[NS];
#pragma unroll
        for (int j = 0; j < NS; ++j) {
            wp[j] = W + ((static_cast<size_t>(strip0 + j) * KC + static_cast<size_t>(gb) * CPG) * 32 + lane);
            sp[j] = SZ + ((static_cast<size_t>(strip0 + j) * G + gb) * 8 + g8);
        }
        const uint4* xp[MT];
        bool xv[MT];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            const int m = m0 + mt * 8 + g8;
            xv[mt] = m < M;
            xp[mt] = reinterpret_cast<const uint4*>(
                X + (static_cast<size_t>(xv[mt] ? m : 0) * K + static_cast<size_t>(gb) * CPG * 64 + t4 * 16));
        }

        uint4 wr[D][NS];
        uint2 sr[GD][NS];
#pragma unroll
        for (int i = 0; i < D; ++i)
#pragma unroll
            for (int j = 0; j < NS; ++j)
                if (i < nchunks) wr[i][j] = ld_stream4(wp[j] + static_cast<size_t>(i) * 32, pol);
#pragma unroll
        for (int i = 0; i < GD; ++i)
#pragma unroll
            for (int j = 0; j < NS; ++j)
                if (i < ng) sr[i][j] = ld_stream2(sp[j] + i * 8, pol);
        pdl_launch_dependents();
        pdl_wait();

        for (int g0 = 0; g0 < ng; g0 += GD) {
#pragma unroll
            for (int gd = 0; gd < GD; ++gd) {
                const int gi = g0 + gd;
                if (gi < ng) {
                    float slo[NS], shi[NS];
                    uint32_t zlo[NS], zhi[NS];
#pragma unroll
                    for (int j = 0; j < NS; ++j) {
                        const uint2 v = sr[gd][j];
                        if (flags & FLAG_SCALE_BF16) {
                            slo[j] = Dt<0>::to_f(static_cast<uint16_t>(v.x & 0xFFFFu));
                            shi[j] = Dt<0>::to_f(static_cast<uint16_t>(v.y & 0xFFFFu));
                        } else {
                            slo[j] = Dt<1>::to_f(static_cast<uint16_t>(v.x & 0xFFFFu));
                            shi[j] = Dt<1>::to_f(static_cast<uint16_t>(v.y & 0xFFFFu));
                        }
                        zlo[j] = Dt<DT>::pack2(-(Dt<DT>::MAGIC_F + static_cast<float>(v.x >> 16)));
                        zhi[j] = Dt<DT>::pack2(-(Dt<DT>::MAGIC_F + static_cast<float>(v.y >> 16)));
                        if (gi + GD < ng) sr[gd][j] = ld_stream2(sp[j] + (gi + GD) * 8, pol);
                    }
                    float cg[NS][MT][4];
#pragma unroll
                    for (int j = 0; j < NS; ++j)
#pragma unroll
                        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                            for (int i = 0; i < 4; ++i) cg[j][mt][i] = 0.0f;
#pragma unroll
                    for (int cc = 0; cc < CPG; ++cc) {
                        const int c = gi * CPG + cc;
                        uint4 w[NS];
#pragma unroll
                        for (int j = 0; j < NS; ++j) {
                            w[j] = wr[gd * CPG + cc][j];
                            if (c + D < nchunks)
                                wr[gd * CPG + cc][j] = ld_stream4(wp[j] + static_cast<size_t>(c + D) * 32, pol);
                        }
                        uint4 xa[MT], xb[MT];
#pragma unroll
                        for (int mt = 0; mt < MT; ++mt) {
                            if (xv[mt]) {
                                xa[mt] = __ldg(xp[mt] + static_cast<size_t>(c) * 8);
                                xb[mt] = __ldg(xp[mt] + static_cast<size_t>(c) * 8 + 1);
                            } else {
                                xa[mt] = make_uint4(0u, 0u, 0u, 0u);
                                xb[mt] = make_uint4(0u, 0u, 0u, 0u);
                            }
                        }
#pragma unroll
                        for (int s = 0; s < 4; ++s) {
                            const int sh = (s & 1) * 4;
#pragma unroll
                            for (int j = 0; j < NS; ++j) {
                                const uint32_t wa = (s < 2) ? w[j].x : w[j].z;
                                const uint32_t wb = (s < 2) ? w[j].y : w[j].w;
                                const uint32_t a0 = deq<DT>(wa, sh, zlo[j], one);
                                const uint32_t a1 = deq<DT>(wa, sh + 8, zhi[j], one);
                                const uint32_t a2 = deq<DT>(wb, sh, zlo[j], one);
                                const uint32_t a3 = deq<DT>(wb, sh + 8, zhi[j], one);
#pragma unroll
                                for (int mt = 0; mt < MT; ++mt) {
                                    uint32_t b0, b1;
                                    if (s == 0) {
                                        b0 = xa[mt].x;
                                        b1 = xa[mt].y;
                                    } else if (s == 1) {
                                        b0 = xa[mt].z;
                                        b1 = xa[mt].w;
                                    } else if (s == 2) {
                                        b0 = xb[mt].x;
                                        b1 = xb[mt].y;
                                    } else {
                                        b0 = xb[mt].z;
                                        b1 = xb[mt].w;
                                    }
                                    Dt<DT>::mma(cg[j][mt], a0, a1, a2, a3, b0, b1);
                                }
                            }
                        }
                    }
#pragma unroll
                    for (int j = 0; j < NS; ++j)
#pragma unroll
                        for (int mt = 0; mt < MT; ++mt) {
                            acc[j][mt][0] = fmaf(slo[j], cg[j][mt][0], acc[j][mt][0]);
                            acc[j][mt][1] = fmaf(slo[j], cg[j][mt][1], acc[j][mt][1]);
                            acc[j][mt][2] = fmaf(shi[j], cg[j][mt][2], acc[j][mt][2]);
                            acc[j][mt][3] = fmaf(shi[j], cg[j][mt][3], acc[j][mt][3]);
                        }
                }
            }
        }
    }

    pdl_wait();
    reduce_and_store<DT, MT, NS>(acc, red4, Y, bias, res, M, N, SN, SK, wn, wk, lane, act);
}

}  // namespace anvil_w4a16

#define ANVIL_W4A16_KERNEL(NAME, DT, MT, NS, CPG, GD)                                                  \
    extern "C" __global__ void __launch_bounds__(512, 1)                                             \
        NAME(const uint4* __restrict__ W, const uint2* __restrict__ SZ, const uint16_t* __restrict__ X, \
             uint16_t* __restrict__ Y, const uint16_t* __restrict__ bias,                              \
             const uint16_t* __restrict__ res, int M, int N, int K, int SN, int SK, int act,            \
             int flags) {                                                                              \
        if constexpr (NS == 1)                                                                         \
            anvil_w4a16::w4a16_stream_body<DT, MT, CPG, GD * CPG>(W, SZ, X, Y, bias, res, M, N, K, SN,   \
                                                                 SK, act, flags);                     \
        else                                                                                          \
            anvil_w4a16::w4a16_body<DT, MT, NS, CPG, GD>(W, SZ, X, Y, bias, res, M, N, K, SN, SK, act,  \
                                                         flags);                                      \
    }

// Present in every module built from this source: its GEMV-like kernels wait (pdl_wait) before they
// read x, so W4A16Linear may launch them as programmatic dependents. A module built before lacks it,
// and its kernels then never run so (anvil_kernels.cuda.w4a16_linear.waits_for_predecessor).
extern "C" __global__ void w4a16_pdl_marker() {}

// Instantiations follow (generated by anvil_kernels.cuda.w4a16.w4a16_source).
