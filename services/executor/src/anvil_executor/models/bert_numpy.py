"""A float32 BERT encoder in numpy, straight from an HF `config.json` + `model.safetensors`.

It is the executor's reference path for BERT-family sentence encoders (mean pooling + L2
normalisation, as sentence-transformers' all-MiniLM-L6-v2 is configured): the compiled INT4 plan
is checked against it, and it serves where no compiled artifact exists yet.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from numba import njit, prange

__all__ = ["BertEncoder"]


@njit(parallel=True, cache=True)
def _gelu_erf_inplace(x: np.ndarray) -> None:  # pragma: no cover (numba)
    flat = x.reshape(-1)
    for i in prange(flat.size):
        v = flat[i]
        flat[i] = 0.5 * v * (1.0 + math.erf(v * 0.7071067811865476))


def _ln(x: np.ndarray, g: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


class BertEncoder:
    """`encode(ids, mask, types) -> (B, D) float32` unit vectors."""

    def __init__(self, model_dir: Path) -> None:
        from safetensors.numpy import load_file

        cfg = json.loads((model_dir / "config.json").read_text())
        if cfg.get("model_type") != "bert" or cfg.get("hidden_act") != "gelu":
            raise ValueError(f"{model_dir}: not a BERT encoder with erf GELU ({cfg.get('model_type')})")
        self.heads = int(cfg["num_attention_heads"])
        self.hidden = int(cfg["hidden_size"])
        self.layers = int(cfg["num_hidden_layers"])
        self.eps = float(cfg.get("layer_norm_eps", 1e-12))
        self.max_positions = int(cfg["max_position_embeddings"])
        w = load_file(str(model_dir / "model.safetensors"))
        self.w = {k.removeprefix("bert."): v.astype(np.float32) for k, v in w.items()}
        for i in range(self.layers):  # transpose nn.Linear weights once: x @ W
            for name in (
                "attention.self.query",
                "attention.self.key",
                "attention.self.value",
                "attention.output.dense",
                "intermediate.dense",
                "output.dense",
            ):
                key = f"encoder.layer.{i}.{name}.weight"
                self.w[key] = np.ascontiguousarray(self.w[key].T)

    @property
    def dim(self) -> int:
        return self.hidden

    def encode(self, ids: np.ndarray, mask: np.ndarray, types: np.ndarray | None = None) -> np.ndarray:
        w, eps = self.w, self.eps
        bsz, seq = ids.shape  # (B, T) int64
        if seq > self.max_positions:
            raise ValueError(f"sequence of {seq} tokens exceeds {self.max_positions} positions")
        types = np.zeros_like(ids) if types is None else types
        h = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][:seq]
            + w["embeddings.token_type_embeddings.weight"][types]
        )  # (B, T, D)
        h = _ln(h, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)
        dh = self.hidden // self.heads
        bias = np.where(mask[:, None, None, :] > 0, 0.0, -1e9).astype(np.float32)  # (B, 1, 1, T)
        for i in range(self.layers):
            p = f"encoder.layer.{i}."

            def lin(x: np.ndarray, name: str, p: str = p) -> np.ndarray:
                return x @ w[p + name + ".weight"] + w[p + name + ".bias"]

            def split(x: np.ndarray) -> np.ndarray:
                return x.reshape(bsz, seq, self.heads, dh).transpose(0, 2, 1, 3)  # (B, H, T, dh)

            q, k, v = (split(lin(h, f"attention.self.{n}")) for n in ("query", "key", "value"))
            scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(dh) + bias  # (B, H, T, T)
            scores -= scores.max(-1, keepdims=True)
            probs = np.exp(scores)
            probs /= probs.sum(-1, keepdims=True)
            ctx = (probs @ v).transpose(0, 2, 1, 3).reshape(bsz, seq, self.hidden)
            h = _ln(
                lin(ctx, "attention.output.dense") + h,
                w[p + "attention.output.LayerNorm.weight"],
                w[p + "attention.output.LayerNorm.bias"],
                eps,
            )
            inter = np.ascontiguousarray(lin(h, "intermediate.dense"), dtype=np.float32)
            _gelu_erf_inplace(inter)  # GELU, erf form, (B, T, 4D) in place
            h = _ln(
                lin(inter, "output.dense") + h,
                w[p + "output.LayerNorm.weight"],
                w[p + "output.LayerNorm.bias"],
                eps,
            )
        m = mask[..., None].astype(np.float32)  # (B, T, 1)
        pooled = (h * m).sum(1) / np.maximum(m.sum(1), 1e-9)
        return (pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)).astype(np.float32)
