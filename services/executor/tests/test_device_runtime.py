"""The GPU runtime's host-side logic, on the CPU: device selection, shape buckets and the launch
table resolved against bank addresses (what the GPU backend captures into CUDA graphs)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from anvil_compiler.options import CompileOptions
from anvil_compiler.pipeline import compile_model
from anvil_core.proto_gen import plan_generated as pg
from anvil_executor.device import DeviceError, DeviceSpec, open_device, parse_device
from anvil_executor.plan_runtime.buckets import Buckets, batch_buckets, seq_buckets
from anvil_executor.plan_runtime.launch import resolve_launches
from anvil_executor.plan_runtime.plan import load_plan

sys.path.insert(0, str(Path(__file__).parents[2] / "compiler" / "tests"))
from onnx_models import mlp_bytes


def test_parse_device_accepts_cpu_and_cuda_ordinals_only() -> None:
    assert parse_device("cpu") == DeviceSpec("cpu")
    assert parse_device("cuda") == DeviceSpec("cuda", 0)
    assert parse_device(" CUDA:3 ") == DeviceSpec("cuda", 3)
    assert str(parse_device("cuda:1")) == "cuda:1"
    for bad in ("gpu", "cuda:", "cuda:-1", "cuda:x", "cpu:0", ""):
        with pytest.raises(ValueError, match="ANVIL_DEVICE"):
            parse_device(bad)


def test_a_cuda_device_without_cupy_refuses_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy -> ImportError
    with pytest.raises(DeviceError, match="needs CuPy"):
        open_device(parse_device("cuda:0"))
    assert open_device(parse_device("cpu")) == "cpu"


def test_buckets_cover_every_shape_with_bounded_padding() -> None:
    assert batch_buckets(64) == (1, 2, 4, 8, 16, 32, 64)
    assert batch_buckets(48) == (1, 2, 4, 8, 16, 32, 48)
    assert batch_buckets(300) == (1, 2, 4, 8, 16, 32, 64, 128, 192, 256, 300)  # steps of 64 above 64
    assert seq_buckets(1) == (1,)
    seq = seq_buckets(512)
    assert seq[0] == 8 and seq[-1] == 512 and list(seq) == sorted(set(seq))
    b = Buckets.for_plan(64, 512)
    for tokens in range(1, 513):
        _, t = b.pick(1, tokens)
        assert t >= tokens
        if tokens > 16:  # past the first steps a sequence pads at most ~25% (+ a 16-token step)
            assert t <= tokens * 1.25 + 16
    for rows in range(1, 65):
        bb, _ = b.pick(rows, 8)
        assert rows <= bb < 2 * rows or bb == rows
    with pytest.raises(ValueError, match="exceeds the largest bucket"):
        b.pick(65, 8)
    with pytest.raises(ValueError, match="exceeds the largest bucket"):
        b.pick(1, 513)
    assert Buckets.waste([(1, 30), (1, 40)], (2, 40)) == pytest.approx(1 - 70 / 80)


def _mlp_plan(tmp_path: Path) -> Path:
    """x (b, 32) -> MatMul + bias + Relu (64) -> MatMul (8), compiled without building kernels."""
    data = mlp_bytes(d_in=32, hidden=64, d_out=8)
    opts = CompileOptions(quantize=False, max_batch=8)
    compile_model("onnx", data, "mlp", opts, tmp_path, "k1", build=False)
    return tmp_path / "plan.bin"


def test_launch_table_points_into_the_banks_and_follows_the_batch(tmp_path: Path) -> None:
    plan = load_plan(_mlp_plan(tmp_path)).plan
    act, wts = 1 << 40, 1 << 41
    small = resolve_launches(plan, act, wts, 1, 1)
    big = resolve_launches(plan, act, wts, 8, 1)
    assert [x.kernel for x in small] == [x.kernel for x in big] and len(small) == len(plan.ops)
    for launch, op in zip(big, plan.ops, strict=True):
        for a, arg in zip(op.args, launch.args, strict=True):
            if a.kind == pg.ArgKind.TENSOR:
                assert int(arg) == act + int(plan.tensors[a.index].offset)
            elif a.kind == pg.ArgKind.WEIGHT and a.index >= 0:
                assert int(arg) == wts + int(plan.weights[a.index].offset)
            elif a.kind == pg.ArgKind.WEIGHT:
                assert int(arg) == 0  # an absent optional weight is a null pointer
    # pointers do not move with the batch; some grid dimension or DIM argument does
    assert any(s.grid != b.grid or s.args != b.args for s, b in zip(small, big, strict=True))
    for s, b in zip(small, big, strict=True):
        assert [type(x) for x in s.args] == [type(x) for x in b.args]
        assert all(isinstance(x, np.uint64 | np.int32 | np.float32) for x in b.args)


def test_a_plan_that_points_outside_itself_is_refused(tmp_path: Path) -> None:
    plan = load_plan(_mlp_plan(tmp_path)).plan
    tensor_arg = next(a for op in plan.ops for a in op.args if a.kind == pg.ArgKind.TENSOR)
    tensor_arg.index = len(plan.tensors) + 5
    with pytest.raises(ValueError, match="out of range"):
        resolve_launches(plan, 0, 0, 1, 1)


def test_fp32_linears_are_handed_to_cublas_with_their_epilogue(tmp_path: Path) -> None:
    from anvil_core.plan_format import ACT_CODES
    from anvil_executor.plan_runtime.cublas_linear import epilogue_args, gemm_ops

    plan = load_plan(_mlp_plan(tmp_path)).plan
    steps = gemm_ops(plan)
    assert [(s.k, s.n) for s in steps] == [(32, 64), (64, 8)]
    assert [s.act for s in steps] == [ACT_CODES["relu"], ACT_CODES["none"]]  # Relu fused into fc1
    assert all(plan.ops[s.op_index].kind in (b"linear", "linear") for s in steps)
    assert [s.rows(plan, 5, 1) for s in steps] == [5, 5]
    block, smem, args = epilogue_args(steps[0], plan, 1 << 40, 1 << 41, 1 << 42)
    assert block[0] % 32 == 0 and block[0] >= 64 and smem == 0  # no LayerNorm: no row buffer
    assert int(args[0]) == 1 << 42 and int(args[5]) == (1 << 40) + int(plan.tensors[steps[0].out].offset)
    assert int(args[2]) == 0  # no residual: a null pointer


def test_compiler_and_executor_share_one_plan_format() -> None:
    """Issue #16's "one plan format": the compiler writes and the executor reads with the same tables
    (anvil_core.plan_format), and the W4A16 kernels' activation codes are the plan's."""
    import anvil_compiler.artifacts as artifacts
    import anvil_compiler.codegen.kernels as compiler_kernels
    import anvil_compiler.lower as lower
    import anvil_executor.plan_runtime.ops as ops
    import anvil_executor.plan_runtime.plan as plan
    from anvil_core import plan_format
    from anvil_kernels.activations import ACTIVATIONS

    assert lower.PLAN_VERSION is plan.PLAN_VERSION is artifacts.PLAN_VERSION is plan_format.PLAN_VERSION
    assert plan.DTYPES is plan_format.DTYPES and lower.DTYPE_CODES is plan_format.DTYPE_CODES
    assert ops.ACT_CODES is compiler_kernels.ACT_CODES is plan_format.ACT_CODES
    assert all(plan_format.ACT_CODES[name] == code for name, code in ACTIVATIONS.items())
