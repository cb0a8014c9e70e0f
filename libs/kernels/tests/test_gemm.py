"""int4_linear against a float64 numpy reference on the same dequantized weight."""

from __future__ import annotations

import math

import numba
import numpy as np
import pytest

from anvil_kernels import Int4Weight, Workspace, gemm_avx512, gemm_tiled, gemv, int4_linear, quantize
from anvil_kernels.activations import ACTIVATIONS
from anvil_kernels.format import pack_nibbles, pack_words, unpack_nibbles
from anvil_kernels.tolerances import ACT_RTOL, GEMV_X_GROUP_RTOL, MATMUL_ATOL, MATMUL_RTOL

_ERF = np.vectorize(math.erf)


def _ref_act(y: np.ndarray, act: str) -> np.ndarray:
    if act == "relu":
        return np.maximum(y, 0.0)
    if act == "gelu_erf":
        return 0.5 * y * (1.0 + _ERF(y / math.sqrt(2.0)))
    if act == "gelu_tanh":
        return 0.5 * y * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (y + 0.044715 * y**3)))
    if act == "silu":
        return y / (1.0 + np.exp(-y))
    return y


def _random_weight(rng: np.random.Generator, k: int, n: int, g: int) -> Int4Weight:
    q = rng.integers(0, 16, size=(k, n), dtype=np.uint8)
    s = rng.uniform(0.001, 0.05, size=(k // g, n)).astype(np.float16)
    z = rng.integers(0, 16, size=(k // g, n)).astype(np.float16)
    return Int4Weight(pack_nibbles(q), s, z, g, k, n, "fp16")


def _terms(w: Int4Weight) -> tuple[np.ndarray, np.ndarray]:
    """(dequantized W, magnitude of the summed terms (q + z) * s), both float64 (K, N)."""
    q = unpack_nibbles(w.packed).astype(np.float64)
    s = np.repeat(w.scales_f32.astype(np.float64), w.group_size, axis=0)
    z = np.repeat(w.zeros_f32.astype(np.float64), w.group_size, axis=0)
    return (q - z) * s, (q + z) * s


def _check(out: np.ndarray, ref: np.ndarray, mag: np.ndarray, extra: np.ndarray | float = 0.0) -> None:
    """|out - ref| <= MATMUL_RTOL * mag + MATMUL_ATOL (+ extra)."""
    err = np.abs(out.astype(np.float64) - ref)
    bound = MATMUL_RTOL * mag + MATMUL_ATOL + extra
    assert np.all(err <= bound), f"max err/bound {float((err / bound).max()):.3g}"


@pytest.mark.parametrize("m", [1, 2, 3, 17])
@pytest.mark.parametrize(("k", "n", "g"), [(256, 67, 128), (512, 129, 64), (96, 8, 32), (512, 300, 256)])
def test_matmul_matches_reference(rng: np.random.Generator, m: int, k: int, n: int, g: int) -> None:
    w = _random_weight(rng, k, n, g)
    x = rng.standard_normal((m, k)).astype(np.float32)
    out = np.full((m, n), np.nan, np.float32)
    assert int4_linear(x, w, out) is out
    wd, wmag = _terms(w)
    xa = x.astype(np.float64)
    _check(out, xa @ wd, np.abs(xa) @ wmag)


def _operands(
    rng: np.random.Generator, m: int, k: int, n: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """x (m, k), bias (n,), residual (m, n) and a NaN-filled out (m, n), all float32."""
    x = rng.standard_normal((m, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    res = rng.standard_normal((m, n)).astype(np.float32)
    return x, bias, res, np.full((m, n), np.nan, np.float32)


def _check_epilogue(
    out: np.ndarray, x: np.ndarray, w: Int4Weight, bias: np.ndarray, act: str, res: np.ndarray
) -> None:
    wd, wmag = _terms(w)
    xa = x.astype(np.float64)
    pre = xa @ wd + bias
    # the activations here are at most 1.13-Lipschitz: matmul error passes through scaled by <= 1.2
    _check(out, _ref_act(pre, act) + res, 1.2 * (np.abs(xa) @ wmag), ACT_RTOL * (np.abs(pre) + np.abs(res)))


@pytest.mark.parametrize("act", ["none", "relu", "gelu_erf", "gelu_tanh", "silu"])
@pytest.mark.parametrize("m", [1, 5])
def test_fused_epilogue(rng: np.random.Generator, act: str, m: int) -> None:
    k, n = 256, 45
    w = quantize(rng.standard_normal((k, n)).astype(np.float32), group_size=64)
    x, bias, res, out = _operands(rng, m, k, n)
    int4_linear(x, w, out, bias=bias, activation=act, residual=res)
    _check_epilogue(out, x, w, bias, act, res)


@pytest.mark.skipif(not gemm_avx512.available(), reason="numba's target CPU has no AVX-512")
@pytest.mark.parametrize("act", ["none", "gelu_tanh"])
@pytest.mark.parametrize("m", [16, 19, 24, 33, 40])
@pytest.mark.parametrize(("k", "n", "g"), [(1280, 2111, 64), (96, 67, 32), (256, 15, 256), (512, 48, 128)])
def test_fma_path(rng: np.random.Generator, act: str, m: int, k: int, n: int, g: int) -> None:
    """M >= BLAS_MIN_M on AVX-512: one block of rows, several with the 8-row tail block and with
    reused weights; K over several KC passes and within one; N % 16 tail columns (all of N when
    N < 16) over several chunks; full epilogue."""
    w = _random_weight(rng, k, n, g)
    x, bias, res, out = _operands(rng, m, k, n)
    ws = Workspace()
    int4_linear(x, w, out, bias=bias, activation=act, residual=res, workspace=ws)
    threads = numba.get_num_threads()
    scratch = k * gemm_avx512.padded_rows(m) + threads * (gemm_avx512.KC * gemm_avx512.COLS + 16)
    assert ws.nbytes == 4 * scratch  # the FMA path ran, and its scratch is all it allocated
    _check_epilogue(out, x, w, bias, act, res)


@pytest.mark.skipif(not gemm_tiled.available(), reason="numpy's bundled OpenBLAS not found")
@pytest.mark.parametrize("act", ["none", "gelu_tanh", "silu"])
@pytest.mark.parametrize(("k", "n", "g"), [(704, 2111, 64), (96, 67, 32)])
def test_tiled_blas_path(rng: np.random.Generator, act: str, k: int, n: int, g: int) -> None:
    """The M >= BLAS_MIN_M path of CPUs without AVX-512, called directly: K not a multiple of
    TILE_K, odd N over several tiles, full epilogue."""
    m = gemm_tiled.BLAS_MIN_M + 3
    w = _random_weight(rng, k, n, g)
    x, bias, res, out = _operands(rng, m, k, n)
    ws = Workspace()
    gemm_tiled.int4_matmul_tiled(x, w, out, bias, ACTIVATIONS[act], res, ws)
    threads = numba.get_num_threads()
    tile_bytes = threads * gemm_tiled.TILE_K * (gemm_tiled.tile_width(n, threads) + gemm_tiled.TILE_PAD) * 4
    assert ws.nbytes == tile_bytes  # the tiled path ran, and its tiles are all it allocated
    _check_epilogue(out, x, w, bias, act, res)


def test_bias_only_and_residual_only(rng: np.random.Generator) -> None:
    k, n, m = 128, 33, 3
    w = _random_weight(rng, k, n, 32)
    x = rng.standard_normal((m, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    res = rng.standard_normal((m, n)).astype(np.float32)
    wd, wmag = _terms(w)
    xa = x.astype(np.float64)
    out = np.empty((m, n), np.float32)
    int4_linear(x, w, out, bias=bias)
    _check(out, xa @ wd + bias, np.abs(xa) @ wmag + np.abs(bias))
    int4_linear(x, w, out, residual=res)
    _check(out, xa @ wd + res, np.abs(xa) @ wmag + np.abs(res))


def test_workspace_reused_across_shapes(rng: np.random.Generator) -> None:
    ws = Workspace()
    w = _random_weight(rng, 128, 70, 64)
    wd, wmag = _terms(w)
    for m in (4, 1, 9, 4):
        x = rng.standard_normal((m, 128)).astype(np.float32)
        out = np.empty((m, 70), np.float32)
        int4_linear(x, w, out, workspace=ws)
        xa = x.astype(np.float64)
        _check(out, xa @ wd, np.abs(xa) @ wmag)
    size = ws.nbytes
    int4_linear(
        rng.standard_normal((4, 128)).astype(np.float32), w, np.empty((4, 70), np.float32), workspace=ws
    )
    assert ws.nbytes == size  # steady state: no growth, no new buffers


@pytest.mark.parametrize("scale_dtype", ["bf16", "fp32"])
def test_scale_dtypes(rng: np.random.Generator, scale_dtype: str) -> None:
    w = quantize(rng.standard_normal((128, 40)).astype(np.float32), group_size=32, scale_dtype=scale_dtype)
    x = rng.standard_normal((2, 128)).astype(np.float32)
    out = np.empty((2, 40), np.float32)
    int4_linear(x, w, out)
    wd, wmag = _terms(w)
    xa = x.astype(np.float64)
    _check(out, xa @ wd, np.abs(xa) @ wmag)


def test_words_hold_eight_k_rows_per_column(rng: np.random.Generator) -> None:
    k, n = 64, 9
    q = rng.integers(0, 16, size=(k, n), dtype=np.uint8)
    words = pack_words(pack_nibbles(q))
    assert words.shape == (k // 8, n) and words.dtype == np.uint32
    for r in range(8):
        np.testing.assert_array_equal((words >> np.uint32(4 * r)) & np.uint32(15), q[r::8])


@pytest.fixture(params=["vnni", "fp32"])
def gemv_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a GEMV test on each M = 1 kernel: the VNNI one (where the CPU has it) and the fp32 one."""
    if request.param == "vnni" and not gemv.vnni512():
        pytest.skip("numba's target CPU has no AVX-512 VNNI")
    if request.param == "fp32":
        monkeypatch.setattr(gemv, "vnni512", lambda: False)
    return str(request.param)


@pytest.mark.parametrize("g", [32, 64, 128, 256])
@pytest.mark.parametrize("n", [64, 192, 320])
def test_gemv_paths(rng: np.random.Generator, gemv_path: str, g: int, n: int) -> None:
    """N a multiple of 64 (the VNNI kernel's step), with the full epilogue."""
    k = 512
    w = _random_weight(rng, k, n, g)
    x = rng.standard_normal((1, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    res = rng.standard_normal((1, n)).astype(np.float32)
    out = np.full((1, n), np.nan, np.float32)
    int4_linear(x, w, out, bias=bias, activation="silu", residual=res)
    wd, wmag = _terms(w)
    xa = x.astype(np.float64)
    pre = xa @ wd + bias
    _check(
        out, _ref_act(pre, "silu") + res, 1.2 * (np.abs(xa) @ wmag), ACT_RTOL * (np.abs(pre) + np.abs(res))
    )


def test_gemv_outliers_and_zero_groups(rng: np.random.Generator, gemv_path: str) -> None:
    """x spanning 1e-6..1e4 inside a group (the VNNI kernel's fixed point is relative to the
    group's max |x|), a group of zeros and a group near float32's bottom (1e-35)."""
    k, n, g = 512, 64, 128
    w = _random_weight(rng, k, n, g)
    x = rng.standard_normal((1, k)).astype(np.float32) * np.float32(1e-3)
    x[0, 5] = 1e4
    x[0, 7] = -3e3
    x[0, 128:256] = 0.0
    x[0, 256:384] *= np.float32(1e-35)
    out = np.empty((1, n), np.float32)
    int4_linear(x, w, out)
    wd, wmag = _terms(w)
    xa = x.astype(np.float64)
    # the VNNI kernel rounds x relative to its group's max |x| (tolerances.GEMV_X_GROUP_RTOL):
    # 1e4 beside 1e-3 costs the small ones their precision where the 1e4 row's weight is 0
    group_max = np.abs(xa).reshape(-1, g).max(axis=1)  # (K/g,)
    extra = (
        GEMV_X_GROUP_RTOL * (group_max[None, :] @ wmag.reshape(-1, g, n).sum(axis=1))
        if gemv_path == "vnni"
        else 0.0
    )
    _check(out, xa @ wd, np.abs(xa) @ wmag, extra)
    # far below MATMUL_ATOL: scaled by 2**-90 (exact), the result must scale with it
    x_scale = np.float32(2.0**-90)
    int4_linear(x * x_scale, w, out)
    _check(out.astype(np.float64) / float(x_scale), xa @ wd, np.abs(xa) @ wmag, extra)


def test_gemv_nan_input_propagates(rng: np.random.Generator, gemv_path: str) -> None:
    k, n = 256, 64
    w = _random_weight(rng, k, n, 64)
    x = rng.standard_normal((1, k)).astype(np.float32)
    x[0, 70] = np.nan
    out = np.zeros((1, n), np.float32)
    int4_linear(x, w, out)
    assert np.all(np.isnan(out))


@pytest.mark.parametrize("n", [70, 128])
def test_gemv_extreme_nibbles(rng: np.random.Generator, gemv_path: str, n: int) -> None:
    """All-15 nibbles put the top nibble's bit 31 to use: it must read as 15, not as a sign."""
    k, g = 256, 64
    q = np.full((k, n), 15, np.uint8)
    s = rng.uniform(0.001, 0.05, size=(k // g, n)).astype(np.float16)
    z = rng.integers(0, 16, size=(k // g, n)).astype(np.float16)
    w = Int4Weight(pack_nibbles(q), s, z, g, k, n, "fp16")
    x = rng.standard_normal((1, k)).astype(np.float32)
    out = np.empty((1, n), np.float32)
    int4_linear(x, w, out)
    wd, wmag = _terms(w)
    xa = x.astype(np.float64)
    _check(out, xa @ wd, np.abs(xa) @ wmag)
