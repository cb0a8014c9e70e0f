"""A BERT WordPiece tokenizer for printable-ASCII text, exact to Hugging Face tokenizers' own, for
the rows of a small batch (a lone sentence above all).

Hugging Face tokenizers spends ~107 µs on one corpus-v2 sentence (~30 words, `encode_batch_fast` of
one string, 2-CPU build machine; `encode` alike): its normalizer and pre-tokenizer keep alignments for
every character. For a string of printable ASCII only (0x20-0x7E) the BERT pipeline reduces to:

- normalizer (`BertNormalizer`): clean_text, Chinese characters and accents change nothing in
  printable ASCII; lowercase is `str.lower`;
- pre-tokenizer (`BertPreTokenizer`): split on spaces, every ASCII punctuation character a word of
  its own (in printable ASCII everything else is a letter or a digit);
- model (`WordPiece`): greedy longest match from each word's start, continuation pieces with the
  model's prefix (`##`); a word with an unmatched rest, or longer than `max_input_chars_per_word`,
  is the unknown token; words are cached (bounded) since corpora repeat them;
- post-processor: `[CLS] A [SEP]` (`TemplateProcessing` or `BertProcessing`), truncation at
  `max_tokens` (the content cut to `max_tokens - 2`).

Anything else goes to Hugging Face: non-ASCII or control characters, text containing an added token's
content (tokenizers matches `[MASK]` and the like in the raw text), text longer than MAX_CHARS or with
an unseen word longer than MAX_NEW_WORD (bounds on the Python work a client's text can cause), and a
tokenizer.json whose pipeline is not this one (`from_tokenizer_json` returns None). ~18 µs for the
same sentence (6x); `services/executor/tests/test_wordpiece.py` compares it with tokenizers on random
strings.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

__all__ = ["FastWordPiece"]

_PRINTABLE = re.compile(r"[\x20-\x7e]*\Z")
# after lowercasing, printable ASCII is spaces, letters and digits, and punctuation (!-/ :-@ [-` {-~)
_WORDS = re.compile(r"[a-z0-9]+|[!-/:-@\[-`{-~]")
_WORDS_CASED = re.compile(r"[A-Za-z0-9]+|[!-/:-@\[-`{-~]")
CACHE_WORDS = 65_536  # words kept with their pieces (then new words are split each time, not kept)
# Bounds on what this path takes (anything past them goes to tokenizers, in Rust and without the GIL):
# the greedy match costs up to n²/2 lookups for an unseen word of n characters, so a client's text of
# crafted words could hold the executor's GIL for long. A corpus-v2 sentence is ~200 characters.
MAX_CHARS = 1024  # characters of one text
MAX_NEW_WORD = 32  # characters of a word not in the cache


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
        self.vocab, self.unk_id, self.prefix, self.max_word_chars = vocab, unk_id, prefix, max_word_chars
        self.cls_id, self.sep_id, self.max_tokens = cls_id, sep_id, max_tokens
        self.lowercase = lowercase
        self._words = _WORDS if lowercase else _WORDS_CASED
        self._added = [a.lower() for a in added if a]  # matched on the lowercased text: conservative
        self._cache: dict[str, list[int]] = {}

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

    def encode(self, text: str) -> list[int] | None:
        """The ids Hugging Face tokenizers gives ``text`` (special tokens added, truncated), or None
        where the text is not for this path."""
        if len(text) > MAX_CHARS or not _PRINTABLE.match(text):
            return None
        low = text.lower() if self.lowercase else text
        if self._added:  # tokenizers matches added tokens in the text first (case-blind here)
            probe = low if self.lowercase else text.lower()
            if any(a in probe for a in self._added):
                return None
        out = [self.cls_id]
        cache = self._cache
        full = self.max_tokens - 1  # [CLS] and the content tokenizers keeps after truncation
        for word in self._words.findall(low):
            ids = cache.get(word)
            if ids is None:
                if len(word) > MAX_NEW_WORD:
                    return None
                ids = self._pieces(word)
                if len(cache) < CACHE_WORDS:
                    cache[word] = ids
            out += ids
            if len(out) >= full:  # the rest would be cut: not split at all
                break
        if len(out) > full:
            del out[self.max_tokens - 1 :]
        out.append(self.sep_id)
        return out

    def _pieces(self, word: str) -> list[int]:
        n = len(word)
        if n > self.max_word_chars:
            return [self.unk_id]
        vocab, ids, start = self.vocab, [], 0
        while start < n:
            end = n
            found = None
            while start < end:
                sub = word[start:end] if start == 0 else self.prefix + word[start:end]
                found = vocab.get(sub)
                if found is not None:
                    break
                end -= 1
            if found is None:
                return [self.unk_id]
            ids.append(found)
            start = end
        return ids


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
