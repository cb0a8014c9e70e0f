"""A BERT WordPiece tokenizer for ASCII text, exact to Hugging Face tokenizers' own, compiled (numba,
models/wordpiece_kernel.py) and run without the GIL on a whole batch at once.

Hugging Face tokenizers spends ~70 µs of CPU on one corpus-v2 sentence (~30 words; `encode_batch_fast`,
2-CPU build machine): its normalizer and pre-tokenizer keep alignments for every character, and its
parallel batch call spreads that over a thread pool per process. For printable ASCII (0x20-0x7E)
with tab, line feed and carriage return, the BERT pipeline reduces to:

- normalizer (`BertNormalizer`): clean_text turns those three into spaces; Chinese characters and
  accents change nothing in ASCII; lowercase maps A-Z to a-z;
- pre-tokenizer (`BertPreTokenizer`): split on whitespace, every ASCII punctuation character a word
  of its own (everything else in printable ASCII is a letter or a digit);
- model (`WordPiece`): greedy longest match from each word's start, continuation pieces with the
  model's prefix (`##`); a word with an unmatched rest, or longer than `max_input_chars_per_word`,
  is the unknown token;
- post-processor: `[CLS] A [SEP]` (`TemplateProcessing` or `BertProcessing`), truncation at
  `max_tokens` (the content cut to `max_tokens - 2`).

Anything else goes to Hugging Face: a row with another byte (non-ASCII, other control characters),
text containing an added token's content (tokenizers matches `[MASK]` and the like in the raw text,
here matched case-blind: conservative), and a tokenizer.json whose pipeline is not this one
(`from_tokenizer_json` returns None). The work is linear in the text (a trie walk per piece, at most
the vocabulary's longest piece deep), so a client's text bounds it by its size and nothing is cached.
`services/executor/tests/test_wordpiece.py` compares it with tokenizers on random strings.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from anvil_executor.models.wordpiece_kernel import DECLINED, encode_rows, slot_of

__all__ = ["DECLINED", "FastWordPiece"]


class FastWordPiece:
    def __init__(
        self,
        vocab: dict[str, int],
        unk_id: int,
        prefix: str,
        max_word_chars: int,
        cls_id: int,
        sep_id: int,
        max_tokens: int,
        lowercase: bool,
        added: list[str],
    ) -> None:
        if max_tokens < 2:
            raise ValueError(f"max_tokens must leave room for [CLS] and [SEP], got {max_tokens}")
        self.unk_id, self.max_word_chars = unk_id, max_word_chars
        self.cls_id, self.sep_id, self.max_tokens = cls_id, sep_id, max_tokens
        self.lowercase = lowercase
        self._trie(vocab, prefix)
        # added tokens' contents, lowercased ASCII (others cannot occur in a row this path takes)
        texts = sorted({a.lower().encode() for a in added if a and a.isascii()})
        self._added = np.zeros((len(texts), max(map(len, texts), default=0)), np.uint8)
        for i, t in enumerate(texts):
            self._added[i, : len(t)] = np.frombuffer(t, np.uint8)
        self._added_len = np.array([len(t) for t in texts], np.int64)

    def _trie(self, vocab: dict[str, int], prefix: str) -> None:
        """The vocabulary's ASCII pieces as a byte trie in a hash table (models/wordpiece_kernel.py)."""
        edges: dict[tuple[int, int], int] = {}
        token = [-1]
        for piece, tid in vocab.items():
            if not piece or not piece.isascii():
                continue
            node = 0
            for b in piece.encode():
                child = edges.get((node, b))
                if child is None:
                    child = edges[(node, b)] = len(token)
                    token.append(-1)
                node = child
            token[node] = tid
        node = 0  # the continuation prefix's node, -1 where no piece starts with it
        for b in prefix.encode() if prefix.isascii() else b"\xff":
            node = edges.get((node, b), -1)
            if node < 0:
                break
        self._cont_root = node
        bits = max(4, (2 * len(edges)).bit_length())  # a table at most half full
        keys = np.full(1 << bits, -1, np.int64)
        children = np.zeros(1 << bits, np.int32)
        mask, shift = (1 << bits) - 1, 64 - bits
        for (parent, b), child in edges.items():
            key = parent * 256 + b
            slot = slot_of(key, shift)
            while keys[slot] >= 0:
                slot = (slot + 1) & mask
            keys[slot], children[slot] = key, child
        self._keys, self._children, self._shift = keys, children, shift
        self._token = np.array(token, np.int32)

    @classmethod
    def from_tokenizer_json(cls, path: Path, max_tokens: int) -> FastWordPiece | None:
        """The fast path for this tokenizer.json, or None where its pipeline is not BERT's WordPiece
        (then every row goes to Hugging Face tokenizers)."""
        try:
            cfg = json.loads(Path(path).read_text())
            return cls._from_config(cfg, max_tokens)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None

    @classmethod
    def _from_config(cls, cfg: dict[str, Any], max_tokens: int) -> FastWordPiece | None:
        keys = ("normalizer", "pre_tokenizer", "model", "post_processor")
        norm, pre, model, post = (cfg.get(k) or {} for k in keys)
        if norm.get("type") != "BertNormalizer" or pre.get("type") != "BertPreTokenizer":
            return None
        if model.get("type") != "WordPiece":
            return None
        vocab: dict[str, int] = {str(k): int(v) for k, v in model["vocab"].items()}
        unk = vocab.get(str(model.get("unk_token", "[UNK]")))
        specials = _cls_sep(post)
        if unk is None or specials is None:
            return None
        added = [str(a.get("content", "")) for a in cfg.get("added_tokens") or ()]
        return cls(
            vocab,
            unk,
            str(model.get("continuing_subword_prefix", "##")),
            int(model.get("max_input_chars_per_word", 100)),
            specials[0],
            specials[1],
            max_tokens,
            bool(norm.get("lowercase", True)),
            added,
        )

    def encode_batch(self, texts: Sequence[bytes | str]) -> tuple[np.ndarray, np.ndarray]:
        """Every row's ids: (rows, max_tokens) int64 with row r's in [:counts[r]], and counts (rows,)
        int32, DECLINED for a row left to Hugging Face tokenizers. Runs without the GIL."""
        raw = [t if isinstance(t, bytes) else str(t).encode("utf-8", "replace") for t in texts]
        offs = np.zeros(len(raw) + 1, np.int64)
        np.cumsum([len(t) for t in raw], out=offs[1:])
        buf = np.frombuffer(b"".join(raw), np.uint8)
        ids = np.empty((len(raw), self.max_tokens), np.int64)
        counts = np.empty(len(raw), np.int32)
        encode_rows(
            buf, offs, self._keys, self._children, self._token, self._shift, self._cont_root,
            self.lowercase, self._added, self._added_len, self.unk_id, self.cls_id, self.sep_id,
            self.max_word_chars, ids, counts,
        )  # fmt: skip
        return ids, counts

    def encode(self, text: bytes | str) -> list[int] | None:
        """The ids Hugging Face tokenizers gives ``text`` (special tokens added, truncated), or None
        where the text is not for this path."""
        ids, counts = self.encode_batch([text])
        return None if counts[0] == DECLINED else ids[0, : counts[0]].tolist()


def _cls_sep(post: dict[str, Any]) -> tuple[int, int] | None:
    """([CLS] id, [SEP] id) of a single-sequence post-processor that is exactly [CLS] A [SEP]."""
    if post.get("type") == "BertProcessing":
        return int(post["cls"][1]), int(post["sep"][1])
    if post.get("type") != "TemplateProcessing":
        return None
    single = post.get("single") or []
    if len(single) != 3 or "Sequence" not in single[1]:
        return None
    ends = [s.get("SpecialToken", {}).get("id") for s in (single[0], single[2])]
    tokens = post.get("special_tokens") or {}
    ids = [tokens.get(e, {}).get("ids") for e in ends]
    if any(not isinstance(i, list) or len(i) != 1 for i in ids):
        return None
    return int(ids[0][0]), int(ids[1][0])
