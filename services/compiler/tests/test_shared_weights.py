"""A weight several MatMuls read (one ONNX initializer, ALBERT-style sharing: `weight_bound_bytes`
with ``distinct``) is converted and quantized once and stored once in the plan, and the plan computes
what the same model with a private copy of the weight per layer computes."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

sys.path.insert(0, str(Path(__file__).parent))
from onnx_models import weight_bound_bytes

from anvil_compiler.options import CompileOptions
from anvil_compiler.pipeline import compile_graph, import_model
from anvil_core.proto_gen import plan_generated as pg
from anvil_executor.plan_runtime.model import PlanModel
from anvil_executor.plan_runtime.plan import LoadedPlan, _s

DIM, LAYERS, DISTINCT = 256, 8, 2


def _unshared(data: bytes) -> bytes:
    """The same model with every MatMul reading its own copy of its weight."""
    m = onnx.load_model_from_string(data)
    inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    for n in m.graph.node:
        if n.op_type == "MatMul":
            copy = f"{n.input[1]}_{n.name}"
            m.graph.initializer.append(numpy_helper.from_array(inits[n.input[1]].copy(), copy))
            n.input[1] = copy
    return m.SerializeToString()


def _compile(data: bytes, quantize: bool) -> tuple[PlanModel, dict, int]:
    opts = CompileOptions(quantize=quantize, max_batch=16, gpu_precision="fp16", max_rel_error=None)
    low = compile_graph(import_model("onnx", data, "wb"), opts)
    plan = LoadedPlan(pg.PlanT.InitFromPackedBuf(low.plan, 0))
    return PlanModel(plan, low.weights), low.stats, len(low.weights)


def test_the_rng_draws_as_without_sharing() -> None:
    def arrays(data: bytes) -> dict[str, np.ndarray]:
        return {t.name: numpy_helper.to_array(t) for t in onnx.load_model_from_string(data).graph.initializer}

    shared, plain = arrays(weight_bound_bytes(64, 4, distinct=2)), arrays(weight_bound_bytes(64, 4))
    assert sorted(shared) == ["b0", "b1", "b2", "b3", "w0", "w1"]
    for k in ("w0", "b0", "w1", "b1"):  # the first `distinct` layers are the unshared model's
        np.testing.assert_array_equal(shared[k], plain[k])
    m = onnx.load_model_from_string(weight_bound_bytes(64, 4, distinct=2))
    assert [n.input[1] for n in m.graph.node if n.op_type == "MatMul"] == ["w0", "w1", "w0", "w1"]
    with pytest.raises(ValueError, match="distinct"):
        weight_bound_bytes(64, 4, distinct=0)


@pytest.mark.parametrize("quantize", [True, False])
def test_a_shared_weight_is_stored_once_and_computes_as_private_copies(quantize: bool) -> None:
    data = weight_bound_bytes(DIM, LAYERS, distinct=DISTINCT)
    shared, s_stats, s_count = _compile(data, quantize)
    plain, p_stats, p_count = _compile(_unshared(data), quantize)
    per_linear = 3 if quantize else 1  # packed, scales, zeros / the fp32 weight
    # one weight entry per distinct matrix (and a bias per layer) against one per layer
    assert s_count == DISTINCT * per_linear + LAYERS and p_count == LAYERS * (per_linear + 1)
    assert s_stats["weight_tensors"] == s_count
    assert s_stats["shared_weight_reads"] == (LAYERS - DISTINCT) * per_linear
    assert p_stats["shared_weight_reads"] == 0
    role = "packed" if quantize else "weight"
    matrix_bytes = DIM * DIM // 2 if quantize else DIM * DIM * 4
    assert p_stats["weight_bytes"] - s_stats["weight_bytes"] >= (LAYERS - DISTINCT) * matrix_bytes
    if quantize:
        assert s_stats["int4_linears"] == LAYERS
        assert s_stats["int4_weight_bytes"] * LAYERS == p_stats["int4_weight_bytes"] * DISTINCT
    # every linear i reads the entry of linear i % DISTINCT
    p = shared.plan.plan
    reads = [
        dict(zip((_s(r) for r in op.weightRoles), (int(i) for i in op.weights), strict=True)) for op in p.ops
    ]
    for i, r in enumerate(reads):
        assert r[role] == reads[i % DISTINCT][role]
        assert _s(p.weights[r[role]].name) == f"op{i % DISTINCT}.{role}"
    assert len({r["bias"] for r in reads}) == LAYERS  # biases: one per layer
    # same outputs (the CPU runtime), bit for bit: the same weights quantized the same way
    x = np.random.default_rng(1).standard_normal((5, DIM)).astype(np.float32)
    got, want = shared.run([{"x": x}])[0]["y"], plain.run([{"x": x}])[0]["y"]
    np.testing.assert_array_equal(got, want)
    if not quantize:  # and what numpy computes
        m = onnx.load_model_from_string(data)
        c = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
        h = x.astype(np.float64)
        for i in range(LAYERS):
            h = h @ c[f"w{i % DISTINCT}"] + c[f"b{i}"]
            h = np.maximum(h, 0) if i < LAYERS - 1 else h
        np.testing.assert_allclose(got, h, rtol=1e-4, atol=1e-4 * float(np.abs(h).max()))


def test_the_accuracy_report_dequantizes_a_shared_weight_once() -> None:
    from anvil_compiler.passes.accuracy import _Bench
    from anvil_compiler.passes.fuse import fuse
    from anvil_compiler.passes.quantize import quantize_graph

    opts = CompileOptions(quantize=True, max_batch=16, max_rel_error=None)
    g = fuse(import_model("onnx", weight_bound_bytes(DIM, LAYERS, distinct=DISTINCT), "wb"))
    weights = quantize_graph(g, opts)
    assert weights["fc0"]["packed"] is weights["fc2"]["packed"] is weights["fc6"]["packed"]
    assert weights["fc0"]["packed"] is not weights["fc1"]["packed"]
    bench = _Bench(g, opts, weights, None)
    assert len(bench.deq) == LAYERS and len({id(a) for a in bench.deq.values()}) == DISTINCT
