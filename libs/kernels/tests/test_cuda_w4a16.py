"""W4A16 CUDA kernels: host-side layout (CPU), nvcc build (CPU, skipped without nvcc), and the
GEMV-like kernel's variants against the numba CPU twin ``int4_linear`` (GPU, skipped without one;
tolerances in ``anvil_kernels.cuda.gpu_check``). The tensor-core kernel: test_cuda_w4a16_tc.py.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from anvil_kernels import Int4Weight
from anvil_kernels.activations import ACTIVATIONS
from anvil_kernels.cuda.gpu_check import check_case, has_gpu
from anvil_kernels.cuda.gpu_check import random_weight as _weight
from anvil_kernels.cuda.w4a16 import (
    Variant,
    W4A16Params,
    build_fatbin,
    default_gd,
    plan_launch,
    prepack,
    unprepack,
)
from anvil_kernels.format import pack_nibbles

# ------------------------------------------------------------------------------------ CPU only


@pytest.mark.parametrize("sdt", ["fp16", "bf16"])
@pytest.mark.parametrize(("k", "n", "g"), [(128, 16, 64), (512, 48, 128), (1024, 32, 256)])
def test_prepack_is_a_bijection(rng: np.random.Generator, sdt: str, k: int, n: int, g: int) -> None:
    w = _weight(rng, k, n, g, sdt)
    p = prepack(w)
    assert p["qweight"].shape == (n // 16, k // 64, 32, 4)
    assert p["sz"].shape == (n // 16, k // g, 8, 2)
    back = unprepack(p)
    assert np.array_equal(back.packed, w.packed)
    assert np.array_equal(back.scales, w.scales)
    assert np.array_equal(back.zeros_f32, w.zeros_f32)
    # every word value occurs once: permuting then packing loses nothing
    assert p["qweight"].nbytes == w.packed.nbytes


def test_prepack_layout_one_nibble() -> None:
    """A single nonzero weight lands where w4a16.cu's header says."""
    k, n, g = 128, 32, 64
    for kk, nn in [(0, 0), (1, 0), (2, 0), (4, 0), (5, 17), (16, 8), (70, 31), (127, 9)]:
        q = np.zeros((k, n), np.uint8)
        q[kk, nn] = 7
        w = Int4Weight(
            pack_nibbles(q), np.ones((k // g, n), np.float16), np.zeros((k // g, n), np.float16), g, k, n
        )
        words = prepack(w)["qweight"]
        hit = np.argwhere(words != 0)
        assert len(hit) == 1
        strip, kc, lane, wi = (int(v) for v in hit[0])
        p = int(np.log2(int(words[strip, kc, lane, wi]) // 7)) // 4
        odd, rowhi, e = p & 1, (p >> 1) & 1, p >> 2
        s, h = 2 * (wi >> 1) + odd, wi & 1
        assert 16 * strip + (lane >> 2) + 8 * rowhi == nn
        assert 64 * kc + 16 * (lane & 3) + 4 * s + 2 * h + e == kk


def test_prepack_rejects_unsupported(rng: np.random.Generator) -> None:
    with pytest.raises(ValueError, match="group_size"):
        prepack(_weight(rng, 128, 16, 32))
    with pytest.raises(ValueError, match="multiple of 16"):
        q = rng.integers(0, 16, size=(128, 24), dtype=np.uint8)
        prepack(
            Int4Weight(
                pack_nibbles(q), np.ones((1, 24), np.float16), np.zeros((1, 24), np.float16), 128, 128, 24
            )
        )
    w = _weight(rng, 128, 16, 64, "fp32")
    bad = Int4Weight(w.packed, w.scales, w.zeros + np.float32(0.5), 64, 128, 16, "fp32")
    with pytest.raises(ValueError, match="zeros"):
        prepack(bad)


def test_plan_launch_shapes() -> None:
    p = plan_launch(1, 8192, 8192, 128)
    assert (p.mt, p.ns, p.sn, p.sk) == (1, 1, 1, 4) and p.grid == (1, 512) and p.block == 128
    assert p.evict_first
    p = plan_launch(256, 8192, 8192, 128)
    assert p.mt == 4 and p.grid[0] == 8 and not p.evict_first
    assert p.smem == p.sk * p.sn * p.ns * p.mt * 512
    with pytest.raises(ValueError, match="warps"):
        plan_launch(1, 8192, 8192, 128, sn=4, sk=8)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_source_compiles_for_sm90(tmp_path: Path) -> None:
    params = W4A16Params(
        variants=(Variant("bf16", 1, 1, 2, default_gd(1, 1, 2)), Variant("fp16", 2, 2, 1, 4)),
        tc_configs=(),
        mtc_configs=(),
    )
    out = build_fatbin(params, ("compute_90,code=sm_90",), tmp_path)
    assert out.stat().st_size > 1000


# ------------------------------------------------------------------------------------ GPU

gpu = pytest.mark.skipif(not has_gpu(), reason="no CUDA device (or no cupy)")


def _run_case(module: object, rng: np.random.Generator, *args: object, **kw: object) -> None:
    """The GEMV-like kernel (forced, whatever the dispatcher would pick for that M) vs the twin."""
    check_case(module, rng, *args, **({"kernel": "gemv"} | kw))  # type: ignore[arg-type]


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dt", ["bf16", "fp16"])
@pytest.mark.parametrize("m", [1, 3, 8, 13, 16, 37, 64, 100])
@pytest.mark.parametrize(("k", "n", "g"), [(1024, 256, 128), (768, 160, 64), (2048, 96, 256)])
def test_matches_cpu_twin(
    module: object, rng: np.random.Generator, dt: str, m: int, k: int, n: int, g: int
) -> None:
    _run_case(module, rng, dt, m, k, n, g)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("act", list(ACTIVATIONS))
@pytest.mark.parametrize("m", [1, 21])
def test_epilogue(module: object, rng: np.random.Generator, act: str, m: int) -> None:
    _run_case(module, rng, "bf16", m, 512, 128, 128, act=act, use_bias=True, use_res=True)
    _run_case(module, rng, "fp16", m, 512, 128, 128, act=act, use_bias=True, use_res=False)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("sdt", ["bf16", "fp32"])
def test_scale_dtypes(module: object, rng: np.random.Generator, sdt: str) -> None:
    _run_case(module, rng, "bf16", 5, 1024, 64, 128, sdt=sdt)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize(
    "ov",
    [
        {"mt": 1, "ns": 1, "sn": 1, "sk": 16},
        {"mt": 1, "ns": 1, "sn": 4, "sk": 2},
        {"mt": 2, "ns": 2, "sn": 2, "sk": 4},
        {"mt": 2, "ns": 1, "sn": 8, "sk": 1},
        {"mt": 4, "ns": 1, "sn": 4, "sk": 4},
    ],
)
@pytest.mark.parametrize("m", [1, 11, 45])
def test_launch_geometries(module: object, rng: np.random.Generator, ov: dict[str, int], m: int) -> None:
    _run_case(module, rng, "bf16", m, 2048, 320 if ov["ns"] == 1 else 384, 128, overrides=ov)


@gpu
@pytest.mark.gpu
def test_uneven_k_split(module: object, rng: np.random.Generator) -> None:
    # 7 groups over 4 warps: unequal K slices (1, 2, 2, 2 groups)
    _run_case(module, rng, "bf16", 2, 7 * 128, 64, 128, overrides={"sk": 4})
    _run_case(module, rng, "fp16", 9, 7 * 64, 64, 64, overrides={"sk": 4})


def test_fragment_emulation_matches_reference(rng: np.random.Generator) -> None:
    """Replays, in numpy, what each lane of w4a16.cu loads and feeds to mma.m16n8k16 (PTX
    fragment layouts for A row-major, B column-major, C), for one 8-row tile: the kernel's
    index arithmetic and the prepack layout must give x @ W."""
    k, n, g, m = 256, 32, 128, 8
    w = _weight(rng, k, n, g)
    p = prepack(w)
    words, sz = p["qweight"], p["sz"]
    x = rng.standard_normal((m, k))
    out = np.zeros((m, n))
    for strip in range(n // 16):
        for gi in range(k // g):
            cg = np.zeros((16, 8))  # C tile: rows = output columns n, cols = rows m of x
            for c in range(gi * (g // 64), (gi + 1) * (g // 64)):
                for s in range(4):
                    a = np.full((16, 16), np.nan)
                    b = np.full((16, 8), np.nan)
                    for lane in range(32):
                        g8, t4 = lane >> 2, lane & 3
                        wv = words[strip, c, lane]
                        wa, wb = (int(wv[0]), int(wv[1])) if s < 2 else (int(wv[2]), int(wv[3]))
                        sh = (s & 1) * 4
                        regs = [(wa >> sh), (wa >> (sh + 8)), (wb >> sh), (wb >> (sh + 8))]
                        z_lo = int(sz[strip, gi, g8, 0]) >> 16
                        z_hi = int(sz[strip, gi, g8, 1]) >> 16
                        for r, v in enumerate(regs):
                            for e in range(2):
                                q = (v >> (16 * e)) & 15
                                a[g8 + 8 * (r & 1), 2 * t4 + e + 8 * (r >> 1)] = q - (z_hi if r & 1 else z_lo)
                        xs = x[g8, 64 * c + 16 * t4 : 64 * c + 16 * t4 + 16]
                        for e in range(2):
                            b[2 * t4 + e, g8] = xs[4 * s + e]
                            b[2 * t4 + 8 + e, g8] = xs[4 * s + 2 + e]
                    assert not np.isnan(a).any() and not np.isnan(b).any()
                    cg += a @ b
            for row in range(16):
                sbits = np.array([int(sz[strip, gi, row % 8, row // 8]) & 0xFFFF], np.uint16)
                out[:, 16 * strip + row] += float(sbits.view(np.float16)[0]) * cg[row, :]
    from anvil_kernels import dequantize

    ref = x @ dequantize(w).astype(np.float64)
    assert np.allclose(out, ref, rtol=1e-9, atol=1e-9)


class _Unit:
    """A stand-in cupy.RawModule: its kernels by name, its driver error for any other."""

    def __init__(self, *names: str) -> None:
        self.names = names

    def get_function(self, name: str) -> str:
        if name not in self.names:
            raise RuntimeError("CUDA_ERROR_NOT_FOUND")
        return f"{id(self)}:{name}"


def test_module_set_finds_the_unit_of_a_kernel() -> None:
    from anvil_kernels.cuda.w4a16_linear import ModuleSet

    a, b = _Unit("k1", "k2"), _Unit("k3")
    mods = ModuleSet([a, b])
    assert mods.module_of("k3") is b and mods.module_of("k2") is a
    assert mods.get_function("k3") == f"{id(b)}:k3"
    with pytest.raises(KeyError, match="k4"):
        mods.get_function("k4")
