"""LayerNorm, masked softmax, attention, embedding and pooling against float64 references."""

from __future__ import annotations

import numpy as np
import pytest

from anvil_kernels import Workspace, attention, embedding, layer_norm, masked_softmax, mean_pool_l2
from anvil_kernels.tolerances import (
    ATTENTION_ATOL,
    ATTENTION_RTOL,
    LAYER_NORM_ATOL,
    LAYER_NORM_RTOL,
    POOL_ATOL,
    POOL_RTOL,
    SOFTMAX_ATOL,
    SOFTMAX_RTOL,
)


def _mask(rng: np.random.Generator, b: int, t: int) -> np.ndarray:
    lengths = rng.integers(1, t + 1, size=b)
    lengths[0] = t  # one full row
    return np.arange(t)[None, :] < lengths[:, None]


def _softmax_ref(x: np.ndarray, valid: np.ndarray) -> np.ndarray:
    z = np.where(valid, x, -np.inf)
    mx = z.max(axis=-1, keepdims=True)
    e = np.where(valid, np.exp(z - np.where(np.isfinite(mx), mx, 0.0)), 0.0)
    total = e.sum(axis=-1, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


@pytest.mark.parametrize("shape", [(1, 8), (3, 17), (2, 5, 384)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_layer_norm(rng: np.random.Generator, shape: tuple[int, ...], with_residual: bool) -> None:
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    res = rng.standard_normal(shape).astype(np.float32) if with_residual else None
    gamma = rng.standard_normal(shape[-1]).astype(np.float32)
    beta = rng.standard_normal(shape[-1]).astype(np.float32)
    out = np.empty(shape, np.float32)
    layer_norm(x, gamma, beta, 1e-5, out, residual=res)
    y = x.astype(np.float64) + (0.0 if res is None else res.astype(np.float64))
    mu = y.mean(-1, keepdims=True)
    ref = (y - mu) / np.sqrt(y.var(-1, keepdims=True) + 1e-5) * gamma + beta
    np.testing.assert_allclose(out, ref, rtol=LAYER_NORM_RTOL, atol=LAYER_NORM_ATOL)


@pytest.mark.parametrize("shape", [(1, 1), (3, 17), (2, 3, 5, 33)])
def test_masked_softmax(rng: np.random.Generator, shape: tuple[int, ...]) -> None:
    x = (rng.standard_normal(shape) * 30).astype(np.float32)  # large logits: needs max-subtraction
    mask = _mask(rng, shape[0], shape[-1])
    out = np.empty(shape, np.float32)
    masked_softmax(x, mask, out)
    valid = mask.reshape(shape[0], *([1] * (len(shape) - 2)), shape[-1])
    ref = _softmax_ref(x.astype(np.float64), valid)
    np.testing.assert_allclose(out, ref, rtol=SOFTMAX_RTOL, atol=SOFTMAX_ATOL)
    assert np.all(out[np.broadcast_to(~valid, shape)] == 0.0)


def test_softmax_fully_masked_row_is_zero_not_nan(rng: np.random.Generator) -> None:
    x = rng.standard_normal((2, 6)).astype(np.float32)
    mask = np.array([[1, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]], dtype=np.int64)
    out = np.empty_like(x)
    masked_softmax(x, mask, out)
    assert np.all(out[1] == 0.0) and abs(out[0].sum() - 1.0) < 1e-6


@pytest.mark.parametrize(("b", "h", "t", "d"), [(1, 1, 1, 4), (2, 3, 7, 16), (3, 2, 33, 8)])
def test_attention(rng: np.random.Generator, b: int, h: int, t: int, d: int) -> None:
    q, k, v = (rng.standard_normal((b, h, t, d)).astype(np.float32) for _ in range(3))
    mask = _mask(rng, b, t)
    out = np.empty_like(q)
    attention(q, k, v, mask, out, workspace=Workspace())
    scores = np.einsum("bhid,bhjd->bhij", q.astype(np.float64), k.astype(np.float64)) / np.sqrt(d)
    p = _softmax_ref(scores, mask[:, None, None, :])
    ref = np.einsum("bhij,bhjd->bhid", p, v.astype(np.float64))
    np.testing.assert_allclose(out, ref, rtol=ATTENTION_RTOL, atol=ATTENTION_ATOL)


def test_attention_custom_scale_and_empty_batch(rng: np.random.Generator) -> None:
    q, k, v = (rng.standard_normal((2, 1, 5, 4)).astype(np.float32) for _ in range(3))
    mask = np.array([[True] * 5, [False] * 5])
    out = np.empty_like(q)
    attention(q, k, v, mask, out, scale=0.3)
    s = np.einsum("id,jd->ij", q[0, 0].astype(np.float64), k[0, 0].astype(np.float64)) * 0.3
    ref = _softmax_ref(s, np.ones(5, bool)) @ v[0, 0].astype(np.float64)
    np.testing.assert_allclose(out[0, 0], ref, rtol=ATTENTION_RTOL, atol=ATTENTION_ATOL)
    assert np.all(out[1] == 0.0)


@pytest.mark.parametrize("id_dtype", [np.int32, np.int64])
def test_embedding(rng: np.random.Generator, id_dtype: type) -> None:
    table = rng.standard_normal((50, 12)).astype(np.float32)
    ids = rng.integers(0, 50, size=(3, 7)).astype(id_dtype)
    out = np.empty((3, 7, 12), np.float32)
    embedding(ids, table, out)
    np.testing.assert_array_equal(out, table[ids])


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize(("b", "t", "h"), [(1, 1, 3), (4, 9, 33)])
def test_mean_pool_l2(rng: np.random.Generator, normalize: bool, b: int, t: int, h: int) -> None:
    x = rng.standard_normal((b, t, h)).astype(np.float32)
    mask = _mask(rng, b, t)
    out = np.empty((b, h), np.float32)
    mean_pool_l2(x, mask, out, normalize=normalize)
    m = mask[..., None].astype(np.float64)
    ref = (x * m).sum(1) / m.sum(1)
    if normalize:
        ref /= np.maximum(np.linalg.norm(ref, axis=-1, keepdims=True), 1e-12)
    np.testing.assert_allclose(out, ref, rtol=POOL_RTOL, atol=POOL_ATOL)


def test_mean_pool_no_valid_token_gives_zeros(rng: np.random.Generator) -> None:
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    mask = np.array([[1, 0, 0], [0, 0, 0]], dtype=np.uint8)
    out = np.empty((2, 4), np.float32)
    mean_pool_l2(x, mask, out)
    assert np.all(out[1] == 0.0) and abs(np.linalg.norm(out[0]) - 1.0) < 1e-6
