"""A compiled artifact directory -> the executor's ``Model``, on the configured device.

The plan runs on the CPU backend (``PlanModel``) or on a CUDA device (``GpuPlanModel``). An artifact
of a sentence encoder that carries its tokenizer (``tokenizer.json``, written by the compiler from
the deployed HF directory) and whose plan has ``input_ids``/``attention_mask`` inputs and a
``sentence_embedding`` output is served as text: a ``TextEmbeddingModel`` (TEXT BYTES in, EMBEDDING
FP32 and TOKENS out) over the plan, so ``/v1/embeddings`` and KServe BYTES inputs work for it like
for the built-in ``minilm`` (which is itself such an artifact, models/minilm.py). On the CPU the
encoder runs packed (no padding: plan_runtime/packed.py); on a GPU sequences are padded to the plan
runtime's buckets, so the plan meets its captured CUDA graphs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from anvil_executor.device import DeviceSpec
from anvil_executor.models.base import Model
from anvil_executor.models.text_embedding import Encoder, PackedEncoder, TextEmbeddingModel
from anvil_executor.plan_runtime.buckets import seq_buckets
from anvil_executor.plan_runtime.io import PlanIO
from anvil_executor.plan_runtime.packed import PackedRunner

__all__ = ["load_artifact", "packed_encoder", "plan_encoder"]

TEXT_INPUTS = ("input_ids", "attention_mask")
EMBEDDING_OUTPUT = "sentence_embedding"


def plan_encoder(plan: PlanIO, output: str = EMBEDDING_OUTPUT) -> Encoder:
    """(ids, mask, types) -> (rows, D) through the plan, in requests of at most max_batch rows."""

    def encode(ids: np.ndarray, mask: np.ndarray, types: np.ndarray) -> np.ndarray:
        step = plan.max_batch
        reqs = [
            {"input_ids": ids[s : s + step], "attention_mask": mask[s : s + step]}
            for s in range(0, len(ids), step)
        ]
        return np.concatenate([o[output] for o in plan.run(reqs)], axis=0).astype(np.float32, copy=False)

    return encode


def packed_encoder(runner: PackedRunner, output: str = EMBEDDING_OUTPUT) -> PackedEncoder:
    """(ids (N,), cu (S+1,)) -> (S, D) through a CPU plan's packed runner (a copy out of the arena)."""

    def encode(ids: np.ndarray, cu: np.ndarray) -> np.ndarray:
        return np.array(runner.run(ids, cu)[output], np.float32)

    return encode


def _load_plan(path: Path, device: DeviceSpec, name: str, gpu: dict[str, Any], lanes: int = 1) -> PlanIO:
    """The artifact's plan on the device; with ``lanes`` > 1, that many independent instances of it
    as one ``LanedPlan`` (each compute thread runs its own: plan_runtime/lanes.py)."""
    if lanes > 1:
        from anvil_executor.plan_runtime.lanes import LanedPlan

        return LanedPlan([_load_plan(path, device, name, gpu) for _ in range(lanes)])
    if device.is_cuda:
        from anvil_executor.plan_runtime.gpu_model import GpuPlanModel

        # A text encoder's batches need only the pooled vector out of the device (not the token states).
        outputs = [EMBEDDING_OUTPUT] if _text_artifact(path) else None
        return GpuPlanModel.load(path, device.index, name=name, outputs=outputs, **gpu)
    from anvil_executor.plan_runtime import PlanModel

    return PlanModel.load(path, name=name)


def _text_artifact(path: Path) -> bool:
    """Whether the artifact is served as text, read from its plan's public names (before loading)."""
    from anvil_executor.plan_runtime.plan import _s, load_plan

    p = load_plan(path / "plan.bin").plan
    names_in = {_s(io.name) for io in p.inputs}
    names_out = {_s(io.name) for io in p.outputs}
    tokenizer = (path / "tokenizer.json").is_file()
    return tokenizer and set(TEXT_INPUTS) <= names_in and EMBEDDING_OUTPUT in names_out


def is_text_encoder(plan: PlanIO, path: Path) -> bool:
    names_in = {n for n, _, _, _ in plan.inputs}
    names_out = {n for n, _, _, _ in plan.outputs}
    return (
        (path / "tokenizer.json").is_file() and set(TEXT_INPUTS) <= names_in and EMBEDDING_OUTPUT in names_out
    )


def load_artifact(
    path: Path, device: DeviceSpec, name: str, gpu: dict[str, Any] | None = None, lanes: int = 1
) -> tuple[Model, PlanIO]:
    """The served model and the plan under it (the same object unless the artifact embeds text).
    ``gpu``: options of ``GpuPlanModel`` (gemm, tf32) on a CUDA device; ``lanes``: plan instances,
    one per compute thread (ANVIL_LANES)."""
    plan = _load_plan(path, device, name, gpu or {}, lanes)
    if not is_text_encoder(plan, path):
        return plan, plan
    dim = next(int(d[-1]) for n, _, _, d in plan.outputs if n == EMBEDDING_OUTPUT)
    runner: PackedRunner | None = getattr(plan, "packed", None)  # CPU plans that run packed
    model = TextEmbeddingModel(
        name,
        path / "tokenizer.json",
        plan_encoder(plan),
        dim,
        max_batch=plan.max_batch,  # rows of text per batch: one plan run (one graph replay on a GPU)
        max_tokens=plan.max_seq,
        buckets=seq_buckets(plan.max_seq),
        encoder_rows=plan.max_batch,  # one plan run (one graph replay on a GPU) per chunk
        packed=packed_encoder(runner) if runner is not None else None,
        packed_tokens=plan.max_batch * plan.max_seq,  # the arena's planned token rows
    )
    return model, plan
