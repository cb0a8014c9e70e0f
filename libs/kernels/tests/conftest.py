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
    """The W4A16 kernels: ``ANVIL_W4A16_FATBIN`` (prebuilt fatbins, os.pathsep-separated, e.g. by
    bench/w4a16_device.sh), else every variant built once per session with nvcc (in parallel)."""
    pytest.importorskip("cupy")
    from anvil_kernels.cuda import W4A16Params, build_fatbins, load_module

    env = os.environ.get("ANVIL_W4A16_FATBIN")
    return load_module(env if env else build_fatbins(W4A16Params(), ("compute_90,code=sm_90",)))
