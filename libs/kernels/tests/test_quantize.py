"""INT4 format: RTN error bound, clip search, dequantization, storage dtypes."""

from __future__ import annotations

import numpy as np
import pytest

from anvil_kernels import Int4Weight, dequantize, quantize
from anvil_kernels.format import bf16_bits_to_f32, f32_to_bf16_bits, unpack_nibbles
from anvil_kernels.tolerances import RTN_SLACK


def _ref_dequant(w: Int4Weight) -> np.ndarray:
    q = unpack_nibbles(w.packed).astype(np.float64)
    s = np.repeat(w.scales_f32.astype(np.float64), w.group_size, axis=0)
    z = np.repeat(w.zeros_f32.astype(np.float64), w.group_size, axis=0)
    return (q - z) * s


def _rtn_bound_holds(w: Int4Weight, ref: np.ndarray) -> None:
    deq = dequantize(w).astype(np.float64)
    s = np.repeat(w.scales_f32.astype(np.float64), w.group_size, axis=0)
    err = np.abs(deq - ref)
    assert np.all(err <= s / 2 * (1 + RTN_SLACK) + 1e-7 * np.abs(ref)), float((err / s).max())


@pytest.mark.parametrize("group_size", [32, 64, 128, 256])
@pytest.mark.parametrize("scale_dtype", ["fp16", "bf16", "fp32"])
def test_rtn_error_at_most_half_scale(rng: np.random.Generator, group_size: int, scale_dtype: str) -> None:
    k, n = 2 * group_size, 37
    w = (rng.standard_normal((k, n)) * rng.uniform(0.01, 3.0, size=(1, n))).astype(np.float32)
    w[:, 0] = np.abs(w[:, 0])  # an all-positive column (range must still contain 0)
    w[:, 1] = 0.0  # a degenerate all-zero column
    qw = quantize(w, group_size=group_size, scale_dtype=scale_dtype)
    assert qw.packed.shape == (k // 2, n) and qw.scales.shape == (k // group_size, n)
    z = qw.zeros_f32
    assert np.all((z >= 0) & (z <= 15) & (z == np.round(z)))
    _rtn_bound_holds(qw, w.astype(np.float64))
    np.testing.assert_array_equal(dequantize(qw)[:, 1], 0.0)


def test_float64_input_and_odd_shapes(rng: np.random.Generator) -> None:
    w = rng.standard_normal((384, 5))
    qw = quantize(w, group_size=128)
    _rtn_bound_holds(qw, w.astype(np.float32).astype(np.float64))


def test_dequantize_matches_formula_exactly(rng: np.random.Generator) -> None:
    w = rng.standard_normal((256, 19)).astype(np.float32)
    qw = quantize(w, group_size=64, scale_dtype="fp32")
    out = np.empty((256, 19), np.float32)
    assert dequantize(qw, out) is out
    ref = _ref_dequant(qw)
    np.testing.assert_allclose(out, ref, rtol=1e-7, atol=0)


@pytest.mark.parametrize("scale_dtype", ["fp16", "bf16"])
def test_clip_search_never_worse_than_rtn(rng: np.random.Generator, scale_dtype: str) -> None:
    w = rng.standard_t(df=3, size=(512, 33)).astype(np.float32)  # heavy tails: clipping helps
    ref = w.astype(np.float64)
    rtn = quantize(w, group_size=128, scale_dtype=scale_dtype)
    clip = quantize(w, group_size=128, scale_dtype=scale_dtype, clip_search=True)
    err_rtn = ((dequantize(rtn) - ref) ** 2).reshape(4, 128, 33).sum(axis=1)
    err_clip = ((dequantize(clip) - ref) ** 2).reshape(4, 128, 33).sum(axis=1)
    assert np.all(err_clip <= err_rtn * (1 + 1e-6) + 1e-12)  # per group and column
    assert err_clip.sum() < err_rtn.sum()  # and it actually helps on heavy-tailed data


def test_bf16_bit_helpers_round_to_nearest_even() -> None:
    x = np.array([1.0, 1.00390625, 1.01171875, -2.5, 3.0e38, 0.0], np.float32)
    bits = f32_to_bf16_bits(x)
    back = bf16_bits_to_f32(bits)
    np.testing.assert_array_equal(back[[0, 3, 5]], x[[0, 3, 5]])
    assert back[1] == 1.0  # halfway between 1.0 and 1.0078125 rounds to even (1.0)
    assert back[2] == np.float32(1.015625)  # 1.01171875 is halfway: rounds up to even mantissa
    assert np.all(np.abs(back - x) <= np.abs(x) * 2.0**-8)


def test_weight_is_frozen(rng: np.random.Generator) -> None:
    qw = quantize(rng.standard_normal((64, 4)).astype(np.float32), group_size=32)
    with pytest.raises(AttributeError):
        qw.group_size = 64  # type: ignore[misc]
