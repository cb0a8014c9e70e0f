"""AWQ/GPTQ import and tinygemm export on synthetic checkpoints packed here, independently."""

from __future__ import annotations

import numpy as np
import pytest

from anvil_kernels import dequantize, from_awq, from_gptq, quantize, tinygemm_unpack, to_tinygemm
from anvil_kernels.format import bf16_bits_to_f32


def _pack_words(vals: np.ndarray, slots: list[int]) -> np.ndarray:
    """Pack 8 values 0..15 into an int32: value ``vals[..., c]`` goes to nibble ``slots[c]``."""
    word = np.zeros(vals.shape[:-1], dtype=np.uint64)
    for c in range(8):
        word |= vals[..., c].astype(np.uint64) << np.uint64(4 * slots[c])
    return word.astype(np.uint32).view(np.int32)


def _expected(q: np.ndarray, z: np.ndarray, s: np.ndarray, g: int) -> np.ndarray:
    """(q - z) * s in float32 arithmetic, the same way the dequantizer rounds."""
    zf = np.repeat(z.astype(np.float32), g, axis=0)
    sf = np.repeat(s.astype(np.float32), g, axis=0)
    return (q.astype(np.float32) - zf) * sf


def _synthetic(rng: np.random.Generator, k: int, n: int, g: int) -> tuple[np.ndarray, ...]:
    q = rng.integers(0, 16, size=(k, n))
    z = rng.integers(0, 16, size=(k // g, n))
    s = rng.uniform(0.001, 0.1, size=(k // g, n)).astype(np.float16)
    return q, z, s


@pytest.mark.parametrize(("k", "n", "g"), [(256, 64, 128), (128, 24, 32)])
def test_awq_import_is_exact(rng: np.random.Generator, k: int, n: int, g: int) -> None:
    q, z, s = _synthetic(rng, k, n, g)
    # AWQ: column 8c + order[i] lives in nibble i, i.e. column offset c -> nibble slot[c]
    order = [0, 2, 4, 6, 1, 3, 5, 7]
    slot = [order.index(c) for c in range(8)]
    qweight = _pack_words(q.reshape(k, n // 8, 8), slot)
    qzeros = _pack_words(z.reshape(k // g, n // 8, 8), slot)
    w = from_awq(qweight, qzeros, s, group_size=g)
    assert (w.k, w.n, w.group_size, w.scale_dtype) == (k, n, g, "fp16")
    np.testing.assert_array_equal(dequantize(w), _expected(q, z, s, g))


@pytest.mark.parametrize(("k", "n", "g"), [(256, 16, 128), (64, 8, 32)])
def test_gptq_import_is_exact(rng: np.random.Generator, k: int, n: int, g: int) -> None:
    q, z, s = _synthetic(rng, k, n, g)
    z[0, 0] = 0  # stored as (0 - 1) & 15 = 15, reads back as 16: GPTQ's own behaviour
    # GPTQ: rows 8i .. 8i+7 of a column in one int32, low nibble first
    qweight = _pack_words(q.reshape(k // 8, 8, n).transpose(0, 2, 1), list(range(8)))
    qzeros = _pack_words(((z - 1) & 15).reshape(k // g, n // 8, 8), list(range(8)))
    g_idx = (np.arange(k) // g).astype(np.int32)
    w, perm = from_gptq(qweight, qzeros, s, g_idx, group_size=g)
    assert perm is None
    z_eff = np.where(z == 0, 16, z)
    np.testing.assert_array_equal(dequantize(w), _expected(q, z_eff, s, g))


def test_gptq_act_order_returns_permutation(rng: np.random.Generator) -> None:
    k, n, g = 128, 16, 32
    q, z, s = _synthetic(rng, k, n, g)
    z = np.maximum(z, 1)
    g_idx = rng.permutation(np.arange(k) // g).astype(np.int32)  # each row's group, shuffled
    qweight = _pack_words(q.reshape(k // 8, 8, n).transpose(0, 2, 1), list(range(8)))
    qzeros = _pack_words((z - 1).reshape(k // g, n // 8, 8), list(range(8)))
    w, perm = from_gptq(qweight, qzeros, s, g_idx, group_size=g)
    assert perm is not None and sorted(perm.tolist()) == list(range(k))
    # original W[r] = (q[r] - z[g_idx[r]]) * s[g_idx[r]]; permuted rows must be grouped
    w_orig = (q.astype(np.float32) - z[g_idx].astype(np.float32)) * s[g_idx].astype(np.float32)
    np.testing.assert_array_equal(dequantize(w), w_orig[perm])
    x = rng.standard_normal((3, k))
    np.testing.assert_allclose(x[:, perm] @ dequantize(w), x @ w_orig, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_tinygemm_export_redequantizes(rng: np.random.Generator, dtype: str) -> None:
    k, n, g = 256, 24, 64
    w = quantize(rng.standard_normal((k, n)).astype(np.float32), group_size=g)
    t = to_tinygemm(w, dtype=dtype)  # type: ignore[arg-type]
    assert t.weight.shape == (n, k // 2) and t.weight.dtype == np.uint8
    assert t.scales_and_zeros.shape == (k // g, n, 2)
    # unpack by the documented byte formula: byte = (q[n, 2k] << 4) | q[n, 2k + 1]
    q = np.empty((n, k), np.float64)
    q[:, 0::2] = t.weight >> 4
    q[:, 1::2] = t.weight & 15
    np.testing.assert_array_equal(tinygemm_unpack(t.weight), q.astype(np.int32))
    sz = t.scales_and_zeros if dtype == "fp32" else bf16_bits_to_f32(t.scales_and_zeros)
    scale = np.repeat(sz[..., 0].astype(np.float64), g, axis=0)  # (K, N)
    zero = np.repeat(sz[..., 1].astype(np.float64), g, axis=0)
    tiny = (q.T - 8.0) * scale + zero  # tinygemm's dequant, (K, N)
    ref = dequantize(w).astype(np.float64)
    if dtype == "fp32":
        np.testing.assert_allclose(tiny, ref, rtol=0, atol=1e-6 * np.abs(ref).max())
    else:  # bf16 rounds scale and zero' (8 bits of mantissa): error <= ~16 * 2^-8 * scale
        s = np.repeat(w.scales_f32.astype(np.float64), g, axis=0)
        assert np.all(np.abs(tiny - ref) <= 16 * 2.0**-8 * s * 1.01)


def test_tinygemm_against_torch_cpu(rng: np.random.Generator) -> None:
    torch = pytest.importorskip(
        "torch", reason="torch is a test-only package that .ci/run installs (CPU wheel); not in the uv lock"
    )
    k, n, g = 256, 32, 64
    w = quantize(rng.standard_normal((k, n)).astype(np.float32), group_size=g)
    t = to_tinygemm(w, dtype="fp32")
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
        torch.from_numpy(tinygemm_unpack(t.weight)), 2
    )
    eye = torch.eye(k, dtype=torch.float32)
    got = torch.ops.aten._weight_int4pack_mm_for_cpu(eye, packed, g, torch.from_numpy(t.scales_and_zeros))
    ref = dequantize(w)
    np.testing.assert_allclose(got.numpy(), ref, rtol=0, atol=1e-5 * float(np.abs(ref).max()))
