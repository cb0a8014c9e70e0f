"""The text front end's tokenization (TextEmbeddingModel.prepare): the ids it hands the encoder are
the tokenizer's own, row after row, cut at the longest bucket, whichever path a row takes (the
compiled WordPiece for ASCII rows, tokenizers' offset-free ``encode_batch_fast`` where it has it, else
``encode_batch``, for the others)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from anvil_executor.models.text_embedding import TextEmbeddingModel
from anvil_executor.models.wordpiece import DECLINED

sys.path.insert(0, str(Path(__file__).parent))
from tiny_bert import make_tiny_bert

TEXTS = ["the cat", "", "a dog runs on the mat " * 20, "naïve café — 東京 🚀", "the red model serves text"]


def _model(tokenizer_json: Path, buckets: tuple[int, ...] = (16, 32, 64)) -> TextEmbeddingModel:
    def encoder(ids: np.ndarray, mask: np.ndarray, types: np.ndarray) -> np.ndarray:
        return np.zeros((ids.shape[0], 8), np.float32)

    return TextEmbeddingModel("t", tokenizer_json, encoder, 8, 64, max_tokens=64, buckets=buckets)


@pytest.mark.parametrize("fast", [True, False])
def test_prepared_ids_are_the_tokenizers_own(tmp_path: Path, fast: bool) -> None:
    hf = make_tiny_bert(tmp_path / "hf")
    model = _model(hf / "tokenizer.json")
    if not fast:  # the fallback for a tokenizers without encode_batch_fast
        model._encode_batch = model.tokenizer.encode_batch
    reqs = [{"TEXT": np.array([t.encode() for t in TEXTS[:2]], dtype=object)}]
    reqs += [{"TEXT": np.array([t.encode()], dtype=object)} for t in TEXTS[2:]]
    assert model.fast is not None  # a BERT WordPiece: the compiled path takes the ASCII rows
    _, counts = model.fast.encode_batch([t.encode() for t in TEXTS])
    assert (counts == DECLINED).tolist() == [False, False, False, True, False]  # the non-ASCII row
    got = model.prepare(reqs)
    want = [model.tokenizer.encode(t).ids[:64] for t in TEXTS]  # cut at max_tokens (the last bucket)
    assert got.rows == [2, 1, 1, 1]
    assert got.counts.tolist() == [len(w) for w in want]
    assert [got.flat[got.cu[r] : got.cu[r + 1]].tolist() for r in range(len(TEXTS))] == want
    assert max(got.counts) == 64  # the long row was cut at the longest bucket


def test_a_lone_row_reaches_the_encoder_unpadded_and_embeds_as_in_a_batch(tmp_path: Path) -> None:
    """One row goes to the encoder as it is, (1, n) with an all-ones mask (the encoder pads to its
    own shapes); in a batch the same row is padded to its length bucket. An encoder that reads only
    the masked tokens gives the row the same vector either way."""
    hf = make_tiny_bert(tmp_path / "hf")
    seen: list[tuple[int, ...]] = []

    def encoder(ids: np.ndarray, mask: np.ndarray, types: np.ndarray) -> np.ndarray:
        seen.append(ids.shape)
        assert mask.shape == ids.shape == types.shape and not types.any()
        summed = (ids * mask).sum(axis=1, keepdims=True).astype(np.float32)  # padding-blind
        return np.repeat(summed, 8, axis=1) + mask.sum(axis=1, keepdims=True)

    model = TextEmbeddingModel("t", hf / "tokenizer.json", encoder, 8, 64, max_tokens=64, buckets=(16, 32))
    text = np.array([b"the red model serves text"], dtype=object)
    alone = model.run([{"TEXT": text}])[0]["EMBEDDING"]
    n = int(model.run([{"TEXT": text}])[0]["TOKENS"][0])
    assert seen[-1] == (1, n)  # unpadded
    both = model.run([{"TEXT": text}, {"TEXT": np.array([b"the cat"], dtype=object)}])
    assert seen[-1] == (2, 16)  # a batch: padded to the bucket of its longest row
    np.testing.assert_array_equal(alone, both[0]["EMBEDDING"])
