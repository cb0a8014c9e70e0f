"""GPTQ over a whole fused graph: run the graph in numpy on a built-in calibration set, quantize the
linears in graph order, each on the activations of the model quantized so far.

The walk is GPTQ's sequential scheme in one forward pass: every node runs on all calibration
batches before the next node starts; a linear that is to be quantized first sums H = X^T X over
the non-padding rows of its input (padding tokens are masked out everywhere downstream, so they
carry no signal), is quantized with `gptq_quantize`, and then runs with its dequantized weight,
so later layers see (and compensate) the error of earlier ones. The forward is a plain numpy twin
of the kernel ops: LayerNorm and attention are anvil_kernels' own (what the executor runs),
activations numpy (GELU-erf through a 1.5e-7 erf approximation), enough for statistics.

Calibration sets (``CompileOptions.calibration``), files next to this package:
    bert-uncased   calibration/bert_uncased.tsv: 158 hand-written sentences of mixed genres
                   (news, instructions, dialogue, science, reviews, ...) as BERT uncased WordPiece
                   ids; fed as each sentence alone plus each window of 3 consecutive sentences
                   (~10k tokens). Disjoint from bench/corpus.py (other words, no templates).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from anvil_compiler.errors import CompileError
from anvil_compiler.ir import Graph, Node
from anvil_compiler.options import CompileOptions
from anvil_compiler.passes.gptq import gptq_quantize
from anvil_kernels import Int4Weight, attention, dequantize, layer_norm

__all__ = ["CALIBRATIONS", "calibration_ids", "gptq_graph"]

CALIBRATIONS = {"bert-uncased": ("bert_uncased.tsv", 30522)}  # name -> (file, vocab rows)
BATCH = 16  # sentences per forward batch (sorted by length, so padding stays small)
WINDOW = 3  # consecutive sentences joined into one longer sample


def calibration_ids(name: str) -> list[np.ndarray]:
    """The samples of calibration set ``name``: int64 token id rows, [CLS] ... [SEP] each."""
    if name not in CALIBRATIONS:
        raise CompileError(
            f"unknown calibration set {name!r}; sets: {sorted(CALIBRATIONS)}", stage="quantize"
        )
    path = Path(__file__).resolve().parents[1] / "calibration" / CALIBRATIONS[name][0]
    rows = [
        [int(t) for t in line.split("\t")[1].split()]
        for line in path.read_text().splitlines()
        if line and not line.startswith("#")
    ]
    samples = [np.array(r, np.int64) for r in rows]
    for i in range(len(rows) - WINDOW + 1):  # [CLS] s_i s_i+1 s_i+2 [SEP]
        inner = [t for r in rows[i : i + WINDOW] for t in r[1:-1]]
        samples.append(np.array([rows[i][0], *inner, rows[i][-1]], np.int64))
    return samples


def _batches(samples: list[np.ndarray]) -> list[dict[str, np.ndarray]]:
    samples = sorted(samples, key=len)
    out = []
    for i in range(0, len(samples), BATCH):
        chunk = samples[i : i + BATCH]
        t = max(len(s) for s in chunk)
        ids = np.zeros((len(chunk), t), np.int64)
        mask = np.zeros((len(chunk), t), np.int64)
        for j, s in enumerate(chunk):
            ids[j, : len(s)], mask[j, : len(s)] = s, 1
        out.append({"ids": ids, "mask": mask})
    return out


def _erf(x: np.ndarray) -> np.ndarray:
    # Abramowitz & Stegun 7.1.26, |error| <= 1.5e-7
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return np.sign(x) * (1.0 - poly * np.exp(-a * a))


def _act(y: np.ndarray, act: str) -> np.ndarray:
    if act == "none":
        return y
    if act == "gelu_erf":
        return 0.5 * y * (1.0 + _erf(y * 0.7071067811865476))
    if act == "gelu_tanh":
        return 0.5 * y * (1.0 + np.tanh(0.7978845608028654 * (y + 0.044715 * y**3)))
    if act == "relu":
        return np.maximum(y, 0.0)
    if act == "silu":
        return y / (1.0 + np.exp(-y))
    if act == "sigmoid":
        return 1.0 / (1.0 + np.exp(-y))
    if act == "tanh":
        return np.tanh(y)
    raise CompileError(f"GPTQ calibration: activation {act!r} unknown", stage="quantize")


def _ln(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    x = np.ascontiguousarray(x, np.float32)
    return layer_norm(x, gamma.reshape(-1), beta.reshape(-1), eps, np.empty_like(x))


class _Forward:
    """Runs one kernel op of ``g`` on one batch's tensors (``env``: value name -> array)."""

    def __init__(self, g: Graph) -> None:
        self.g = g

    def c(self, name: str) -> np.ndarray:
        return np.asarray(self.g.consts[name], np.float32)

    def linear(self, n: Node, env: dict[str, np.ndarray], w: np.ndarray) -> np.ndarray:
        x = env[n.inputs[0]]
        y = x.reshape(-1, x.shape[-1]) @ w  # (rows, N) f32
        if n.attrs.get("bias"):
            y += self.c(n.attrs["bias"]).reshape(-1)
        y = _act(y, str(n.attrs.get("act", "none"))).reshape(*x.shape[:-1], w.shape[1])
        if len(n.inputs) > 1:
            y = y + env[n.inputs[1]]
        if n.attrs.get("ln"):
            gm, bt, eps = n.attrs["ln"]
            y = _ln(y, self.c(gm), self.c(bt), float(eps))
        return y.astype(np.float32)

    def run(self, n: Node, env: dict[str, np.ndarray], b: int, t: int) -> np.ndarray:
        a = n.attrs
        if n.op == "view":
            return env[n.inputs[0]].reshape([d.eval(b, t) for d in self.g.types[n.outputs[0]].shape])
        if n.op == "embed_ln":
            pos = self.c(a["pos"])
            e = self.c(a["table"])[env[n.inputs[0]]] + (pos[:t] if pos.shape[0] > 1 else pos[0])
            return _ln(e, self.c(a["ln"][0]), self.c(a["ln"][1]), float(a["ln"][2])) if a.get("ln") else e
        if n.op == "layer_norm":
            x = env[n.inputs[0]] + (env[n.inputs[1]] if len(n.inputs) > 1 else 0.0)
            return _ln(x, self.c(a["gamma"]), self.c(a["beta"]), float(a["eps"]))
        if n.op == "attention":
            h, d = int(a["heads"]), int(a["head_dim"])
            q, k, v = (
                np.ascontiguousarray(
                    env[n.inputs[j]][..., a["offsets"][j] : a["offsets"][j] + h * d]
                    .reshape(b, t, h, d)
                    .transpose(0, 2, 1, 3),
                    np.float32,
                )
                for j in range(3)
            )
            mask = env[n.inputs[3]] if len(n.inputs) > 3 else np.ones((b, t), np.uint8)
            o = attention(q, k, v, mask, np.empty_like(q), float(a["scale"]))  # (B, H, T, D)
            return o.transpose(0, 2, 1, 3).reshape(b, t, h * d)
        if n.op == "unary":
            return _act(env[n.inputs[0]], str(a["act"])).astype(np.float32)
        raise CompileError(f"GPTQ calibration: op {n.op} (node {n.name!r}) cannot run here", stage="quantize")


def _feeds(g: Graph, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    feeds = {}
    for name in g.inputs:
        if name == "input_ids":
            feeds[name] = batch["ids"]
        elif name == "attention_mask":
            feeds[name] = batch["mask"]
        elif name == "token_type_ids":
            feeds[name] = np.zeros_like(batch["ids"])
        else:
            raise CompileError(
                f"GPTQ calibration feeds input_ids, attention_mask (and token_type_ids = 0); "
                f"graph input {name!r} is none of them",
                stage="quantize",
            )
    return feeds


def gptq_graph(g: Graph, opts: CompileOptions, groups: dict[str, int]) -> dict[str, Int4Weight]:
    """INT4 weights (by node name) of the linears in ``groups`` (node -> group size), by GPTQ on the
    calibration set ``opts.calibration``; other linears run in fp32 during calibration."""
    samples = calibration_ids(opts.calibration)
    vocab = CALIBRATIONS[opts.calibration][1]
    for n in g.nodes:
        if n.op == "embed_ln" and g.consts[n.attrs["table"]].shape[0] != vocab:
            raise CompileError(
                f"calibration set {opts.calibration!r} holds ids of a {vocab}-token vocabulary; "
                f"this model's embedding table (node {n.name!r}) has "
                f"{g.consts[n.attrs['table']].shape[0]} rows",
                stage="quantize",
            )
    batches = _batches(samples)
    envs = [_feeds(g, b) for b in batches]
    masks = [b["mask"].astype(bool) for b in batches]
    todo = [n for n in g.nodes if n.name in groups]
    stop = g.nodes.index(todo[-1]) if todo else -1
    last_use = {x: i for i, n in enumerate(g.nodes) for x in n.inputs}
    fwd = _Forward(g)
    out: dict[str, Int4Weight] = {}
    for i, n in enumerate(g.nodes[: stop + 1]):
        if n.op == "linear":
            w = fwd.c(n.attrs["weight"])  # (K, N)
            if n.name in groups:
                h = np.zeros((w.shape[0], w.shape[0]), np.float64)
                for env, m in zip(envs, masks, strict=True):
                    x = env[n.inputs[0]]
                    rows = x[m] if x.shape[:2] == m.shape else x.reshape(-1, x.shape[-1])  # (R, K)
                    h += rows.T @ rows
                out[n.name] = gptq_quantize(w, h, groups[n.name], opts.clip_search, opts.act_order)
                w = dequantize(out[n.name])
            for env in envs:
                env[n.outputs[0]] = fwd.linear(n, env, w)
        else:
            for env, m in zip(envs, masks, strict=True):
                env[n.outputs[0]] = fwd.run(n, env, *m.shape)
        for env in envs:  # drop values no later node reads
            for name in n.inputs:
                if last_use.get(name) == i and name not in g.outputs:
                    env.pop(name, None)
    return out
