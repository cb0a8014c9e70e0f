"""Bad input raises ValueError naming the constraint: one test per case, never a crash."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from anvil_kernels import (
    Int4Weight,
    attention,
    embedding,
    from_awq,
    from_gptq,
    int4_linear,
    layer_norm,
    masked_softmax,
    mean_pool_l2,
    quantize,
    to_tinygemm,
)

K, N, M, G = 128, 16, 3, 64
F32 = np.float32
W = quantize(np.random.default_rng(0).standard_normal((K, N)).astype(F32), group_size=G)


def _x(shape: tuple[int, ...] = (M, K), dtype: type = F32) -> np.ndarray:
    return np.ones(shape, dtype)


def _readonly(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


def _linear(**kw: object) -> Callable[[], object]:
    args: dict[str, object] = {"x": _x(), "w": W, "out": _x((M, N))}
    args.update(kw)
    return lambda: int4_linear(**args)  # type: ignore[arg-type]


def _aliased_residual() -> None:
    out = _x((M, N))
    int4_linear(_x(), W, out, residual=out)


def _gptq_bad_g_idx() -> None:
    g_idx = np.zeros(K, np.int32)  # every row in group 0
    qweight = np.zeros((K // 8, N), np.int32)
    from_gptq(qweight, np.zeros((K // G, N // 8), np.int32), np.ones((K // G, N), np.float16), g_idx, G)


def _awq(qweight_dtype: type = np.int32, scales_n: int = N) -> None:
    qweight = np.zeros((K, N // 8), qweight_dtype)
    from_awq(qweight, np.zeros((K // G, N // 8), np.int32), np.ones((K // G, scales_n), np.float16), G)


def _weight(**kw: np.ndarray) -> None:
    fields = {"packed": W.packed, "scales": W.scales, "zeros": W.zeros}
    fields.update(kw)
    Int4Weight(fields["packed"], fields["scales"], fields["zeros"], G, K, N, "fp16")


def _ln(gamma_h: int = K, eps: float = 1e-5, in_place: bool = False) -> None:
    x = _x()
    layer_norm(x, _x((gamma_h,)), _x((K,)), eps, x if in_place else _x())


def _attn(k_shape: tuple[int, ...] = (1, 2, 4, 8), v_fortran: bool = False) -> None:
    shape = (1, 2, 4, 8)
    v = np.asfortranarray(_x(shape)) if v_fortran else _x(shape)
    attention(_x(shape), _x(k_shape), v, np.ones((1, 4), bool), _x(shape))


def _softmax(mask: np.ndarray) -> None:
    masked_softmax(_x((2, 5)), mask, _x((2, 5)))


def _pool(x_shape: tuple[int, int, int], mask_shape: tuple[int, int]) -> None:
    mean_pool_l2(_x(x_shape), np.ones(mask_shape, bool), _x((x_shape[0], x_shape[2])))


def _embed(ids: np.ndarray) -> None:
    embedding(ids, _x((50, 4)), _x((*ids.shape, 4)))


CASES: dict[str, tuple[Callable[[], object], str]] = {
    "x_float64": (_linear(x=_x(dtype=np.float64)), "x must have dtype float32"),
    "x_not_contiguous": (_linear(x=np.ones((K, M), F32).T), "x must be C-contiguous"),
    "x_wrong_k": (_linear(x=_x((M, K + 2))), "x must have shape (M, K=128)"),
    "x_not_array": (_linear(x=[[1.0] * K]), "x must be a numpy.ndarray"),
    "out_wrong_shape": (_linear(out=_x((M, N + 1))), "out must have shape (3, 16)"),
    "out_readonly": (_linear(out=_readonly(_x((M, N)))), "out must be writable"),
    "bias_wrong_shape": (_linear(bias=_x((N + 1,))), "bias must have shape (16,)"),
    "residual_wrong_dtype": (_linear(residual=_x((M, N), np.float64)), "residual must have dtype float32"),
    "unknown_activation": (_linear(activation="tanh"), "activation must be one of"),
    "residual_aliases_out": (_aliased_residual, "out must not share memory with residual"),
    "w_not_int4": (_linear(w=np.ones((K, N), F32)), "w must be an Int4Weight"),
    "group_not_dividing_k": (
        lambda: quantize(_x((96, N)), group_size=64),
        "K=96 must be a positive multiple of group_size=64",
    ),
    "unsupported_group_size": (
        lambda: quantize(_x((96, N)), group_size=48),
        "group_size must be one of (32, 64, 128, 256)",
    ),
    "quantize_nan": (lambda: quantize(np.full((K, N), np.nan, F32)), "w must be finite"),
    "quantize_int_dtype": (
        lambda: quantize(np.ones((K, N), np.int32)),
        "w must have dtype float32 or float64",
    ),
    "quantize_fp16_overflow": (lambda: quantize(np.full((K, N), 1e6, F32)), "overflows fp16"),
    "quantize_bad_scale_dtype": (
        lambda: quantize(_x((K, N)), scale_dtype="fp8"),  # type: ignore[arg-type]
        "scale_dtype must be one of",
    ),
    "weight_packed_shape": (lambda: _weight(packed=W.packed[:-1]), "packed must have shape (64, 16)"),
    "weight_scales_dtype": (lambda: _weight(scales=W.scales.astype(F32)), "scales must have dtype float16"),
    "weight_nonfinite_scale": (
        lambda: _weight(scales=np.full_like(W.scales, np.inf)),
        "scales must be finite",
    ),
    "layer_norm_gamma_shape": (lambda: _ln(gamma_h=K - 1), "gamma must have shape (128,)"),
    "layer_norm_eps": (lambda: _ln(eps=0.0), "eps must be finite and > 0"),
    "layer_norm_in_place": (lambda: _ln(in_place=True), "out must not share memory with x"),
    "softmax_mask_shape": (lambda: _softmax(np.ones((2, 4), bool)), "mask must have shape (2, 5)"),
    "softmax_mask_float": (lambda: _softmax(np.ones((2, 5), F32)), "mask must have dtype bool"),
    "attention_k_shape": (lambda: _attn(k_shape=(1, 2, 5, 8)), "k must have shape (1, 2, 4, 8)"),
    "attention_v_fortran": (lambda: _attn(v_fortran=True), "v must be C-contiguous"),
    "embedding_id_range": (lambda: _embed(np.array([[0, 50]])), "ids must lie in [0, V=50)"),
    "embedding_float_ids": (lambda: _embed(np.array([[0.0, 1.0]])), "ids must have dtype int32 or int64"),
    "pool_mask_shape": (lambda: _pool((2, 3, 4), (2, 4)), "mask must have shape (2, 3)"),
    "pool_empty": (lambda: _pool((2, 0, 4), (2, 0)), "every dimension >= 1"),
    "awq_scales_shape": (lambda: _awq(scales_n=N + 8), "scales must have shape (2, 16)"),
    "awq_qweight_dtype": (lambda: _awq(qweight_dtype=np.int64), "qweight must have dtype int32"),
    "gptq_g_idx_counts": (_gptq_bad_g_idx, "act-order g_idx must assign exactly group_size=64 rows"),
    "tinygemm_dtype": (
        lambda: to_tinygemm(W, dtype="fp16"),  # type: ignore[arg-type]
        "dtype must be 'fp32' or 'bf16'",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_raises_value_error(case: str) -> None:
    call, message = CASES[case]
    with pytest.raises(ValueError) as info:
        call()
    assert message in str(info.value), str(info.value)
