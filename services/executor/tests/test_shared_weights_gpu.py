"""Shared weights on the GPU runtime's host path, without a GPU (CuPy replaced by ``fake_cupy`` as in
test_gpu_host_path.py): a plan whose linears cycle over a few weight matrices (`weight_bound_bytes`
with ``distinct``; the compiler stores each once) gets each matrix converted to fp16, prepacked for
W4A16 and uploaded once; every linear's launches read the shared copy."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

from anvil_compiler.codegen.build import full_source
from anvil_compiler.options import CompileOptions
from anvil_compiler.pipeline import compile_graph, import_model
from anvil_core.proto_gen import plan_generated as pg
from anvil_executor.plan_runtime.plan import LoadedPlan

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[2] / "compiler" / "tests"))
import fake_cupy
from onnx_models import weight_bound_bytes

DIM, LAYERS, DISTINCT = 256, 8, 2


def _model(quantize: bool, distinct: int | None) -> Any:
    from anvil_executor.plan_runtime.gpu_model import GpuPlanModel

    opts = CompileOptions(quantize=quantize, max_batch=16, gpu_precision="fp16", max_rel_error=None)
    low = compile_graph(import_model("onnx", weight_bound_bytes(DIM, LAYERS, distinct=distinct), "wb"), opts)
    plan = LoadedPlan(pg.PlanT.InitFromPackedBuf(low.plan, 0))
    module = fake_cupy.RawModule(code=full_source(low.sources))
    w4a16 = fake_cupy.RawModule() if quantize else None
    return GpuPlanModel(plan, low.weights, module, 0, w4a16_module=w4a16)


def test_int4_shared_weights_are_prepacked_and_uploaded_once(fake: Any) -> None:
    gpu, plain = _model(True, DISTINCT), _model(True, None)
    lins = gpu._lin16
    assert len(lins.layers) == LAYERS and all(lin.backend == "w4a16" for lin in lins.lins.values())
    assert len({id(layer.qweight) for layer in lins.layers.values()}) == DISTINCT
    ops = sorted(lins.lins)
    for k, i in enumerate(ops):  # linear k reads linear (k % DISTINCT)'s upload, with its own activation
        assert lins.layers[i].qweight is lins.layers[ops[k % DISTINCT]].qweight
        assert lins.layers[i].activation == ("none" if k == LAYERS - 1 else "relu")
    assert lins.shares == {ops[k]: ops[k % DISTINCT] for k in range(DISTINCT, LAYERS)}
    assert lins.w4a16_bytes * LAYERS == plain._lin16.w4a16_bytes * DISTINCT
    assert gpu.weight_bytes < plain.weight_bytes
    # the captured launches: every linear a W4A16 launch on its shared weight, in layer order
    fake_cupy.LAUNCHES.calls.clear()
    eager = _model(True, DISTINCT)
    fake_cupy.LAUNCHES.calls.clear()
    eager._graphs.clear()
    eager.run([{"x": np.ones((3, DIM), np.float32)}])
    w4 = [args for name, args in fake_cupy.LAUNCHES.calls if name.startswith("w4a16_fp16_")]
    assert len(w4) == LAYERS
    layers = eager._lin16.layers
    assert [id(a[0]) for a in w4] == [id(layers[ops[k % DISTINCT]].qweight) for k in range(LAYERS)]


def test_fp16_shared_weights_are_converted_and_uploaded_once(fake: Any) -> None:
    gpu, plain = _model(False, DISTINCT), _model(False, None)
    lins = gpu._lin16
    ops = sorted(lins.lins)
    w16 = {lins._keys[("w16", i)] for i in ops}
    assert len(w16) == DISTINCT  # LAYERS linears over DISTINCT fp16 copies
    for k, i in enumerate(ops):
        assert lins._keys[("w16", i)] == lins._keys[("w16", ops[k % DISTINCT])]
    matrix = DIM * DIM * 2
    assert plain.weight_bytes - gpu.weight_bytes >= (LAYERS - DISTINCT) * matrix
    fake.calls.clear()
    gpu._graphs.clear()
    gpu.run([{"x": np.ones((2, DIM), np.float32)}])
    assert fake.calls.count("cublasGemmEx") == LAYERS
