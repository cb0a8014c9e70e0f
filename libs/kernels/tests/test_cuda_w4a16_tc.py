"""The tensor-core W4A16 kernel (w4a16_tc.cu): its numpy model, planning and dispatch, ptxas's report
(CPU; the ptxas test skips without nvcc), and the kernel against the CPU twin (GPU, skipped without
one; tolerances in anvil_kernels.cuda.gpu_check)."""

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
from anvil_kernels.cuda import TC_CONFIGS, DispatchTable, KernelChoice, W4A16Params, choose, plan_tc
from anvil_kernels.cuda.gpu_check import (
    check_case,
    compare,
    from_dev,
    has_gpu,
    random_weight,
    to_dev,
    weight_error,
)
from anvil_kernels.cuda.tc_model import round_a, simulate
from anvil_kernels.cuda.w4a16 import prepack, w4a16_source
from anvil_kernels.cuda.w4a16_tc import choose_split
from anvil_kernels.format import bf16_bits_to_f32, f32_to_bf16_bits, unpack_nibbles

TC_SRC = Path(__file__).parents[1] / "src/anvil_kernels/cuda/w4a16_tc.cu"

# ------------------------------------------------------------------------------------ CPU only


@pytest.mark.parametrize(
    ("cfg", "m", "k", "n", "g", "split", "sdt"),
    [
        ("tc64", 37, 512, 160, 128, 3, "fp16"),  # partial M tile, partial N tile, uneven split
        ("tc128", 130, 256, 96, 64, 2, "bf16"),  # two M tiles
        ("tc16", 5, 512, 48, 256, 1, "fp16"),
        ("tc32", 33, 384, 272, 128, 3, "bf16"),
        ("tc64s", 70, 256, 288, 64, 4, "fp16"),  # scaled A: 2 M tiles, partial N tile
        ("tc128s", 9, 512, 128, 128, 2, "bf16"),
        ("tc128ws", 130, 256, 272, 128, 1, "bf16"),
    ],
)
@pytest.mark.parametrize("dt", ["bf16", "fp16"])
def test_model_reconstructs_product(
    rng: np.random.Generator, cfg: str, m: int, k: int, n: int, g: int, split: int, sdt: str, dt: str
) -> None:
    """Every lane's fragments, assembled through the PTX layouts from the stage copies of the
    prepacked weights, give x @ W (float64; for scaled-A configs W's elements rounded as the
    kernel rounds them), and every output is written exactly once."""
    w = random_weight(rng, k, n, g, sdt)
    x = rng.standard_normal((m, k))
    out, writes = simulate(prepack(w), x, cfg, split, dt)
    assert np.array_equal(writes, np.ones((m, n), np.int64))
    ref = x @ _kernel_weight(w, TC_CONFIGS[cfg].sa, dt)
    np.testing.assert_allclose(out, ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dt", ["bf16", "fp16"])
def test_scaled_a_error_is_within_the_gpu_tests_bound(rng: np.random.Generator, dt: str) -> None:
    """The GPU tests' tolerance for scaled-A configs holds for what such a kernel computes (the
    model's output rounded to the activations' type) against the CPU twin."""
    k, n, m, g = 1024, 128, 9, 128
    w = random_weight(rng, k, n, g, "fp16")
    x = round_a(rng.standard_normal((m, k)), dt).astype(np.float32)
    out, _ = simulate(prepack(w), x.astype(np.float64), "tc128s", 2, dt)
    ref = np.empty((m, n), np.float32)
    int4_linear(x, w, ref)
    compare(round_a(out, dt).astype(np.float32), ref, dt, "model", weight_error("tc128s", dt, x, w))


def _kernel_weight(w: Int4Weight, sa: bool, dt: str) -> np.ndarray:
    """(K, N) float64 weights as the kernel multiplies them: (q - z) * s exactly, or for a
    scaled-A config round((q - z) * round(s)) in the activations' type."""
    if not sa:
        return dequantize(w).astype(np.float64)
    q = unpack_nibbles(w.packed).astype(np.float64)
    g = w.group_size
    s = np.repeat(round_a(w.scales_f32.astype(np.float64), dt), g, axis=0)
    z = np.repeat(w.zeros_f32.astype(np.float64), g, axis=0)
    return round_a((q - z) * s, dt)


def test_model_detects_a_layout_error(rng: np.random.Generator) -> None:
    """The model is sensitive: two lanes' words swapped in one chunk of the prepacked weights
    (what a wrong prepack index would do) changes the product."""
    k, n, g = 256, 128, 128
    w = random_weight(rng, k, n, g)
    x = rng.standard_normal((16, k))
    p = prepack(w)
    bad = dict(p)
    bad["qweight"] = p["qweight"].copy()
    bad["qweight"][0, 1, [3, 7]] = bad["qweight"][0, 1, [7, 3]]
    assert not np.array_equal(bad["qweight"], p["qweight"])
    ref = x @ dequantize(w).astype(np.float64)
    out, _ = simulate(bad, x, "tc16", 1)
    assert not np.allclose(out, ref, rtol=1e-6, atol=1e-6)


def test_model_index_expressions_are_the_kernels() -> None:
    """The model mirrors these lines of w4a16_tc.cu; if one changes, the model must change too."""
    src = TC_SRC.read_text()
    for expr in [
        "XROW = 144",
        "W + ((static_cast<size_t>(strip) * KC + c) * 32 + (p & 31))",
        "SZ + ((static_cast<size_t>(strip) * G + grp) * 4 + (tid & 3))",
        "st + T::W_BYTES + T::SZ_BYTES + r * T::XROW + (p & 7) * 16",
        "sSZ[(wn * NS + j) * 8 + g8]",
        "sW[(wn * NS + j) * 32 + lane]",
        "sX + ((wm * MT + mt) * 8 + g8) * T::XROW + t4 * 32",
        "(nx % ST) * T::STAGE",
        "(i % ST) * T::STAGE",
        "(static_cast<size_t>(z) * T::REGS + (j * MT + mt) * 4 + q) * T::NT + tid",
        "const int n = strip * 16 + g8 + 8 * (q >> 1);",
        "const int m = m0 + (wm * MT + mt) * 8 + 2 * t4 + (q & 1);",
    ]:
        assert expr in src, f"w4a16_tc.cu no longer has: {expr}"


def test_plan_tc_geometry() -> None:
    p = plan_tc(64, 8192, 8192, 128, "tc64", sm_count=132)
    assert p.grid[:2] == (1, 64) and p.block == 256 and p.split > 1
    assert p.ws_floats == 64 * p.split * 64 * 128
    assert p.smem == 4 * (8 * 512 + 8 * 64 + 64 * 144)
    p = plan_tc(256, 8192, 8192, 128, "tc128s", sm_count=132)
    assert p.grid[:2] == (2, 64) and p.block == 256
    p = plan_tc(33, 160, 512, 128, "tc64", split=3)
    assert p.grid == (1, 2, 3)  # N = 160: a second, partial tile of 32 columns
    with pytest.raises(ValueError, match="split"):
        plan_tc(64, 256, 512, 128, "tc64", split=5)  # 4 groups
    with pytest.raises(ValueError, match="unknown"):
        plan_tc(64, 256, 512, 128, "tc7")
    for cfg in TC_CONFIGS.values():
        assert cfg.smem <= 227 * 1024


def test_choose_split() -> None:
    assert choose_split(tiles=1024, groups=64, sm_count=132, blocks_per_sm=2) == 1
    few = choose_split(tiles=32, groups=64, sm_count=132, blocks_per_sm=1)
    assert few > 1 and 32 * few <= 2 * 132
    assert choose_split(tiles=1, groups=2, sm_count=132, blocks_per_sm=1) == 2  # capped by groups


def test_dispatch_rule_and_table() -> None:
    assert choose(1, 8192, 8192, 128).kernel == "gemv"
    assert choose(16, 8192, 8192, 128).kernel == "gemv"
    assert choose(17, 8192, 8192, 128).kernel == "mtc32"
    assert choose(64, 8192, 8192, 128).kernel == "mtc64"
    assert choose(256, 8192, 8192, 128).kernel == "mtc128w"
    table = DispatchTable.from_json(
        '{"arch": "sm_90", "entries": ['
        '{"K": 8192, "N": 8192, "M": 16, "kernel": "tc16", "split": 4},'
        '{"K": 8192, "N": 8192, "M": 1, "kernel": "gemv"},'
        '{"K": 8192, "N": 8192, "M": 256, "kernel": "tc128ws", "bf16_faster": true}]}'
    )
    assert choose(1, 8192, 8192, 128, table) == KernelChoice("gemv", source="table")
    assert choose(9, 8192, 8192, 128, table) == KernelChoice("tc16", 4, "table")
    assert choose(200, 8192, 8192, 128, table).bf16_faster
    assert choose(300, 8192, 8192, 128, table).source == "rule"  # above the measured M
    assert choose(9, 4096, 8192, 128, table).source == "rule"  # another shape
    ch = choose(64, 8192, 8192, 128)
    assert KernelChoice.from_dict(ch.as_dict()) == ch
    with pytest.raises(ValueError, match="kernel"):
        KernelChoice("wgmma")
    with pytest.raises(ValueError, match="split"):
        KernelChoice("gemv", split=2)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_tc_ptxas_report(tmp_path: Path, ptxas_registers: Callable[[str], dict[str, int]]) -> None:
    """Every tc config compiles for sm_90 with no spills and no stack, within the registers its
    TcConfig states (which the split planner's occupancy estimate uses). bf16 only, to keep CI
    short: the fp16 instantiations differ in four instructions (their registers: docs)."""
    procs = []
    for cfg in TC_CONFIGS:  # one nvcc per config, in parallel (each takes seconds)
        src = tmp_path / f"{cfg}.cu"
        params = W4A16Params(dtypes=("bf16",), tiles=(), groups=(128,), tc_configs=(cfg,), mtc_configs=())
        src.write_text(w4a16_source(params))
        cubin = str(tmp_path / f"{cfg}.cubin")
        cmd = ["nvcc", "--cubin", "-O3", "-std=c++17", "-arch=sm_90", "-Xptxas", "-v", "-o", cubin, str(src)]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    stderr = ""
    for proc in procs:
        err = proc.communicate()[1]
        assert proc.returncode == 0, err
        stderr += err
    seen = set()
    for name, regs in ptxas_registers(stderr).items():
        hit = re.match(r"w4a16(tc\w+?)_(bf16|fp16)_c2$", name)
        assert hit is not None, name
        seen.add(name)
        assert regs <= TC_CONFIGS[hit.group(1)].regs, f"{name}: {regs} registers"
    assert len(seen) == len(TC_CONFIGS), stderr


@pytest.mark.parametrize(
    ("cfg", "dt", "m", "k", "n", "g", "split"),
    [("tc64", "bf16", 37, 512, 160, 128, 3), ("tc64s", "fp16", 70, 256, 288, 64, 1)],
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
    """W4A16Linear's tc launch (argument order, grid, shared memory, workspace, counters) with the
    numpy model as the kernel behind a stand-in cupy, against the CPU twin with the GPU tests'
    tolerances: the host side of the GPU tests, run in CI."""

    dev = fake_cupy
    from anvil_kernels.cuda import W4A16Linear

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


# ------------------------------------------------------------------------------------ GPU

gpu = pytest.mark.skipif(not has_gpu(), reason="no CUDA device (or no cupy)")
MS = [1, 7, 16, 33, 64, 128, 256]


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("cfg", list(TC_CONFIGS))
@pytest.mark.parametrize("dt", ["bf16", "fp16"])
@pytest.mark.parametrize(("k", "n", "g"), [(1024, 256, 128), (768, 160, 64), (2048, 96, 256)])
def test_tc_matches_twin(
    module: object, rng: np.random.Generator, cfg: str, dt: str, k: int, n: int, g: int
) -> None:
    for m in MS:
        check_case(module, rng, dt, m, k, n, g, kernel=cfg)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize(("k", "n"), [(4096, 14336), (14336, 4096), (8192, 8192)])
def test_dispatched_large_shapes(module: object, rng: np.random.Generator, k: int, n: int) -> None:
    """The dispatcher's choice at every M on the benchmark's shapes (g128, bf16, one weight)."""
    import cupy as cp

    from anvil_kernels.cuda import W4A16Linear

    w = random_weight(rng, k, n, 128, "bf16")
    layer = W4A16Linear(module, prepack(w), max(MS))
    for m in MS:
        x_d, x = to_dev(rng.standard_normal((m, k)).astype(np.float32), "bf16")
        out = cp.full((m, n), 0xFFFF, dtype=cp.uint16)  # bf16 NaN
        layer(x_d, out)
        ref = np.empty((m, n), np.float32)
        int4_linear(x, w, ref)
        ch = layer.choice(m)
        extra = weight_error(ch.kernel, "bf16", x, w)
        compare(from_dev(out, "bf16"), ref, "bf16", f"{ch} M={m} K={k} N={n}", extra)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("split", [1, 2, 3, 4, 7])
def test_tc_splits(module: object, rng: np.random.Generator, split: int) -> None:
    """Every split up to the group count, uneven ones included (7 groups)."""
    check_case(module, rng, "bf16", 40, 7 * 128, 320, 128, kernel="tc64", split=split)
    check_case(module, rng, "fp16", 130, 7 * 64, 64, 64, kernel="tc128s", split=split)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("act", list(ACTIVATIONS))
def test_tc_epilogue(module: object, rng: np.random.Generator, act: str) -> None:
    check_case(
        module, rng, "bf16", 70, 512, 192, 128, act=act, use_bias=True, use_res=True, kernel="tc64", split=2
    )
    check_case(module, rng, "fp16", 33, 512, 128, 128, act=act, use_bias=True, kernel="tc32")


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("sdt", ["bf16", "fp32"])
def test_tc_scale_dtypes(module: object, rng: np.random.Generator, sdt: str) -> None:
    check_case(module, rng, "bf16", 50, 1024, 128, 128, sdt=sdt, kernel="tc64")


@gpu
@pytest.mark.gpu
def test_tc_split_is_deterministic_and_reusable(module: object, rng: np.random.Generator) -> None:
    """Split-K partials are added in a fixed order and the tile counters reset themselves: two
    calls give the same bits, and a following call with another M is still right."""
    import cupy as cp

    from anvil_kernels.cuda import W4A16Linear

    k, n = 2048, 512
    w = random_weight(rng, k, n, 128)
    x = cp.asarray(rng.standard_normal((64, k)).astype(np.float16))
    a = cp.empty((64, n), np.float16)
    b = cp.empty((64, n), np.float16)
    layer = W4A16Linear(module, prepack(w), 64, dtype="fp16", kernel="tc64", split=8)
    layer(x, a)
    layer(x, b)
    assert bool(cp.all(a.view(np.uint16) == b.view(np.uint16)))
    c = cp.empty((9, n), np.float16)
    layer(x[:9], c)
    assert bool(cp.all(c.view(np.uint16) == a[:9].view(np.uint16)))
