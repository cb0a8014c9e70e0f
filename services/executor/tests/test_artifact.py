"""Artifacts as served models: a plan alone, and a sentence encoder whose artifact carries its
tokenizer, served as text (TEXT in, EMBEDDING and TOKENS out) over the same plan."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

from anvil_compiler.frontends.hf import bundle_from_dir
from anvil_compiler.options import CompileOptions
from anvil_compiler.pipeline import compile_model
from anvil_executor.artifact import load_artifact
from anvil_executor.device import parse_device
from anvil_executor.models.text_embedding import TextEmbeddingModel
from anvil_executor.plan_runtime import PlanModel

sys.path.insert(0, str(Path(__file__).parent))
from tiny_bert import make_tiny_bert


def _compile(tmp_path: Path, with_tokenizer: bool) -> Path:
    """The compiler keeps the directory's tokenizer.json in the artifact (anvil_core.hf_bundle)."""
    hf = make_tiny_bert(tmp_path / "hf")
    if not with_tokenizer:
        (hf / "tokenizer.json").unlink()
    art = tmp_path / "art"
    opts = CompileOptions(quantize=False, max_batch=4, max_seq=32)
    manifest = compile_model("hf", bundle_from_dir(hf), "tiny", opts, art, "k", build=False)
    assert ("tokenizer.json" in manifest["files"]) == with_tokenizer
    return art


def test_an_encoder_artifact_with_its_tokenizer_embeds_text(tmp_path: Path) -> None:
    art = _compile(tmp_path, with_tokenizer=True)
    model, plan = load_artifact(art, parse_device("cpu"), "tiny")
    assert isinstance(model, TextEmbeddingModel) and isinstance(plan, PlanModel)
    assert [t.datatype for t in model.spec.inputs] == ["BYTES"] and model.spec.max_batch == 4
    texts = ["the cat sat on the mat", "a dog runs", "red model serves blue text fast", "slow", "the dog"]
    reqs = [{"TEXT": np.array([t.encode()], dtype=object)} for t in texts]  # 5 rows > max_batch 4
    outs = model.run(reqs)
    for text, out in zip(texts, outs, strict=True):
        emb, tokens = out["EMBEDDING"], out["TOKENS"]
        assert emb.shape == (1, 32) and abs(float(np.linalg.norm(emb)) - 1.0) < 1e-4
        enc = model.tokenizer.encode(text)
        assert int(tokens[0]) == len(enc.ids)
        ids = np.array([enc.ids], np.int64)  # the same sentence alone, unpadded, straight through the plan
        ref = plan.run([{"input_ids": ids, "attention_mask": np.ones_like(ids)}])[0]["sentence_embedding"]
        np.testing.assert_allclose(emb, ref, rtol=1e-4, atol=1e-5)  # padding inside a batch changes nothing


def test_a_plan_without_a_tokenizer_is_served_as_tensors(tmp_path: Path) -> None:
    art = _compile(tmp_path, with_tokenizer=False)
    model, plan = load_artifact(art, parse_device("cpu"), "tiny")
    assert model is plan and {t.name for t in model.spec.inputs} == {"input_ids", "attention_mask"}


def test_a_big_batch_is_encoded_in_length_sorted_chunks(tmp_path: Path) -> None:
    """Short sentences are not padded to the longest of the batch, and no encoder call exceeds
    encoder_rows; every request still gets its own rows back, in order."""
    hf = make_tiny_bert(tmp_path / "hf")
    calls: list[tuple[int, int]] = []

    def encoder(ids: np.ndarray, mask: np.ndarray, types: np.ndarray) -> np.ndarray:
        calls.append(ids.shape)
        return np.repeat(mask.sum(1, keepdims=True).astype(np.float32), 4, axis=1)  # row -> its length

    model = TextEmbeddingModel("t", hf / "tokenizer.json", encoder, 4, max_batch=64, encoder_rows=3)
    texts = ["cat " * 30, "a", "dog runs", "the red model serves blue text " * 3, "mat", "slow dog"]
    outs = model.run([{"TEXT": np.array([t.encode()], dtype=object)} for t in texts])
    assert all(rows <= 3 for rows, _ in calls) and sum(rows for rows, _ in calls) == len(texts)
    assert min(seq for _, seq in calls) < max(seq for _, seq in calls)  # the short chunk is not padded long
    for text, out in zip(texts, outs, strict=True):
        n = len(model.tokenizer.encode(text).ids)
        assert int(out["TOKENS"][0]) == n and float(out["EMBEDDING"][0, 0]) == n


def test_a_text_artifact_is_recognised_from_its_plan_before_loading(tmp_path: Path) -> None:
    from anvil_executor.artifact import _text_artifact

    assert _text_artifact(_compile(tmp_path / "a", with_tokenizer=True))
    assert not _text_artifact(_compile(tmp_path / "b", with_tokenizer=False))


def test_a_plan_serves_only_the_outputs_it_is_asked_for(tmp_path: Path) -> None:
    """What GpuPlanModel does for a text encoder (only the pooled vector leaves the device), through
    the shared PlanIO layer on the CPU."""
    import pytest

    from anvil_executor.plan_runtime.io import PlanIO
    from anvil_executor.plan_runtime.plan import load_plan

    class Names(PlanIO):
        def _run_chunk(self, reqs: Any, lens: Any, t: int) -> Any:
            raise AssertionError("not run")

    art = _compile(tmp_path, with_tokenizer=True)
    every, only = Names(), Names()
    every._init_io(load_plan(art / "plan.bin"), "tiny")
    only._init_io(load_plan(art / "plan.bin"), "tiny", ["sentence_embedding"])
    assert {o[0] for o in every.outputs} == {"last_hidden_state", "sentence_embedding"}
    assert [o[0] for o in only.outputs] == ["sentence_embedding"]
    assert [t.name for t in only.spec.outputs] == ["sentence_embedding"]
    with pytest.raises(ValueError, match="no output"):
        Names()._init_io(load_plan(art / "plan.bin"), "tiny", ["logits"])


def test_sorted_rows_are_cut_where_the_length_bucket_grows_once_a_chunk_is_big_enough() -> None:
    from anvil_executor.models.text_embedding import MIN_CHUNK_ROWS, padded_chunks

    def bucket(n: int) -> int:
        return -(-n // 8) * 8

    counts = np.array([10] * 100 + [30] * 100 + [70] * 10, np.int32)  # sorted lengths
    chunks = padded_chunks(counts, 512, bucket)
    assert chunks == [(0, 100), (100, 200), (200, 210)]  # the 10 long rows do not pad 100 others to 72
    assert padded_chunks(counts, 64, bucket)[0] == (0, 64)  # never more than max_rows
    few = np.array([5] * (MIN_CHUNK_ROWS - 1) + [60], np.int32)
    assert padded_chunks(few, 512, bucket) == [(0, MIN_CHUNK_ROWS)]  # too few rows to be worth a cut
    covered = [i for s, e in padded_chunks(counts, 48, bucket) for i in range(s, e)]
    assert covered == list(range(len(counts)))
