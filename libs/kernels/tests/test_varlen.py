"""Packed-sequence kernels and the fused fp32 linear against numpy references and against the padded
kernels they replace, on fresh random inputs with explicit tolerances."""

from __future__ import annotations

import math

import numpy as np
import pytest

from anvil_kernels import attention, gemm_f32_avx512, layer_norm, mean_pool_l2
from anvil_kernels.linear_f32 import f32_linear
from anvil_kernels.varlen import (
    bias_act,
    bias_residual_layer_norm,
    embed_ln_varlen,
    erf_fast,
    mean_pool_l2_varlen,
)
from anvil_kernels.varlen_attention import attention_varlen

RNG = np.random.default_rng(2026)
LENS = [1, 7, 3, 12, 5]  # sequences of a packed batch (lengths differ, one of a single token)


def _cu(lens: list[int]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)


def _ln(y: np.ndarray, g: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    y64 = y.astype(np.float64)
    mu, var = y64.mean(-1, keepdims=True), y64.var(-1, keepdims=True)
    return (y64 - mu) / np.sqrt(var + eps) * g + b


def _gelu(y: np.ndarray) -> np.ndarray:
    erf = np.vectorize(math.erf)
    return 0.5 * y * (1.0 + erf(y.astype(np.float64) / math.sqrt(2)))


def test_erf_fast_matches_math_erf_over_the_float32_range() -> None:
    xs = np.concatenate([np.linspace(-6, 6, 4001), RNG.standard_normal(2000) * 3]).astype(np.float32)
    got = np.array([erf_fast(float(x)) for x in xs])
    ref = np.array([math.erf(float(x)) for x in xs])
    assert np.abs(got - ref).max() < 1e-6


@pytest.mark.parametrize("act", ["none", "relu", "gelu_erf", "gelu_tanh", "silu"])
def test_bias_act_in_place(act: str) -> None:
    y = RNG.standard_normal((37, 64)).astype(np.float32) * 3
    bias = RNG.standard_normal(64).astype(np.float32)
    z = (y + bias).astype(np.float64)
    ref = {
        "none": z,
        "relu": np.maximum(z, 0),
        "gelu_erf": _gelu(z),
        "gelu_tanh": 0.5 * z * (1 + np.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3))),
        "silu": z / (1 + np.exp(-z)),
    }[act]
    np.testing.assert_allclose(bias_act(y, bias, act), ref, rtol=1e-5, atol=2e-6)


def test_bias_residual_layer_norm_matches_the_unfused_ops() -> None:
    y = RNG.standard_normal((29, 48)).astype(np.float32)
    bias, g, b = (RNG.standard_normal(48).astype(np.float32) for _ in range(3))
    res = RNG.standard_normal((29, 48)).astype(np.float32)
    ref = np.empty_like(y)
    layer_norm(y + bias, g, b, 1e-12, ref, res)
    out = np.empty_like(y)
    bias_residual_layer_norm(y.copy(), bias, res, g, b, 1e-12, out)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("m", [1, 5, 40, 300])
@pytest.mark.parametrize("epilogue", ["plain", "bias_gelu", "residual_ln", "act_residual"])
def test_f32_linear_matches_numpy(m: int, epilogue: str) -> None:
    k, n = 64, 96
    x = RNG.standard_normal((m, k)).astype(np.float32)
    w = (RNG.standard_normal((k, n)) / 8).astype(np.float32)
    bias, g, b = (RNG.standard_normal(n).astype(np.float32) for _ in range(3))
    res = RNG.standard_normal((m, n)).astype(np.float32)
    y = x.astype(np.float64) @ w + bias
    out = np.empty((m, n), np.float32)
    if epilogue == "plain":
        f32_linear(x, w, out)
        ref = x.astype(np.float64) @ w
    elif epilogue == "bias_gelu":
        f32_linear(x, w, out, bias, "gelu_erf")
        ref = _gelu(y)
    elif epilogue == "residual_ln":
        f32_linear(x, w, out, bias, "none", res, (g, b, 1e-12))
        ref = _ln(y + res, g, b, 1e-12)
    else:
        f32_linear(x, w, out, bias, "relu", res)
        ref = np.maximum(y, 0) + res
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_f32_linear_refuses_bad_shapes_with_the_constraint() -> None:
    x = np.zeros((4, 8), np.float32)
    with pytest.raises(ValueError, match="K=8"):
        f32_linear(x, np.zeros((7, 3), np.float32), np.zeros((4, 3), np.float32))
    with pytest.raises(ValueError, match="act"):
        f32_linear(x, np.zeros((8, 3), np.float32), np.zeros((4, 3), np.float32), act="swish")


def _padded(packed: np.ndarray, lens: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(N, ...) packed rows -> (S, T, ...) zero-padded and the (S, T) mask."""
    t = max(lens)
    out = np.zeros((len(lens), t, *packed.shape[1:]), packed.dtype)
    mask = np.zeros((len(lens), t), np.uint8)
    for s, (lo, n) in enumerate(zip(_cu(lens)[:-1], lens, strict=True)):
        out[s, :n] = packed[lo : lo + n]
        mask[s, :n] = 1
    return out, mask


def test_attention_varlen_matches_padded_attention_from_fused_qkv() -> None:
    heads, d = 3, 8
    n = sum(LENS)
    qkv = RNG.standard_normal((n, 3 * heads * d + 5)).astype(np.float32)  # 5 spare columns: a stride
    offs = (0, heads * d, 2 * heads * d)
    out = np.empty((n, heads * d), np.float32)
    attention_varlen(qkv, _cu(LENS), heads, d, offs, 0.3, out)
    padded, mask = _padded(qkv, LENS)
    b, t = mask.shape

    def part(o: int) -> np.ndarray:  # (B, H, T, D)
        return np.ascontiguousarray(
            padded[:, :, o : o + heads * d].reshape(b, t, heads, d).transpose(0, 2, 1, 3)
        )

    ref = np.empty((b, heads, t, d), np.float32)
    attention(part(offs[0]), part(offs[1]), part(offs[2]), mask, ref, 0.3)
    ref_rows = ref.transpose(0, 2, 1, 3).reshape(b, t, heads * d)
    for s, (lo, ln) in enumerate(zip(_cu(LENS)[:-1], LENS, strict=True)):
        np.testing.assert_allclose(out[lo : lo + ln], ref_rows[s, :ln], rtol=1e-5, atol=1e-5)


def test_embed_ln_varlen_restarts_positions_per_sequence() -> None:
    vocab, h = 50, 16
    n = sum(LENS)
    ids = RNG.integers(0, vocab, n).astype(np.int64)
    table, pos = (
        RNG.standard_normal((vocab, h)).astype(np.float32),
        RNG.standard_normal((20, h)).astype(np.float32),
    )
    g, b = RNG.standard_normal(h).astype(np.float32), RNG.standard_normal(h).astype(np.float32)
    out = np.empty((n, h), np.float32)
    embed_ln_varlen(ids, _cu(LENS), table, pos, g, b, 1e-12, out)
    positions = np.concatenate([np.arange(ln) for ln in LENS])
    np.testing.assert_allclose(out, _ln(table[ids] + pos[positions], g, b, 1e-12), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="ids must lie"):
        embed_ln_varlen(ids + vocab, _cu(LENS), table, pos, g, b, 1e-12, out)


def test_mean_pool_varlen_matches_the_masked_padded_pool() -> None:
    x = RNG.standard_normal((sum(LENS), 24)).astype(np.float32)
    out = np.empty((len(LENS), 24), np.float32)
    mean_pool_l2_varlen(x, _cu(LENS), out)
    padded, mask = _padded(x, LENS)
    ref = np.empty_like(out)
    mean_pool_l2(padded, mask, ref)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


def test_cumulative_lengths_are_checked() -> None:
    x = np.zeros((5, 4), np.float32)
    out = np.zeros((2, 4), np.float32)
    for bad in ([0, 3, 3], [0, 2, 4], [1, 5]):  # an empty sequence, a short total, not from 0
        with pytest.raises(ValueError, match="cu must rise"):
            mean_pool_l2_varlen(x, np.array(bad, np.int64), out[: len(bad) - 1])


@pytest.mark.parametrize(("m", "threads"), [(1, 2), (22, 1), (22, 2), (70, 1), (300, 2)])
def test_f32_linear_tiles_by_rows_or_columns_alike(m: int, threads: int) -> None:
    """Small M splits the columns across threads (LN then runs as a second pass), large M the rows:
    both give the reference result, bias+GELU and residual+LN epilogues included."""
    import numba

    from anvil_kernels.linear_f32 import tiles

    k, n = 48, 80
    x = RNG.standard_normal((m, k)).astype(np.float32)
    w = (RNG.standard_normal((k, n)) / 8).astype(np.float32)
    bias, g, b = (RNG.standard_normal(n).astype(np.float32) for _ in range(3))
    res = RNG.standard_normal((m, n)).astype(np.float32)
    y = x.astype(np.float64) @ w + bias
    before = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))  # type: ignore[attr-defined]
    try:
        rows, cols = tiles(m, n, numba.get_num_threads())
        assert rows * cols >= 1 and (cols == n or cols % 16 == 0)
        gelu, normed = np.empty((m, n), np.float32), np.empty((m, n), np.float32)
        f32_linear(x, w, gelu, bias, "gelu_erf")
        f32_linear(x, w, normed, bias, "none", res, (g, b, 1e-12))
    finally:
        numba.set_num_threads(before)
    np.testing.assert_allclose(gelu, _gelu(y), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(normed, _ln(y + res, g, b, 1e-12), rtol=1e-4, atol=1e-4)


def test_tiles_split_columns_below_min_block_rows_and_rows_above() -> None:
    from anvil_kernels.linear_f32 import MAX_BLOCK, MIN_BLOCK, tiles

    assert tiles(22, 1536, 1) == (22, 1536)  # one thread: one sgemm, W packed once
    assert tiles(1000, 384, 1) == (MAX_BLOCK, 384)
    rows, cols = tiles(22, 1536, 2)  # two threads, few rows: each its own half of the columns
    assert (rows, cols) == (22, 768)
    rows, cols = tiles(4 * MIN_BLOCK, 384, 2)  # enough rows: row tiles of >= MIN_BLOCK rows
    assert cols == 384 and rows >= MIN_BLOCK


@pytest.mark.parametrize("blas", [True, False], ids=["sgemm", "scalar"])
def test_attention_varlen_paths_agree(monkeypatch: pytest.MonkeyPatch, blas: bool) -> None:
    """The sgemm path and the scalar fallback (numpy on another BLAS) give the padded reference."""
    from anvil_kernels import _openblas

    if blas and _openblas.SGEMM is None:
        pytest.skip("numpy does not use a bundled OpenBLAS here")
    if not blas:
        monkeypatch.setattr(_openblas, "SGEMM", None)
    heads, d = 2, 16
    lens = [1, 33, 2, 9]
    n = sum(lens)
    qkv = RNG.standard_normal((n, 3 * heads * d)).astype(np.float32)
    offs = (0, heads * d, 2 * heads * d)
    out = np.empty((n, heads * d), np.float32)
    attention_varlen(qkv, _cu(lens), heads, d, offs, 0.25, out)
    for lo, ln in zip(_cu(lens)[:-1], lens, strict=True):
        for h in range(heads):
            q, k, v = (qkv[lo : lo + ln, o + h * d : o + (h + 1) * d].astype(np.float64) for o in offs)
            sc = q @ k.T * 0.25
            p = np.exp(sc - sc.max(1, keepdims=True))
            ref = (p / p.sum(1, keepdims=True)) @ v
            np.testing.assert_allclose(out[lo : lo + ln, h * d : (h + 1) * d], ref, rtol=1e-5, atol=1e-5)


def test_exp_fast_is_within_2e_7_of_exp_and_clamps() -> None:
    from numba import njit

    from anvil_kernels.approx import exp_fast

    @njit(cache=False)
    def run(x: np.ndarray, o: np.ndarray) -> None:
        for i in range(x.size):
            o[i] = exp_fast(x[i])

    x = np.concatenate([np.linspace(-87, 88, 100_001), RNG.uniform(-20, 0, 10_000)]).astype(np.float32)
    out = np.empty_like(x)
    run(x, out)
    ref = np.exp(x.astype(np.float64))
    assert float(np.max(np.abs(out - ref) / ref)) < 2e-7
    edges = np.array([-np.inf, -1e4, 0.0, 1e4], np.float32)
    got = np.empty_like(edges)
    run(edges, got)
    assert got[0] == got[1] and 0 < got[0] < 2e-38  # underflow clamps at exp(-87), no NaN
    assert got[2] == 1.0 and np.isfinite(got[3])


@pytest.mark.skipif(not gemm_f32_avx512.available(), reason="the packed fp32 GEMM needs AVX-512")
@pytest.mark.parametrize("m", [1, 3, 5, 9, 12, 13, 22, 40, 128])
@pytest.mark.parametrize("threads", [1, 2])
def test_f32_linear_on_packed_weights_matches_the_reference(m: int, threads: int) -> None:
    """Every block height (12, 8, 4, 1) and its padded rows, the GELU and the LN epilogues."""
    import numba

    k, n = 72, 96
    x = RNG.standard_normal((m, k)).astype(np.float32)
    w = (RNG.standard_normal((k, n)) / 8).astype(np.float32)
    wp = gemm_f32_avx512.pack(w)
    assert wp.shape == (n // 16, k, 16) and wp.ctypes.data % 64 == 0
    bias, g, b = (RNG.standard_normal(n).astype(np.float32) for _ in range(3))
    res = RNG.standard_normal((m, n)).astype(np.float32)
    y = x.astype(np.float64) @ w + bias
    gelu, normed = np.full((m, n), np.nan, np.float32), np.full((m, n), np.nan, np.float32)
    before = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))  # type: ignore[attr-defined]
    try:
        f32_linear(x, w, gelu, bias, "gelu_erf", packed=wp)
        f32_linear(x, w, normed, bias, "none", res, (g, b, 1e-12), packed=wp)
    finally:
        numba.set_num_threads(before)
    np.testing.assert_allclose(gelu, _gelu(y), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(normed, _ln(y + res, g, b, 1e-12), rtol=1e-4, atol=1e-4)


def test_pack_refuses_what_the_kernel_cannot_take() -> None:
    assert not gemm_f32_avx512.packable(np.zeros((8, 40), np.float32))  # N not a multiple of 32
    assert not gemm_f32_avx512.packable(np.zeros((8, 64), np.float64))
    x = np.zeros((2, 8), np.float32)
    with pytest.raises(ValueError, match="packed"):
        bad = np.zeros((4, 8, 8), np.float32)  # strips of 8 columns: not what pack makes
        f32_linear(x, np.zeros((8, 64), np.float32), np.zeros((2, 64), np.float32), packed=bad)
