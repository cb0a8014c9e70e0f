"""GPU vs CPU: each plan's kernels (fatbin from nvcc) run with cupy.RawModule on the GPU, driven
only by the plan's launch table (grid, block, args), and match the CPU runtime op by op.

Self-contained for one device call on the H200: builds the ONNX models with torch (installed
there), compiles, loads the fatbin, runs. Skips where cupy, a GPU, nvcc, torch or onnx is absent.
    pytest -q -m gpu services/compiler/tests/test_plan_gpu.py
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")
torch = pytest.importorskip(
    "torch", reason="torch is a test-only package that .ci/run installs (CPU wheel); not in the uv lock"
)
if shutil.which("nvcc") is None:
    pytest.skip("nvcc not on PATH", allow_module_level=True)
try:
    if cp.cuda.runtime.getDeviceCount() < 1:
        pytest.skip("no CUDA device", allow_module_level=True)
except Exception as exc:  # no driver
    pytest.skip(f"no CUDA device: {exc}", allow_module_level=True)

from torch_models import export_bert, export_mlp  # noqa: E402

from anvil_compiler.codegen.build import build_kernels  # noqa: E402
from anvil_compiler.frontends.onnx import load_onnx  # noqa: E402
from anvil_compiler.options import CompileOptions  # noqa: E402
from anvil_compiler.pipeline import compile_graph  # noqa: E402
from anvil_core.proto_gen import plan_generated as pg  # noqa: E402
from anvil_executor.plan_runtime.model import PlanModel  # noqa: E402
from anvil_executor.plan_runtime.plan import DTYPES, LoadedPlan, eval_dim  # noqa: E402


def _arch() -> str:
    return f"sm_{cp.cuda.Device(0).compute_capability}"  # e.g. "90"


def _run_gpu(
    plan: Any, weights: dict[str, np.ndarray], fatbin: Path, feeds: dict[str, np.ndarray], b: int, t: int
) -> dict[str, np.ndarray]:
    """A minimal launcher: device banks at the plan's offsets, kernels launched from the plan."""
    mod = cp.RawModule(path=str(fatbin))
    act = cp.zeros(int(plan.activationBytes) + 256, dtype=cp.uint8)
    wbank = cp.zeros(int(plan.weightBytes) + 256, dtype=cp.uint8)
    for wi in plan.weights:
        arr = np.ascontiguousarray(weights[wi.name.decode()])
        wbank[int(wi.offset) : int(wi.offset) + arr.nbytes] = cp.asarray(arr.reshape(-1).view(np.uint8))

    def tview(i: int) -> Any:
        ti = plan.tensors[i]
        shape = tuple(eval_dim(d, b, t) for d in ti.shape)
        n = int(np.prod(shape)) * np.dtype(DTYPES[ti.dtype]).itemsize
        return act[int(ti.offset) : int(ti.offset) + n].view(DTYPES[ti.dtype]).reshape(shape)

    for io in plan.inputs:
        tview(int(io.tensor))[...] = cp.asarray(feeds[io.name.decode()])
    for op in plan.ops:
        args: list[Any] = []
        for a in op.args:
            if a.kind == pg.ArgKind.TENSOR:
                args.append(tview(int(a.index)))
            elif a.kind == pg.ArgKind.WEIGHT:
                args.append(
                    np.uint64(0)
                    if a.index < 0
                    else np.uint64(wbank.data.ptr + int(plan.weights[a.index].offset))
                )
            elif a.kind == pg.ArgKind.DIM:
                args.append(np.int32(eval_dim(a.dim, b, t)))
            else:
                args.append(np.float32(a.value))
        grid = tuple(max(1, -(-eval_dim(g, b, t) // int(g.div))) for g in op.grid)
        fn = mod.get_function(op.kernel.decode())
        smem = int(op.smemBytes or 0)  # dynamic shared memory the plan recorded (staged attention)
        if smem > 48 * 1024:
            fn.max_dynamic_shared_size_bytes = smem
        fn(grid, tuple(int(x) for x in op.block), tuple(args), shared_mem=smem)
    cp.cuda.Device(0).synchronize()
    return {io.name.decode(): cp.asnumpy(tview(int(io.tensor))) for io in plan.outputs}


@pytest.mark.parametrize("kind", ["mlp", "bert"])
@pytest.mark.parametrize("quantize", [True, False])
def test_gpu_kernels_match_cpu_runtime(tmp_path: Path, kind: str, quantize: bool) -> None:
    path = export_mlp(tmp_path / "m.onnx") if kind == "mlp" else export_bert(tmp_path / "m.onnx")
    low = compile_graph(
        load_onnx(path),
        CompileOptions(quantize=quantize, max_batch=8, max_seq=32, archs=("sm_90",), max_rel_error=None),
    )
    files = build_kernels(low.sources, (_arch(),), tmp_path / "k")
    plan = pg.PlanT.InitFromPackedBuf(low.plan, 0)
    rng = np.random.default_rng(0)
    if kind == "mlp":
        b, t = 5, 1
        feeds = {"x": rng.standard_normal((b, 64)).astype(np.float32)}
    else:
        b, t = 3, 20
        mask = np.ones((b, t), np.int64)
        mask[1, 11:] = 0
        feeds = {"input_ids": rng.integers(0, 500, (b, t)).astype(np.int64), "attention_mask": mask}
    cpu = PlanModel(LoadedPlan(plan), low.weights).forward(feeds)
    gpu = _run_gpu(plan, low.weights, tmp_path / "k" / files["fatbin"], feeds, b, t)
    for name, ref in cpu.items():
        np.testing.assert_allclose(gpu[name], ref, rtol=2e-3, atol=2e-3 * float(np.abs(ref).max()))
