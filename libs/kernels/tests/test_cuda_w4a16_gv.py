"""The GEMV-like kernel's shared-memory ring configs (w4a16_gv.cu, ``GV_CONFIGS``): planning, the
numpy model of the ring (``gv_model``) driven through ``W4A16Linear``'s launch, the model's index
expressions against the .cu, ptxas's report (CPU; skipped without nvcc) and every config against
the CPU twin (GPU, skipped without one; tolerances in anvil_kernels.cuda.gpu_check)."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from anvil_kernels import int4_linear
from anvil_kernels.activations import ACTIVATIONS
from anvil_kernels.cuda import GV_CONFIGS, W4A16Params, plan_gv, prepack
from anvil_kernels.cuda.gpu_check import check_case, compare, has_gpu, random_weight
from anvil_kernels.cuda.gv_model import simulate
from anvil_kernels.cuda.tc_model import round_a
from anvil_kernels.cuda.w4a16 import w4a16_source
from anvil_kernels.cuda.w4a16_dispatch import KernelChoice
from anvil_kernels.format import bf16_bits_to_f32, f32_to_bf16_bits

GV_SRC = Path(__file__).parents[1] / "src/anvil_kernels/cuda/w4a16_gv.cu"
SMEM_MAX = 227 * 1024  # the H200's dynamic shared memory per block (opt-in)

# ------------------------------------------------------------------------------------ CPU only


def test_plan_gv_geometry() -> None:
    p = plan_gv(1, 8192, 8192, 128, "gvc8")
    # 16 warps/SM: as plan_launch (512 strips x sk 4 = 2048 warps), 8-row tiles
    assert (p.mt, p.ns, p.sn, p.sk, p.grid, p.block, p.kernel) == (1, 1, 1, 4, (1, 512), 128, "gvc8")
    assert p.smem == GV_CONFIGS["gvc8"].smem(2, 4, 1) == 4 * 4 * (2 * 512 + 64) + 4 * 512
    assert p.evict_first
    p = plan_gv(1, 8192, 8192, 128, "gvc8w")  # 32 warps/SM: twice the split
    assert (p.sk, p.block) == (8, 256)
    p = plan_gv(16, 8192, 8192, 128, "gvb16")
    assert (p.mt, p.grid) == (2, (1, 512))
    p = plan_gv(16, 8192, 8192, 128, "gvb8w")  # 8-row tiles only: two M blocks
    assert (p.mt, p.grid) == (1, (2, 512)) and not p.evict_first
    bars = -(-(p.sn * p.sk * 2 * 8) // 128) * 128
    assert p.smem == bars + p.sn * p.sk * 2 * (4 * 512 + 2 * 64) + p.sn * p.sk * 512
    with pytest.raises(ValueError, match="unknown gv config"):
        plan_gv(1, 256, 256, 128, "gv3")


def test_plan_gv_keeps_one_wave() -> None:
    """plan_launch's doubling overshoots at 4096 x 14336 with 32 warps per SM (sk 8: 7,168 warps
    for 132 x 32 places); plan_gv halves the split back to one wave, unless sk is given."""
    from anvil_kernels.cuda import plan_launch

    c = GV_CONFIGS["gvc8w"]
    assert plan_launch(1, 14336, 4096, 128, mt=1, warps_per_sm=32).sk == 8
    p = plan_gv(1, 14336, 4096, 128, "gvc8w")
    assert p.sk == 4 and p.grid[1] * p.sk <= 132 * c.resident_warps(2, p.sk, 1) == 132 * 32
    assert plan_gv(1, 14336, 4096, 128, "gvc8w", sk=8).sk == 8
    for cfg in GV_CONFIGS:  # every plan of the bench's shapes fits one wave
        for k, n in ((8192, 8192), (4096, 14336), (14336, 4096)):
            for m in (1, 4, 16, 32):
                p = plan_gv(m, n, k, 128, cfg)
                warps = p.grid[0] * p.grid[1] * p.sn * p.sk
                assert p.sk == 1 or warps <= 132 * GV_CONFIGS[cfg].resident_warps(2, p.sn * p.sk, p.mt)


@pytest.mark.parametrize("cfg", list(GV_CONFIGS))
def test_gv_shared_memory_fits_every_plan(cfg: str) -> None:
    """The largest block a plan can ask for (16 warps, the tallest tile, every group size) fits the
    H200's shared memory; so do the bench's shapes at every M."""
    c = GV_CONFIGS[cfg]
    for cpg in (1, 2, 4):
        assert c.stage_chunks(cpg) % cpg == 0 and c.stage_chunks(cpg) // cpg <= 8  # lanes of the sz copy
        assert c.smem(cpg, 16, c.mt_max) <= SMEM_MAX
    for k, n in ((8192, 8192), (4096, 14336), (14336, 4096), (384, 1152), (1536, 384)):
        for m in (1, 4, 16, 32, 100):
            p = plan_gv(m, n, k, 128, cfg)
            assert p.smem <= SMEM_MAX and p.block <= 512 and p.mt <= c.mt_max


def test_gv_kernels_are_gemv_like_in_the_dispatch() -> None:
    assert KernelChoice("gvb16").split is None
    with pytest.raises(ValueError, match="split"):
        KernelChoice("gvc8", split=2)


class _GvModelKernel:
    """Stands in for one compiled gv kernel: checks the launch against ``plan_gv``'s rules and
    runs ``gv_model.simulate`` on the arguments in the kernel's order, then the epilogue."""

    def __init__(self, name: str, registry: dict[int, np.ndarray]) -> None:
        self.name = name
        self.registry = registry
        self.max_dynamic_shared_size_bytes = 0

    def __call__(
        self, grid: tuple[int, ...], block: tuple[int, ...], args: tuple, shared_mem: int = 0
    ) -> None:
        from anvil_kernels.activations import activate

        hit = re.match(r"w4a16(gv\w+?)_(bf16|fp16)_m(\d)_c(\d)$", self.name)
        assert hit is not None, self.name
        cfg, dt, mt, cpg = hit.group(1), hit.group(2), int(hit.group(3)), int(hit.group(4))
        qw, sz, x, y, bias, res, m, n, k, sn, sk, act, flags = args
        assert shared_mem <= 48 * 1024 or self.max_dynamic_shared_size_bytes >= shared_mem
        assert tuple(grid) == (-(-int(m) // (8 * mt)), -(-(int(n) // 16) // int(sn)))

        def f64(a: np.ndarray) -> np.ndarray:
            return bf16_bits_to_f32(a).astype(np.float64) if dt == "bf16" else a.astype(np.float64)

        meta = np.array([int(k), int(n), 64 * cpg, int(flags) & 1], np.int64)
        packed = {"qweight": qw, "sz": sz, "meta": meta}
        out, writes = simulate(packed, f64(x), cfg, mt, grid, block[0], shared_mem, int(sn), int(sk))
        assert writes.all(), "outputs no block wrote"
        v = out + (f64(self.registry[int(bias)]) if int(bias) else 0.0)
        v = np.vectorize(lambda t: activate(t, int(act)))(v)
        if int(res):
            v = v + f64(self.registry[int(res)])
        y[...] = f32_to_bf16_bits(v.astype(np.float32)) if dt == "bf16" else v.astype(np.float16)


@pytest.mark.parametrize("cfg", list(GV_CONFIGS))
@pytest.mark.parametrize(
    ("dt", "m", "k", "n", "g", "ov"),
    [
        ("bf16", 1, 512, 48, 128, {}),
        ("fp16", 11, 7 * 64, 32, 64, {"sk": 4}),  # 7 groups over 4 warps: slices of 1, 2, 2, 2
        ("bf16", 16, 9 * 256, 32, 256, {"sk": 2, "sn": 2}),  # 9 groups: slices of 4 and 5
        ("bf16", 3, 40 * 128, 16, 128, {"sk": 1}),  # 80 chunks: the ring wraps many times
    ],
)
def test_launcher_drives_the_gv_model(
    fake_cupy: Callable[[np.ndarray], Any],
    rng: np.random.Generator,
    cfg: str,
    dt: str,
    m: int,
    k: int,
    n: int,
    g: int,
    ov: dict[str, int],
) -> None:
    """W4A16Linear's gv launch (kernel name, argument order, grid, shared memory and its opt-in,
    split-K slices, partial last stages) with the ring model as the kernel, against the CPU twin
    with the GPU tests' tolerances."""
    from anvil_kernels.cuda import W4A16Linear

    dev = fake_cupy
    registry = type(dev(np.zeros(1))).registry  # type: ignore[attr-defined]
    module = type("M", (), {"get_function": staticmethod(lambda name: _GvModelKernel(name, registry))})
    w = random_weight(rng, k, n, g, "bf16")
    dtype: Any = dt
    act = "silu"
    layer = W4A16Linear(
        module, prepack(w), m, dtype=dtype, activation=act, sm_count=132, kernel=cfg, overrides=ov
    )
    assert layer.plan(m).kernel == cfg
    xs = rng.standard_normal((m, k)).astype(np.float32)
    bs, rs = rng.standard_normal(n).astype(np.float32), rng.standard_normal((m, n)).astype(np.float32)
    x, bias, res = (round_a(a.astype(np.float64), dt).astype(np.float32) for a in (xs, bs, rs))
    bits = f32_to_bf16_bits if dt == "bf16" else (lambda a: a.astype(np.float16))
    out = dev(np.full((m, n), 0xFFFF, np.uint16) if dt == "bf16" else np.full((m, n), np.nan, np.float16))
    layer(dev(bits(x)), out, dev(bits(bias)), dev(bits(res)))
    ref = np.empty((m, n), np.float32)
    int4_linear(x, w, ref, bias, act, res)
    got = bf16_bits_to_f32(np.asarray(out)) if dt == "bf16" else np.asarray(out).astype(np.float32)
    compare(got, ref, dt, f"{cfg} M={m} K={k} N={n} g={g}")


def test_gv_model_is_not_vacuous(rng: np.random.Generator) -> None:
    """The model reconstructs x @ W from what the lanes read, and fails on a wrong shared-memory
    size or a chunk out of place in the prepacked weights."""
    from anvil_kernels import dequantize

    k, n, g = 1024, 32, 128
    w = random_weight(rng, k, n, g, "bf16")
    p = prepack(w)
    x = rng.standard_normal((3, k))
    ref = x @ dequantize(w).astype(np.float64)
    for cfg in GV_CONFIGS:
        plan = plan_gv(3, n, k, g, cfg, sk=3)  # 8 groups over 3 warps: slices of 2, 3, 3
        out, writes = simulate(p, x, cfg, plan.mt, plan.grid, plan.block, plan.smem, plan.sn, plan.sk)
        assert writes.all() and np.allclose(out, ref, rtol=1e-9, atol=1e-9), cfg
        with pytest.raises(AssertionError, match="shared memory"):
            simulate(p, x, cfg, plan.mt, plan.grid, plan.block, plan.smem + 16, plan.sn, plan.sk)
    bad = dict(p)
    bad["qweight"] = p["qweight"][:, [1, 0, *range(2, k // 64)]]  # chunks 0 and 1 swapped
    plan = plan_gv(3, n, k, g, "gvb16")
    out, _ = simulate(bad, x, "gvb16", plan.mt, plan.grid, plan.block, plan.smem, plan.sn, plan.sk)
    assert not np.allclose(out, ref, rtol=1e-3)


def test_gv_model_index_expressions_are_the_kernels() -> None:
    """The offsets the model uses, as the .cu writes them (a change to one must change the other)."""
    src = GV_SRC.read_text()
    for expr in (
        "constexpr int STAGE_BYTES = SC * 512 + GPS * 64;",
        "LOAD == LOAD_BULK ? ((nwarps * NST * 8 + 127) & ~127) : 0;",
        "gv_smem + bar_bytes + warp * (NST * STAGE_BYTES);",
        "gv_smem + bar_bytes + nwarps * (NST * STAGE_BYTES));",
        "smem_u32(gv_smem) + warp * (NST * 8);",
        "st + SC * 512 + gi * 64 + g8 * 8",
        "st + (gi * CPG + cc) * 512 + lane * 16",
        "gv_cp16(dst + c * 512 + lane * 16, wq + c * 32 + lane);",
        "if (lane < 4 * ngr) gv_cp16(dst + sc * 512 + lane * 16, sq + lane);",
        "bulk_g2s(dst, wq, static_cast<uint32_t>(nc * 512), bar);",
        "bulk_g2s(dst + sc * 512, sq, static_cast<uint32_t>(ngr * 64), bar);",
        "mbar_wait(bar_s + si * 8, static_cast<uint32_t>((s / NST) & 1));",
        "cp_async_wait<NST - 1>();",
        "const int sn = s + NST;",
        "(static_cast<size_t>(strip) * KC + static_cast<size_t>(gb) * CPG) * 32",
        "(static_cast<size_t>(strip) * G + gb) * 4",
    ):
        assert expr in src, expr


def _ptxas(tmp_path: Path, params: W4A16Params, arch: str = "sm_90a") -> str:
    src = tmp_path / "gv.cu"
    src.write_text(w4a16_source(params))
    cmd = ["nvcc", "--cubin", "-O3", "-std=c++17", f"-arch={arch}", "-Xptxas", "-v"]
    cmd += ["-o", str(tmp_path / "gv.cubin"), str(src)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stderr


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
@pytest.mark.timeout(900)
def test_gv_ptxas_report_and_sass(
    tmp_path: Path, ptxas_registers: Callable[[str], dict[str, int]], cuobjdump: str | None
) -> None:
    """Every gv kernel (both dtypes, every group size, every tile) compiles for sm_90a with no
    spills and no stack; at bf16 g128 within the registers its GvConfig states; the SASS has the
    loader's copies (LDGSTS for cp.async, UBLKCP for the bulk copies) and no local memory."""
    params = W4A16Params(tiles=(), tc_configs=(), mtc_configs=(), gv_configs=tuple(GV_CONFIGS))
    stderr = _ptxas(tmp_path, params)
    seen = set()
    for name, regs in ptxas_registers(stderr).items():
        hit = re.match(r"w4a16(gv\w+?)_(bf16|fp16)_m(\d)_c(\d)$", name)
        assert hit is not None, name
        seen.add(name)
        c = GV_CONFIGS[hit.group(1)]
        assert regs <= (64 if c.minb == 2 else 128), f"{name}: {regs} registers"
        if hit.group(2) == "bf16" and hit.group(4) == "2":
            want = c.regs[int(hit.group(3)) - 1]
            assert regs <= want, f"{name}: {regs} registers, GvConfig says {want}"
    assert len(seen) == 2 * 3 * sum(c.mt_max for c in GV_CONFIGS.values()), stderr
    if cuobjdump is None:
        return
    cmd = [cuobjdump, "-sass", str(tmp_path / "gv.cubin")]
    sass = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    assert "LDL" not in sass and "STL" not in sass, "local memory"
    for op in ("HMMA.16816.F32.BF16", "LDGSTS.E.BYPASS.128", "UBLKCP", "SYNCS"):
        assert op in sass, f"no {op}"


# ------------------------------------------------------------------------------------ GPU

gpu = pytest.mark.skipif(not has_gpu(), reason="no CUDA device (or no cupy)")


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("cfg", list(GV_CONFIGS))
@pytest.mark.parametrize("dt", ["bf16", "fp16"])
@pytest.mark.parametrize("m", [1, 5, 16, 37])
@pytest.mark.parametrize(("k", "n", "g"), [(1024, 256, 128), (768, 160, 64), (2048, 96, 256)])
def test_gv_matches_twin(
    module: object, rng: np.random.Generator, cfg: str, dt: str, m: int, k: int, n: int, g: int
) -> None:
    check_case(module, rng, dt, m, k, n, g, kernel=cfg)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("cfg", list(GV_CONFIGS))
@pytest.mark.parametrize(
    "ov", [{"sk": 1}, {"sk": 16}, {"sn": 4, "sk": 4}, {"sn": 2, "sk": 8}, {"mt": 1, "sk": 3}]
)
def test_gv_launch_geometries(module: object, rng: np.random.Generator, cfg: str, ov: dict[str, int]) -> None:
    # 40 groups: slices of 2-40 groups, partial last stages, rings that wrap many times
    check_case(module, rng, "bf16", 13, 40 * 128, 320, 128, kernel=cfg, overrides=ov)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("cfg", list(GV_CONFIGS))
def test_gv_uneven_k_split(module: object, rng: np.random.Generator, cfg: str) -> None:
    check_case(module, rng, "bf16", 2, 7 * 128, 64, 128, kernel=cfg, overrides={"sk": 4})
    check_case(module, rng, "fp16", 9, 7 * 64, 64, 64, kernel=cfg, overrides={"sk": 4})


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("cfg", list(GV_CONFIGS))
@pytest.mark.parametrize("act", list(ACTIVATIONS))
def test_gv_epilogue(module: object, rng: np.random.Generator, cfg: str, act: str) -> None:
    check_case(module, rng, "bf16", 3, 512, 128, 128, act=act, use_bias=True, use_res=True, kernel=cfg)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("cfg", list(GV_CONFIGS))
@pytest.mark.parametrize("sdt", ["bf16", "fp32"])
def test_gv_scale_dtypes(module: object, rng: np.random.Generator, cfg: str, sdt: str) -> None:
    check_case(module, rng, "bf16", 5, 1024, 64, 128, sdt=sdt, kernel=cfg)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("cfg", list(GV_CONFIGS))
@pytest.mark.parametrize("m", [1, 16])
def test_gv_large_shape(module: object, rng: np.random.Generator, cfg: str, m: int) -> None:
    """The planned geometry of a large layer (more than 48 KiB of shared memory per block at sk = 16,
    the opt-in) and a second layer of the same kernel planned with less: the opt-in only grows."""
    check_case(module, rng, "bf16", m, 8192, 1024, 128, kernel=cfg)
    check_case(module, rng, "bf16", m, 8192, 1024, 128, kernel=cfg, overrides={"sk": 16})
    check_case(module, rng, "bf16", m, 8192, 1024, 128, kernel=cfg, overrides={"sk": 2})
