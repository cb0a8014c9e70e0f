"""The compiled WordPiece (models/wordpiece.py) gives Hugging Face tokenizers' ids exactly, or declines.

Compared with tokenizers on a WordPiece vocabulary trained here (continuation pieces, punctuation,
digits, unknown words), on random printable-ASCII strings and edge cases; with the real
all-MiniLM-L6-v2 tokenizer on corpus-v2 where ANVIL_TEST_MINILM_DIR names a checkpoint."""

from __future__ import annotations

import json
import os
import random
import string
import sys
from pathlib import Path

import pytest

from anvil_executor.models.wordpiece import DECLINED, FastWordPiece

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
    out += ["tab\there", "line\nbreak\r\n", "\t\n", "the model " * 40 + "ab" * 40]
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(0, 40)):
            r = rng.random()
            if r < 0.6:
                w = rng.choice(WORDS)
                parts.append(w.upper() if rng.random() < 0.2 else w)
            elif r < 0.8:
                parts.append(rng.choice(string.punctuation))
            else:  # printable ASCII with tab, line feed and carriage return
                chars = string.printable[:97] + "\r"
                parts.append("".join(rng.choice(chars) for _ in range(rng.randint(1, 8))))
        out.append(rng.choice(["", " ", "  ", "\n"]).join(parts))
    return out


@pytest.mark.parametrize("lowercase", [True, False])
def test_ids_match_tokenizers_on_ascii(tmp_path: Path, lowercase: bool) -> None:
    path, hf = _trained(tmp_path, lowercase)
    fast = FastWordPiece.from_tokenizer_json(path, max_tokens=32)
    assert fast is not None
    texts = _strings(2000)
    ids, counts = fast.encode_batch(texts)  # one call for the whole batch, as the model makes it
    declined = []
    for r, text in enumerate(texts):
        if counts[r] == DECLINED:  # an added token's text
            declined.append(text)
            continue
        assert ids[r, : counts[r]].tolist() == hf.encode(text).ids, text  # type: ignore[attr-defined]
        assert fast.encode(text.encode()) == hf.encode(text).ids  # type: ignore[attr-defined]  # alone, as bytes
    assert "hello [MASK] there" in declined and "[cls] lower" in declined
    for text in declined:
        assert any(s.lower() in text.lower() for s in SPECIALS), text
    assert len(declined) < len(texts) // 4
    assert "unbelievablyunbelievable" * 5 not in declined  # past max_input_chars_per_word: [UNK]
    assert any(len(hf.encode(t).ids) == 32 for t in texts)  # type: ignore[attr-defined]  # truncation hit


def test_declines_text_outside_its_alphabet(tmp_path: Path) -> None:
    path, hf = _trained(tmp_path)
    fast = FastWordPiece.from_tokenizer_json(path, max_tokens=32)
    assert fast is not None
    for text in ["naïve", "東京", "nul\x00", "del\x7f", "bell\x07", "vt\x0b", "ff\x0c", "the model\x1b"]:
        assert fast.encode(text) is None, repr(text)
    assert fast.encode(b"bad \xff\xfe utf-8") is None
    ids, counts = fast.encode_batch(["the model", "naïve", "", "text"])
    assert counts.tolist()[1] == DECLINED and counts.tolist()[2] == 2  # an empty row: [CLS] [SEP]
    for r, text in ((0, "the model"), (3, "text")):
        assert ids[r, : counts[r]].tolist() == hf.encode(text).ids  # type: ignore[attr-defined]


def test_long_text_is_linear_and_truncated_like_tokenizers(tmp_path: Path) -> None:
    """No bound on a row's size here (the gateway bounds the body): a long text and a long word cost
    a trie walk per character, and the ids are still tokenizers' own."""
    path, hf = _trained(tmp_path, max_length=32)
    fast = FastWordPiece.from_tokenizer_json(path, max_tokens=32)
    assert fast is not None
    for text in ["the model " * 5000, "ab" * 50_000, "x" * 21, "x" * 20, "runner" * 3 + "zz", "!" * 100]:
        assert fast.encode(text) == hf.encode(text).ids, text[:40]  # type: ignore[attr-defined]


def test_max_tokens_bounds_each_row(tmp_path: Path) -> None:
    path, _ = _trained(tmp_path)
    assert FastWordPiece.from_tokenizer_json(path, max_tokens=1) is None  # no room for [CLS] [SEP]
    tight = FastWordPiece.from_tokenizer_json(path, max_tokens=2)
    assert tight is not None
    ids, counts = tight.encode_batch(["the model serves text"])
    assert counts.tolist() == [2] and ids[0, :2].tolist() == [tight.cls_id, tight.sep_id]


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
    ids, counts = fast.encode_batch(texts)
    assert (counts[:1000] != DECLINED).all()  # corpus-v2 is ASCII
    for r, text in enumerate(texts):
        if counts[r] != DECLINED:
            assert ids[r, : counts[r]].tolist() == hf.encode(text).ids, text
