"""The Marlin-like tensor-core W4A16 kernel (w4a16_mtc.cu): its layout (prepack_mtc), its numpy
model (which lane gets which element, through ldmatrix and the mma.m16n8k16 fragments), planning,
ptxas's report and SASS (CPU; those skip without nvcc / cuobjdump), and the kernel against the CPU
twin (GPU, skipped without one; tolerances in anvil_kernels.cuda.gpu_check)."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from anvil_kernels import Int4Weight, dequantize, int4_linear
from anvil_kernels.activations import ACTIVATIONS
from anvil_kernels.cuda import MTC_CONFIGS, W4A16Params, plan_mtc, prepack, prepack_mtc, unprepack_mtc
from anvil_kernels.cuda.gpu_check import check_case, compare, has_gpu, random_weight, weight_error
from anvil_kernels.cuda.mtc_model import ldmatrix_x4, simulate
from anvil_kernels.cuda.tc_model import round_a
from anvil_kernels.cuda.w4a16 import w4a16_source
from anvil_kernels.cuda.w4a16_mtc import MtcConfig, mtc_from_prepack
from anvil_kernels.format import bf16_bits_to_f32, f32_to_bf16_bits, pack_nibbles, unpack_nibbles

MTC_SRC = Path(__file__).parents[1] / "src/anvil_kernels/cuda/w4a16_mtc.cu"

# ------------------------------------------------------------------------------------ CPU only


@pytest.mark.parametrize("sdt", ["fp16", "bf16", "fp32"])
def test_prepack_mtc_is_a_bijection(rng: np.random.Generator, sdt: str) -> None:
    w = random_weight(rng, 512, 96, 128, sdt)
    p = prepack_mtc(w)
    assert p["mq"].shape == (8, 6, 32, 4) and p["msz"].shape == (4, 6, 8, 2)
    back = unprepack_mtc(p)
    assert np.array_equal(unpack_nibbles(back.packed), unpack_nibbles(w.packed))
    ref = w if sdt != "fp32" else unprepack_mtc(prepack_mtc(w))  # fp32 scales are kept as bf16
    np.testing.assert_array_equal(back.scales_f32, ref.scales_f32)
    np.testing.assert_array_equal(back.zeros_f32, w.zeros_f32)
    # the GEMV layout converts to the same arrays
    conv = mtc_from_prepack(prepack(w))
    assert np.array_equal(conv["mq"], p["mq"]) and np.array_equal(conv["msz"], p["msz"])


def test_single_nibble_lands_where_the_kernel_reads_it() -> None:
    """One nonzero nibble at (k, n) sits at mq[kc, strip, lane, step], bits 4p, with the fragment
    formulas of w4a16_mtc.cu's header."""
    k, n, g = 256, 64, 64
    for kk, nn in [(0, 0), (77, 13), (255, 63), (136, 40), (9, 8)]:
        q = np.zeros((k, n), np.uint8)
        q[kk, nn] = 11
        ones, zeros = np.ones((k // g, n), np.float16), np.zeros((k // g, n), np.float16)
        w = Int4Weight(pack_nibbles(q), ones, zeros, g, k, n, "fp16")
        mq = prepack_mtc(w)["mq"]
        hits = np.argwhere(mq)
        assert len(hits) == 1
        kc, strip, lane, step = hits[0]
        p = int(np.log2(int(mq[kc, strip, lane, step]) // 11)) // 4
        assert int(mq[kc, strip, lane, step]) == 11 << (4 * p)
        j, e = p & 3, p >> 2
        assert nn == 16 * strip + (lane >> 2) + 8 * (j & 1)
        assert kk == 64 * kc + 16 * step + 2 * (lane & 3) + e + 8 * (j >> 1)


def test_ldmatrix_model_gives_the_b_fragments() -> None:
    """ldmatrix.x4 from the addresses the kernel computes gives each lane the B fragment of the PTX
    layout: (k = 2 t4 + e + 8 r, m = g8) of the 8-row tile, for two k16 steps."""
    xrow = 144
    rows, ks = 16, 64
    x = np.arange(rows * ks, dtype=np.float64).reshape(rows, ks)
    stage = np.full(rows * xrow // 2, np.nan)
    for r in range(rows):
        stage[r * xrow // 2 : r * xrow // 2 + ks] = x[r]
    lanes = np.arange(32)
    for mt in range(2):
        for h in range(2):
            addr = (mt * 8 + (lanes & 7)) * xrow + (lanes >> 3) * 16 + h * 64
            b = ldmatrix_x4(stage, addr)
            for ss in range(2):
                for r in range(2):
                    for e in range(2):
                        kk = 32 * h + 16 * ss + 8 * r + 2 * (lanes & 3) + e
                        np.testing.assert_array_equal(b[2 * ss + r][:, e], x[mt * 8 + (lanes >> 2), kk])


def _kernel_weight(w: Int4Weight, sa: bool, dt: str) -> np.ndarray:
    """(K, N) float64 weights as the kernel multiplies them (see test_cuda_w4a16_tc)."""
    if not sa:
        return dequantize(w).astype(np.float64)
    q = unpack_nibbles(w.packed).astype(np.float64)
    g = w.group_size
    s = np.repeat(round_a(w.scales_f32.astype(np.float64), dt), g, axis=0)
    z = np.repeat(w.zeros_f32.astype(np.float64), g, axis=0)
    return round_a((q - z) * s, dt)


@pytest.mark.parametrize(
    ("cfg", "m", "k", "n", "g", "split", "sdt"),
    [
        ("mtc8", 5, 512, 288, 128, 3, "fp16"),  # partial N tile, uneven split
        ("mtc16", 16, 384, 64, 64, 4, "bf16"),
        ("mtc8x", 3, 256, 544, 128, 2, "bf16"),  # a second, partial 512-column tile
        ("mtc16x", 11, 512, 160, 256, 1, "fp16"),
        ("mtc32", 33, 256, 256, 256, 1, "bf16"),  # two M tiles, the second partial
        ("mtc64", 70, 256, 160, 128, 2, "fp16"),
        ("mtc64w", 9, 512, 272, 64, 3, "bf16"),
        ("mtc128", 130, 256, 144, 128, 1, "fp16"),
        ("mtc128w", 40, 256, 288, 128, 2, "bf16"),
        ("wg64", 70, 256, 288, 128, 2, "bf16"),  # two M tiles; a second, partial 256-column tile
        ("wg64n", 9, 384, 160, 64, 3, "fp16"),
        ("wg128", 130, 256, 144, 128, 1, "fp16"),
        ("wg128w", 40, 256, 288, 128, 2, "bf16"),
        ("wg128w", 257, 256, 160, 256, 1, "bf16"),  # three M tiles
        ("wg64d", 70, 1024, 288, 128, 1, "bf16"),  # 16 chunks through an 8-stage ring
        ("wg128wd", 40, 768, 160, 64, 2, "fp16"),  # 6 chunks a split: fewer than the ring holds
        ("wgs64", 70, 1024, 288, 128, 2, "bf16"),  # x from tile_x: two M tiles, the second padded
        ("wgs64n", 9, 768, 160, 64, 3, "fp16"),
        ("wgs128w", 130, 512, 288, 128, 2, "bf16"),  # producer warpgroup: two M tiles, partial N
        ("wgs32", 40, 1024, 288, 128, 2, "bf16"),  # wgmma n32: two M tiles
        ("wgs32", 1, 768, 160, 64, 3, "fp16"),  # one row, 31 padded; a partial N tile
    ],
)
@pytest.mark.parametrize("dt", ["bf16", "fp16"])
def test_model_reconstructs_product(
    rng: np.random.Generator, cfg: str, m: int, k: int, n: int, g: int, split: int, sdt: str, dt: str
) -> None:
    """Every lane's fragments, assembled through ldmatrix and the PTX layouts from the stage copies
    of the prepacked weights, give x @ W (float64; for scaled-A configs W rounded as the kernel
    rounds it), and every output is written exactly once."""
    w = random_weight(rng, k, n, g, sdt)
    x = rng.standard_normal((m, k))
    out, writes = simulate(prepack_mtc(w), x, cfg, split, dt)
    assert np.array_equal(writes, np.ones((m, n), np.int64))
    np.testing.assert_allclose(out, x @ _kernel_weight(w, MTC_CONFIGS[cfg].sa, dt), rtol=1e-10, atol=1e-10)


def test_model_detects_a_layout_error(rng: np.random.Generator) -> None:
    """Two lanes' words swapped in one chunk (what a wrong prepack index would do), or the scales
    of two groups swapped, change the product."""
    k, n, g = 256, 256, 128
    w = random_weight(rng, k, n, g)
    x = rng.standard_normal((8, k))
    p = prepack_mtc(w)
    ref = x @ dequantize(w).astype(np.float64)
    bad = dict(p, mq=p["mq"].copy())
    bad["mq"][1, 2, [3, 7]] = bad["mq"][1, 2, [7, 3]]
    assert not np.allclose(simulate(bad, x, "mtc8", 1)[0], ref, rtol=1e-6, atol=1e-6)
    bad = dict(p, msz=p["msz"][::-1].copy())
    assert not np.allclose(simulate(bad, x, "mtc8", 2)[0], ref, rtol=1e-6, atol=1e-6)


def test_model_index_expressions_are_the_kernels() -> None:
    """The model mirrors these lines of w4a16_mtc.cu and w4a16_wg.cu; if one changes, the model
    must change too."""
    src = "".join(MTC_SRC.with_name(f).read_text() for f in ("w4a16_tc.cu", "w4a16_mtc.cu", "w4a16_wg.cu"))
    for expr in [
        "XROW = WG ? 128 : 144",
        "return WG ? (r >> 3) * 1024 + p * 128 + (r & 7) * 16 : r * XROW + p * 16;",
        "w = W + (static_cast<size_t>(c0) * strips + strip0) * 32 + tid;",
        "sz = SZ + (static_cast<size_t>(c0 / CPG) * strips + strip0) * 4 + tid;",
        "xdst = T::W_BYTES + T::SZ_BYTES + T::x_off(T::x_row(tid), T::x_piece(tid));",
        "return WG ? 8 * (tid >> 6) + (tid & 7) : tid >> 3;",
        "return WG ? 4 * ((tid >> 5) & 1) + ((tid >> 3) & 3) : tid & 7;",
        "st + xdst + T::x_off(it * (T::NT / 8), 0)",
        "constexpr uint32_t WG_LBO = 128, WG_SBO = 1024;",  # the model's lbo, sbo
        "wg_desc(dlo + 16 * s)",  # step s at 256 s bytes
        "return ((saddr & 0x3FFFFu) >> 4) | ((WG_LBO >> 4) << 16);",
        "constexpr int PF = ST - 2;",  # wg: the model's PF (a stage more for the chunk in the tensor cores)
        "if (i + PF < nck) ld.issue(smem_s + wr * T::STAGE);  // the stage of chunk i - 2",
        "sW[(wn * NS + j) * 32 + lane];",
        "if (c % CPG == 0) {",
        "const uint32_t v = w >> (4 * j);",
        '"r"(0x000F000Fu)',
        "sSZ[(s0 + j) * 8 + g8]",
        "sc.load(reinterpret_cast<const uint2*>(st + T::W_BYTES), wn * NS, g8, flags);",
        "sW[(wn * NS + j) * 32 + lane]",
        "ldsm_off = (wm * MT * 8 + (lane & 7)) * T::XROW + (lane >> 3) * 16;",
        "sX + ldsm_off + mt * 8 * T::XROW + h * 64",
        "b[mt][2 * ss], b[mt][2 * ss + 1]",
        "mtc_pair<DT>(wd, 1), one, zhi[j]",
        "(static_cast<uint64_t>(WG_SBO >> 4) << 32)",
        "(static_cast<size_t>(z) * T::REGS + (j * MT + mt) * 4 + q) * T::NT + tid",
    ]:
        assert expr in src, f"w4a16_mtc.cu no longer has: {expr}"
    wgs = MTC_SRC.with_name("w4a16_wgs.cu").read_text()
    for expr in [  # the cluster's split-K (mtc_model._cluster_sum)
        "constexpr int NT = 32 * WN, QK = NS * MT / KCD;",
        "base[o] = mapa_shared(smem_s, static_cast<uint32_t>(o)) + 16 * threadIdx.x;",
        "const int q = j * MT + mt, o = q % KC;",
        "const int slot = rank < o ? rank : rank - 1;",
        "st_cluster_v4(base[o] + 16 * NT * (slot * QK + q / KC), v[0], v[1], v[2], v[3]);",
        "const float4* mine = reinterpret_cast<const float4*>(smem) + threadIdx.x;",
        "if (q % KC != rank) continue;",
        "p = mine[NT * ((z < rank ? z : z - 1) * QK + q / KC)];",
        "if (KC > 1 && (j * MT + mt) % KC != rank) continue;",
    ]:
        assert expr in wgs + src, f"w4a16_wgs.cu no longer has: {expr}"


@pytest.mark.parametrize(("nt", "bm"), [(256, 64), (256, 128), (128, 64)])
def test_wg_x_pieces_each_copied_once_in_whole_core_matrices(nt: int, bm: int) -> None:
    """The wg loader's thread -> x piece map (x_row, x_piece; pinned above): over the trips every
    (row, piece) of the tile is copied once, and each warp's 32 pieces are 4 whole 128-byte core
    matrices (8 rows of one group, 4 consecutive pieces): 512 contiguous bytes of the stage."""
    tid = np.arange(nt)
    row, piece = 8 * (tid >> 6) + (tid & 7), 4 * ((tid >> 5) & 1) + ((tid >> 3) & 3)
    seen = [(r + it * (nt // 8), p) for it in range(bm * 8 // nt) for r, p in zip(row, piece, strict=True)]
    assert sorted(seen) == [(r, p) for r in range(bm) for p in range(8)]
    off = (row >> 3) * 1024 + piece * 128 + (row & 7) * 16
    for w in range(nt // 32):
        o = np.sort(off[32 * w : 32 * w + 32])
        assert o[0] % 512 == 0 and np.array_equal(o, o[0] + 16 * np.arange(32))


def test_plan_mtc_geometry() -> None:
    p = plan_mtc(1, 8192, 8192, 128, "mtc8", sm_count=132)
    assert p.grid[:2] == (1, 32) and p.block == 256
    assert 32 * p.split <= 132 * MTC_CONFIGS["mtc8"].blocks_per_sm and p.split >= 4
    assert p.ws_floats == 32 * p.split * 8 * 256
    p = plan_mtc(256, 8192, 8192, 128, "mtc128w", sm_count=132)
    assert p.grid[:2] == (2, 32)
    p = plan_mtc(33, 288, 512, 128, "mtc64", split=3)
    assert p.grid == (1, 3, 3)  # N = 288: a third, partial tile of 32 columns
    with pytest.raises(ValueError, match="split"):
        plan_mtc(64, 256, 512, 128, "mtc64", split=5)  # 4 groups
    with pytest.raises(ValueError, match="unknown"):
        plan_mtc(64, 256, 512, 128, "tc64")
    for cfg in MTC_CONFIGS.values():
        assert cfg.smem <= 227 * 1024


def test_cluster_split_k_plans_its_split_and_no_workspace() -> None:
    """A wgs config that sums its splits in a cluster (kc) runs at split kc whatever the planner
    would choose, asks for no workspace, and refuses any other split; kc is 2, 4 or 8, for wgs
    configs whose accumulator quads (ns * mt) it divides among the ranks."""
    kc = [name for name, c in MTC_CONFIGS.items() if c.kc]
    assert kc
    for name in kc:
        c = MTC_CONFIGS[name]
        for m, n, k in ((256, 8192, 8192), (1, 256, 1024), (128, 14336, 4096)):
            p = plan_mtc(m, n, k, 128, name, sm_count=132)
            assert p.split == c.kc and p.grid[2] == c.kc and p.ws_floats == 0
        with pytest.raises(ValueError, match=f"split {c.kc} only"):
            plan_mtc(256, 8192, 8192, 128, name, split=2 * c.kc)
        with pytest.raises(ValueError, match="groups"):
            plan_mtc(256, 256, 128, 128, name)  # one group along K: nothing for the other splits
    with pytest.raises(ValueError, match="kc"):
        MtcConfig(mt=16, ns=2, wm=1, wn=8, st=6, regs=168, sa=True, wg=True, ws=4, kc=3)
    with pytest.raises(ValueError, match="kc"):
        MtcConfig(mt=4, ns=1, wm=1, wn=8, st=6, regs=64, sa=True, wg=True, ws=1, kc=8)  # 4 quads, 8 ranks
    with pytest.raises(ValueError, match="kc"):
        MtcConfig(mt=16, ns=2, wm=1, wn=8, st=6, regs=168, sa=True, wg=True, kc=2)  # no producer


def _ptxas(tmp_path: Path, dtype: str) -> tuple[str, list[Path]]:
    procs, cubins = [], []
    for cfg in MTC_CONFIGS:  # one nvcc per config, in parallel
        params = W4A16Params(dtypes=(dtype,), tiles=(), groups=(128,), tc_configs=(), mtc_configs=(cfg,))
        src = tmp_path / f"{cfg}_{dtype}.cu"
        src.write_text(w4a16_source(params))
        cubin = tmp_path / f"{cfg}_{dtype}.cubin"
        cubins.append(cubin)
        arch = "sm_90a" if MTC_CONFIGS[cfg].wg else "sm_90"  # wgmma: sm_90a only
        cmd = ["nvcc", "--cubin", "-O3", "-std=c++17", f"-arch={arch}", "-Xptxas", "-v"]
        cmd += ["-o", str(cubin), str(src)]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    stderr = ""
    for proc in procs:
        err = proc.communicate()[1]
        assert proc.returncode == 0, err
        stderr += err
    return stderr, cubins


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
@pytest.mark.timeout(900)  # 13 nvcc runs (9 mtc: 107 s alone on the shared 2-vCPU machine), more when busy
def test_mtc_ptxas_report_and_sass(
    tmp_path: Path, ptxas_registers: Callable[[str], dict[str, int]], cuobjdump: str | None
) -> None:
    """Every mtc config compiles for sm_90 with no spills and no stack, within the registers its
    MtcConfig states (the split planner's occupancy estimate uses them); with cuobjdump (PATH, or
    pip's nvidia-cuda-cuobjdump: .ci/run installs it) the SASS has the tensor-core, ldmatrix and copy
    instructions, no local memory, and every wgmma kernel both of its waits a chunk."""
    stderr, cubins = _ptxas(tmp_path, "bf16")
    seen = set()
    tile_x = False
    for name, regs in ptxas_registers(stderr).items():
        if name == "w4a16_tile_x":  # in each wgs config's unit (the x retiling it reads)
            tile_x = True
            continue
        hit = re.match(r"w4a16((?:mtc|wg)\w+?)_bf16_c2$", name)
        assert hit is not None, name
        seen.add(name)
        assert regs <= MTC_CONFIGS[hit.group(1)].regs, f"{name}: {regs} registers"
    assert len(seen) == len(MTC_CONFIGS), stderr
    assert tile_x == any(c.ws for c in MTC_CONFIGS.values())
    # e.g. C7513: wgmmas serialized because their input registers are redefined while they may run
    assert "Potential Performance Loss" not in stderr, stderr
    if cuobjdump is None:
        return
    for cubin in cubins:
        cmd = [cuobjdump, "-sass", str(cubin)]
        sass = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        c = MTC_CONFIGS[cubin.stem.rsplit("_", 1)[0]]
        if c.ws:  # bulk copies completed on mbarriers, no cp.async; tx: x by tensor copies
            ops: tuple[str, ...] = ("HGMMA.64x", "UBLKCP", "SYNCS") + (("UTMALDG.2D",) if c.tx else ())
        elif c.wg:
            ops = ("HGMMA.64x", "LDGSTS.E.BYPASS.128")
        else:
            ops = ("HMMA.16816.F32.BF16", "LDSM.16.M88.4", "LDGSTS.E.BYPASS.128")
        for op in ops:
            assert op in sass, f"{cubin.name}: no {op}"
        assert c.tx or "UTMALDG" not in sass, f"{cubin.name}: a tensor copy in a tile that reads XT"
        assert "LDL" not in sass and "STL" not in sass, f"{cubin.name}: local memory"
        if c.wg and not c.dq:  # a wait before each half's registers are written again: two per
            # chunk (a missing one lets a half's dequantization overwrite the A registers of a group
            # still running)
            assert sass.count("WARPGROUP.DEPBAR.LE gsb0, 0x1") >= 2, f"{cubin.name}: a wgmma wait missing"
        if c.dq:  # wgd: A from shared memory, one group a chunk retired before its stages go back;
            # the dequantizing warps' stores made visible to wgmma (fence.proxy.async) before they arrive
            assert sass.count("WARPGROUP.DEPBAR.LE gsb0, 0x1") >= 1, f"{cubin.name}: a wgmma wait missing"
            assert "FENCE.VIEW.ASYNC.S" in sass and "STS" in sass, f"{cubin.name}: no proxy fence or A stores"
            # both operands through descriptors (register A would read "R.., R.., gdesc[..]")
            ss = re.search(r"HGMMA\.64x\d+x16\.F32\.\w+ R\d+, gdesc\[", sass)
            assert ss, f"{cubin.name}: A not from shared memory"


@pytest.mark.parametrize(
    ("cfg", "dt", "m", "k", "n", "g", "split"),
    [
        ("mtc8", "bf16", 3, 512, 288, 128, 3),
        ("mtc64", "fp16", 70, 256, 160, 64, 1),
        ("wg64", "bf16", 70, 256, 288, 128, 2),
        ("wgs64", "bf16", 70, 512, 288, 128, 2),  # x retiled by the tile_x stand-in first
        ("wgs64n", "fp16", 5, 256, 160, 64, 1),
        ("wgs128w", "bf16", 40, 256, 288, 128, 2),
        ("wgs128wk", "fp16", 130, 512, 544, 128, 2),  # split-K in a cluster: no workspace
        ("wgs64ndk2", "bf16", 70, 1024, 288, 128, 2),
        ("wgs64ndk2", "bf16", 33, 512, 160, 64, 2),
        ("wgs64ndt", "fp16", 70, 256, 288, 128, 2),  # x through a tensor map: no w4a16_tile_x
        ("wgs64ndk2tu", "bf16", 5, 512, 160, 64, 2),
        ("wgs128wt", "bf16", 130, 256, 288, 128, 1),
        ("wgs128wkt", "fp16", 37, 512, 544, 128, 2),
        ("wgs64ndk2tu", "fp16", 70, 640, 160, 64, 2),  # both: a tensor map and the unrolled loop
        ("wgs32", "fp16", 3, 256, 288, 64, 1),
        ("wgd64", "bf16", 70, 512, 288, 128, 2),
    ],
)
def test_launcher_drives_the_model(
    fake_cupy: Callable[[np.ndarray], Any],
    model_module: object,
    rng: np.random.Generator,
    cfg: str,
    dt: str,
    m: int,
    k: int,
    n: int,
    g: int,
    split: int,
) -> None:
    """W4A16Linear's mtc launch (the mtc layout derived from prepack's and uploaded, argument
    order, grid, shared memory, workspace, counters) with the numpy model as the kernel, against
    the CPU twin with the GPU tests' tolerances."""
    from anvil_kernels.cuda import W4A16Linear

    dev = fake_cupy
    w = random_weight(rng, k, n, g, "bf16")
    dtype: Any = dt
    layer = W4A16Linear(
        model_module,
        prepack(w),
        m,
        dtype=dtype,
        activation="gelu_tanh",
        sm_count=132,
        kernel=cfg,
        split=split,
    )
    assert layer.qweight is None and layer.mq is not None  # only the layout its kernel reads
    xs = rng.standard_normal((m, k)).astype(np.float32)
    bs, rs = rng.standard_normal(n).astype(np.float32), rng.standard_normal((m, n)).astype(np.float32)
    x, bias, res = (round_a(a.astype(np.float64), dt).astype(np.float32) for a in (xs, bs, rs))
    bits = f32_to_bf16_bits if dt == "bf16" else (lambda a: a.astype(np.float16))
    out = dev(np.full((m, n), 0xFFFF, np.uint16) if dt == "bf16" else np.full((m, n), np.nan, np.float16))
    layer(dev(bits(x)), out, dev(bits(bias)), dev(bits(res)))
    ref = np.empty((m, n), np.float32)
    int4_linear(x, w, ref, bias, "gelu_tanh", res)
    got = bf16_bits_to_f32(np.asarray(out)) if dt == "bf16" else np.asarray(out).astype(np.float32)
    compare(got, ref, dt, cfg, weight_error(cfg, dt, x, w))
    with pytest.raises(ValueError, match="keep_host"):
        layer.set_kernel("gemv")  # the GEMV layout was never uploaded and the host copy is gone


# ------------------------------------------------------------------------------------ GPU

gpu = pytest.mark.skipif(not has_gpu(), reason="no CUDA device (or no cupy)")
MS = [1, 7, 16, 33, 64, 128, 256]


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("cfg", list(MTC_CONFIGS))
@pytest.mark.parametrize("dt", ["bf16", "fp16"])
@pytest.mark.parametrize(("k", "n", "g"), [(1024, 256, 128), (768, 160, 64), (2048, 288, 256)])
def test_mtc_matches_twin(
    module: object, rng: np.random.Generator, cfg: str, dt: str, k: int, n: int, g: int
) -> None:
    for m in MS:
        check_case(module, rng, dt, m, k, n, g, kernel=cfg)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize(("k", "n"), [(4096, 14336), (14336, 4096), (8192, 8192), (384, 1536), (1536, 384)])
def test_mtc_large_shapes(module: object, rng: np.random.Generator, k: int, n: int) -> None:
    """The benchmark's shapes, each config at the M it is meant for, with the planned split (one
    weight per shape, both layouts prepacked once: the large ones take seconds on the host)."""
    import cupy as cp

    from anvil_kernels.cuda import W4A16Linear
    from anvil_kernels.cuda.gpu_check import from_dev, to_dev

    w = random_weight(rng, k, n, 128, "bf16")
    packed = prepack(w) | prepack_mtc(w)
    cases = (("mtc8", 1), ("mtc8x", 1), ("mtc16x", 16), ("mtc64", 64), ("mtc128w", 256))
    wg = (("wg64", 64), ("wg64n", 64), ("wg128", 128), ("wg128w", 256), ("wg64d", 64), ("wg128wd", 256))
    wgs = (("wgs64", 64), ("wgs64", 256), ("wgs64n", 64), ("wgs128w", 128), ("wgs128w", 256))
    for cfg, m in (*cases, *wg, *wgs):
        layer = W4A16Linear(module, packed, m, kernel=cfg)
        x_d, x = to_dev(rng.standard_normal((m, k)).astype(np.float32), "bf16")
        out = cp.full((m, n), 0xFFFF, dtype=cp.uint16)  # bf16 NaN
        layer(x_d, out)
        ref = np.empty((m, n), np.float32)
        int4_linear(x, w, ref)
        where = f"{cfg} split {layer.plan(m).split} M={m} K={k} N={n}"
        compare(from_dev(out, "bf16"), ref, "bf16", where, weight_error(cfg, "bf16", x, w))


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("split", [1, 2, 3, 4, 7])
def test_mtc_splits(module: object, rng: np.random.Generator, split: int) -> None:
    """Every split up to the group count, uneven ones included (7 groups)."""
    check_case(module, rng, "bf16", 40, 7 * 128, 320, 128, kernel="mtc64", split=split)
    check_case(module, rng, "fp16", 13, 7 * 64, 272, 64, kernel="mtc16", split=split)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("act", list(ACTIVATIONS))
def test_mtc_epilogue(module: object, rng: np.random.Generator, act: str) -> None:
    check_case(
        module, rng, "bf16", 70, 512, 192, 128, act=act, use_bias=True, use_res=True, kernel="mtc64", split=2
    )
    check_case(module, rng, "fp16", 5, 512, 256, 128, act=act, use_bias=True, kernel="mtc8", split=4)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("sdt", ["bf16", "fp32"])
def test_mtc_scale_dtypes(module: object, rng: np.random.Generator, sdt: str) -> None:
    check_case(module, rng, "bf16", 50, 1024, 128, 128, sdt=sdt, kernel="mtc64")
    check_case(module, rng, "fp16", 3, 1024, 256, 128, sdt=sdt, kernel="mtc8")


@gpu
@pytest.mark.gpu
def test_mtc_split_is_deterministic_and_reusable(module: object, rng: np.random.Generator) -> None:
    """Split-K partials are added in a fixed order and the tile counters reset themselves: two
    calls give the same bits, and a following call with another M is still right."""
    import cupy as cp

    from anvil_kernels.cuda import W4A16Linear

    k, n = 2048, 512
    w = random_weight(rng, k, n, 128)
    x = cp.asarray(rng.standard_normal((64, k)).astype(np.float16))
    a = cp.empty((64, n), np.float16)
    b = cp.empty((64, n), np.float16)
    layer = W4A16Linear(module, prepack(w), 64, dtype="fp16", kernel="mtc16", split=8)
    layer(x, a)
    layer(x, b)
    assert bool(cp.all(a.view(np.uint16) == b.view(np.uint16)))
    c = cp.empty((9, n), np.float16)
    layer(x[:9], c)
    assert bool(cp.all(c.view(np.uint16) == a[:9].view(np.uint16)))


# ------------------------------------------------------------------------------ wgs: x retiled


@pytest.mark.parametrize(
    ("m", "bm", "k"),
    [(70, 64, 256), (5, 64, 128), (64, 64, 512), (130, 128, 192), (1, 16, 128), (40, 32, 192)],
)
def test_tile_x_slices_are_the_wg_stages(rng: np.random.Generator, m: int, bm: int, k: int) -> None:
    """The producer's one bulk copy of x per chunk (XT from (c * mpad + m0) * 64, BM * 64 values)
    lands what the wg kernel's cp.async pieces land (``stage_x_wg``), zeros past M included; and
    ``untile_x`` inverts ``tile_x``."""
    from anvil_kernels.cuda.mtc_model import stage_x_wg, tile_x, untile_x

    x = rng.standard_normal((m, k))
    mpad = -(-m // bm) * bm
    xt = tile_x(x, mpad)
    assert xt.size == mpad * k
    for m0 in range(0, mpad, bm):
        for c in range(k // 64):
            want = np.full(bm * 64, np.nan)
            stage_x_wg(want, x, c, bm, m0, m)
            start = (c * mpad + m0) * 64
            np.testing.assert_array_equal(xt[start : start + bm * 64], want)
    np.testing.assert_array_equal(untile_x(xt, m, k, mpad), x)


def test_tile_x_kernel_index_expressions(rng: np.random.Generator) -> None:
    """w4a16_tile_x's index arithmetic (as written in the .cu, one thread per 16-byte piece p)
    reproduces ``tile_x``; a change to the .cu's expressions fails the text check."""
    from anvil_kernels.cuda.mtc_model import tile_x

    src = (Path(__file__).parents[1] / "src/anvil_kernels/cuda/w4a16_wgs.cu").read_text()
    for expr in (
        "const long long blk = p >> 6;",
        "const int groups = mpad >> 3;",
        "const int r = static_cast<int>(blk % groups) * 8 + static_cast<int>(p & 7);",
        "const int piece = static_cast<int>(blk / groups) * 8 + static_cast<int>((p >> 3) & 7);",
        "XT[p] = r < M ? X[static_cast<long long>(r) * (K >> 3) + piece] : make_uint4(0, 0, 0, 0);",
    ):
        assert expr in src, expr
    m, mpad, k = 13, 64, 192
    x = rng.standard_normal((m, k))
    pieces = x.reshape(m, k // 8, 8)  # X as uint4 pieces of 8 values
    p = np.arange(mpad * (k >> 3))
    blk, groups = p >> 6, mpad >> 3
    r = (blk % groups) * 8 + (p & 7)
    piece = (blk // groups) * 8 + ((p >> 3) & 7)
    xt = np.where((r < m)[:, None], pieces[np.minimum(r, m - 1), piece], 0.0)
    np.testing.assert_array_equal(xt.reshape(-1), tile_x(x, mpad))
