"""Contract between the executor loop and a model implementation."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from anvil_core.model_spec import ModelSpec

__all__ = ["Model", "RequestInputs", "RequestOutputs"]

RequestInputs = dict[str, np.ndarray]  # input name -> (batch_i, ...) array of one request
RequestOutputs = dict[str, np.ndarray]  # output name -> (batch_i, ...) array of one request


class Model(ABC):
    """A loaded model.

    The executor's compute thread calls `run` with the inputs of every request in one batch, already
    validated against `spec` by the gateway (and re-checked cheaply here); it owns the returned arrays
    until they are sent. `run` must not keep references to its inputs: their memory belongs to the
    received ZeroMQ frames and is released after the batch.
    """

    spec: ModelSpec
    # True: `prepare` does real host work (e.g. tokenization) worth running on the executor's prep
    # thread, overlapped with the compute of the batch before it (service.py)
    prepares: bool = False

    def check_request(self, inputs: RequestInputs) -> None:
        """Limits of this model that the spec cannot state (e.g. a compiled plan's longest sequence):
        raise ``SpecError`` with the limit, and only that request is refused (400). Default: none."""
        return None

    @abstractmethod
    def run(self, batch: list[RequestInputs]) -> list[RequestOutputs]:
        """One output dict per request, in order."""

    def prepare(self, batch: list[RequestInputs]) -> Any:
        """The host-side part of `run` that needs no device and no compute thread (decode, tokenize,
        pack): the executor runs it on its prep thread while the previous batch computes. Its result
        goes to `run_prepared`. Default: nothing to prepare."""
        return batch

    def run_prepared(self, prepared: Any) -> list[RequestOutputs]:
        """`run` on what `prepare` returned (the compute thread). Default: `run`."""
        return self.run(prepared)
