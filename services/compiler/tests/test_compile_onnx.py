"""ONNX exports of an MLP and a 2-layer BERT encoder compile, fuse, plan memory and run on the CPU
runtime matching onnxruntime (INT4: cosine >= 0.99 per row; unquantized: 1e-4 relative)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="torch is a test-only package that .ci/run installs (CPU wheel); not in the uv lock"
)
ort = pytest.importorskip("onnxruntime", reason="onnxruntime is a test-only package that .ci/run installs")

from torch_models import export_bert, export_mlp  # noqa: E402

from anvil_compiler.frontends.onnx import load_onnx  # noqa: E402
from anvil_compiler.lower import Lowered  # noqa: E402
from anvil_compiler.options import CompileOptions  # noqa: E402
from anvil_compiler.pipeline import compile_graph  # noqa: E402
from anvil_core.proto_gen import plan_generated as pg  # noqa: E402
from anvil_executor.plan_runtime.model import PlanModel  # noqa: E402
from anvil_executor.plan_runtime.plan import LoadedPlan  # noqa: E402

INT4_COSINE = 0.99  # per output row, INT4 g<=128 RTN vs fp32 onnxruntime
FP32_REL = 1e-4  # max |out - ref| / max |ref|, unquantized plan


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("onnx")
    return {"mlp": export_mlp(d / "mlp.onnx"), "bert": export_bert(d / "bert.onnx")}


def _run(low: Lowered, feeds: dict[str, np.ndarray]) -> np.ndarray:
    model = PlanModel(LoadedPlan(pg.PlanT.InitFromPackedBuf(low.plan, 0)), low.weights)
    return next(iter(model.forward(feeds).values()))


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


def _feeds(kind: str, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    if kind == "mlp":
        return {"x": rng.standard_normal((5, 64)).astype(np.float32)}
    mask = np.ones((3, 20), np.int64)
    mask[1, 13:] = 0
    mask[2, 4:] = 0
    return {"input_ids": rng.integers(0, 500, (3, 20)).astype(np.int64), "attention_mask": mask}


@pytest.mark.parametrize("kind", ["mlp", "bert"])
def test_int4_and_fp32_plans_match_onnxruntime(models: dict[str, Path], kind: str) -> None:
    feeds = _feeds(kind, 0)
    ref = ort.InferenceSession(str(models[kind])).run(None, feeds)[0]
    valid = feeds["attention_mask"].astype(bool) if kind == "bert" else np.ones(ref.shape[0], bool)
    opts = CompileOptions(max_batch=8, max_seq=32, group_size=128, max_rel_error=None)  # every linear INT4
    q = _run(compile_graph(load_onnx(models[kind]), opts), feeds)
    assert _cos(q[valid], ref[valid]).min() >= INT4_COSINE
    full = _run(
        compile_graph(load_onnx(models[kind]), CompileOptions(quantize=False, max_batch=8, max_seq=32)), feeds
    )
    assert np.abs(full[valid] - ref[valid]).max() <= FP32_REL * np.abs(ref).max()


def test_bert_layer_fuses_to_at_most_six_kernels(models: dict[str, Path]) -> None:
    g = load_onnx(models["bert"])
    low = compile_graph(g, CompileOptions(max_batch=8, max_seq=32))
    kinds = [n.op for n in g.nodes if n.op != "view"]
    assert kinds.count("embed_ln") == 1 and kinds.count("attention") == 2
    per_layer = (low.stats["kernels"] - 1) / 2  # embeddings, then 2 identical layers
    assert per_layer <= 6, kinds
    assert low.stats["int4_linears"] == 8  # qkv, out, ffn1, ffn2 per layer


def test_bert_memory_plan_peak_is_under_40_percent(models: dict[str, Path]) -> None:
    low = compile_graph(load_onnx(models["bert"]), CompileOptions(max_batch=8, max_seq=32))
    assert low.stats["activation_bytes"] <= 0.4 * low.stats["intermediate_bytes"], low.stats


def test_per_layer_opt_out_keeps_fp32(models: dict[str, Path]) -> None:
    low = compile_graph(load_onnx(models["mlp"]), CompileOptions(keep_fp32=("/fc3/*",)))
    assert low.stats["fp32_linears"] == 1 and low.stats["int4_linears"] == 2
