"""The committed generated code is what `make proto` would produce from proto/anvil.fbs today."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
GENERATED = ROOT / "libs/core/src/anvil_core/proto_gen/anvil_generated.py"


def test_generated_python_is_fresh(tmp_path: Path) -> None:
    flatc = shutil.which("flatc")
    if flatc is None:
        pytest.skip("flatc not installed (it is in the dev group: uv sync)")
    version = subprocess.run([flatc, "--version"], capture_output=True, text=True, check=True).stdout
    import flatbuffers

    runtime = getattr(flatbuffers, "__version__", "")
    assert runtime and runtime in version, f"flatc {version.strip()} does not match runtime {runtime}"
    subprocess.run(
        [
            flatc,
            "--python",
            "--gen-onefile",
            "--gen-object-api",
            "-o",
            str(tmp_path),
            str(ROOT / "proto/anvil.fbs"),
        ],
        check=True,
    )
    fresh = (tmp_path / "anvil_generated.py").read_text()
    assert fresh == GENERATED.read_text(), "stale: run `make proto` and commit the result"
