"""The GPU runtime's host path without a GPU: ``GpuPlanModel`` loads fp16 and fp32 plans (MLP and an
HF BERT encoder, unquantized and INT4), lays out its banks, captures every bucket and serves a batch
with CuPy replaced by ``fake_cupy`` (no kernel runs). Every launch is checked against the CUDA
signature of the kernel it names (the artifact's kernels.cu, the runtime epilogues): the kernel exists,
argument count and types match. What the kernels compute is tested on a GPU (test_gpu_fp16.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from anvil_compiler.codegen.build import full_source
from anvil_compiler.frontends.hf import bundle_from_dir
from anvil_compiler.options import CompileOptions
from anvil_compiler.pipeline import compile_graph, import_model
from anvil_core.proto_gen import plan_generated as pg
from anvil_executor.plan_runtime.plan import LoadedPlan, _s, attrs_of

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[2] / "compiler" / "tests"))
import fake_cupy
from onnx_models import mlp_bytes
from tiny_bert import make_tiny_bert


def _lowered(tmp_path: Path, kind: str, quantize: bool, precision: str) -> tuple[LoadedPlan, Any, str]:
    opts = CompileOptions(
        quantize=quantize, max_batch=8, max_seq=32, gpu_precision=precision, max_rel_error=None, group_size=64
    )
    if kind == "mlp":
        g = import_model("onnx", mlp_bytes(op="Sigmoid"), "mlp")
    else:
        g = import_model("hf", bundle_from_dir(make_tiny_bert(tmp_path / "hf", hidden=64)), "tiny")
    low = compile_graph(g, opts)
    return LoadedPlan(pg.PlanT.InitFromPackedBuf(low.plan, 0)), low.weights, full_source(low.sources)


def _requests(kind: str) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    if kind == "mlp":
        return [{"x": rng.standard_normal((n, 64)).astype(np.float32)} for n in (3, 2)]
    return [
        {
            "input_ids": rng.integers(4, 19, (1, n)).astype(np.int64),
            "attention_mask": np.ones((1, n), np.int64),
        }
        for n in (5, 13)
    ]


@pytest.mark.parametrize("kind", ["mlp", "bert"])
@pytest.mark.parametrize("quantize", [False, True])
@pytest.mark.parametrize("precision", ["fp16", "bf16", "fp32"])
def test_every_launch_matches_its_kernel_signature(
    tmp_path: Path, fake: Any, kind: str, quantize: bool, precision: str
) -> None:
    from anvil_executor.plan_runtime.cublas_raw import DATA_TYPES
    from anvil_executor.plan_runtime.gpu_model import GpuPlanModel

    plan, weights, source = _lowered(tmp_path, kind, quantize, precision)
    module = fake_cupy.RawModule(code=source)
    half = precision != "fp32"
    w4a16 = fake_cupy.RawModule() if quantize and half else None  # a fatbin: unchecked
    gpu = GpuPlanModel(plan, weights, module, 0, nan_fill=True, w4a16_module=w4a16)
    assert gpu.precision == precision and gpu.graph_count == len(gpu.buckets.all()), gpu.graph_error
    names = {n for n, _ in fake_cupy.LAUNCHES.calls}
    p = plan.plan
    linear_kernels = {_s(op.kernel) for op in p.ops if _s(op.kind) == "linear"}
    other = {i: op for i, op in enumerate(p.ops) if _s(op.kind) != "linear"}
    gemm_types = {a[8] for n, a in zip(fake.calls, fake.args, strict=True) if n == "cublasGemmEx"}
    if half:
        attr = {"fp16": "kernel_f16", "bf16": "kernel_bf16"}[precision]
        prefix = {"fp16": "anvil_f16_epilogue", "bf16": "anvil_bf16_epilogue"}[precision]
        assert not names & linear_kernels  # linears run on cuBLAS / W4A16
        assert {attrs_of(op)[attr] for op in other.values()} <= names
        assert not {_s(op.kernel) for op in other.values()} & names  # no fp32 kernel in a half plan
        if quantize:
            assert any(n.startswith(f"w4a16_{precision}_") for n in names)  # rows <= 16 on W4A16
            assert not any(n.startswith("w4a16_") and precision not in n for n in names)
        epilogues = {n for n in names if "_epilogue" in n}
        assert epilogues and all(n.startswith(prefix) for n in epilogues), names
        gemms = fake.calls.count("cublasGemmEx")
        assert gemms > 0 if (not quantize or kind == "bert") else gemms == 0
        assert gemm_types <= {DATA_TYPES[precision]}  # cuBLAS in the plan's half type
    else:
        assert {_s(op.kernel) for op in other.values()} <= names
        if quantize:
            assert linear_kernels <= names  # the compiler's INT4 linear.cu
        else:
            assert fake.calls.count("cublasGemmEx") > 0 and gemm_types == {DATA_TYPES["fp32"]}
    fake_cupy.LAUNCHES.calls.clear()
    out = gpu.run(_requests(kind))  # a graph replay each (nothing launched one by one)
    assert not fake_cupy.LAUNCHES.calls
    for o in out:
        assert all(v.dtype == np.float32 for v in o.values())
    eager = GpuPlanModel(plan, weights, module, 0, graphs=False, w4a16_module=w4a16)
    fake_cupy.LAUNCHES.calls.clear()
    eager.run(_requests(kind))  # every kernel launched by the per-batch path, checked again
    assert fake_cupy.LAUNCHES.calls


def test_the_compute_thread_waits_on_an_event_or_the_stream_as_configured(tmp_path: Path, fake: Any) -> None:
    from anvil_executor.plan_runtime.gpu_model import GpuPlanModel

    plan, weights, source = _lowered(tmp_path, "mlp", False, "fp16")
    block = GpuPlanModel(plan, weights, fake_cupy.RawModule(code=source), 0, sync="block")
    assert block._done is not None and block._done.block  # a blocking-sync event, made at load
    block.run(_requests("mlp"))
    block.run(_requests("mlp"))
    assert block._done.recorded == 2  # recorded after each batch, the one object reused
    spin = GpuPlanModel(plan, weights, fake_cupy.RawModule(code=source), 0)  # the default
    assert spin._done is None
    with pytest.raises(ValueError, match="sync must be"):
        GpuPlanModel(plan, weights, fake_cupy.RawModule(code=source), 0, sync="yield")


def test_an_fp16_plan_without_its_w4a16_module_takes_cublas(tmp_path: Path, fake: Any) -> None:
    from anvil_executor.plan_runtime.gpu_model import GpuPlanModel

    plan, weights, source = _lowered(tmp_path, "mlp", True, "fp16")
    gpu = GpuPlanModel(plan, weights, fake_cupy.RawModule(code=source), 0)
    assert {r["backend"] for r in gpu.linear_report()} == {"cublas_f16_dequant"}
    assert not any(n.startswith("w4a16") for n, _ in fake_cupy.LAUNCHES.calls)
    assert fake.calls.count("cublasGemmEx") > 0


def test_plan_gemm_runs_an_fp16_plan_in_fp32_and_fp16_needs_fp16_kernels(tmp_path: Path, fake: Any) -> None:
    from anvil_executor.plan_runtime.gpu_model import GpuPlanModel

    plan, weights, source = _lowered(tmp_path, "bert", False, "fp16")
    gpu = GpuPlanModel(plan, weights, fake_cupy.RawModule(code=source), 0, gemm="plan")
    assert gpu.precision == "fp32"
    with pytest.raises(ValueError, match="gemm must be 'cublas'"):
        GpuPlanModel(plan, weights, fake_cupy.RawModule(code=source), 0, gemm="plan", precision="fp16")
    plan32, weights32, source32 = _lowered(tmp_path / "b", "bert", False, "fp32")
    with pytest.raises(ValueError, match="no fp16 kernels"):
        GpuPlanModel(plan32, weights32, fake_cupy.RawModule(code=source32), 0, precision="fp16")


def test_cublaslt_takes_the_linears_whose_bias_it_can_fuse(tmp_path: Path, fake: Any) -> None:
    """ANVIL_GPU_LT_EPILOGUE: BERT's QKV (bias, no activation, no residual) and an MLP's bias + ReLU
    go to cuBLASLt with its bias epilogue (no epilogue kernel after them); GELU (erf), residual and
    LayerNorm linears keep cuBLAS + the fp16 epilogue; a linear with nothing to add, cuBLAS alone."""
    from anvil_executor.plan_runtime.gpu_model import GpuPlanModel

    for kind in ("bert", "mlp"):
        plan, weights, source = _lowered(tmp_path / kind, kind, False, "fp16")
        fake.calls.clear()
        gpu = GpuPlanModel(plan, weights, fake_cupy.RawModule(code=source), 0, graphs=False, lt_epilogue=True)
        kinds = {k for r in gpu.linear_report() for k in r["rows"]}
        fake_cupy.LAUNCHES.calls.clear()
        fake.calls.clear()
        gpu.run(_requests(kind))
        if kind == "bert":
            assert kinds == {"cublaslt_f16_bias", "cublas_f16+epilogue"}, kinds
            assert fake.calls.count("cublasLtMatmul") == 2  # one QKV per layer
        else:  # fc1: bias + sigmoid (not a cuBLASLt epilogue); fc2: no bias
            assert kinds == {"cublas_f16+epilogue", "cublas_f16"}, kinds
            assert fake.calls.count("cublasGemmEx") == 2 and "cublasLtMatmul" not in fake.calls
            assert len(fake_cupy.LAUNCHES.calls) == 1  # fc1's epilogue only


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_a_shape_cublaslt_has_no_algorithm_for_runs_cublas_and_the_epilogue(
    tmp_path: Path, fake: Any, precision: str
) -> None:
    """The default (ANVIL_GPU_LT_EPILOGUE on): where cuBLASLt's heuristic finds no algorithm, the
    linear runs cuBLAS + the epilogue kernel, the graphs are still captured (no fall back to eager
    launches for the whole model), and the shape is asked about once."""
    from anvil_executor.plan_runtime.cublas_raw import DATA_TYPES
    from anvil_executor.plan_runtime.gpu_model import GpuPlanModel

    plan, weights, source = _lowered(tmp_path, "bert", False, precision)
    fake.lt_algorithms = 0
    gpu = GpuPlanModel(plan, weights, fake_cupy.RawModule(code=source), 0, lt_epilogue=True)
    assert gpu.graph_count == len(gpu.buckets.all()), gpu.graph_error
    assert "cublasLtMatmul" not in fake.calls
    asked = fake.calls.count("cublasLtMatmulAlgoGetHeuristic")
    eager = GpuPlanModel(plan, weights, fake_cupy.RawModule(code=source), 0, graphs=False, lt_epilogue=True)
    fake.clear()
    fake_cupy.LAUNCHES.calls.clear()
    eager.run(_requests("bert"))
    assert "cublasLtMatmul" not in fake.calls and fake.calls.count("cublasLtMatmulAlgoGetHeuristic") <= asked
    prefix = {"fp16": "anvil_f16_epilogue", "bf16": "anvil_bf16_epilogue"}[precision]
    epilogues = [n for n, _ in fake_cupy.LAUNCHES.calls if n.startswith(prefix)]
    assert len(epilogues) == fake.calls.count("cublasGemmEx")  # every linear's epilogue kernel ran
    gemm_types = {a[8] for n, a in zip(fake.calls, fake.args, strict=True) if n == "cublasGemmEx"}
    assert gemm_types == {DATA_TYPES[precision]}
    fake.lt_algorithms = 1
    fake.clear()
    lt = GpuPlanModel(plan, weights, fake_cupy.RawModule(code=source), 0, graphs=False, lt_epilogue=True)
    lt.run(_requests("bert"))
    assert fake.calls.count("cublasLtMatmul") == 2  # QKV of both layers, where it has one
    layouts = {a[1] for n, a in zip(fake.calls, fake.args, strict=True) if n == "cublasLtMatrixLayoutCreate"}
    assert layouts == {DATA_TYPES[precision]}


def test_trace_returns_every_op_output_at_the_bucket_shape(tmp_path: Path, fake: Any) -> None:
    """gpu_trace.trace (the GPU tests' op-by-op diagnosis): one fp32 array per op, eager launches."""
    from anvil_executor.plan_runtime.gpu_model import GpuPlanModel
    from anvil_executor.plan_runtime.gpu_trace import trace

    plan, weights, source = _lowered(tmp_path, "bert", True, "fp16")
    gpu = GpuPlanModel(plan, weights, fake_cupy.RawModule(code=source), 0, w4a16_module=fake_cupy.RawModule())
    (b, t), got = trace(gpu, _requests("bert"))
    assert (b, t) == (2, 16) and len(got) == len(plan.plan.ops)
    for (name, kind, arr), op in zip(got, plan.plan.ops, strict=True):
        assert (name, kind) == (_s(op.name), _s(op.kind)) and arr.dtype == np.float32
        assert arr.shape == plan.shape(int(op.outputs[0]), b, t)


def test_runs_and_their_phase_times_are_counted_and_exported_per_model(tmp_path: Path, fake: Any) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from anvil_executor import metrics
    from anvil_executor.plan_runtime.gpu_model import PHASES, GpuPlanModel
    from anvil_executor.plan_runtime.lanes import LanedPlan, use_lane

    plan, weights, source = _lowered(tmp_path, "mlp", False, "fp16")
    lanes = [GpuPlanModel(plan, weights, fake_cupy.RawModule(code=source), 0) for _ in range(2)]
    laned = LanedPlan(lanes)
    laned.run(_requests("mlp"))  # warm-up: forgotten below, as the executor does after loading
    laned.reset_padding()
    assert laned.runs == 0 and laned.phase_ns == [0] * len(PHASES)
    laned.run(_requests("mlp"))
    with use_lane(1):
        laned.run(_requests("mlp"))
    assert [lane.runs for lane in lanes] == [1, 1]  # one chunk each: the two requests fit one bucket
    assert laned.runs == 2 and all(ns > 0 for ns in laned.phase_ns)
    assert laned.phase_ns == [a + b for a, b in zip(lanes[0].phase_ns, lanes[1].phase_ns, strict=True)]
    registry = CollectorRegistry()
    registry.register(metrics._GpuPhases(lambda: {"mlp": laned, "cpu-model": object()}))
    text = generate_latest(registry).decode()
    assert 'anvil_executor_gpu_runs_total{model="mlp"} 2.0' in text
    for phase, ns in zip(PHASES, laned.phase_ns, strict=True):
        assert f'anvil_executor_gpu_phase_us_total{{model="mlp",phase="{phase}"}} {ns / 1000}' in text
    assert "cpu-model" not in text  # a plan without phase times is left out


def test_a_batch_staged_where_a_bigger_one_ran_sees_zeros_not_its_rows(tmp_path: Path, fake: Any) -> None:
    """The pinned input slots are made once per bucket and reused: a batch staged into the bucket a
    fuller one used before sees its own tokens and zeros after them (the padding), nothing left over."""
    from anvil_executor.plan_runtime.gpu_model import GpuPlanModel

    plan, weights, source = _lowered(tmp_path, "bert", False, "fp16")
    gpu = GpuPlanModel(plan, weights, fake_cupy.RawModule(code=source), 0)

    def req(n: int, token: int) -> dict[str, np.ndarray]:
        return {"input_ids": np.full((1, n), token, np.int64), "attention_mask": np.ones((1, n), np.int64)}

    gpu.run([req(9, 7), req(9, 7), req(9, 7)])
    bucket = gpu._stage([req(9, 11), req(3, 11), req(3, 11)], [9, 3, 3], 9)  # the same bucket
    assert bucket == gpu.buckets.pick(3, 9)
    ids = gpu._pinned("input_ids", *bucket)
    assert ids is gpu._pinned("input_ids", *bucket)  # one array per bucket, reused
    assert (ids[0, :9] == 11).all() and (ids[1:3, :3] == 11).all()
    assert not ids[0, 9:].any() and not ids[1:3, 3:].any() and not ids[3:].any()  # no 7 left anywhere


def test_an_fp16_plan_refuses_float_inputs_past_fp16s_range(tmp_path: Path, fake: Any) -> None:
    """|x| > 65,504 would run as inf in an fp16 plan: refused with the remedy (a clear 400), per
    request, before batching; bf16 and fp32 plans take it, and so do the lanes of a laned plan."""
    from anvil_core.model_spec import SpecError
    from anvil_executor.plan_runtime.gpu_model import GpuPlanModel
    from anvil_executor.plan_runtime.lanes import LanedPlan

    big = {"x": np.full((1, 64), 1e5, np.float32)}
    fine = {"x": np.full((1, 64), 6.5e4, np.float32)}
    odd = {"x": np.array([[np.inf, -np.inf, np.nan, *[1.0] * 61]], np.float32)}  # the client's own values
    plan, weights, source = _lowered(tmp_path, "mlp", False, "fp16")
    f16 = GpuPlanModel(plan, weights, fake_cupy.RawModule(code=source), 0)
    laned = LanedPlan([f16, GpuPlanModel(plan, weights, fake_cupy.RawModule(code=source), 0)])
    for model in (f16, laned):
        with pytest.raises(SpecError, match=r"magnitude 1e\+05 exceeds fp16's range .* --gpu-precision bf16"):
            model.check_request(big)
        model.check_request(fine)
        model.check_request(odd)
    for precision in ("bf16", "fp32"):
        plan, weights, source = _lowered(tmp_path / precision, "mlp", False, precision)
        GpuPlanModel(plan, weights, fake_cupy.RawModule(code=source), 0).check_request(big)


class _PreMarkerModule(fake_cupy.RawModule):
    """An older artifact's w4a16.fatbin: every kernel but the PDL marker (its kernels never wait)."""

    def get_function(self, name: str) -> fake_cupy.Function:
        if name == "w4a16_pdl_marker":
            raise KeyError(f"no kernel {name!r} in the module")
        return super().get_function(name)


@pytest.mark.parametrize("waits", [True, False])
def test_int4_linears_launch_as_dependents_only_where_the_kernels_wait(
    tmp_path: Path, fake: Any, monkeypatch: pytest.MonkeyPatch, waits: bool
) -> None:
    """pdl=True: every W4A16 launch of a half plan goes through the PDL launcher (the same kernel,
    grid, block and arguments) when the artifact's module has kernels that wait; an older module's
    kernels launch plainly. The other kernels and cuBLAS never go through it."""
    import anvil_kernels.cuda.w4a16_linear as wl
    from anvil_executor.plan_runtime.gpu_model import GpuPlanModel

    through: list[str] = []

    class _Launcher:
        def __call__(
            self, fn: Any, grid: Any, block: Any, args: tuple[Any, ...], shared_mem: int = 0
        ) -> None:
            through.append(fn.name)
            fn(grid, block, args, shared_mem=shared_mem)  # recorded and checked as a plain launch is

    monkeypatch.setattr(wl, "default_launcher", _Launcher)  # the process's launcher: this stand-in
    plan, weights, source = _lowered(tmp_path, "mlp", True, "fp16")
    w4a16 = fake_cupy.RawModule() if waits else _PreMarkerModule()
    gpu = GpuPlanModel(
        plan, weights, fake_cupy.RawModule(code=source), 0, graphs=False, w4a16_module=w4a16, pdl=True
    )
    assert gpu._lin16 is not None and gpu._lin16.pdl is waits
    fake_cupy.LAUNCHES.calls.clear()
    gpu.run(_requests("mlp"))
    w4 = [n for n, _ in fake_cupy.LAUNCHES.calls if n.startswith("w4a16_")]
    assert w4  # the plan's INT4 linears ran on W4A16 (rows <= 16)
    assert through == (w4 if waits else [])
    w4_entries = [r for r in gpu.linear_report() if any(k.startswith("w4a16") for k in r["rows"])]
    assert w4_entries and all(r.get("pdl", False) is waits for r in w4_entries)
