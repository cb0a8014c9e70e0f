"""What a model accepts and returns, published by executors in Redis (`anvil:model:{name}`) and used
by the gateway to validate requests before they enter a queue.

Dims follow KServe: `-1` is variable. When `max_batch > 0` the first dim of every request tensor
is the batch dim (1..max_batch) and `dims` describes one row.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from anvil_core.tensors import DATATYPES, HostTensor

__all__ = ["ModelSpec", "SpecError", "TensorSpec"]


class SpecError(ValueError):
    """A request that does not fit the model's spec; the message states the constraint."""


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    datatype: str
    dims: tuple[int, ...]  # per row when the model batches; -1 = any size

    def full_shape(self, max_batch: int) -> list[int]:
        return ([-1] if max_batch > 0 else []) + list(self.dims)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    version: str = "1"
    platform: str = "anvil_cpu"
    max_batch: int = 0  # 0: the model does not batch; shapes are taken as given
    inputs: tuple[TensorSpec, ...] = field(default_factory=tuple)
    outputs: tuple[TensorSpec, ...] = field(default_factory=tuple)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: str) -> ModelSpec:
        doc: dict[str, Any] = json.loads(raw)
        return cls(
            name=doc["name"],
            version=str(doc.get("version", "1")),
            platform=doc.get("platform", "anvil_cpu"),
            max_batch=int(doc.get("max_batch", 0)),
            inputs=tuple(TensorSpec(t["name"], t["datatype"], tuple(t["dims"])) for t in doc["inputs"]),
            outputs=tuple(TensorSpec(t["name"], t["datatype"], tuple(t["dims"])) for t in doc["outputs"]),
        )

    def input(self, name: str) -> TensorSpec:
        for spec in self.inputs:
            if spec.name == name:
                return spec
        raise SpecError(f"model {self.name!r} has no input {name!r}; inputs: {[t.name for t in self.inputs]}")

    def check_shape(self, spec: TensorSpec, datatype: str, shape: tuple[int, ...]) -> None:
        """Raise SpecError unless a tensor of `datatype` and `shape` fits input `spec`."""
        if datatype not in DATATYPES:
            raise SpecError(f"input {spec.name!r}: unsupported datatype {datatype!r}")
        if datatype != spec.datatype:
            raise SpecError(f"input {spec.name!r}: datatype {datatype} given, model expects {spec.datatype}")
        dims = tuple(shape)
        if self.max_batch > 0:
            if not dims:
                raise SpecError(f"input {spec.name!r}: shape [] has no batch dimension")
            batch, dims = dims[0], dims[1:]
            if not 1 <= batch <= self.max_batch:
                raise SpecError(f"input {spec.name!r}: batch dimension {batch} outside 1..{self.max_batch}")
        if len(dims) != len(spec.dims) or any(
            want != -1 and want != got for want, got in zip(spec.dims, dims, strict=True)
        ):
            raise SpecError(
                f"input {spec.name!r}: shape {list(shape)} does not match {spec.full_shape(self.max_batch)}"
            )

    def validate(self, tensors: list[HostTensor]) -> None:
        """Check names, datatypes, shapes and a common batch dim across inputs."""
        given = {t.name for t in tensors}
        missing = [s.name for s in self.inputs if s.name not in given]
        if missing:
            raise SpecError(f"model {self.name!r}: missing inputs {missing}")
        if len(given) != len(tensors):
            raise SpecError("an input name appears twice")
        for t in tensors:
            self.check_shape(self.input(t.name), t.datatype, t.shape)
        if self.max_batch > 0 and len({t.shape[0] for t in tensors}) > 1:
            raise SpecError(f"inputs disagree on the batch dimension: {[list(t.shape) for t in tensors]}")
