"""set_blas_threads: the executor's knob for numpy's OpenBLAS pool."""

from __future__ import annotations

import pytest

from anvil_kernels import _openblas, set_blas_threads


@pytest.mark.skipif(_openblas.SGEMM is None, reason="numpy does not use a bundled OpenBLAS here")
def test_sets_and_restores_the_thread_count() -> None:
    assert _openblas._FOUND is not None
    get_threads = _openblas._FOUND[2]
    before = get_threads()
    try:
        assert set_blas_threads(1) is True
        assert get_threads() == 1
        with _openblas.single_threaded():  # the GEMM's own scope leaves the setting as it found it
            assert get_threads() == 1
        assert set_blas_threads(before) is True
        assert get_threads() == before
    finally:
        set_blas_threads(before)


def test_refuses_fewer_than_one_thread() -> None:
    with pytest.raises(ValueError, match=">= 1"):
        set_blas_threads(0)
