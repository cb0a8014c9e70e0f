"""The CPU plan runtime: the host arena's bounds, and a compiled artifact served through the
executor's Model contract (requests stacked, split at max_batch, outputs per request)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from anvil_executor.plan_runtime import HostArena


def test_arena_views_are_bounded_and_aligned() -> None:
    arena = HostArena({"weights": 1000, "activations": 4096})
    v = arena.view("activations", 256, (4, 8), np.float32)
    assert v.ctypes.data % 256 == 0 and v.shape == (4, 8)
    arena.write("weights", 0, np.arange(4, dtype=np.float32))
    assert arena.view("weights", 0, (4,), np.float32).tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="exceeds bank"):
        arena.view("activations", 4000, (100,), np.float32)
    with pytest.raises(ValueError, match="unknown banks"):
        HostArena({"nope": 1})
    assert arena.usage() == {"weights": 1000, "activations": 4096}


def test_plan_model_serves_batches(tmp_path: Path) -> None:
    import onnx  # the compiler's dependency, in the uv lock: a broken import fails
    from onnx import TensorProto, helper, numpy_helper

    from anvil_compiler.options import CompileOptions
    from anvil_compiler.pipeline import compile_model
    from anvil_executor.plan_runtime import PlanModel

    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((32, 64)).astype(np.float32) / 6
    w2 = rng.standard_normal((64, 8)).astype(np.float32) / 8
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
            helper.make_node("Relu", ["h"], ["r"]),
            helper.make_node("MatMul", ["r", "w2"], ["y"], name="fc2"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 8])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )
    data = helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]).SerializeToString()
    opts = CompileOptions(quantize=False, max_batch=4)
    compile_model("onnx", data, "mlp", opts, tmp_path, "k1", build=False)
    model = PlanModel.load(tmp_path, name="served")
    assert model.spec.name == "served" and model.spec.max_batch == 4
    reqs = [{"x": rng.standard_normal((n, 32)).astype(np.float32)} for n in (3, 2, 1)]  # 6 rows > 4
    outs = model.run(reqs)
    for req, out in zip(reqs, outs, strict=True):
        ref = np.maximum(req["x"] @ w1, 0) @ w2
        np.testing.assert_allclose(out["y"], ref, rtol=1e-4, atol=1e-5)
