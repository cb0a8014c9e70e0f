"""The Python WordPiece (models/wordpiece.py) gives Hugging Face tokenizers' ids exactly, or declines.

Compared with tokenizers on a WordPiece vocabulary trained here (continuation pieces, punctuation,
digits, unknown words), on random printable-ASCII strings and edge cases; with the real
all-MiniLM-L6-v2 tokenizer on corpus-v2 where ANVIL_TEST_MINILM_DIR names a checkpoint."""

from __future__ import annotations

import json
import os
import random
import re
import string
import sys
from pathlib import Path

import pytest

from anvil_executor.models.wordpiece import MAX_CHARS, MAX_NEW_WORD, FastWordPiece

ROOT = Path(__file__).resolve().parents[3]
WORDS = ["the", "model", "serves", "text", "quickly", "unbelievable", "tokenization", "running", "runner"]
WORDS += ["ran", "2024", "v2", "GPU's"]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _trained(tmp_path: Path, lowercase: bool = True, max_length: int = 32) -> tuple[Path, object]:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=20))
    tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    rng = random.Random(1)
    lines = [" ".join(rng.choice(WORDS) for _ in range(12)) + rng.choice(".,!?;") for _ in range(400)]
    tok.train_from_iterator(lines, trainers.WordPieceTrainer(vocab_size=160, special_tokens=SPECIALS))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    tok.enable_truncation(max_length=max_length)
    tok.no_padding()
    return path, tok


def _strings(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = ["", " ", "   ", "a", "[", "]", "the.", "unbelievablyunbelievable" * 5, "x" * 21, "x" * 20]
    out += ["hello [MASK] there", "[cls] lower", "THE MODEL", "GPU's 2024-v2...", "#hash ##tag ~`|"]
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(0, 40)):
            r = rng.random()
            if r < 0.6:
                w = rng.choice(WORDS)
                parts.append(w.upper() if rng.random() < 0.2 else w)
            elif r < 0.8:
                parts.append(rng.choice(string.punctuation))
            else:
                parts.append("".join(rng.choice(string.printable[:95]) for _ in range(rng.randint(1, 8))))
        out.append(rng.choice(["", " ", "  "]).join(parts))
    return out


@pytest.mark.parametrize("lowercase", [True, False])
def test_ids_match_tokenizers_on_printable_ascii(tmp_path: Path, lowercase: bool) -> None:
    path, hf = _trained(tmp_path, lowercase)
    fast = FastWordPiece.from_tokenizer_json(path, max_tokens=32)
    assert fast is not None
    declined = []
    for text in _strings(2000):
        got = fast.encode(text)
        if got is None:  # an added token's text, or past the bounds on the Python work
            declined.append(text)
            continue
        assert got == hf.encode(text).ids, text  # type: ignore[attr-defined]
    assert "hello [MASK] there" in declined and "[cls] lower" in declined
    assert "unbelievablyunbelievable" * 5 in declined  # an unseen word of 120 characters
    for text in declined:
        words = re.findall(r"[A-Za-z0-9]+", text)
        assert any(s.lower() in text.lower() for s in SPECIALS) or max(map(len, words)) > MAX_NEW_WORD
    assert any(len(hf.encode(t).ids) == 32 for t in _strings(50))  # type: ignore[attr-defined]  # truncation hit


def test_declines_text_outside_printable_ascii_or_past_its_bounds(tmp_path: Path) -> None:
    path, hf = _trained(tmp_path)
    fast = FastWordPiece.from_tokenizer_json(path, max_tokens=32)
    assert fast is not None
    for text in ["naïve", "tab\there", "line\nbreak", "東京", "nul\x00", "del\x7f"]:
        assert fast.encode(text) is None
    assert fast.encode("the model " * (MAX_CHARS // 10 + 1)) is None  # too long a text
    assert fast.encode("the " + "ab" * MAX_NEW_WORD) is None  # an unseen word too long
    # past the truncation point nothing is split, so a long word there changes nothing
    text = "the model " * 40 + "ab" * MAX_NEW_WORD
    assert fast.encode(text) == hf.encode(text).ids  # type: ignore[attr-defined]


def test_other_pipelines_get_no_fast_path(tmp_path: Path) -> None:
    path, _ = _trained(tmp_path)
    cfg = json.loads(path.read_text())
    for key, value in [
        ("pre_tokenizer", {"type": "Whitespace"}),
        ("normalizer", None),
        ("post_processor", None),
        ("model", {**cfg["model"], "type": "BPE"}),
    ]:
        other = tmp_path / f"other_{key}.json"
        other.write_text(json.dumps({**cfg, key: value}))
        assert FastWordPiece.from_tokenizer_json(other, max_tokens=32) is None, key
    assert FastWordPiece.from_tokenizer_json(tmp_path / "missing.json", max_tokens=32) is None


@pytest.mark.skipif(not os.environ.get("ANVIL_TEST_MINILM_DIR"), reason="ANVIL_TEST_MINILM_DIR not set")
def test_matches_the_minilm_tokenizer_on_corpus_v2() -> None:
    from tokenizers import Tokenizer

    sys.path.insert(0, str(ROOT / "bench"))
    from corpus import sentences

    path = Path(os.environ["ANVIL_TEST_MINILM_DIR"]) / "tokenizer.json"
    hf = Tokenizer.from_file(str(path))
    hf.enable_truncation(max_length=128)
    hf.no_padding()
    fast = FastWordPiece.from_tokenizer_json(path, max_tokens=128)
    assert fast is not None
    texts = sentences(1000) + _strings(1000)
    for text in texts:
        got = fast.encode(text)
        if got is not None:
            assert got == hf.encode(text).ids, text
