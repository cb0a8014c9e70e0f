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


@pytest.fixture(scope="session")
def module() -> object:
    """The W4A16 kernels as a cupy.RawModule: ``ANVIL_W4A16_FATBIN`` (prebuilt, e.g. by
    bench/w4a16_device.sh), else every variant built once per session with nvcc."""
    cp = pytest.importorskip("cupy")
    from anvil_kernels.cuda.w4a16 import W4A16Params, build_fatbin

    path = os.environ.get("ANVIL_W4A16_FATBIN") or str(build_fatbin(W4A16Params()))
    return cp.RawModule(path=path)
