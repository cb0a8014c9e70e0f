"""A tiny HF BERT sentence encoder made on the spot: config.json, model.safetensors (random
weights) and a WordPiece tokenizer.json, as a Hugging Face checkpoint directory holds them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

WORDS = [
    "the",
    "a",
    "cat",
    "dog",
    "sat",
    "on",
    "mat",
    "runs",
    "fast",
    "slow",
    "red",
    "blue",
    "model",
    "serves",
    "text",
]


def make_tiny_bert(
    path: Path, hidden: int = 32, layers: int = 2, heads: int = 2, seed: int = 0, std: float = 0.2
) -> Path:
    """``std``: of the random weights (0.02 is BERT's initializer_range: MiniLM-like activations)."""
    from safetensors.numpy import save_file
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", *WORDS]
    path.mkdir(parents=True, exist_ok=True)
    cfg = {
        "model_type": "bert",
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "intermediate_size": 4 * hidden,
        "hidden_act": "gelu",
        "max_position_embeddings": 64,
        "type_vocab_size": 2,
        "vocab_size": len(vocab),
        "layer_norm_eps": 1e-12,
    }
    (path / "config.json").write_text(json.dumps(cfg))
    rng = np.random.default_rng(seed)

    def r(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    w: dict[str, np.ndarray] = {
        "embeddings.word_embeddings.weight": r(len(vocab), hidden),
        "embeddings.position_embeddings.weight": r(64, hidden),
        "embeddings.token_type_embeddings.weight": r(2, hidden),
        "embeddings.LayerNorm.weight": np.ones(hidden, np.float32),
        "embeddings.LayerNorm.bias": np.zeros(hidden, np.float32),
    }
    for i in range(layers):
        p = f"encoder.layer.{i}"
        for name, (n_out, n_in) in {
            "attention.self.query": (hidden, hidden),
            "attention.self.key": (hidden, hidden),
            "attention.self.value": (hidden, hidden),
            "attention.output.dense": (hidden, hidden),
            "intermediate.dense": (4 * hidden, hidden),
            "output.dense": (hidden, 4 * hidden),
        }.items():
            w[f"{p}.{name}.weight"], w[f"{p}.{name}.bias"] = r(n_out, n_in), r(n_out)
        for ln in ("attention.output.LayerNorm", "output.LayerNorm"):
            w[f"{p}.{ln}.weight"], w[f"{p}.{ln}.bias"] = (
                np.ones(hidden, np.float32),
                np.zeros(hidden, np.float32),
            )
    save_file(w, str(path / "model.safetensors"))

    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    tok.save(str(path / "tokenizer.json"))
    return path
