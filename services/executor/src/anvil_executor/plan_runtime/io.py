"""What the CPU and GPU backends of the plan runtime share: the plan's public inputs and outputs, the
model spec, splitting a batch into chunks that fit ``max_batch``, and handing each request its rows
of the outputs.

A backend implements ``_run_chunk(reqs, lens, t)``: run the requests of one chunk (their sequence
lengths ``lens``, padded to ``t`` where the model has an attention mask) and return, per output, an
array of (rows of the chunk, ...) from which ``_split`` takes each request's rows.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np

from anvil_core.model_spec import ModelSpec, SpecError, TensorSpec
from anvil_executor.models.base import Model, RequestInputs, RequestOutputs
from anvil_executor.plan_runtime.plan import LoadedPlan, _s

__all__ = ["IOEntry", "PlanIO"]

IOEntry = tuple[str, int, str, list[int]]  # public name, tensor index, KServe datatype, per-row dims


def _l(v: Any) -> list[Any]:
    """Vectors of the flatbuffers object API are None, lists or numpy arrays."""
    return [] if v is None else list(v)


class PlanIO(Model):
    """A compiled plan served as a ``Model``; the backend subclass runs the chunks."""

    platform = "anvil_plan_cpu"

    def _init_io(self, plan: LoadedPlan, name: str | None, outputs: Sequence[str] | None = None) -> None:
        """``outputs``: the public outputs to serve (default all). A text encoder serves only its
        pooled vector: MiniLM's ``last_hidden_state`` (B, T, 384) fp32 is ~50 MB per 512-row batch,
        and copying it out of the device and the pinned bank took most of the executor's time."""
        p = plan.plan
        self.plan = plan
        self.max_batch, self.max_seq = int(p.maxBatch), int(p.maxSeq)
        self.inputs: list[IOEntry] = [
            (_s(io.name), int(io.tensor), _s(io.datatype), [int(d) for d in _l(io.dims)]) for io in p.inputs
        ]
        self.outputs: list[IOEntry] = [
            (_s(io.name), int(io.tensor), _s(io.datatype), [int(d) for d in _l(io.dims)]) for io in p.outputs
        ]
        if outputs is not None:
            known = [n for n, _, _, _ in self.outputs]
            unknown = sorted(set(outputs) - set(known))
            if unknown:
                raise ValueError(f"plan {plan.name!r} has no output {unknown}; outputs: {known}")
            self.outputs = [o for o in self.outputs if o[0] in outputs]
        self.seq_inputs = [n for n, t, _, _ in self.inputs if self._has_seq(t)]
        self.mask_inputs = [n for n, _, _, _ in self.inputs if "mask" in n.lower()]
        self.spec = ModelSpec(
            name=name or plan.name,
            platform=self.platform,
            max_batch=self.max_batch,
            inputs=tuple(TensorSpec(n, dt, tuple(d)) for n, _, dt, d in self.inputs),
            outputs=tuple(TensorSpec(n, dt, tuple(d)) for n, _, dt, d in self.outputs),
        )

    def _has_seq(self, tensor: int) -> bool:
        return any(d.t for d in self.plan.plan.tensors[tensor].shape)

    def check_request(self, inputs: RequestInputs) -> None:
        """A sequence longer than the plan's max_seq is refused with the limit (400), not truncated:
        the compiled memory plan and position table end there."""
        if self.seq_inputs:
            n = int(inputs[self.seq_inputs[0]].shape[1]) if inputs[self.seq_inputs[0]].ndim > 1 else 1
            if n > self.max_seq:
                name, limit = self.seq_inputs[0], self.max_seq
                raise SpecError(f"input {name!r}: sequence of {n} exceeds the model's limit of {limit}")

    def run(self, batch: list[RequestInputs]) -> list[RequestOutputs]:
        results: list[RequestOutputs] = []
        start = 0
        while start < len(batch):  # chunks whose rows fit max_batch
            rows, end = 0, start
            while end < len(batch) and (rows + self._rows(batch[end]) <= self.max_batch or end == start):
                rows += self._rows(batch[end])
                end += 1
            reqs = batch[start:end]
            lens = self._lens(reqs)
            results.extend(self._split(reqs, lens, self._run_chunk(reqs, lens, max(lens))))
            start = end
        return results

    def _rows(self, req: RequestInputs) -> int:
        return int(req[self.inputs[0][0]].shape[0])

    def _lens(self, reqs: list[RequestInputs]) -> list[int]:
        lens = [int(r[self.seq_inputs[0]].shape[1]) for r in reqs] if self.seq_inputs else [1] * len(reqs)
        if max(lens) > self.max_seq:
            raise ValueError(f"a sequence of {max(lens)} exceeds this model's limit of {self.max_seq}")
        if len(set(lens)) > 1 and not self.mask_inputs:
            raise ValueError("requests of different sequence lengths need a model with an attention mask")
        return lens

    def _split(
        self, reqs: list[RequestInputs], lens: list[int], outs: dict[str, np.ndarray]
    ) -> list[RequestOutputs]:
        """Each request's own rows (and tokens) of the chunk's outputs, as arrays it owns."""
        results: list[RequestOutputs] = []
        row = 0
        for r, n in zip(reqs, lens, strict=True):
            k = self._rows(r)
            res: RequestOutputs = {}
            for name, tensor, _, _ in self.outputs:
                o = outs[name][row : row + k]
                res[name] = np.array(o[:, :n] if self._has_seq(tensor) else o)
            results.append(res)
            row += k
        return results

    @abstractmethod
    def _run_chunk(self, reqs: list[RequestInputs], lens: list[int], t: int) -> dict[str, np.ndarray]:
        """Run one chunk (rows <= max_batch, sequences padded to ``t``); outputs by name."""
