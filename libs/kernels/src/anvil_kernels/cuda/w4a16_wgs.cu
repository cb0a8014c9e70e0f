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
//     [8 rows][8 values], Mpad = gridDim.x * BM, rows past M zero. A stage is then one slice of XT.
//     A tx tile (TX = 1) has no XT: its producer copies each chunk's x
//     box (64 k x BM rows) from x itself with one tensor copy through the map the launcher passes
//     (tmap.py: 128-byte swizzle, rows past M zero-filled), and its wgmmas read the stage through
//     a swizzled descriptor (wg_desc_sw; the stage layout is WgsStage's);
//   - per stage two mbarriers: full (the producer's expect_tx, completed by the copies' bytes) and
//     empty (every consumer thread arrives once the wgmma groups that read the stage are retired).
//     No __syncthreads in the loop: each consumer warp waits only for the chunk it multiplies, and
//     the producer only for the stage it refills, ST chunks ahead of the slowest warp.
// The copies are async-proxy writes completed on the mbarrier, which the wgmmas (async proxy) and
// the scale/weight loads (generic) read after waiting on it: no proxy fence is needed.
// The producer warps leave after the last copy; the consumers' split-K barriers in tile_finish are
// a named barrier over the 32*WN consumer threads (BAR = 1).
// Programmatic dependent launch (W4A16Linear(pdl=True), as the GEMV-like kernels of w4a16.cu): the
// producer copies the first ST stages' weights and scale words (no kernel writes them), then
// launch_dependents, then waits (griddepcontrol.wait) for the kernel before it, w4a16_tile_x, which
// wrote XT, and only then copies x. Every consumer thread waits too before tile_finish reads bias or
// the residual and writes the output, the split-K workspace and the counters (a no-op by then:
// its chunks came through the producer's wait). w4a16_tile_x waits before it reads x and before it
// writes XT, which the previous wgs launch of the same layer may still be reading, and lets its wgs
// kernel launch only after that wait: triggered at its top, the chain ran a layer further ahead (the
// next wgs grid's blocks parked on the SMs, copying their weights, while this one ran), which cost
// 10 µs at 64 rows on the H200 (twenty-fifth session).

// Split-K in a cluster (KC = 2, 4 or 8, `__cluster_dims__(1, 1, KC)`: wgs128wk, wgs64ndk2): the
// KC splits of a tile are one cluster and never touch the workspace. After every CTA's loop (a
// cluster barrier: each ring is idle), rank r stores each accumulator quad (acc[j][mt], 4 floats a
// thread) it does not own into its owner's shared memory (quad q = j * MT + mt is rank q % KC's; the
// ring's first bytes, [sender slot][quad][consumer thread] float4s: a warp's stores are 512
// contiguous bytes), a second cluster barrier, then each owner adds the KC partials of its quads in
// z order (deterministic, as tile_finish's) and runs the epilogue of those quads only. The
// producer warps stay for both barriers (no remote store may reach an exited CTA). Such a kernel
// runs only at split KC (plan_mtc).

// A per-block timeline of the wgs kernels, for bench/wgs_ablate.py only (its AB 16 row): a source that
// defines ANVIL_WGS_TRACE (the most blocks traced) gets this buffer, and its kernels with
// AB & WGS_AB_TRACE write, per block b, anvil_wgs_trace[16 b + slot] (wgs_stamp). The library's
// source defines neither the macro nor such kernels.
#ifdef ANVIL_WGS_TRACE
__device__ unsigned long long anvil_wgs_trace[16 * ANVIL_WGS_TRACE];
#endif

namespace anvil_w4a16 {

// Slots of a block's timeline (wgs_stamp is empty unless AB has WGS_AB_TRACE and the source defines
// ANVIL_WGS_TRACE, so its calls cost the library's kernels nothing): 0 %globaltimer at entry (ns, comparable across SMs), 1 clock64 at
// entry, then clock64 (cycles of this SM) 2 after the barriers' init, 3 when consumer warp 0's first
// chunk has landed, 4 at its loop's end, 5 after its epilogue (split-K included), 6 when the producer
// has issued its last copy; 7 the SM (%smid); 8 %globaltimer after the epilogue; a cluster's
// split-K (KC > 1) also 9 after its first cluster barrier (every loop of the cluster done) and 10
// after its second (the peers' partials landed).
enum WgsSlot : int {
    WGS_T_GT = 0, WGS_T_ENTRY, WGS_T_INIT, WGS_T_FIRST, WGS_T_LOOP, WGS_T_END, WGS_T_PROD, WGS_T_SM, WGS_T_GT_END,
    WGS_T_XSYNC, WGS_T_XDONE
};

template <int AB>
__device__ __forceinline__ void wgs_stamp(int slot) {
#ifdef ANVIL_WGS_TRACE
    if constexpr ((AB & WGS_AB_TRACE) != 0) {
        const unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
        if (b >= ANVIL_WGS_TRACE) return;
        unsigned long long v;
        if (slot == WGS_T_GT || slot == WGS_T_GT_END) {
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(v));
        } else if (slot == WGS_T_SM) {
            unsigned sm;
            asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
            v = sm;
        } else {
            v = clock64();
        }
        anvil_wgs_trace[16 * b + slot] = v;
    }
#endif
}

// One arrival: this thread's
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

// One arrival for the whole warp: __syncwarp (every lane's earlier accesses ordered before it),
// then one elected lane arrives, so the barrier counts warps. The arrive is predicated inside the
// asm rather than behind a branch on the lane (such a branch between wgmma groups made ptxas
// serialize them: C7513). Used by the wgd kernel. The wgs tiles keep one arrival a thread: wgs
// tiles with elected arrivals, and with one barrier pair for two stages, measured the same as
// theirs on an H100 (thirty-second session, docs/kernels_gpu.md; their code is in b6556ef).
__device__ __forceinline__ void mbar_arrive_warp(uint32_t bar) {
    __syncwarp();
    asm volatile(
        "{\n.reg .pred p;\nelect.sync _|p, 0xffffffff;\n@p mbarrier.arrive.shared::cta.b64 _, [%0];\n}\n" ::"r"(bar)
        : "memory");
}

// This CTA's rank in its cluster
__device__ __forceinline__ uint32_t cluster_rank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}

// Every thread of every CTA of the cluster (whole warps): what each did before is visible to all
// after (release / acquire at cluster scope)
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// The shared address saddr of this CTA as the same offset in the cluster's CTA `rank`
__device__ __forceinline__ uint32_t mapa_shared(uint32_t saddr, uint32_t rank) {
    uint32_t r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(saddr), "r"(rank));
    return r;
}

__device__ __forceinline__ void st_cluster_v4(uint32_t addr, float a, float b, float c, float d) {
    asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "f"(a), "f"(b), "f"(c), "f"(d)
                 : "memory");
}

// A TMA tensor map (the driver's CUtensorMap: 128 opaque bytes, 64-byte aligned), passed to a tx
// kernel as a __grid_constant__ parameter: x (M rows x K, 16-bit values, row-major) with boxes of
// 64 k x BM rows, 128-byte swizzle, rows past M read as zero (w4a16_linear encodes it per x and M)
struct alignas(64) AnvilTmap {
    unsigned long long v[16];
};

// Box (k0 .. k0 + 63, rows row0 .. row0 + BM - 1) of the map's x into shared dst (1024-byte
// aligned), completed on the mbarrier bar with the box's bytes (rows past M zero-filled, counted)
__device__ __forceinline__ void tma_x_g2s(uint32_t dst, const AnvilTmap* map, int k0, int row0, uint32_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
            dst),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(k0), "r"(row0), "r"(bar)
        : "memory");
}

// Where the parts of a ring stage sit (T: the tile). TX = 0: weights, scale words, then the x tile
// as w4a16_tile_x ordered it (no swizzle). TX = 1 (x by a tensor map): the x tile first, as the
// TMA's 128-byte swizzle lays it (BM rows of 128 bytes; the swizzle pattern repeats every 1024
// bytes, so the tile starts 1024-byte aligned), then weights and scale words, the stage rounded
// up to 1024 bytes.
template <class T, int TX>
struct WgsStage {
    static constexpr int X_OFF = TX ? 0 : T::W_BYTES + T::SZ_BYTES;
    static constexpr int W_OFF = TX ? T::X_BYTES : 0;
    static constexpr int SZ_OFF = W_OFF + T::W_BYTES;
    static constexpr int BYTES = TX ? (T::STAGE + 1023) / 1024 * 1024 : T::STAGE;
    static_assert(!TX || T::X_BYTES % 1024 == 0, "whole swizzle atoms of x");
};

// Where a thread of a wgs or wgd block works: its lane and warp, its tile's first row of x and
// first strip, and the block's chunks (first, count) of split z = blockIdx.z.
struct WgsBlock {
    int lane, wn, m0, strip0, c0, nck;
    template <class T, int CPG>
    static __device__ __forceinline__ WgsBlock of(int K) {
        WgsBlock b;
        b.lane = threadIdx.x & 31;
        b.wn = threadIdx.x >> 5;
        b.m0 = blockIdx.x * T::BM;
        b.strip0 = blockIdx.y * T::BS;
        const int2 chunks = mtc_split_chunks<CPG>(K);
        b.c0 = chunks.x;
        b.nck = chunks.y;
        return b;
    }
};

// A ring slot and the parity of its current pass (N slots)
template <int N>
struct RingPos {
    int i = 0;
    uint32_t ph = 0;
    __device__ __forceinline__ void next() {
        if (++i == N) {
            i = 0;
            ph ^= 1u;
        }
    }
};

// A ring's N full and N empty barriers, 8 bytes apart from full0 and empty0, expecting FULL and
// EMPTY arrivals a phase (thread 0, before fence.mbarrier_init and the block's barrier)
template <int N, uint32_t FULL, uint32_t EMPTY>
__device__ __forceinline__ void mbar_ring_init(uint32_t full0, uint32_t empty0) {
#pragma unroll
    for (int s = 0; s < N; ++s) {
        mbar_init<FULL>(full0 + 8 * s);
        mbar_init<EMPTY>(empty0 + 8 * s);
    }
}

// The producer (one thread: lane 0 of the producer warp) of a wgs-style ring of ST stages at
// smem_s (T: the tile), chunks c0 .. c0 + nck - 1 of this block: each stage's weights, scale words
// (a group's first chunk) and x tile in three bulk copies on its full barrier, refilled once its
// empty barrier has every reader's arrival. Shared by the wgs and wgd kernels.
template <class T, int ST, int CPG, int AB = 0, int TX = 0>
__device__ __forceinline__ void wgs_produce(const uint4* __restrict__ W, const uint4* __restrict__ SZ,
                                            const uint16_t* __restrict__ XT, uint32_t smem_s, uint32_t full0,
                                            uint32_t empty0, int N, int c0, int nck, int m0, int strip0,
                                            const AnvilTmap* tmx = nullptr, int flags = 0) {
    using S = WgsStage<T, TX>;
    const int strips = N >> 4;
    const int vs = min(T::BS, strips - strip0);  // strips of this tile inside N
    const uint32_t wbytes = vs * 512, szbytes = vs * 64, xbytes = T::X_BYTES;
    const int mpad = gridDim.x * T::BM;
    const uint4* w = W + (static_cast<size_t>(c0) * strips + strip0) * 32;
    const uint4* sz = SZ + (static_cast<size_t>(c0 / CPG) * strips + strip0) * 4;
    const uint16_t* xt = XT + (static_cast<size_t>(c0) * mpad + m0) * 64;
    const size_t wstep = static_cast<size_t>(strips) * 32, szstep = static_cast<size_t>(strips) * 4;
    const size_t xstep = static_cast<size_t>(mpad) * 64;
    // chunk i's weights (and, a group's first chunk, its scale words) into stage st
    auto copy_weights = [&](int i, uint32_t st, uint32_t full) {
        const bool first = i % CPG == 0;  // c0 is a multiple of CPG
        if constexpr ((AB & (WGS_AB_W | WGS_AB_X)) != 0) {  // timing ablations: past the first
            // ST chunks no weights and scale words (WGS_AB_W) or no x (WGS_AB_X)
            const bool cw = !(AB & WGS_AB_W) || i < ST, cx = !(AB & WGS_AB_X) || i < ST;
            mbar_expect_tx(full, (cw ? wbytes + (first ? szbytes : 0u) : 0u) + (cx ? xbytes : 0u));
            if (cw) bulk_g2s(st + S::W_OFF, w, wbytes, full);
            if (cw && first) bulk_g2s(st + S::SZ_OFF, sz, szbytes, full);
            if (first) sz += szstep;
            w += wstep;
            return;
        }
        mbar_expect_tx(full, wbytes + xbytes + (first ? szbytes : 0u));  // x's bytes too
        bulk_g2s(st + S::W_OFF, w, wbytes, full);
        if (first) {
            bulk_g2s(st + S::SZ_OFF, sz, szbytes, full);
            sz += szstep;
        }
        w += wstep;
    };
    // the first stages: weights and scale words now (each stage's full barrier expects its x
    // bytes too, so no consumer passes it before they land), x after the wait
    const int pro = min(ST, nck);
    // chunk i's x tile into stage st: a slice of XT, or (TX) a box of x through the tensor map
    auto copy_x = [&](int i, uint32_t st, uint32_t full) {
        if constexpr (TX) {
            tma_x_g2s(st + S::X_OFF, tmx, (c0 + i) * 64, m0, full);
        } else {
            bulk_g2s(st + S::X_OFF, xt, xbytes, full);
            xt += xstep;
        }
    };
    for (int i = 0; i < pro; ++i) copy_weights(i, smem_s + i * S::BYTES, full0 + 8 * i);
    // x written (TX: by the kernel before; else w4a16_tile_x has written XT). The next kernel may
    // be scheduled before this wait (its blocks then take SM room and stream their first weights
    // while the kernel before this one drains: a tx chain can run two layers ahead) or, with
    // FLAG_LATE_TRIGGER, only after it (at most this kernel and the next in flight)
    if (flags & FLAG_LATE_TRIGGER) {
        pdl_wait();
        pdl_launch_dependents();
    } else {
        pdl_launch_dependents();
        pdl_wait();
    }
    for (int i = 0; i < pro; ++i) copy_x(i, smem_s + i * S::BYTES, full0 + 8 * i);
    for (int i = pro; i < nck; ++i) {
        const int s = i % ST;
        // pass i / ST over the ring: wait for the consumers' release of pass i / ST - 1
        mbar_wait(empty0 + 8 * s, static_cast<uint32_t>((i / ST + 1) & 1));
        const uint32_t st = smem_s + s * S::BYTES;
        copy_weights(i, st, full0 + 8 * s);
        if constexpr ((AB & WGS_AB_X) == 0) copy_x(i, st, full0 + 8 * s);
        else if constexpr (!TX) xt += xstep;
    }
}

// Timing ablations (AB: WGS_AB_* bits, w4a16_wg.cu; 0 in every kernel the library builds, only
// bench/wgs_ablate.py instantiates others): past the first ST chunks, AB & WGS_AB_X copies no x
// (the stages keep the x of earlier chunks), AB & WGS_AB_W no weights or scale words.
// blockDim.x = 32*(WN + PW); dynamic shared memory ST * STAGE bytes, then 2*ST mbarriers (8 B each).
template <int DT, int MT, int NS, int WN, int ST, int CPG, int PW, int AB = 0, int KC = 0, int TX = 0, int UR = 0>
__device__ __forceinline__ void w4a16_wgs_body(const uint4* __restrict__ W, const uint4* __restrict__ SZ,
                                               const uint16_t* __restrict__ XT, uint16_t* __restrict__ Y,
                                               const uint16_t* __restrict__ bias,
                                               const uint16_t* __restrict__ res, float* __restrict__ ws,
                                               int* __restrict__ counters, int M, int N, int K, int act,
                                               int flags, const AnvilTmap* tmx = nullptr) {
    static_assert(WN % 4 == 0, "whole warpgroups");
    static_assert(MT == 4 || MT == 8 || MT == 16, "wgmma N = 8*MT: 32, 64 or 128");
    static_assert(ST >= 2, "a stage being multiplied and one being filled");
    static_assert(PW == 1 || PW == 4, "a producer warp, or a producer warpgroup that gives its registers away");
    constexpr int KCD = KC > 0 ? KC : 1;  // (no division by zero where KC = 0)
    static_assert(KC == 0 || ((KC == 2 || KC == 4 || KC == 8) && NS * MT % KCD == 0),
                  "split-K in a cluster of 2, 4 or 8: each rank finishes a KC-th of the accumulator quads");
    static_assert(KC == 0 || (KCD - 1) * (NS * MT / KCD) * 32 * WN * 16 <= ST * MtcTile<MT, NS, 1, WN, true>::STAGE,
                  "the peers' partials fit in the ring");
    using T = MtcTile<MT, NS, 1, WN, true>;
    using S = WgsStage<T, TX>;
    extern __shared__ uint4 smem4[];
    unsigned char* smem = reinterpret_cast<unsigned char*>(smem4);
    uint32_t smem_s = smem_u32(smem);
    if constexpr (TX) {  // the ring from the first 1024-byte boundary (the launch adds 1024 bytes)
        const uint32_t pad = (1024u - (smem_s & 1023u)) & 1023u;
        smem += pad;
        smem_s += pad;
    }
    const uint32_t full0 = smem_s + ST * S::BYTES;  // full[s] = full0 + 8 s, empty[s] = full0 + 8 (ST + s)
    const uint32_t empty0 = full0 + 8 * ST;
    const auto [lane, wn, m0, strip0, c0, nck] = WgsBlock::of<T, CPG>(K);

    if (threadIdx.x == 0) {
        wgs_stamp<AB>(WGS_T_GT);
        wgs_stamp<AB>(WGS_T_ENTRY);
        wgs_stamp<AB>(WGS_T_SM);
        // full: the producer's arrive (with the bytes expected); empty: every consumer thread
        mbar_ring_init<ST, 1, 32 * WN>(full0, empty0);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x == 0) wgs_stamp<AB>(WGS_T_INIT);

    if (wn >= WN) {  // the producer
        // PW = 4: the producer warpgroup keeps 40 registers a thread and the consumers take the
        // rest (232: a 128 x 256 tile's 128 accumulators a thread without spilling)
        if constexpr (PW == 4) asm volatile("setmaxnreg.dec.sync.aligned.u32 40;" ::: "memory");
        if (wn == WN && lane == 0 && nck > 0) {
            wgs_produce<T, ST, CPG, AB, TX>(W, SZ, XT, smem_s, full0, empty0, N, c0, nck, m0, strip0, tmx,
                                            flags);
            wgs_stamp<AB>(WGS_T_PROD);
        }
        if constexpr (KC > 1) {  // the consumers' two cluster barriers
            __syncwarp();
            cluster_sync();
            cluster_sync();
        }
        return;
    }

    if constexpr (PW == 4) asm volatile("setmaxnreg.inc.sync.aligned.u32 232;" ::: "memory");
    float acc[NS][MT][4];
    tile_zero(acc);
    const uint32_t one = Dt<DT>::pack2(1.0f);
    MtcScales<DT, NS> sc;
    uint32_t a[4][NS][4];
    // The loop's bookkeeping kept incrementally (the SASS of one chunk, docs/kernels_gpu.md): the
    // stage s = i % ST and its parity (i / ST) & 1 advance by one, x's descriptor is stage 0's plus
    // s * STAGE / 16 (wg_half adds 16 per step), and a group's CPG chunks are one unrolled pass, so
    // the scale words load without a branch. nck is whole groups (mtc_split_chunks).
    static_assert(S::BYTES % 16 == 0, "a stage's descriptor is stage 0's plus STAGE / 16");
    const uint32_t dx0 = TX ? wg_desc_sw_lo(smem_s + S::X_OFF) : wg_desc_lo(smem_s + S::X_OFF);
    // UR: the loop unrolled over the ring's ST stages (a trip is a pass over the ring, whole groups),
    // so that each chunk's stage, addresses, descriptor and previous stage are constants
    static_assert(!UR || ST % CPG == 0, "a pass over the ring is whole groups");
    constexpr int TRIP = UR ? ST : CPG;  // chunks a trip of the outer loop
    int s = 0;         // i % ST
    uint32_t ph = 0;   // (i / ST) & 1
    int sp = ST - 1;   // (i - 1) % ST: the stage chunk i - 1 read
    for (int i0 = 0; i0 < nck; i0 += TRIP) {
#pragma unroll
        for (int c = 0; c < TRIP; ++c) {
            if (UR && i0 + c >= nck) break;
            const int cs = UR ? c : s, csp = UR ? (c + ST - 1) % ST : sp;
            mbar_wait(full0 + 8 * cs, ph);  // chunk i = i0 + c: its bytes have landed
            if (threadIdx.x == 0 && i0 == 0 && c == 0) wgs_stamp<AB>(WGS_T_FIRST);
            const uint32_t so = static_cast<uint32_t>(cs) * S::BYTES;
            const unsigned char* st = smem + so;
            if (c % CPG == 0) sc.load(reinterpret_cast<const uint2*>(st + S::SZ_OFF), wn * NS, lane >> 2, flags);
            const uint4* sW = reinterpret_cast<const uint4*>(st + S::W_OFF) + wn * NS * 32 + lane;  // this warp's strips
            const uint32_t dx = dx0 + (so >> 4);
            uint4 w[NS];
            wg_wait<1>();  // steps 0-1 of chunk i - 1 retired: a[0..1] free (its steps 2-3 may still run)
            wg_half<0, DT, MT, NS, AB, TX>(acc, a, w, sW, sc, one, dx);
            wg_wait<1>();  // chunk i - 1's groups retired (a[2..3] free): its stage may be refilled
            // every consumer thread arrives (a branch on the lane between the groups made ptxas
            // serialize the wgmmas: C7513)
            if (c > 0 || i0 > 0) mbar_arrive(empty0 + 8 * csp);
            wg_half<1, DT, MT, NS, AB, TX>(acc, a, w, sW, sc, one, dx);
            if constexpr (!UR) {
                sp = s;
                if (++s == ST) {
                    s = 0;
                    ph ^= 1u;
                }
            }
        }
        if constexpr (UR) ph ^= 1u;
    }
    wg_wait<0>();
#pragma unroll
    for (int j = 0; j < NS; ++j) wg_pin(reinterpret_cast<float(&)[4 * MT]>(acc[j]));
    if (threadIdx.x == 0) wgs_stamp<AB>(WGS_T_LOOP);
    pdl_wait();  // before bias, residual, output, workspace and counters (a no-op: see the top)
    if constexpr (KC > 1) {
        // quad q = j * MT + mt (the 4 accumulators acc[j][mt]) belongs to rank q % KC; the owner o
        // keeps in its stages, for each other rank s, that rank's partial of its quads:
        // [slot s < o ? s : s - 1][q / KC][consumer thread] float4s
        constexpr int NT = 32 * WN, QK = NS * MT / KCD;
        const int rank = static_cast<int>(cluster_rank());
        uint32_t base[KC];
#pragma unroll
        for (int o = 0; o < KC; ++o) base[o] = mapa_shared(smem_s, static_cast<uint32_t>(o)) + 16 * threadIdx.x;
        cluster_sync();  // every ring of the cluster idle: the peers may write into this CTA's stages
        if (threadIdx.x == 0) wgs_stamp<AB>(WGS_T_XSYNC);
#pragma unroll
        for (int j = 0; j < NS; ++j)
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                const int q = j * MT + mt, o = q % KC;
                if (o != rank) {
                    const int slot = rank < o ? rank : rank - 1;
                    const float(&v)[4] = acc[j][mt];
                    st_cluster_v4(base[o] + 16 * NT * (slot * QK + q / KC), v[0], v[1], v[2], v[3]);
                }
            }
        cluster_sync();  // the peers' partials of this CTA's quads have landed
        if (threadIdx.x == 0) wgs_stamp<AB>(WGS_T_XDONE);
        const float4* mine = reinterpret_cast<const float4*>(smem) + threadIdx.x;
#pragma unroll
        for (int j = 0; j < NS; ++j)
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                const int q = j * MT + mt;
                if (q % KC != rank) continue;
                // the splits' partials added in z order (deterministic; tile_finish's order)
                float t[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int z = 0; z < KC; ++z) {
                    float4 p;
                    if (z == rank) {
                        p = make_float4(acc[j][mt][0], acc[j][mt][1], acc[j][mt][2], acc[j][mt][3]);
                    } else {
                        p = mine[NT * ((z < rank ? z : z - 1) * QK + q / KC)];
                    }
                    t[0] += p.x;
                    t[1] += p.y;
                    t[2] += p.z;
                    t[3] += p.w;
                }
#pragma unroll
                for (int i = 0; i < 4; ++i) acc[j][mt][i] = t[i];
            }
        tile_epilogue<DT, MT, NS, 1, WN, KC>(acc, Y, bias, res, M, N, m0, strip0, act, rank);
    } else {
        tile_finish<DT, MT, NS, 1, WN, 1>(acc, Y, bias, res, ws, counters, M, N, m0, strip0, act);
    }
    if (threadIdx.x == 0) {
        wgs_stamp<AB>(WGS_T_END);
        wgs_stamp<AB>(WGS_T_GT_END);
    }
}

}  // namespace anvil_w4a16

// KC: 0, or 2, 4, 8 (split-K in a cluster of a tile's splits: a compile-time cluster)
#define ANVIL_WGS_KC_0
#define ANVIL_WGS_KC_2 __cluster_dims__(1, 1, 2)
#define ANVIL_WGS_KC_4 __cluster_dims__(1, 1, 4)
#define ANVIL_WGS_KC_8 __cluster_dims__(1, 1, 8)
// TX: 0, or 1 (x through a tensor map, no w4a16_tile_x before the kernel: its map the last
// parameter, by value; X unused)
#define ANVIL_WGS_TX_PARAM_0
#define ANVIL_WGS_TX_PARAM_1 , const __grid_constant__ anvil_w4a16::AnvilTmap tmx
#define ANVIL_WGS_TX_ARG_0
#define ANVIL_WGS_TX_ARG_1 , &tmx
#define ANVIL_W4A16_WGS_KERNEL(NAME, DT, MT, NS, WN, ST, CPG, PW, MINB, KC, TX, UR)                     \
    extern "C" __global__ void __launch_bounds__(32 * (WN + PW), MINB) ANVIL_WGS_KC_##KC                \
        NAME(const uint4* __restrict__ W, const uint4* __restrict__ SZ, const uint16_t* __restrict__ X, \
             uint16_t* __restrict__ Y, const uint16_t* __restrict__ bias,                              \
             const uint16_t* __restrict__ res, float* __restrict__ ws, int* __restrict__ counters,     \
             int M, int N, int K, int act, int flags ANVIL_WGS_TX_PARAM_##TX) {                        \
        anvil_w4a16::w4a16_wgs_body<DT, MT, NS, WN, ST, CPG, PW, 0, KC, TX, UR>(                        \
            W, SZ, X, Y, bias, res, ws, counters, M, N, K, act, flags ANVIL_WGS_TX_ARG_##TX);          \
    }

// x (M x K, 16-bit values) -> XT, the wgs stages' order: [K/64][mpad/8][8 k pieces][8 rows][8 values],
// rows M .. mpad - 1 zero. One thread a 16-byte piece, in XT order (the stores coalesce; a warp
// reads 4 pieces of 8 rows).
#define ANVIL_W4A16_TILE_X_KERNEL()                                                                     \
    extern "C" __global__ void __launch_bounds__(256) w4a16_tile_x(                                     \
        const uint4* __restrict__ X, uint4* __restrict__ XT, int M, int mpad, int K) {                 \
        anvil_w4a16::pdl_wait();              /* x written; the last wgs launch done with XT */       \
        anvil_w4a16::pdl_launch_dependents(); /* only now: the wgs kernel's weight copies may start */ \
        const long long p = static_cast<long long>(blockIdx.x) * 256 + threadIdx.x;                    \
        const long long total = static_cast<long long>(mpad) * (K >> 3);                               \
        if (p >= total) return;                                                                        \
        const long long blk = p >> 6; /* (chunk, row group): 64 pieces, 1024 bytes */                  \
        const int groups = mpad >> 3;                                                                  \
        const int r = static_cast<int>(blk % groups) * 8 + static_cast<int>(p & 7);                    \
        const int piece = static_cast<int>(blk / groups) * 8 + static_cast<int>((p >> 3) & 7);         \
        XT[p] = r < M ? X[static_cast<long long>(r) * (K >> 3) + piece] : make_uint4(0, 0, 0, 0);     \
    }

// Present in every module built from this source: the wgs kernels and w4a16_tile_x wait
// (pdl_wait) before they read x or XT, so W4A16Linear may launch them as programmatic dependents;
// a module built before lacks it and launches them plainly (w4a16_linear.WGS_PDL_MARKER).
extern "C" __global__ void w4a16_wgs_pdl_marker() {}
