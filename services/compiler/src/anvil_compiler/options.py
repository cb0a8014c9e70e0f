"""Compile options: everything besides the model bytes that changes an artifact (part of its key)."""

from __future__ import annotations

import fnmatch
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from anvil_compiler.errors import CompileError

__all__ = ["ARCHS", "CALIBRATION_SETS", "GPU_PRECISIONS", "CompileOptions"]

ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90")
GPU_PRECISIONS = ("auto", "fp16", "bf16", "fp32")
CALIBRATION_SETS = ("bert-uncased",)  # built-in GPTQ calibration sets (passes/calibrate.py)


@dataclass(frozen=True, slots=True)
class CompileOptions:
    # INT4 group size along K (32, 64, 128, 256); a layer whose K it does not divide uses the
    # largest smaller one that does, or stays fp32 when none does (recorded in the manifest).
    group_size: int = 128
    # False: the "unquantized" plan, every weight fp32, output matches the reference to ~1e-5.
    quantize: bool = True
    # fnmatch patterns of node names whose linear weights stay fp32 (per-layer opt-out).
    keep_fp32: tuple[str, ...] = ()
    # embedding tables in fp16 (halves their bytes; gathers are exact up to fp16 rounding).
    embeddings_fp16: bool = True
    # the activation bank is planned for this many rows and tokens per row
    max_batch: int = 8
    max_seq: int = 128
    # GPU archs the kernels are built for (one fatbin holds them all)
    archs: tuple[str, ...] = field(default=("sm_90",))
    # also search clipping ratios when quantizing (slower compile, lower error)
    clip_search: bool = False
    # GPTQ instead of round-to-nearest for the INT4 linears (passes/gptq.py): error feedback from
    # calibration activations; 7-30 s more compile on 2 CPU cores for all-MiniLM-L6-v2
    gptq: bool = False
    # the GPTQ calibration set: token ids of one vocabulary, so it must match the model's
    calibration: str = "bert-uncased"
    # GPTQ only: quantize rows by decreasing input energy, group scales fixed up front
    act_order: bool = False
    # Error budget of the quantized plan (passes/accuracy.py): the largest relative max-norm error
    # max|q - ref| / max|ref| of any output row against the unquantized plan on the calibration
    # inputs. Over budget, linears are kept fp32, most sensitive first, until it fits; a budget
    # that cannot be met fails the compile. None: measure and report only. 0.05: INT4 g128 RTN
    # rounds each weight by up to 1/30 of its group's range, so a well-conditioned model's outputs
    # move by a few percent (the test BERT: 1-2%); 5% of the largest output keeps argmax and
    # top-k of confident predictions while flagging models whose error compounds (issue 22's
    # 64-256-10 MLP: 10-24%).
    max_rel_error: float | None = 0.05
    # Activations of the plan on a GPU (docs/executor_gpu.md): "fp16" stores activations and linear
    # weights fp16 (cuBLAS / W4A16 with fp32 accumulation, fp32 softmax and LayerNorm statistics,
    # pooled outputs fp32); "bf16" the same in bf16 (fp32's range, 8 bits of mantissa: for models
    # whose activations overflow fp16); "fp32" keeps the fp32 plan (TF32 GEMMs). "auto": fp16 for encoders (a
    # graph with attention: all-MiniLM-L6-v2 measured cosine >= 0.9999 to fp32), fp32 otherwise. The
    # CPU backend always runs the fp32 plan.
    gpu_precision: str = "auto"

    def __post_init__(self) -> None:
        if self.group_size not in (32, 64, 128, 256):
            raise CompileError(f"group_size must be one of 32, 64, 128, 256, got {self.group_size}")
        if not 1 <= self.max_batch <= 4096 or not 1 <= self.max_seq <= 8192:
            raise CompileError("max_batch must be in 1..4096 and max_seq in 1..8192")
        bad = [a for a in self.archs if a not in ARCHS]
        if bad or not self.archs:
            raise CompileError(f"archs must be a non-empty subset of {ARCHS}, got {list(self.archs)}")
        if self.max_rel_error is not None and not (
            math.isfinite(self.max_rel_error) and self.max_rel_error > 0
        ):
            raise CompileError(f"max_rel_error must be a number > 0 (or None), got {self.max_rel_error}")
        if self.gpu_precision not in GPU_PRECISIONS:
            raise CompileError(f"gpu_precision must be one of {GPU_PRECISIONS}, got {self.gpu_precision!r}")
        if self.calibration not in CALIBRATION_SETS:
            raise CompileError(f"calibration must be one of {CALIBRATION_SETS}, got {self.calibration!r}")

    def keeps_fp32(self, node: str) -> bool:
        return not self.quantize or any(fnmatch.fnmatchcase(node, p) for p in self.keep_fp32)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["keep_fp32"], d["archs"] = list(self.keep_fp32), sorted(self.archs)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CompileOptions:
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        for k in ("keep_fp32", "archs"):
            if k in known:
                known[k] = tuple(known[k])
        try:
            return cls(**known)
        except TypeError as exc:
            raise CompileError(f"bad compile options: {exc}") from exc
