"""Packed (varlen) execution of an encoder plan on the CPU: the same outputs as the padded run, no
padding, and the text front end's chunks within the plan's rows and tokens."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from anvil_compiler.frontends.hf import bundle_from_dir
from anvil_compiler.options import CompileOptions
from anvil_compiler.pipeline import compile_model
from anvil_executor.artifact import load_artifact
from anvil_executor.device import parse_device
from anvil_executor.models.text_embedding import TextEmbeddingModel
from anvil_executor.plan_runtime import PlanModel
from anvil_executor.plan_runtime.packed import packable
from anvil_kernels import gemm_f32_avx512

sys.path.insert(0, str(Path(__file__).parent))
from tiny_bert import WORDS, make_tiny_bert


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tiny")
    hf = make_tiny_bert(root / "hf")
    opts = CompileOptions(quantize=False, max_batch=4, max_seq=32)
    compile_model("hf", bundle_from_dir(hf), "tiny", opts, root / "art", "k", build=False)
    return root / "art"


def test_packed_run_equals_the_padded_run(tiny: Path) -> None:
    model = PlanModel.load(tiny)
    assert model.packed is not None, packable(model)
    rng = np.random.default_rng(3)
    lens = [5, 1, 17, 9]
    ids = [rng.integers(4, 4 + len(WORDS), n).astype(np.int64) for n in lens]
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    got = {k: v.copy() for k, v in model.packed.run(np.concatenate(ids), cu).items()}  # arena views
    t = max(lens)
    pid, mask = np.zeros((4, t), np.int64), np.zeros((4, t), np.int64)
    for i, row in enumerate(ids):
        pid[i, : len(row)], mask[i, : len(row)] = row, 1
    ref = model.forward({"input_ids": pid, "attention_mask": mask})
    np.testing.assert_allclose(got["sentence_embedding"], ref["sentence_embedding"], rtol=1e-5, atol=1e-6)
    hidden = got["last_hidden_state"]  # per token: (N, H), the padded rows' valid tokens in order
    assert hidden.shape == (sum(lens), ref["last_hidden_state"].shape[-1])
    for i, (lo, n) in enumerate(zip(cu[:-1], lens, strict=True)):
        np.testing.assert_allclose(hidden[lo : lo + n], ref["last_hidden_state"][i, :n], rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not gemm_f32_avx512.available(), reason="the packed fp32 GEMM needs AVX-512")
def test_fp32_linears_run_on_weights_packed_at_load_like_on_sgemm(tiny: Path) -> None:
    """Every fp32 linear whose N is a multiple of 32 gets its weight packed once at load (the small-M
    GEMM); the encoder's outputs equal those of the same plan on OpenBLAS's sgemm."""
    model = PlanModel.load(tiny)
    assert model.packed is not None
    linears = [op for op in model.ops if op.kind == "linear"]
    assert linears and all("weight_packed" in op.weights for op in linears)  # hidden 32, FFN 128, QKV 96
    rng = np.random.default_rng(5)
    lens = [3, 11, 1]
    ids = rng.integers(4, 4 + len(WORDS), sum(lens)).astype(np.int64)
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    got = model.packed.run(ids, cu)["sentence_embedding"].copy()
    for op in linears:
        del op.weights["weight_packed"]
    ref = model.packed.run(ids, cu)["sentence_embedding"]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_packed_run_refuses_more_than_the_plan_holds(tiny: Path) -> None:
    model = PlanModel.load(tiny)
    assert model.packed is not None
    with pytest.raises(ValueError, match="exceed the plan"):
        model.packed.run(np.full(33, 5, np.int64), np.array([0, 33], np.int64))  # max_seq 32
    with pytest.raises(ValueError, match="exceed the plan"):
        model.packed.run(np.full(5, 5, np.int64), np.arange(6, dtype=np.int64))  # 5 rows > max_batch 4


def test_a_plan_without_a_sequence_axis_is_not_packable(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = np.ones((4, 2), np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="fc")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 2])],
        [numpy_helper.from_array(w, "w")],
    )
    data = helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]).SerializeToString()
    compile_model("onnx", data, "m", CompileOptions(quantize=False, max_batch=4), tmp_path, "k", build=False)
    model = PlanModel.load(tmp_path)
    assert model.packed is None and "mask" in packable(model)


def test_text_on_the_cpu_runs_packed_in_chunks_within_the_plan(tiny: Path) -> None:
    """The CPU text model feeds the packed runner: every call at most max_batch rows and
    max_batch x max_seq tokens, no padding, each request gets its own rows back."""
    model, plan = load_artifact(tiny, parse_device("cpu"), "tiny")
    assert isinstance(model, TextEmbeddingModel) and model.packed is not None
    calls: list[tuple[int, int]] = []
    inner = model.packed

    def spy(ids: np.ndarray, cu: np.ndarray) -> np.ndarray:
        calls.append((cu.size - 1, ids.size))
        return inner(ids, cu)

    model.packed = spy
    model.packed_tokens = 40  # smaller than 4 x 32: the token budget cuts chunks too
    texts = ["cat " * 30, "a", "dog runs", "the red model serves blue text " * 2, "mat", "slow dog", "the"]
    outs = model.run([{"TEXT": np.array([t.encode()], dtype=object)} for t in texts])
    assert all(rows <= 4 and tokens <= 40 for rows, tokens in calls)
    counts = [int(o["TOKENS"][0]) for o in outs]
    assert sum(tokens for _, tokens in calls) == sum(counts)  # tokens only: no padding was run
    for text, out in zip(texts, outs, strict=True):
        ids = np.array([model.tokenizer.encode(text).ids], np.int64)
        ref = plan.run([{"input_ids": ids, "attention_mask": np.ones_like(ids)}])[0]["sentence_embedding"]
        np.testing.assert_allclose(out["EMBEDDING"], ref, rtol=1e-4, atol=1e-5)
