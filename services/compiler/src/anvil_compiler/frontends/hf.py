"""Hugging Face BERT-family checkpoints (``config.json`` + ``model.safetensors``) -> `ir.Graph`.

The graph is built directly in kernel ops (embed_ln, linear, attention, mean_pool_l2): the
architecture is known, so there is nothing to pattern-match. Inputs ``input_ids`` and
``attention_mask`` (B, T) INT64; outputs ``last_hidden_state`` (B, T, H) and
``sentence_embedding`` (B, H), the masked mean L2-normalized (sentence-transformers' pooling).
Token type ids are taken as 0 (type row 0 is folded into the position table).

Upload format ("bundle"): ``anvil_core.hf_bundle`` (config.json, model.safetensors and, when the
directory has them, tokenizer.json and sentence-transformers' configs), made by `bundle_from_dir`;
its bytes are the model's content address. The tokenizer and configs are kept in the artifact
(``assets``), so the executor serves the encoder as text; ``1_Pooling/config.json`` and
``modules.json`` set the pooling (masked mean; L2-normalized when a Normalize module is listed).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from anvil_compiler.errors import CompileError
from anvil_compiler.ir import Dim, Graph, Node, TensorType
from anvil_core.hf_bundle import MAGIC_V1, REQUIRED, BundleError, pack_dir, unpack

__all__ = ["MAGIC", "assets", "bundle_from_dir", "load_hf_bundle"]

MAGIC = MAGIC_V1
ACTS = {
    "gelu": "gelu_erf",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
    "silu": "silu",
}
MODEL_TYPES = ("bert", "roberta", "distilbert-like")


def bundle_from_dir(path: Path) -> bytes:
    """The upload bundle of a checkpoint directory (``anvil_core.hf_bundle``)."""
    try:
        return pack_dir(path)
    except BundleError as exc:
        raise CompileError(str(exc), stage="load") from exc


def bundle_files(data: bytes) -> dict[str, bytes]:
    try:
        return unpack(data)
    except BundleError as exc:
        raise CompileError(f"not a readable HF bundle: {exc}", stage="load") from exc


def assets(data: bytes) -> dict[str, bytes]:
    """The files besides the checkpoint that the artifact keeps for serving (tokenizer, configs)."""
    return {k: v for k, v in bundle_files(data).items() if k not in REQUIRED}


def pooling(files: dict[str, bytes]) -> bool:
    """sentence-transformers' pooling of the checkpoint -> whether the embedding is L2-normalized.

    Without its configs a BERT is pooled as all-MiniLM-L6-v2 is (masked mean, normalized). A pooling
    config other than the mean is refused: the plan's pooling op is the masked mean.
    """
    try:
        pool = json.loads(files["1_Pooling/config.json"]) if "1_Pooling/config.json" in files else {}
        modules = json.loads(files["modules.json"]) if "modules.json" in files else None
    except (ValueError, UnicodeDecodeError) as exc:
        raise CompileError(f"unreadable sentence-transformers config: {exc}", stage="import") from exc
    if not isinstance(pool, dict):
        raise CompileError("1_Pooling/config.json is not a JSON object", stage="import")
    mean = "pooling_mode_mean_tokens"
    other = [k for k, v in pool.items() if k.startswith("pooling_mode_") and v and k != mean]
    if other or (pool and not pool.get(mean, False)):
        raise CompileError(f"pooling {other or pool} is not supported (masked mean only)", stage="import")
    if not isinstance(modules, list):
        return True
    return any(isinstance(m, dict) and str(m.get("type", "")).endswith(".Normalize") for m in modules)


def load_hf_bundle(data: bytes, name: str = "model") -> Graph:
    from safetensors.numpy import load

    files = bundle_files(data)
    try:
        config = json.loads(files["config.json"])
        tensors = load(files["model.safetensors"])
    except Exception as exc:
        raise CompileError(f"cannot read the HF checkpoint (truncated?): {exc}", stage="load") from exc
    return _Builder(config, tensors, name, normalize=pooling(files)).build()


class _Builder:
    def __init__(
        self, config: dict[str, Any], tensors: dict[str, np.ndarray], name: str, normalize: bool = True
    ) -> None:
        self.normalize = normalize
        if config.get("model_type") not in ("bert",):
            raise CompileError(
                f"HF model_type {config.get('model_type')!r} is not supported (bert)", stage="import"
            )
        self.c = config
        prefix = "bert." if any(k.startswith("bert.") for k in tensors) else ""
        self.t = {k.removeprefix(prefix): v for k, v in tensors.items()}
        self.g = Graph(name=name)
        self.h = int(config["hidden_size"])
        self.eps = float(config.get("layer_norm_eps", 1e-12))

    def w(self, key: str) -> np.ndarray:
        if key not in self.t:
            raise CompileError(f"checkpoint lacks tensor {key!r}", stage="import")
        return np.ascontiguousarray(self.t[key], dtype=np.float32)

    def const(self, key: str, value: np.ndarray) -> str:
        return self.g.add_const(key, value)

    def out(self, name: str, shape: tuple[Dim, ...]) -> str:
        self.g.types[name] = TensorType("float32", shape)
        return name

    def ln(self, prefix: str) -> tuple[str, str, float]:
        return (
            self.const(f"{prefix}.weight", self.w(f"{prefix}.weight")),
            self.const(f"{prefix}.bias", self.w(f"{prefix}.bias")),
            self.eps,
        )

    def linear(
        self,
        name: str,
        x: str,
        w: np.ndarray,
        b: np.ndarray,
        act: str = "none",
        residual: str | None = None,
        ln: tuple[str, str, float] | None = None,
    ) -> str:
        out = self.out(f"{name}.out", (Dim(1, b=1), Dim(1, t=1), Dim(w.shape[1])))
        attrs = {
            "weight": self.const(f"{name}.w", w),
            "bias": self.const(f"{name}.b", b),
            "act": act,
            "ln": ln,
        }
        self.g.nodes.append(Node("linear", name, [x] + ([residual] if residual else []), [out], attrs))
        return out

    def build(self) -> Graph:
        g, h, c = self.g, self.h, self.c
        bt = (Dim(1, b=1), Dim(1, t=1))
        for name in ("input_ids", "attention_mask"):
            g.types[name] = TensorType("int64", bt)
            g.inputs.append(name)
            g.io_datatypes[name] = "INT64"
        pos = self.w("embeddings.position_embeddings.weight")
        if "embeddings.token_type_embeddings.weight" in self.t:
            pos = pos + self.w("embeddings.token_type_embeddings.weight")[0]
        x = self.out("embeddings.out", (*bt, Dim(h)))
        g.nodes.append(
            Node(
                "embed_ln",
                "embeddings",
                ["input_ids"],
                [x],
                {
                    "table": self.const("embeddings.word", self.w("embeddings.word_embeddings.weight")),
                    "pos": self.const("embeddings.pos", np.ascontiguousarray(pos)),
                    "ln": self.ln("embeddings.LayerNorm"),
                },
            )
        )
        heads = int(c["num_attention_heads"])
        act = ACTS.get(str(c.get("hidden_act", "gelu")))
        if act is None:
            raise CompileError(f"hidden_act {c.get('hidden_act')!r} is not supported", stage="import")
        for i in range(int(c["num_hidden_layers"])):
            p = f"encoder.layer.{i}"
            a = f"{p}.attention.self"
            wqkv = np.concatenate([self.w(f"{a}.{r}.weight").T for r in ("query", "key", "value")], axis=1)
            bqkv = np.concatenate([self.w(f"{a}.{r}.bias") for r in ("query", "key", "value")])
            qkv = self.linear(f"{p}.qkv", x, np.ascontiguousarray(wqkv), bqkv)
            ctx = self.out(f"{p}.ctx", (*bt, Dim(h)))
            g.nodes.append(
                Node(
                    "attention",
                    f"{p}.attention",
                    [qkv, qkv, qkv, "attention_mask"],
                    [ctx],
                    {
                        "heads": heads,
                        "head_dim": h // heads,
                        "scale": 1.0 / float(np.sqrt(h // heads)),
                        "offsets": [0, h, 2 * h],
                        "strides": [3 * h] * 3,
                        "has_mask": True,
                    },
                )
            )
            o = f"{p}.attention.output"
            x = self.linear(
                o,
                ctx,
                np.ascontiguousarray(self.w(f"{o}.dense.weight").T),
                self.w(f"{o}.dense.bias"),
                residual=x,
                ln=self.ln(f"{o}.LayerNorm"),
            )
            f1 = self.linear(
                f"{p}.intermediate",
                x,
                np.ascontiguousarray(self.w(f"{p}.intermediate.dense.weight").T),
                self.w(f"{p}.intermediate.dense.bias"),
                act=act,
            )
            x = self.linear(
                f"{p}.output",
                f1,
                np.ascontiguousarray(self.w(f"{p}.output.dense.weight").T),
                self.w(f"{p}.output.dense.bias"),
                residual=x,
                ln=self.ln(f"{p}.output.LayerNorm"),
            )
        g.public[x] = "last_hidden_state"
        emb = self.out("sentence_embedding", (Dim(1, b=1), Dim(h)))
        g.nodes.append(
            Node("mean_pool_l2", "pooling", [x, "attention_mask"], [emb], {"normalize": self.normalize})
        )
        g.outputs = [x, emb]
        g.io_datatypes.update({x: "FP32", emb: "FP32"})
        return g
