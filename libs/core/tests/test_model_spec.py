"""Model specs: JSON round trip and request validation messages."""

from __future__ import annotations

import numpy as np
import pytest

from anvil_core.model_spec import ModelSpec, SpecError, TensorSpec
from anvil_core.tensors import HostTensor

SPEC = ModelSpec(
    name="m",
    max_batch=8,
    inputs=(TensorSpec("x", "FP32", (4,)), TensorSpec("y", "INT64", (-1,))),
    outputs=(TensorSpec("z", "FP32", (2,)),),
)


def _t(name: str, dt: str, shape: tuple[int, ...]) -> HostTensor:
    return HostTensor.from_array(name, dt, np.zeros(shape))


def test_json_round_trip() -> None:
    assert ModelSpec.from_json(SPEC.to_json()) == SPEC


def test_valid_request_passes() -> None:
    SPEC.validate([_t("x", "FP32", (3, 4)), _t("y", "INT64", (3, 9))])


@pytest.mark.parametrize(
    ("tensors", "match"),
    [
        ([_t("x", "FP32", (3, 4))], "missing inputs"),
        ([_t("x", "FP64", (3, 4)), _t("y", "INT64", (3, 1))], "datatype FP64 given"),
        ([_t("x", "FP32", (3, 5)), _t("y", "INT64", (3, 1))], r"does not match \[-1, 4\]"),
        ([_t("x", "FP32", (9, 4)), _t("y", "INT64", (9, 1))], "outside 1..8"),
        ([_t("x", "FP32", (2, 4)), _t("y", "INT64", (3, 1))], "disagree on the batch"),
        ([_t("x", "FP32", (2, 4)), _t("y", "INT64", (2, 1)), _t("w", "FP32", (2,))], "no input 'w'"),
    ],
)
def test_invalid_requests_name_the_constraint(tensors: list[HostTensor], match: str) -> None:
    with pytest.raises(SpecError, match=match):
        SPEC.validate(tensors)
