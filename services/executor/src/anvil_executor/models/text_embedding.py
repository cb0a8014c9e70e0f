"""A sentence-embedding model: a tokenizer stage in front of an encoder (ids, mask) -> vectors.

TEXT (BYTES, one string per row) -> EMBEDDING (FP32, dim per row) and TOKENS (INT32 per row, for
OpenAI-style usage). Every row of the batch is tokenized together: the ASCII rows by the compiled
WordPiece of models/wordpiece.py (a BERT WordPiece tokenizer.json; same ids as Hugging Face, one
numba call without the GIL), the other rows by HF tokenizers' Rust ``encode_batch_fast`` where the
installed tokenizers has it, else ``encode_batch`` (parallel, without the GIL); truncation at
`max_tokens`; then:

- with a ``packed`` encoder (the CPU plan runtime): the rows' tokens go back to back, in chunks of
  at most `encoder_rows` rows and `packed_tokens` tokens, and the encoder runs on the tokens alone
  (no padding at all; plan_runtime/packed.py);
- else (a padded encoder: the GPU plan, a reference): rows are sorted by length and cut into chunks
  of at most `encoder_rows` rows; each chunk is padded to the smallest length bucket that holds its
  longest row, so a short sentence is never padded to the longest one of a big batch, and the
  encoder sees a handful of shapes (what a captured CUDA graph needs).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from anvil_core.model_spec import ModelSpec, TensorSpec
from anvil_executor.models.base import Model, RequestInputs, RequestOutputs
from anvil_executor.models.wordpiece import DECLINED, FastWordPiece

__all__ = ["Encoder", "PackedEncoder", "TextEmbeddingModel", "Tokenized"]

Encoder = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]  # (ids, mask, types) -> (B, D)
PackedEncoder = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (ids (N,), cu (S+1,)) -> (S, D)
BUCKETS = (16, 32, 64, 128, 256)


@dataclass(slots=True)
class Tokenized:
    """A batch after `prepare`: every row's token ids back to back (cut at the longest bucket), with
    their offsets and counts, and rows per request. Built on the prep thread, so the compute thread
    only slices and gathers arrays (it had read each row's id list in Python, twice)."""

    flat: np.ndarray  # (tokens,) int64, row after row
    cu: np.ndarray  # (rows + 1,) int64: row r's ids are flat[cu[r]:cu[r + 1]]
    counts: np.ndarray  # (rows,) int32, tokens per row
    rows: list[int]


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
        packed: PackedEncoder | None = None,
        packed_tokens: int = 0,
    ) -> None:
        if encoder_rows < 1:
            raise ValueError(f"encoder_rows must be >= 1, got {encoder_rows}")
        self.encoder_rows = encoder_rows  # rows per encoder call (a GPU plan: its max_batch)
        self.dim = dim
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(tokenizer_json))
        self.tokenizer.enable_truncation(max_length=max_tokens)
        self.tokenizer.no_padding()
        self.max_tokens = max_tokens
        # the same ids without the character offsets (unused here): 17-18% less tokenizer time on
        # corpus-v2 (tokenizers 0.23, 64-1000 sentences a call); older tokenizers lack it
        self._encode_batch = getattr(self.tokenizer, "encode_batch_fast", self.tokenizer.encode_batch)
        # ASCII rows (a BERT WordPiece tokenizer.json): the same ids from a compiled trie walk without
        # the GIL, ~30x less CPU than tokenizers' call (models/wordpiece.py, bench/tokenize_fast.py)
        self.fast = FastWordPiece.from_tokenizer_json(tokenizer_json, max_tokens)
        self.encoder = encoder
        self.packed = packed
        # tokens per packed encoder call (the plan's max_batch x max_seq): a chunk never exceeds it
        self.packed_tokens = packed_tokens or encoder_rows * max_tokens
        self.buckets = sorted(b for b in buckets if b <= max_tokens) or [max_tokens]
        self.spec = ModelSpec(
            name=name,
            platform="anvil_text_embedding",
            max_batch=max_batch,
            inputs=(TensorSpec("TEXT", "BYTES", ()),),
            outputs=(TensorSpec("EMBEDDING", "FP32", (dim,)), TensorSpec("TOKENS", "INT32", ())),
        )

    def bucket(self, longest: int) -> int:
        """The smallest length bucket holding ``longest`` tokens (the largest one past them all)."""
        return self.buckets[min(bisect.bisect_left(self.buckets, longest), len(self.buckets) - 1)]

    prepares = True  # tokenization runs on the executor's prep thread (base.Model.prepare)

    def run(self, batch: list[RequestInputs]) -> list[RequestOutputs]:
        return self.run_prepared(self.prepare(batch))

    def prepare(self, batch: list[RequestInputs]) -> Tokenized:
        """Every row of the batch tokenized together (compiled or Rust, without the GIL)."""
        texts = [t for req in batch for t in req["TEXT"].reshape(-1)]  # bytes (or str) per row
        ids, counts = self._ids(texts)  # (rows, max_tokens) int64, (rows,) int32
        np.minimum(counts, self.buckets[-1], out=counts)  # rows longer than every bucket are cut there
        cu = np.zeros(len(counts) + 1, np.int64)
        np.cumsum(counts, out=cu[1:])
        flat = ids[np.arange(ids.shape[1])[None, :] < counts[:, None]]  # (tokens,) row after row
        return Tokenized(flat, cu, counts, [req["TEXT"].shape[0] for req in batch])

    def _ids(self, texts: list[bytes | str]) -> tuple[np.ndarray, np.ndarray]:
        """Each row's token ids, (rows, max_tokens) with row r's in [:counts[r]]: the compiled
        WordPiece's where it takes the row, tokenizers' batch call for every other row."""
        if self.fast is not None:
            ids, counts = self.fast.encode_batch(texts)
        else:
            ids = np.empty((len(texts), self.max_tokens), np.int64)
            counts = np.full(len(texts), DECLINED, np.int32)
        rest = np.flatnonzero(counts == DECLINED)
        if len(rest):
            decoded = [_text(texts[i]) for i in rest]
            for i, e in zip(rest, self._encode_batch(decoded), strict=True):
                counts[i] = len(e.ids)  # <= max_tokens: the tokenizer truncates there
                ids[i, : counts[i]] = e.ids
        return ids, counts

    def run_prepared(self, prepared: Tokenized) -> list[RequestOutputs]:
        counts = prepared.counts
        if self.packed is not None:
            vectors = self._run_packed(prepared)
        else:
            vectors = self._run_padded(prepared)
        out: list[RequestOutputs] = []
        row = 0
        for n in prepared.rows:
            out.append({"EMBEDDING": vectors[row : row + n], "TOKENS": counts[row : row + n]})
            row += n
        return out

    def _run_packed(self, prepared: Tokenized) -> np.ndarray:
        """Chunks of rows in order, each at most encoder_rows rows and packed_tokens tokens."""
        assert self.packed is not None
        counts, cu, n = prepared.counts, prepared.cu, len(prepared.counts)
        vectors = np.empty((n, self.dim), np.float32)  # (rows, D)
        start = 0
        while start < n:
            end, tokens = start, 0
            while end < n and end - start < self.encoder_rows:
                if tokens + int(counts[end]) > self.packed_tokens and end > start:
                    break
                tokens += int(counts[end])
                end += 1
            ids = prepared.flat[cu[start] : cu[end]]  # (N,) the chunk's token ids back to back
            vectors[start:end] = self.packed(ids, cu[start : end + 1] - cu[start])  # (S, D) fp32
            start = end
        return vectors

    def _run_padded(self, prepared: Tokenized) -> np.ndarray:
        """Rows sorted by length, cut into chunks (padded_chunks) each padded to its own longest row."""
        counts, flat, cu = prepared.counts, prepared.flat, prepared.cu
        if len(counts) == 1 and len(flat):  # a lone row (c1's case): as it is, no gather, no padding
            ids = flat[None, :]  # (1, n); the encoder pads to its own shapes (a GPU plan: its bucket)
            ones = np.ones(ids.shape, np.int64)
            out = self.encoder(ids, ones, np.zeros(ids.shape, np.int64))
            return np.array(out, np.float32)  # its own array, as the chunked path's (1, D)
        order = np.argsort(counts, kind="stable")  # short rows together: little padding per chunk
        vectors = np.empty((len(counts), self.dim), np.float32)  # (rows, D)
        for start, end in padded_chunks(counts[order], self.encoder_rows, self.bucket):
            rows = order[start:end]
            lens = counts[rows]  # (rows,) ascending
            seq = self.bucket(int(lens[-1]))
            pos = np.arange(seq)  # (T,)
            on = pos[None, :] < lens[:, None]  # (rows, T) True on tokens
            at = cu[rows][:, None] + pos[None, :]  # (rows, T) where each token sits in flat
            ids = np.zeros((len(rows), seq), np.int64)  # (rows, T) padded with [PAD] = 0
            if len(flat):  # gathered at every position, kept on the tokens (at may run past flat's end)
                ids = np.where(on, flat[np.minimum(at, len(flat) - 1)], 0)
            types = np.zeros((len(rows), seq), np.int64)  # one segment per sentence
            vectors[rows] = self.encoder(ids, on.astype(np.int64), types)  # (rows, D) fp32
        return vectors


def _text(t: bytes | str) -> str:
    return t.decode("utf-8", errors="replace") if isinstance(t, bytes) else str(t)


MIN_CHUNK_ROWS = 64  # rows a chunk keeps before a longer length bucket may start a new one


def padded_chunks(
    sorted_counts: np.ndarray, max_rows: int, bucket: Callable[[int], int]
) -> list[tuple[int, int]]:
    """[start, end) chunks of rows sorted by length: at most ``max_rows`` each, and a new chunk where
    the length bucket grows once the current one holds MIN_CHUNK_ROWS rows. One chunk padded to the
    longest of ~140 corpus-v2 sentences (T 80) ran ~50% padding on the H200 (mean 39 tokens); below
    ~64 rows a GPU plan run costs more per row than the padding it saves (bench/gpu_op_profile.py)."""
    chunks: list[tuple[int, int]] = []
    start = 0
    n = len(sorted_counts)
    buckets = [bucket(int(c)) for c in sorted_counts]  # once per row (it was twice per row)
    while start < n:
        end = start + 1
        while end < n and end - start < max_rows:
            grows = buckets[end] > buckets[end - 1]
            if grows and end - start >= MIN_CHUNK_ROWS:
                break
            end += 1
        chunks.append((start, end))
        start = end
    return chunks
