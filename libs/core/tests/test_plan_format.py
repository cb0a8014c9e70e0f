"""The plan format's tables (anvil_core.plan_format): the writer's dtype table is the reader's
inverse, every schema dtype has a numpy type, and the activation codes are distinct."""

from __future__ import annotations

import numpy as np

from anvil_core.plan_format import ACT_CODES, DTYPE_CODES, DTYPES
from anvil_core.proto_gen import plan_generated as pg


def test_the_writers_dtype_table_is_the_readers_inverse() -> None:
    assert {DTYPES[code] for code in DTYPE_CODES.values()} == set(DTYPES.values())
    for name, code in DTYPE_CODES.items():
        assert np.dtype(DTYPES[code]).name == name
    schema = {v for k, v in vars(pg.DType).items() if not k.startswith("_")}
    assert set(DTYPES) == schema  # every dtype the schema can name is readable


def test_activation_codes_are_distinct_and_start_at_none() -> None:
    assert ACT_CODES["none"] == 0
    assert sorted(ACT_CODES.values()) == list(range(len(ACT_CODES)))
