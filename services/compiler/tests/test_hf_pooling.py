"""sentence-transformers' configs in an HF bundle decide the plan's pooling."""

from __future__ import annotations

import json

import pytest

from anvil_compiler.errors import CompileError
from anvil_compiler.frontends.hf import pooling

NORMALIZE = [
    {"idx": 0, "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "type": "sentence_transformers.models.Pooling"},
    {"idx": 2, "type": "sentence_transformers.models.Normalize"},
]


def _files(pool: object = None, modules: object = None) -> dict[str, bytes]:
    out = {}
    if pool is not None:
        out["1_Pooling/config.json"] = json.dumps(pool).encode()
    if modules is not None:
        out["modules.json"] = json.dumps(modules).encode()
    return out


def test_mean_pooling_normalizes_only_when_a_normalize_module_is_listed() -> None:
    mean = {"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": False}
    assert pooling(_files()) is True  # no configs: pooled as all-MiniLM-L6-v2
    assert pooling(_files(mean, NORMALIZE)) is True
    assert pooling(_files(mean, NORMALIZE[:2])) is False


@pytest.mark.parametrize(
    "pool",
    [
        {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False},
        {"pooling_mode_max_tokens": True},
        [1],
    ],
)
def test_pooling_other_than_the_mean_is_refused(pool: object) -> None:
    with pytest.raises(CompileError):
        pooling(_files(pool, NORMALIZE))


def test_unreadable_configs_are_refused() -> None:
    with pytest.raises(CompileError, match="unreadable"):
        pooling({"modules.json": b"{not json"})
