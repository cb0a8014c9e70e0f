"""GPTQ over a whole fused graph: run the graph in numpy on a built-in calibration set, quantize the
linears in graph order, each on the activations of the model quantized so far.

The walk is GPTQ's sequential scheme in one forward pass: every node runs on all calibration
batches before the next node starts; a linear that is to be quantized first sums H = X^T X over
the non-padding rows of its input (padding tokens are masked out everywhere downstream, so they
carry no signal), is quantized with `gptq_quantize`, and then runs with its dequantized weight,
so later layers see (and compensate) the error of earlier ones. The forward is the compiler's
numpy twin of the kernel ops (`forward.py`, shared with the accuracy report).

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
from anvil_compiler.ir import Graph
from anvil_compiler.options import CompileOptions
from anvil_compiler.passes.forward import Forward
from anvil_compiler.passes.gptq import gptq_quantize
from anvil_kernels import Int4Weight, dequantize

__all__ = ["CALIBRATIONS", "calibration_batches", "calibration_feeds", "calibration_ids", "gptq_graph"]

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


def calibration_batches(samples: list[np.ndarray]) -> list[dict[str, np.ndarray]]:
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


def calibration_feeds(g: Graph, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
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
    batches = calibration_batches(samples)
    envs = [calibration_feeds(g, b) for b in batches]
    masks = [b["mask"].astype(bool) for b in batches]
    todo = [n for n in g.nodes if n.name in groups]
    stop = g.nodes.index(todo[-1]) if todo else -1
    last_use = {x: i for i, n in enumerate(g.nodes) for x in n.inputs}
    fwd = Forward(g)
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
