"""`PlanModel`: a compiled artifact served by the executor on the CPU.

Load: read plan.bin and weights.safetensors, put every weight in the arena's weight bank at the
compiler's offset, size the activation bank from the plan. Run: copy each input into its slot,
run the ops in order on views at the batch's (B, T), copy the outputs out (the bank is reused by
the next batch). Requests of one batch are stacked along B; a model with an attention mask also
takes requests of different lengths (padded to the longest, mask 0 on padding).

An encoder plan whose ops all run on token rows (packed.py says which) also gets ``packed``: the
same ops on the sequences back to back, no padding at all; the text-embedding front end uses it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from anvil_executor.models.base import RequestInputs
from anvil_executor.plan_runtime.arena import HostArena
from anvil_executor.plan_runtime.io import PlanIO, _l
from anvil_executor.plan_runtime.ops import CPU_OPS, OpState
from anvil_executor.plan_runtime.packed import PackedRunner, packable
from anvil_executor.plan_runtime.plan import DTYPES, LoadedPlan, _s, attrs_of, load_plan
from anvil_kernels import Int4Weight, Workspace, gemm_f32_avx512

__all__ = ["PlanModel"]


class PlanModel(PlanIO):
    """The CPU backend: host arena, anvil_kernels' numba ops, one op after another."""

    def __init__(self, plan: LoadedPlan, weights: dict[str, np.ndarray], name: str | None = None) -> None:
        p = plan.plan
        self._init_io(plan, name)
        self.arena = HostArena({"weights": int(p.weightBytes), "activations": int(p.activationBytes)})
        bank: list[np.ndarray] = []
        for wi in p.weights:
            arr = weights[_s(wi.name)]
            view = self.arena.view(
                "weights", int(wi.offset), tuple(int(d) for d in _l(wi.shape)), DTYPES[wi.dtype]
            )
            view[...] = arr
            bank.append(view)
        self._packed_w: dict[int, np.ndarray] = {}  # weight index -> its AVX-512 copy, once per weight
        self.ops = [self._prepare(op, bank) for op in p.ops]
        self.ws = Workspace()
        self.packed: PackedRunner | None = PackedRunner(self) if not packable(self) else None

    @classmethod
    def load(cls, artifact_dir: str | Path, name: str | None = None) -> PlanModel:
        from safetensors.numpy import load_file

        root = Path(artifact_dir)
        return cls(load_plan(root / "plan.bin"), load_file(str(root / "weights.safetensors")), name)

    def _prepare(self, op: Any, bank: list[np.ndarray]) -> OpState:
        roles = [_s(r) for r in _l(op.weightRoles)]
        index = {r: int(i) for r, i in zip(roles, _l(op.weights), strict=True)}
        w: dict[str, Any] = {r: bank[i] for r, i in index.items()}
        attrs = attrs_of(op)
        if "packed" in w:
            k2, n = w["packed"].shape
            group = int(attrs["group"])
            w["int4"] = Int4Weight(w["packed"], w["scales"], w["zeros"], group, 2 * k2, n, "fp16")
        if _s(op.kind) == "linear" and "weight" in w and gemm_f32_avx512.packable(w["weight"]):
            # the small-M GEMM reads this copy (no repack per call); sgemm, for large M, the bank's
            # (a second copy of each fp32 linear weight: 42 MB for all-MiniLM-L6-v2)
            # (ops reading one shared weight share its copy)
            if index["weight"] not in self._packed_w:
                self._packed_w[index["weight"]] = gemm_f32_avx512.pack(w["weight"])
            w["weight_packed"] = self._packed_w[index["weight"]]
        if "table" in w and w["table"].dtype != np.float32:
            w["table"] = w["table"].astype(np.float32)  # anvil_kernels.embedding gathers fp32 rows
        ins = {_s(r): int(i) for r, i in zip(_l(op.inputRoles), _l(op.inputs), strict=True)}
        return OpState(_s(op.kind), _s(op.name), attrs, ins, int(op.outputs[0]), w)

    def _view(self, tensor: int, b: int, t: int) -> np.ndarray:
        ti = self.plan.plan.tensors[tensor]
        return self.arena.view("activations", int(ti.offset), self.plan.shape(tensor, b, t), DTYPES[ti.dtype])

    def forward(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One padded batch: every input (B, ...) with B <= max_batch, T <= max_seq; outputs copied."""
        return {name: v.copy() for name, v in self._compute(feeds).items()}

    def _compute(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the ops; the outputs as views into the arena (valid until the next batch)."""
        first = feeds[self.inputs[0][0]]
        b = first.shape[0]
        t = feeds[self.seq_inputs[0]].shape[1] if self.seq_inputs else 1
        if not 1 <= b <= self.max_batch or not 1 <= t <= self.max_seq:
            raise ValueError(f"batch {b} x seq {t} exceeds the plan's {self.max_batch} x {self.max_seq}")
        for name, tensor, _, _ in self.inputs:
            view = self._view(tensor, b, t)
            if feeds[name].shape != view.shape:
                raise ValueError(f"input {name!r}: shape {feeds[name].shape}, plan expects {view.shape}")
            view[...] = feeds[name]
        for op in self.ops:
            views = {r: self._view(i, b, t) for r, i in op.inputs.items()}
            views["out"] = self._view(op.output, b, t)
            CPU_OPS[op.kind](op, views, self.ws)
        return {name: self._view(tensor, b, t) for name, tensor, _, _ in self.outputs}

    def _run_chunk(self, reqs: list[RequestInputs], lens: list[int], t: int) -> dict[str, np.ndarray]:
        feeds: dict[str, np.ndarray] = {}
        for name, tensor, _, _ in self.inputs:
            dt = self.plan.dtype(tensor)
            parts = []
            for r, n in zip(reqs, lens, strict=True):
                a = np.asarray(r[name], dtype=dt)
                if name in self.seq_inputs and n < t:
                    a = np.concatenate([a, np.zeros((a.shape[0], t - n, *a.shape[2:]), dt)], axis=1)
                parts.append(a)
            feeds[name] = np.concatenate(parts, axis=0)
        return self._compute(feeds)  # views: _split copies each request's rows out once
