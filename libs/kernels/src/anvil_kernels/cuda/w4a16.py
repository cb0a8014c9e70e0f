"""W4A16 GEMM/GEMV on NVIDIA GPUs (sm_90): bf16/fp16 activations, Anvil INT4 weights.

``out = act(x @ W + bias) + residual`` with x (M, K) bf16 or fp16, W an ``Int4Weight`` (K, N)
with group-wise scales and integer zero points, out (M, N) in x's dtype. Two kernels read the same
prepacked weights: the GEMV-like one (``w4a16.cu``, every warp streams its own weights, best at
small M) and the tiled tensor-core one (``w4a16_tc.cu`` / ``w4a16_tc.py``, x and weights staged
through a cp.async pipeline, split-K); ``w4a16_dispatch.choose`` picks per (M, K, N). Design and
layout notes at the top of each .cu file, measured numbers in docs/kernels_gpu.md.

Host side (no GPU needed):
    prepack(w) -> {"qweight", "sz", "meta"}   weights permuted into the order the kernels load them
    unprepack(packed) -> Int4Weight           the inverse (prepack is a bijection)
    w4a16_source(params) -> str               CUDA source with the requested instantiations
    build_fatbin(params, archs, out_dir)      nvcc -> a fatbin (sm_90a + sm_90 by default)
    plan_launch(m, n, k, g, ...)              launch geometry of the GEMV-like kernel
    plan_gv(m, n, k, g, cfg, ...)             the same for its shared-memory ring configs (w4a16_gv)

The CuPy launcher (``W4A16Linear``) and the compiler seam (``OPS``) are in ``w4a16_linear.py``.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from anvil_kernels.cuda.w4a16_gv import GV_CONFIGS, gv_instantiations
from anvil_kernels.cuda.w4a16_mtc import MTC_CONFIGS, TILE_X_INSTANTIATION, mtc_instantiation
from anvil_kernels.cuda.w4a16_tc import TC_CONFIGS, tc_instantiation
from anvil_kernels.format import Int4Weight, f32_to_bf16_bits, pack_nibbles, unpack_nibbles

ActDType = Literal["bf16", "fp16"]
_DT_CODE: dict[str, int] = {"bf16": 0, "fp16": 1}
SUPPORTED_GROUPS: tuple[int, ...] = (64, 128, 256)
FLAG_SCALE_BF16 = 1
FLAG_EVICT_FIRST = 2
FLAG_LATE_TRIGGER = 4  # wgs/wgd: launch_dependents after the producer's wait (w4a16.cu)
SCALE_FP16, SCALE_BF16 = 0, 1
_SRC_PATH = Path(__file__).with_name("w4a16.cu")
_TC_SRC_PATH = Path(__file__).with_name("w4a16_tc.cu")
_MTC_SRC_PATH = Path(__file__).with_name("w4a16_mtc.cu")
_WG_SRC_PATH = Path(__file__).with_name("w4a16_wg.cu")
_GV_SRC_PATH = Path(__file__).with_name("w4a16_gv.cu")
_WGS_SRC_PATH = Path(__file__).with_name("w4a16_wgs.cu")
_WGD_SRC_PATH = Path(__file__).with_name("w4a16_wgd.cu")


@dataclass(frozen=True)
class Variant:
    """One compiled kernel: activation dtype, 8-row M tiles per block (mt), 16-column strips
    per warp (ns), 64-k chunks per group (cpg = g / 64) and groups in flight per warp (gd)."""

    dtype: ActDType
    mt: int
    ns: int
    cpg: int
    gd: int

    @property
    def name(self) -> str:
        return f"w4a16_{self.dtype}_m{self.mt}_n{self.ns}_c{self.cpg}_d{self.gd}"


def default_gd(mt: int, ns: int, cpg: int) -> int:
    """Groups in flight: 4 chunks (2 KiB per warp) for one strip of up to 16 rows (the H200 probe,
    bench/results/w4a16_probe.md: 15.2 us at 8192^2 M = 1 against 18.7 with 8, whose 120 registers
    left fewer warps per SM), about 8 for wider strips of few rows, fewer for wide tiles."""
    if ns == 1 and mt <= 2:
        chunks = 4
    else:
        chunks = 8 // ns if mt <= 2 else 4 // ns
    return max(1, chunks // cpg)


TILES: tuple[tuple[int, int], ...] = ((1, 1), (2, 1), (2, 2), (4, 1))  # (mt, ns)


@dataclass(frozen=True)
class W4A16Params:
    """Which variants to compile."""

    dtypes: tuple[ActDType, ...] = ("bf16", "fp16")
    tiles: tuple[tuple[int, int], ...] = TILES
    groups: tuple[int, ...] = SUPPORTED_GROUPS
    variants: tuple[Variant, ...] = field(default=())
    tc_configs: tuple[str, ...] = tuple(TC_CONFIGS)  # tensor-core tiles, for every dtype x group
    # Marlin-like tiles (w4a16_mtc.cu), for every dtype x group; opt-in (tuple(MTC_CONFIGS): all),
    # so that a build that names only the kernels it needs (the compiler's) does not grow
    mtc_configs: tuple[str, ...] = ()
    # GEMV-like kernels with a shared-memory ring (w4a16_gv.cu), for every dtype x group; opt-in
    # like the mtc tiles (tuple(GV_CONFIGS): all)
    gv_configs: tuple[str, ...] = ()

    def all_variants(self) -> list[Variant]:
        if self.variants:
            return list(self.variants)
        out = []
        for dt in self.dtypes:
            for mt, ns in self.tiles:
                for g in self.groups:
                    cpg = g // 64
                    out.append(Variant(dt, mt, ns, cpg, default_gd(mt, ns, cpg)))
        return out


def w4a16_source(params: W4A16Params | None = None) -> str:
    """The CUDA source: w4a16.cu, w4a16_tc.cu, w4a16_mtc.cu, w4a16_wg.cu, w4a16_gv.cu, w4a16_wgs.cu
    and w4a16_wgd.cu plus one extern "C" kernel per variant (and ``w4a16_tile_x`` with any wgs or
    wgd config)."""
    return "\n".join([*_sources(), *_instantiations(params)]) + "\n"


def _sources() -> list[str]:
    paths = [_SRC_PATH, _TC_SRC_PATH, _MTC_SRC_PATH, _WG_SRC_PATH, _GV_SRC_PATH, _WGS_SRC_PATH, _WGD_SRC_PATH]
    return [p.read_text() for p in paths]


def _instantiations(params: W4A16Params | None) -> list[str]:
    return [line for line, _ in _costed_instantiations(params)]


def _costed_instantiations(params: W4A16Params | None) -> list[tuple[str, float]]:
    """(instantiation, compile seconds with nvcc 13.0 on the shared CI machine, one core)."""
    params = params or W4A16Params()
    out = []
    for v in params.all_variants():
        line = f"ANVIL_W4A16_KERNEL({v.name}, {_DT_CODE[v.dtype]}, {v.mt}, {v.ns}, {v.cpg}, {v.gd})"
        out.append((line, 0.6))
    for dt in params.dtypes:
        for g in params.groups:
            for cfg in params.tc_configs:
                out.append((tc_instantiation(_DT_CODE[dt], dt, cfg, g // 64), _TC_COMPILE_S.get(cfg, 10.0)))
            for cfg in params.mtc_configs:
                line = mtc_instantiation(_DT_CODE[dt], dt, cfg, g // 64)
                out.append((line, _MTC_COMPILE_S.get(cfg, 10.0)))
            for cfg in params.gv_configs:
                out += [(line, 1.5) for line in gv_instantiations(_DT_CODE[dt], dt, cfg, g // 64)]
    if any(MTC_CONFIGS[c].ws for c in params.mtc_configs):
        out.append((TILE_X_INSTANTIATION, 0.5))  # the x retiling the wgs kernels read
    return out


_TC_COMPILE_S = {"tc16": 2.3, "tc32": 4.1, "tc64": 2.4, "tc128": 10.1, "tc64s": 17.1, "tc128s": 12.4}
_TC_COMPILE_S["tc128ws"] = 15.4
_MTC_COMPILE_S = {"mtc8": 3.0, "mtc16": 4.0, "mtc8x": 4.0, "mtc16x": 6.0, "mtc32": 6.0, "mtc64": 6.0}
_MTC_COMPILE_S |= {"mtc64w": 10.0, "mtc128": 10.0}
_MTC_COMPILE_S["mtc128w"] = 16.0


DEFAULT_ARCHS: tuple[str, ...] = ("compute_90a,code=sm_90a", "compute_90,code=sm_90")


def build_fatbin(
    params: W4A16Params | None = None,
    archs: Sequence[str] = DEFAULT_ARCHS,
    out_dir: str | Path | None = None,
    *,
    nvcc: str | None = None,
    extra_flags: Sequence[str] = (),
) -> Path:
    """Compile ``w4a16_source(params)`` with nvcc into ``out_dir/w4a16.fatbin`` and return its path.

    ``archs`` are ``-gencode arch=...`` values. Raises RuntimeError with nvcc's output on failure.
    """
    return build_fatbins(params, archs, out_dir, jobs=1, nvcc=nvcc, extra_flags=extra_flags)[0]


def build_fatbins(
    params: W4A16Params | None = None,
    archs: Sequence[str] = DEFAULT_ARCHS,
    out_dir: str | Path | None = None,
    *,
    jobs: int = 0,
    nvcc: str | None = None,
    extra_flags: Sequence[str] = (),
) -> list[Path]:
    """Like ``build_fatbin`` but split over ``jobs`` translation units compiled in parallel (0: one
    per CPU; nvcc compiles one unit on one core, and the tensor-core tiles take seconds each):
    ``out_dir/w4a16.{i}.fatbin`` (``w4a16.fatbin`` when jobs == 1). ``load_module`` takes the list."""
    exe = nvcc or shutil.which("nvcc")
    if exe is None:
        raise RuntimeError("nvcc not found on PATH")
    out = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix="anvil_w4a16_"))
    out.mkdir(parents=True, exist_ok=True)
    inst = _costed_instantiations(params)
    jobs = max(1, min(jobs or (os.cpu_count() or 1), len(inst)))
    # longest first onto the least loaded unit, so the units take about the same time
    units: list[list[str]] = [[] for _ in range(jobs)]
    load = [0.0] * jobs
    for line, cost in sorted(inst, key=lambda t: -t[1]):
        u = load.index(min(load))
        units[u].append(line)
        load[u] += cost
    head = _sources()
    procs = []
    for i in range(jobs):
        stem = "w4a16" if jobs == 1 else f"w4a16.{i}"
        src = out / f"{stem}_gen.cu"
        src.write_text("\n".join([*head, *units[i]]) + "\n")
        cmd = [exe, "--fatbin", "-O3", "-std=c++17", "-lineinfo", *extra_flags]
        for a in archs:
            cmd += ["-gencode", f"arch={a}"]
        cmd += ["-o", str(out / f"{stem}.fatbin"), str(src)]
        procs.append((cmd, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    for cmd, proc in procs:
        so, se = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"nvcc failed ({proc.returncode}): {' '.join(cmd)}\n{so}\n{se}")
    return [Path(c[c.index("-o") + 1]) for c, _ in procs]


# ---------------------------------------------------------------------------------------------
# prepack


def _check_prepackable(w: Int4Weight) -> None:
    if not isinstance(w, Int4Weight):
        raise ValueError(f"w must be an Int4Weight, got {type(w).__name__}")
    if w.group_size not in SUPPORTED_GROUPS:
        raise ValueError(
            f"group_size must be one of {SUPPORTED_GROUPS} for the CUDA kernel, got {w.group_size}"
        )
    if w.n % 16 != 0:
        raise ValueError(f"N={w.n} must be a multiple of 16 for the CUDA kernel")


def prepack(w: Int4Weight) -> dict[str, np.ndarray]:
    """Int4Weight -> the arrays the kernel reads (layout in w4a16.cu's header comment).

    qweight uint32 (N/16, K/64, 32, 4); sz uint32 (N/16, K/g, 8, 2) = scale bits | zero << 16;
    meta int64 [K, N, g, scale kind (0 fp16, 1 bf16)]. fp32 scales are rounded to bf16 (nearest
    even). Zero points must be integers in [0, 64] (Anvil's quantizer and the AWQ/GPTQ
    importers give 0..16).
    """
    _check_prepackable(w)
    k, n, g = w.k, w.n, w.group_size
    q = unpack_nibbles(w.packed)  # (K, N)
    # k = 64 kc + 16 t + 8 jj + 4 odd + 2 h + e ; n = 16 strip + 8 rowhi + r
    q9 = q.reshape(k // 64, 4, 2, 2, 2, 2, n // 16, 2, 8)
    # -> (strip, kc, r, t, jj, h, e, rowhi, odd):
    #    lane = 4 r + t, word = 2 jj + h, nibble = 4 e + 2 rowhi + odd
    qt = np.ascontiguousarray(q9.transpose(6, 0, 8, 1, 2, 4, 5, 7, 3)).reshape(n // 16, k // 64, 32, 4, 8)
    words = np.zeros(qt.shape[:-1], np.uint32)
    for p in range(8):
        words |= qt[..., p].astype(np.uint32) << np.uint32(4 * p)

    word_sz, kind = sz_words(w)  # (G, N)
    sz = np.ascontiguousarray(word_sz.reshape(k // g, n // 16, 2, 8).transpose(1, 0, 3, 2))
    meta = np.array([k, n, g, kind], np.int64)
    return {"qweight": words, "sz": sz, "meta": meta}


def unprepack(packed: Mapping[str, np.ndarray]) -> Int4Weight:
    """Inverse of ``prepack`` (fp32 scales come back as bf16)."""
    k, n, g, kind = (int(v) for v in packed["meta"])
    words = packed["qweight"]
    nib = np.empty((*words.shape, 8), np.uint8)
    for p in range(8):
        nib[..., p] = (words >> np.uint32(4 * p)) & np.uint32(15)
    # (strip, kc, r, t, jj, h, e, rowhi, odd) -> (kc, t, jj, odd, h, e, strip, rowhi, r)
    nib9 = nib.reshape(n // 16, k // 64, 8, 4, 2, 2, 2, 2, 2)
    q = np.ascontiguousarray(nib9.transpose(1, 3, 4, 8, 5, 6, 0, 7, 2)).reshape(k, n)
    word_sz = packed["sz"].transpose(1, 0, 3, 2).reshape(k // g, n)
    return int4_from_words(q, word_sz, g, kind)


def sz_words(w: Int4Weight) -> tuple[np.ndarray, int]:
    """(G, N) uint32 words scale bits | zero << 16 (both kernels' scale/zero format) and the scale
    kind (SCALE_FP16 or SCALE_BF16; fp32 scales are rounded to bf16, nearest even)."""
    if w.scale_dtype == "fp16":
        sbits, kind = w.scales.view(np.uint16), SCALE_FP16
    elif w.scale_dtype == "bf16":
        sbits, kind = w.scales, SCALE_BF16
    else:
        sbits, kind = f32_to_bf16_bits(w.scales_f32), SCALE_BF16
    z = w.zeros_f32
    if not np.all((z == np.round(z)) & (z >= 0) & (z <= 64)):
        raise ValueError("zeros must be integers in [0, 64] for the CUDA kernel")
    return sbits.astype(np.uint32) | (z.astype(np.uint32) << np.uint32(16)), kind


def int4_from_words(q: np.ndarray, word_sz: np.ndarray, g: int, kind: int) -> Int4Weight:
    """The Int4Weight of nibbles q (K, N) and ``sz_words`` (G, N) of scale kind ``kind``."""
    k, n = q.shape
    sbits = np.ascontiguousarray((word_sz & np.uint32(0xFFFF)).astype(np.uint16))
    zf = (word_sz >> np.uint32(16)).astype(np.float32)
    if kind == SCALE_FP16:
        return Int4Weight(pack_nibbles(q), sbits.view(np.float16), zf.astype(np.float16), g, k, n, "fp16")
    zb = f32_to_bf16_bits(zf)
    return Int4Weight(pack_nibbles(q), sbits, zb, g, k, n, "bf16")


# ---------------------------------------------------------------------------------------------
# launch planning


@dataclass(frozen=True)
class LaunchPlan:
    mt: int
    ns: int
    sn: int  # warps across N per block
    sk: int  # warps across K per block (split-K inside the block)
    grid: tuple[int, int]
    block: int
    smem: int
    evict_first: bool
    kernel: str = "gemv"  # "gemv" (w4a16.cu's register ring) or a GV_CONFIGS name (w4a16_gv.cu)


def tile_for(m: int, n: int) -> tuple[int, int]:
    """(mt, ns) for an M: one 8-row tile up to 8 rows, two up to 16, else 32-row tiles."""
    if m <= 8:
        return 1, 1
    if m <= 16:
        return 2, 1
    return 4, 1


def plan_launch(
    m: int,
    n: int,
    k: int,
    g: int,
    *,
    sm_count: int = 132,
    mt: int | None = None,
    ns: int | None = None,
    sn: int | None = None,
    sk: int | None = None,
    warps_per_sm: int = 16,
) -> LaunchPlan:
    """Launch geometry: about ``warps_per_sm`` streaming warps per SM, split K inside a block
    until there are that many; overrides (mt, ns, sn, sk) are for tuning."""
    tmt, tns = tile_for(m, n)
    mt = mt or tmt
    ns = ns or tns
    if n % (16 * ns) != 0:
        raise ValueError(f"N={n} must be a multiple of {16 * ns} for ns={ns}")
    groups = k // g
    mblocks = -(-m // (8 * mt))
    warp_cols = n // (16 * ns)
    # 0.85: on the H200 sweep (bench/results/kernels_gpu.json) one full wave of 16 warps/SM
    # (e.g. 2048 warps for 8192 x 8192, M = 1) beat doubling split-K to overshoot it.
    target = 0.85 * sm_count * warps_per_sm
    if sn is None:
        # one strip's warps per block up to 16 rows: two measured within 2% on the large shapes
        # (8192^2 M = 1: 15.2 vs 15.5 us) and halved the blocks of the small ones (1536 x 384 M = 16:
        # 12 blocks, 4.8 us against 3.5)
        sn = 1 if mt <= 2 else 4
        while sn > 1 and warp_cols % sn != 0:
            sn //= 2
    if sk is None:
        sk = 1
        while sk < 16 and sk * 2 <= groups and mblocks * warp_cols * sk < target and sn * sk * 2 <= 16:
            sk *= 2
    if sn * sk > 16:
        raise ValueError(f"sn*sk={sn * sk} warps exceeds 16 per block")
    if sk > groups:
        raise ValueError(f"sk={sk} exceeds the {groups} groups along K")
    grid = (mblocks, -(-warp_cols // sn))
    smem = sk * sn * ns * mt * 512
    return LaunchPlan(mt, ns, sn, sk, grid, 32 * sn * sk, smem, evict_first=mblocks == 1)


def bf16_bits(a: NDArray[np.floating]) -> NDArray[np.uint16]:
    """float -> bf16 bit patterns (round to nearest even), for building kernel inputs."""
    return f32_to_bf16_bits(np.asarray(a, dtype=np.float32))


def plan_gv(
    m: int,
    n: int,
    k: int,
    g: int,
    cfg_name: str,
    *,
    sm_count: int = 132,
    mt: int | None = None,
    sn: int | None = None,
    sk: int | None = None,
) -> LaunchPlan:
    """``plan_launch``'s geometry for gv config ``cfg_name`` (one strip per warp, the config's
    warps per SM, M tiles of at most 8 * mt_max rows) with its shared memory (ring + reduction).
    Unless sk is given, the split is halved while the launch has more warps than the SMs hold at
    once (``GvConfig.resident_warps``): plan_launch's doubling can overshoot its target to ~1.7
    waves (4096 x 14336 at 32 warps per SM: 7,168 warps for 4,224 places), where the H200 sweeps of
    the register-ring kernel found one full wave faster than overshooting it (plan_launch's 0.85)."""
    if cfg_name not in GV_CONFIGS:
        raise ValueError(f"unknown gv config {cfg_name!r}; known: {sorted(GV_CONFIGS)}")
    c = GV_CONFIGS[cfg_name]
    mt = min(mt or tile_for(m, n)[0], c.mt_max)
    cpg = g // 64
    p = plan_launch(m, n, k, g, sm_count=sm_count, mt=mt, ns=1, sn=sn, sk=sk, warps_per_sm=c.warps_per_sm)
    while sk is None and p.sk > 1:
        warps = p.grid[0] * p.grid[1] * p.sn * p.sk
        if warps <= sm_count * c.resident_warps(cpg, p.sn * p.sk, p.mt):
            break
        p = plan_launch(m, n, k, g, sm_count=sm_count, mt=mt, ns=1, sn=p.sn, sk=p.sk // 2)
    return dataclasses.replace(p, smem=c.smem(cpg, p.sn * p.sk, p.mt), kernel=cfg_name)
