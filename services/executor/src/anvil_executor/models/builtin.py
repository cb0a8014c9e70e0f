"""Built-in CPU models for the foundation: `identity` and a seeded numpy `mlp`."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from anvil_core.model_spec import ModelSpec, TensorSpec
from anvil_executor.models.base import Model, RequestInputs, RequestOutputs

__all__ = [
    "BUILTIN",
    "BusyModel",
    "DeepMlpModel",
    "IdentityModel",
    "MlpModel",
    "deep_mlp_weights",
    "load_builtin",
    "mlp_reference",
]

MLP_SEED = 20261129
MLP_IN, MLP_HIDDEN, MLP_OUT = 16, 32, 4


class IdentityModel(Model):
    """Returns INPUT0 as OUTPUT0, any FP32 shape per row."""

    def __init__(self, max_batch: int) -> None:
        self.spec = ModelSpec(
            name="identity",
            max_batch=max_batch,
            inputs=(TensorSpec("INPUT0", "FP32", (-1,)),),
            outputs=(TensorSpec("OUTPUT0", "FP32", (-1,)),),
        )

    def run(self, batch: list[RequestInputs]) -> list[RequestOutputs]:
        return [{"OUTPUT0": np.array(req["INPUT0"], copy=True)} for req in batch]


def mlp_weights(seed: int = MLP_SEED) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The fixed weights: anyone (tests, clients) can rebuild them from the seed."""
    rng = np.random.default_rng(seed)
    w1 = rng.standard_normal((MLP_IN, MLP_HIDDEN)).astype(np.float32) / np.sqrt(MLP_IN)
    b1 = rng.standard_normal(MLP_HIDDEN).astype(np.float32) * 0.1
    w2 = rng.standard_normal((MLP_HIDDEN, MLP_OUT)).astype(np.float32) / np.sqrt(MLP_HIDDEN)
    b2 = rng.standard_normal(MLP_OUT).astype(np.float32) * 0.1
    return w1, b1, w2, b2


def mlp_reference(x: np.ndarray, seed: int = MLP_SEED) -> np.ndarray:
    """relu(x @ w1 + b1) @ w2 + b2 in float32: the numpy result the server must return."""
    w1, b1, w2, b2 = mlp_weights(seed)
    h = np.maximum(x.astype(np.float32) @ w1 + b1, 0.0)
    return (h @ w2 + b2).astype(np.float32)


class MlpModel(Model):
    """Two-layer ReLU MLP, INPUT0 (B, 16) FP32 -> OUTPUT0 (B, 4) FP32. Rows of a batch are stacked."""

    def __init__(self, max_batch: int) -> None:
        self.spec = ModelSpec(
            name="mlp",
            max_batch=max_batch,
            inputs=(TensorSpec("INPUT0", "FP32", (MLP_IN,)),),
            outputs=(TensorSpec("OUTPUT0", "FP32", (MLP_OUT,)),),
        )
        self.w1, self.b1, self.w2, self.b2 = mlp_weights()

    def run(self, batch: list[RequestInputs]) -> list[RequestOutputs]:
        x = np.concatenate([req["INPUT0"] for req in batch], axis=0)  # (sum B_i, 16) fp32
        h = np.maximum(x @ self.w1 + self.b1, 0.0)  # (sum B_i, 32)
        y = (h @ self.w2 + self.b2).astype(np.float32)  # (sum B_i, 4)
        out: list[RequestOutputs] = []
        row = 0
        for req in batch:
            n = req["INPUT0"].shape[0]
            out.append({"OUTPUT0": y[row : row + n]})
            row += n
        return out


class BusyModel(Model):
    """A stand-in device with a known service time t(B) = base + per_row·B (sleeping, so it costs no
    CPU): the scheduler's batching is tested on it where no GPU exists. Returns INPUT0 as OUTPUT0."""

    def __init__(self, max_batch: int, base_us: int = 4000, per_row_us: int = 500) -> None:
        self.base_s = base_us / 1e6
        self.per_row_s = per_row_us / 1e6
        self.spec = ModelSpec(
            name="busy",
            max_batch=max_batch,
            inputs=(TensorSpec("INPUT0", "FP32", (-1,)),),
            outputs=(TensorSpec("OUTPUT0", "FP32", (-1,)),),
        )

    def run(self, batch: list[RequestInputs]) -> list[RequestOutputs]:
        rows = sum(req["INPUT0"].shape[0] for req in batch)
        time.sleep(self.base_s + self.per_row_s * rows)
        return [{"OUTPUT0": np.array(req["INPUT0"], copy=True)} for req in batch]


DEEP_SEED, DEEP_WIDTH, DEEP_LAYERS = 1234, 1024, 4


def deep_mlp_weights() -> list[tuple[np.ndarray, np.ndarray]]:
    """mlp4x1024's weights: for each of 4 layers, w = N(0,1)/sqrt(1024) (1024, 1024) then
    b = 0.01·N(0,1) (1024,), float32, drawn in that order from numpy.random.default_rng(1234).
    The serving-peers benchmark rebuilds the same weights in each peer from this recipe."""
    rng = np.random.default_rng(DEEP_SEED)
    out = []
    for _ in range(DEEP_LAYERS):
        w = (rng.standard_normal((DEEP_WIDTH, DEEP_WIDTH)) / np.sqrt(DEEP_WIDTH)).astype(np.float32)
        b = (0.01 * rng.standard_normal(DEEP_WIDTH)).astype(np.float32)
        out.append((w, b))
    return out


class DeepMlpModel(Model):
    """mlp4x1024: 4 layers of x @ w + b, ReLU between layers (not after the last), FP32 [-1, 1024]."""

    def __init__(self, max_batch: int) -> None:
        self.spec = ModelSpec(
            name="mlp4x1024",
            max_batch=max_batch,
            inputs=(TensorSpec("INPUT0", "FP32", (DEEP_WIDTH,)),),
            outputs=(TensorSpec("OUTPUT0", "FP32", (DEEP_WIDTH,)),),
        )
        self.layers = deep_mlp_weights()

    def run(self, batch: list[RequestInputs]) -> list[RequestOutputs]:
        h = np.concatenate([req["INPUT0"] for req in batch], axis=0)  # (sum B_i, 1024) fp32
        for i, (w, b) in enumerate(self.layers):
            h = h @ w + b
            if i < len(self.layers) - 1:
                np.maximum(h, 0.0, out=h)
        out: list[RequestOutputs] = []
        row = 0
        for req in batch:
            n = req["INPUT0"].shape[0]
            out.append({"OUTPUT0": h[row : row + n]})
            row += n
        return out


BUILTIN: dict[str, Callable[[int], Model]] = {
    "identity": IdentityModel,
    "mlp": MlpModel,
    "busy": BusyModel,
    "mlp4x1024": DeepMlpModel,
}


def load_builtin(name: str, max_batch: int) -> Model:
    """The numpy built-ins; `minilm` (all-MiniLM-L6-v2) is a compiled artifact (models/minilm.py)."""
    try:
        cls = BUILTIN[name]
    except KeyError:
        raise ValueError(
            f"unknown built-in model {name!r}; built-ins: {sorted([*BUILTIN, 'minilm', 'all-MiniLM-L6-v2'])}"
        ) from None
    return cls(max_batch)
