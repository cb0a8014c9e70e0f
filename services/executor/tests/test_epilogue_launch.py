"""Which epilogue kernel a cuBLAS linear gets, and with what launch shape (no GPU needed)."""

from __future__ import annotations

from types import SimpleNamespace

from anvil_executor.plan_runtime.cublas_linear import LN_WARP_MAX_N, GemmStep, epilogue_launch

PLAN = SimpleNamespace(
    weights=[SimpleNamespace(offset=o) for o in (0, 4096, 8192, 12288)],
    tensors=[SimpleNamespace(offset=o) for o in (0, 1 << 20, 2 << 20, (3 << 20) + 4)],
)


def _step(n: int, ln: bool, out: int = 2) -> GemmStep:
    return GemmStep(
        op_index=0, x=0, out=out, residual=1 if ln else -1, weight=0, bias=1,
        gamma=2 if ln else -1, beta=3 if ln else -1, k=384, n=n, act=2, eps=1e-12,
    )  # fmt: skip


def test_layer_norm_rows_that_fit_a_warp_get_one_warp_each() -> None:
    kernel, grid, block, smem, args = epilogue_launch(
        _step(384, True), PLAN, 1 << 30, 1 << 29, 1 << 28, m=1000
    )
    assert kernel == "anvil_gemm_epilogue_ln_warp" and smem == 0
    assert grid[0] * (block[0] // 32) >= 1000 > (grid[0] - 1) * (block[0] // 32)  # every row, no spare block
    assert int(args[6]) == 1000 and int(args[7]) == 384


def test_wide_layer_norm_rows_fall_back_to_a_block_per_row() -> None:
    kernel, grid, _, smem, _ = epilogue_launch(
        _step(LN_WARP_MAX_N + 4, True), PLAN, 1 << 30, 1 << 29, 1 << 28, m=7
    )
    assert kernel == "anvil_gemm_epilogue" and grid == (7, 1, 1) and smem == 4 * (LN_WARP_MAX_N + 4)


def test_bias_and_activation_alone_run_four_floats_per_thread() -> None:
    kernel, grid, block, _, args = epilogue_launch(_step(1536, False), PLAN, 1 << 30, 1 << 29, 1 << 28, m=50)
    assert kernel == "anvil_gemm_epilogue_v4"
    assert int(args[4]) == 50 * 1536 // 4 and int(args[5]) == 1536 // 4
    assert grid[0] * block[0] >= int(args[4])  # small tensors: one quad per thread


def test_unaligned_or_odd_widths_take_the_scalar_kernel() -> None:
    assert epilogue_launch(_step(10, False), PLAN, 1 << 30, 1 << 29, 1 << 28, m=5)[0] == "anvil_gemm_epilogue"
    odd_out = _step(1536, False, out=3)  # tensor 3 sits 4 bytes past a 16-byte boundary
    assert epilogue_launch(odd_out, PLAN, 1 << 30, 1 << 29, 1 << 28, m=5)[0] == "anvil_gemm_epilogue"
