"""ONNX models built with onnx.helper (no torch needed): a small MLP and broken variants."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def mlp_bytes(seed: int = 0, d_in: int = 64, hidden: int = 128, d_out: int = 16, op: str = "Relu") -> bytes:
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((d_in, hidden)) / np.sqrt(d_in)).astype(np.float32)
    b1 = (rng.standard_normal(hidden) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((hidden, d_out)) / np.sqrt(hidden)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h0"], name="fc1"),
        helper.make_node("Add", ["h0", "b1"], ["h1"], name="fc1_bias"),
        helper.make_node(op, ["h1"], ["h2"], name="act"),
        helper.make_node("MatMul", ["h2", "w2"], ["y"], name="fc2"),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", d_in])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", d_out])],
        [
            numpy_helper.from_array(w1, "w1"),
            numpy_helper.from_array(b1, "b1"),
            numpy_helper.from_array(w2, "w2"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model.SerializeToString()


def mismatched_bytes() -> bytes:
    """fc2's weight has K = 100 where fc1 produces 128 columns."""
    rng = np.random.default_rng(1)
    w1 = rng.standard_normal((64, 128)).astype(np.float32)
    w2 = rng.standard_normal((100, 16)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
            helper.make_node("MatMul", ["h", "w2"], ["y"], name="fc2_bad"),
        ],
        "bad",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def reference(data: bytes, x: np.ndarray) -> np.ndarray:
    """numpy evaluation of mlp_bytes (Relu / Tanh / Sigmoid) for tests without onnxruntime."""
    m = onnx.load_model_from_string(data)
    w = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    op = m.graph.node[2].op_type
    h = x @ w["w1"] + w["b1"]
    h = {"Relu": np.maximum(h, 0), "Tanh": np.tanh(h), "Sigmoid": 1 / (1 + np.exp(-h))}[op]
    return (h @ w["w2"]).astype(np.float32)


def user_mlp_bytes(seed: int = 0) -> bytes:
    """Issue 22's model: MatMul -> Add -> Relu -> MatMul -> Add, 64 -> 256 -> 10, N(0, 0.1^2)
    weights and biases. Default INT4 moves its outputs by 10-38% (max-norm, relative)."""
    rng = np.random.default_rng(seed)
    w1, b1 = (
        (0.1 * rng.standard_normal((64, 256))).astype(np.float32),
        (0.1 * rng.standard_normal(256)).astype(np.float32),
    )
    w2, b2 = (
        (0.1 * rng.standard_normal((256, 10))).astype(np.float32),
        (0.1 * rng.standard_normal(10)).astype(np.float32),
    )
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["h0"], name="fc1"),
            helper.make_node("Add", ["h0", "b1"], ["h1"], name="fc1_bias"),
            helper.make_node("Relu", ["h1"], ["h2"], name="relu"),
            helper.make_node("MatMul", ["h2", "w2"], ["h3"], name="fc2"),
            helper.make_node("Add", ["h3", "b2"], ["y"], name="fc2_bias"),
        ],
        "usermlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 10])],
        [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (b1, "b1"), (w2, "w2"), (b2, "b2"))],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def embed_mlp_bytes(seed: int = 0, vocab: int = 300, hidden: int = 64) -> bytes:
    """Token ids (batch, seq) -> Gather from an embedding table -> linear -> Relu -> linear: an fp16
    table (the quantized plan's) and two INT4 linears."""
    rng = np.random.default_rng(seed)
    table = rng.standard_normal((vocab, hidden)).astype(np.float32)
    w1 = (rng.standard_normal((hidden, 128)) / np.sqrt(hidden)).astype(np.float32)
    w2 = (rng.standard_normal((128, 32)) / np.sqrt(128)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["table", "ids"], ["e"], name="embed"),
            helper.make_node("MatMul", ["e", "w1"], ["h0"], name="fc1"),
            helper.make_node("Relu", ["h0"], ["h1"], name="act"),
            helper.make_node("MatMul", ["h1", "w2"], ["y"], name="fc2"),
        ],
        "embedmlp",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 32])],
        [numpy_helper.from_array(a, n) for a, n in ((table, "table"), (w1, "w1"), (w2, "w2"))],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def weight_bound_bytes(dim: int = 8192, layers: int = 4, seed: int = 0, distinct: int | None = None) -> bytes:
    """A weight-bound model (issue #16): ``layers`` linears of ``dim`` x ``dim`` with bias, ReLU
    between them, random weights (std 1/sqrt(dim)) from a fixed seed: y = L_n(relu(... L_1(x))).
    At 8192 x 8192 its fp32 weights are 1 GiB (256 MiB per layer; INT4 g128: 33 MiB per layer), so
    at batch <= 16 every linear reads its weights once per batch and the time is the weight traffic.

    ``distinct`` (ALBERT-style sharing): layer i multiplies by weight matrix ``w{i % distinct}``, one
    initializer read by several MatMuls, so a deep model stays one protobuf (< 2 GiB: at dim 8192 at
    most 7 fp32 matrices); every layer keeps its own bias ``b{i}``. The RNG draws as without sharing
    (w0, b0, w1, b1, ...) but skips the weights of layers >= ``distinct``, so the first ``distinct``
    layers equal the unshared model's. None (the default): every layer its own weights, the bytes as
    they always were."""
    if distinct is not None and distinct < 1:
        raise ValueError(f"distinct must be >= 1, got {distinct}")
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    h = "x"
    for i in range(layers):
        if distinct is None or i < distinct:
            w = rng.standard_normal((dim, dim), dtype=np.float32) * np.float32(1 / np.sqrt(dim))
            inits.append(numpy_helper.from_array(w, f"w{i}"))
        b = rng.standard_normal(dim, dtype=np.float32) * np.float32(0.02)
        inits.append(numpy_helper.from_array(b, f"b{i}"))
        wname = f"w{i}" if distinct is None else f"w{i % distinct}"
        nodes.append(helper.make_node("MatMul", [h, wname], [f"m{i}"], name=f"fc{i}"))
        last = i == layers - 1
        out = "y" if last else f"a{i}"
        nodes.append(helper.make_node("Add", [f"m{i}", f"b{i}"], [out], name=f"fc{i}_bias"))
        if not last:
            nodes.append(helper.make_node("Relu", [f"a{i}"], [f"h{i}"], name=f"act{i}"))
            h = f"h{i}"
    graph = helper.make_graph(
        nodes,
        f"weight_bound_{dim}x{layers}" + ("" if distinct is None else f"_d{distinct}"),
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", dim])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", dim])],
        inits,
    )
    # IR 9 (opset 17 needs 8): the H200 host's onnx writes IR 14 by default, which its onnxruntime
    # (bench/int4_gpu.py's reference) refuses
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    return model.SerializeToString()
