"""Artifact files and manifest, and the content address of a compile.

An artifact directory ``{artifact_dir}/{id}/`` holds:

| file | what |
|---|---|
| plan.bin | flatbuffers `anvil.plan.Plan` (proto/plan.fbs) |
| weights.safetensors | weights by the plan's names (INT4 packed u8 + fp16 scales/zeros; fp16/fp32) |
| kernels.cu | the generated CUDA source, kept for inspection |
| kernels.fatbin or kernels.sm_XX.cubin | compiled kernels (nvcc fatbin for all archs, or NVRTC cubins) |
| tokenizer.json, modules.json, ... | an HF encoder's tokenizer and sentence-transformers configs |
| manifest.json | id, name, options, compiler version, stats, model spec, sha256 + size of every file |
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from anvil_compiler.options import CompileOptions
from anvil_core.model_spec import ModelSpec, TensorSpec
from anvil_core.plan_format import PLAN_VERSION
from anvil_core.proto_gen import plan_generated as pg

if TYPE_CHECKING:  # the service reads manifests only; lowering (numba kernels) is the worker's
    from anvil_compiler.lower import Lowered

__all__ = [
    "COMPILER_VERSION",
    "artifact_key",
    "model_digest",
    "read_manifest",
    "spec_from_plan",
    "write_artifact",
]

# Part of every artifact key: bump when a change to passes, codegen or templates changes outputs.
# 0.2: accuracy report and error budget; 0.3: GPU precision (fp16 kernels); 0.3.1: the GEMV-like W4A16
# kernels' variants changed (4 chunks in flight: new kernel names in the artifact's fatbin); 0.3.2: a
# weight several linears read (a shared initializer) is quantized and stored once, and the staged
# attention spreads a short batch's query rows over more blocks; 0.3.3: GPU precision bf16 (kernels.cu
# carries the bf16 loads and stores); 0.3.4: the W4A16 fatbin's GEMV-like kernels wait for their
# predecessor (programmatic dependent launch, w4a16_pdl_marker)
COMPILER_VERSION = "0.3.4+plan1"


def model_digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def artifact_key(digest: str, fmt: str, opts: CompileOptions, calibration: str = "") -> str:
    """hash(model bytes, format, pass options incl. archs, compiler version[, calibration data
    digest: it picks the layers the error budget keeps]) -> artifact id."""
    doc_: dict[str, Any] = {
        "model": digest,
        "format": fmt,
        "options": opts.to_dict(),
        "compiler": COMPILER_VERSION,
    }
    if calibration:
        doc_["calibration"] = calibration
    doc = json.dumps(doc_, sort_keys=True)
    return hashlib.sha256(doc.encode()).hexdigest()[:32]


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def spec_from_plan(plan_bytes: bytes, name: str) -> ModelSpec:
    """The ModelSpec (gateway validation) of a plan: its inputs/outputs per row, batched."""
    p = pg.PlanT.InitFromPackedBuf(plan_bytes, 0)

    def ts(io: Any) -> TensorSpec:
        return TensorSpec(
            _s(io.name), _s(io.datatype), tuple(int(d) for d in ([] if io.dims is None else io.dims))
        )

    return ModelSpec(
        name=name,
        platform="anvil_plan",
        max_batch=int(p.maxBatch),
        inputs=tuple(ts(io) for io in p.inputs),
        outputs=tuple(ts(io) for io in p.outputs),
    )


def _file_info(path: Path) -> dict[str, Any]:
    return {"sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "bytes": path.stat().st_size}


def write_artifact(
    out_dir: Path,
    key: str,
    name: str,
    lowered: Lowered,
    kernels: dict[str, str],
    opts: CompileOptions,
    compile_s: float,
    assets: dict[str, bytes] | None = None,
) -> dict[str, Any]:
    """``assets``: files kept as they came (an HF bundle's tokenizer.json, sentence-transformers
    configs); their names were checked against ``anvil_core.hf_bundle``'s list."""
    from safetensors.numpy import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    for rel, data in (assets or {}).items():
        (out_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (out_dir / rel).write_bytes(data)
    (out_dir / "plan.bin").write_bytes(lowered.plan)
    save_file(lowered.weights, str(out_dir / "weights.safetensors"))
    files = [
        "plan.bin",
        "weights.safetensors",
        *(["kernels.cu"] if (out_dir / "kernels.cu").exists() else []),
        *kernels.values(),
        *sorted(assets or {}),
    ]
    manifest = {
        "id": key,
        "name": name,
        "plan_version": PLAN_VERSION,
        "compiler_version": COMPILER_VERSION,
        "created": time.time(),
        "compile_s": round(compile_s, 3),
        "options": opts.to_dict(),
        "stats": lowered.stats,
        "accuracy": lowered.accuracy,
        "spec": json.loads(spec_from_plan(lowered.plan, name).to_json()),
        "kernels": kernels,
        "files": {f: _file_info(out_dir / f) for f in files},
    }
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return manifest


def read_manifest(artifact_dir: Path) -> dict[str, Any] | None:
    path = artifact_dir / "manifest.json"
    if not path.is_file():
        return None
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc
