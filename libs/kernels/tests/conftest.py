"""Fresh random inputs on every run; the seed is printed so a failure can be replayed."""

from __future__ import annotations

import os

import numpy as np
import pytest


@pytest.fixture
def rng() -> np.random.Generator:
    seed = int(os.environ.get("ANVIL_TEST_SEED", np.random.SeedSequence().entropy % (2**63)))
    print(f"ANVIL_TEST_SEED={seed}")  # shown by pytest when the test fails
    return np.random.default_rng(seed)
