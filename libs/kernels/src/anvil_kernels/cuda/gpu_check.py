"""One W4A16 kernel call on the GPU against its CPU twin (``anvil_kernels.int4_linear``), with the
tolerances below: the check the GPU tests run for every kernel (CuPy imported on use).

Tolerance (bf16/fp16 activations): the kernels multiply exactly ((q - z) is an integer, the
tensor cores form exact products and add in fp32) and round once to the output dtype, so against
the twin on the same (rounded) inputs the error is the output rounding (2^-9 relative for bf16,
2^-12 for fp16) plus fp32 summation: ||out - ref|| / ||ref|| <= 1e-2 (bf16) / 2e-3 (fp16), and every
element within 2^-7 (bf16) / 2^-10 (fp16) of |ref| plus 1e-3 of max|ref|. The output starts
NaN-filled, so an element no block wrote fails the check.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anvil_kernels.format import Int4Weight, bf16_bits_to_f32, f32_to_bf16_bits, pack_nibbles
from anvil_kernels.gemm import int4_linear

DT_TOL: dict[str, tuple[float, float]] = {"bf16": (1e-2, 2.0**-7), "fp16": (2e-3, 2.0**-10)}


def has_gpu() -> bool:
    """CuPy imports and sees at least one CUDA device (False on the CI machine)."""
    try:
        import cupy as cp

        return int(cp.cuda.runtime.getDeviceCount()) > 0
    except Exception:  # no cupy, no driver, no device: all mean "skip the GPU tests"
        return False


def random_weight(rng: np.random.Generator, k: int, n: int, g: int, sdt: str = "fp16") -> Int4Weight:
    """Random nibbles, scales in [0.001, 0.05), integer zeros in [0, 16] (GPTQ's range)."""
    q = rng.integers(0, 16, size=(k, n), dtype=np.uint8)
    s = rng.uniform(0.001, 0.05, size=(k // g, n))
    z = rng.integers(0, 17, size=(k // g, n)).astype(np.float32)
    if sdt == "fp16":
        return Int4Weight(pack_nibbles(q), s.astype(np.float16), z.astype(np.float16), g, k, n, "fp16")
    if sdt == "bf16":
        sb, zb = f32_to_bf16_bits(s.astype(np.float32)), f32_to_bf16_bits(z)
        return Int4Weight(pack_nibbles(q), sb, zb, g, k, n, "bf16")
    return Int4Weight(pack_nibbles(q), s.astype(np.float32), z, g, k, n, "fp32")


def to_dev(a: np.ndarray, dt: str) -> tuple[Any, np.ndarray]:
    """float32 -> (device array in dt's storage, the float32 values it holds)."""
    import cupy as cp

    if dt == "bf16":
        bits = f32_to_bf16_bits(a)
        return cp.asarray(bits), bf16_bits_to_f32(bits)
    h = a.astype(np.float16)
    return cp.asarray(h), h.astype(np.float32)


def from_dev(a: Any, dt: str) -> np.ndarray:
    import cupy as cp

    h = cp.asnumpy(a)
    return bf16_bits_to_f32(h) if dt == "bf16" else h.astype(np.float32)


def check_case(
    module: Any,
    rng: np.random.Generator,
    dt: str,
    m: int,
    k: int,
    n: int,
    g: int,
    *,
    act: str = "none",
    use_bias: bool = False,
    use_res: bool = False,
    sdt: str = "fp16",
    **layer_kwargs: Any,
) -> float:
    """Random weight and inputs, one call of a ``W4A16Linear`` (``layer_kwargs``: kernel, split,
    overrides, table) into a NaN-filled output, compared with the twin; returns the relative
    error, raises AssertionError naming the violated bound."""
    import cupy as cp

    from anvil_kernels.cuda.w4a16 import prepack, unprepack
    from anvil_kernels.cuda.w4a16_linear import W4A16Linear

    w = random_weight(rng, k, n, g, sdt)
    layer = W4A16Linear(module, prepack(w), m, dtype=dt, activation=act, **layer_kwargs)  # type: ignore[arg-type]
    x_d, x = to_dev(rng.standard_normal((m, k)).astype(np.float32), dt)
    bias_d, bias = to_dev(rng.standard_normal(n).astype(np.float32), dt) if use_bias else (None, None)
    res_d, res = to_dev(rng.standard_normal((m, n)).astype(np.float32), dt) if use_res else (None, None)
    out_d = cp.full((m, n), 0xFFFF if dt == "bf16" else np.float16(np.nan), dtype=layer.xdtype)  # NaN poison
    layer(x_d, out_d, bias_d, res_d)
    cp.cuda.runtime.deviceSynchronize()
    got = from_dev(out_d, dt)
    wref = w if sdt != "fp32" else unprepack(prepack(w))  # the kernels read fp32 scales as bf16
    ref = np.empty((m, n), np.float32)
    int4_linear(x, wref, ref, bias, act, res)
    ch = layer.choice(m)
    return compare(got, ref, dt, f"{ch} M={m} K={k} N={n} g={g} {dt}", weight_error(ch.kernel, dt, x, wref))


def weight_error(kernel: str, dt: str, x: np.ndarray, w: Int4Weight) -> np.ndarray | None:
    """For a scaled-A tensor-core config (TcConfig.sa or MtcConfig.sa), which multiplies weights
    rounded to the activations' type (the scale rounded once, the product once: relative error <= 2u, u = 2^-9
    for bf16, 2^-12 for fp16), the rigorous bound on that rounding's effect per output element:
    2u * (|x| @ |W|), times 1.2 for the activations' slope (gelu's is below 1.13). None otherwise."""
    from anvil_kernels.cuda.w4a16_mtc import MTC_CONFIGS
    from anvil_kernels.cuda.w4a16_tc import TC_CONFIGS
    from anvil_kernels.quantize import dequantize

    cfg = TC_CONFIGS.get(kernel) or MTC_CONFIGS.get(kernel)
    if cfg is None or not cfg.sa:
        return None
    u = 2.0**-9 if dt == "bf16" else 2.0**-12
    return np.float32(1.2 * 2 * u) * (np.abs(x) @ np.abs(dequantize(w)))


def compare(got: np.ndarray, ref: np.ndarray, dt: str, where: str, extra: np.ndarray | None = None) -> float:
    """The tolerances of the module docstring, plus ``extra`` (per element, from
    ``weight_error``) where the kernel rounds the weights; returns the relative error."""
    assert np.all(np.isfinite(got)), f"{where}: {int((~np.isfinite(got)).sum())} unwritten (NaN) outputs"
    rel, elem = DT_TOL[dt]
    err = float(np.linalg.norm(got - ref) / max(float(np.linalg.norm(ref)), 1e-30))
    assert err <= rel, f"{where}: relative error {err:.3g} > {rel}"
    bound = elem * np.abs(ref) + 1e-3 * float(np.abs(ref).max())
    if extra is not None:
        bound = bound + extra
    worst = float((np.abs(got - ref) / bound).max())
    assert worst <= 1.0, f"{where}: max |err| / bound {worst:.3g}"
    return err
