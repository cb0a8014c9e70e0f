"""The numpy built-ins on a GPU executor (``ANVIL_GPU_BUILTINS=device``, the default there).

On ``ANVIL_DEVICE=cuda:N`` the seeded MLPs are served by the compiler's plan on the device, not by
numpy on the host: the executor writes the model as ONNX from the same recipe as the numpy model
(``builtin.mlp_weights`` / ``deep_mlp_weights``: MatMul, Add, Relu), compiles it through the
compiler's offline entry point (models/compiled.py: content-addressed, cached) and loads it as any
artifact (a ``GpuPlanModel``: arena, pinned bank, CUDA graphs per batch bucket). ``identity``
becomes ``GpuIdentityModel`` (a round trip through device memory). ``busy`` (a sleep standing in
for a device) stays on the host. ``ANVIL_GPU_BUILTINS=host`` keeps every built-in on the host.

The ONNX writer needs the ``onnx`` package, which the compiler depends on and which is therefore
present wherever the compiler is; without it the model is not served and the log says why.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from anvil_executor.device import DeviceSpec
from anvil_executor.models.base import Model
from anvil_executor.models.builtin import deep_mlp_weights, mlp_weights
from anvil_executor.models.compiled import BuiltinUnavailable, compile_builtin

__all__ = ["DEVICE_BUILTINS", "compile_options", "load_device_builtin", "mlp_layers", "mlp_onnx"]

DEVICE_BUILTINS = ("identity", "mlp", "mlp4x1024")
OPSET = 17

Layer = tuple[np.ndarray, np.ndarray, bool]  # weight (K, N), bias (N,), ReLU after it


def mlp_layers(name: str) -> list[Layer]:
    """The layers of a seeded MLP built-in, exactly the numpy model's weights."""
    if name == "mlp":
        w1, b1, w2, b2 = mlp_weights()
        return [(w1, b1, True), (w2, b2, False)]
    if name == "mlp4x1024":
        layers = deep_mlp_weights()
        return [(w, b, i < len(layers) - 1) for i, (w, b) in enumerate(layers)]
    raise ValueError(f"{name!r} is not a seeded MLP built-in; those are 'mlp', 'mlp4x1024'")


def mlp_onnx(name: str, layers: list[Layer]) -> bytes:
    """ONNX bytes of ``layers``: INPUT0 (batch, K) FP32 -> OUTPUT0 (batch, N) FP32."""
    try:
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        raise BuiltinUnavailable(
            f"{name} on the GPU is compiled from ONNX, and the onnx package (a dependency of the "
            "compiler) is not installed; or set ANVIL_GPU_BUILTINS=host"
        ) from None
    nodes, inits = [], []
    x = "INPUT0"
    for i, (w, b, relu) in enumerate(layers):
        last = i == len(layers) - 1
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"mm{i}"], name=f"fc{i}"))
        out = "OUTPUT0" if last and not relu else f"h{i}"
        nodes.append(helper.make_node("Add", [f"mm{i}", f"b{i}"], [out], name=f"fc{i}_bias"))
        if relu:
            act = "OUTPUT0" if last else f"r{i}"
            nodes.append(helper.make_node("Relu", [out], [act], name=f"relu{i}"))
            out = act
        x = out
    k, n = layers[0][0].shape[0], layers[-1][0].shape[1]
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", k])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", n])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    return bytes(model.SerializeToString())


def compile_options(max_batch: int) -> dict[str, Any]:
    """CompileOptions of a seeded MLP (part of its content address): unquantized, fp32 on the GPU."""
    return {"quantize": False, "max_batch": max_batch, "gpu_precision": "fp32"}


def compile_mlp(name: str, artifact_root: Path, max_batch: int, build_kernels: bool) -> Path:
    """The artifact of a seeded MLP built-in (compiled on first use, then found by its address)."""
    data = mlp_onnx(name, mlp_layers(name))
    artifact_root.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".onnx", dir=artifact_root)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        opts = compile_options(max_batch)
        return compile_builtin(("onnx", Path(tmp)), artifact_root, name, opts, build_kernels)
    finally:
        Path(tmp).unlink(missing_ok=True)


def load_device_builtin(
    name: str, artifact_root: Path, max_batch: int, device: DeviceSpec, gpu: dict[str, Any], lanes: int = 1
) -> tuple[Model, Any]:
    """(served model, the object whose device metrics the executor reads) of a built-in on a GPU."""
    if not device.is_cuda:
        raise ValueError(f"{name} on the device needs a CUDA executor, this one runs on {device}")
    if name == "identity":
        from anvil_executor.plan_runtime.gpu_identity import GpuIdentityModel

        model = GpuIdentityModel(max_batch, device.index, lanes)
        return model, model
    from anvil_executor.artifact import load_artifact

    path = compile_mlp(name, artifact_root, max_batch, build_kernels=True)
    return load_artifact(path, device, name, gpu, lanes)
