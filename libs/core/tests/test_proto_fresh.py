"""The committed generated code and the codec's field tables are what `make proto` would produce
from proto/*.fbs today."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
GENERATED = ROOT / "libs/core/src/anvil_core/proto_gen"
SCHEMAS = sorted(p.name for p in (ROOT / "proto").glob("*.fbs"))
WIRE_SCHEMAS = ["anvil.fbs", "zerocopy.fbs"]  # the wire codec's (Makefile WIRE_SCHEMAS)


def test_every_schema_is_checked() -> None:
    assert "anvil.fbs" in SCHEMAS


@pytest.mark.parametrize("schema", SCHEMAS)
def test_generated_python_is_fresh(tmp_path: Path, schema: str) -> None:
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
            str(ROOT / "proto" / schema),
        ],
        check=True,
    )
    name = schema.removesuffix(".fbs") + "_generated.py"
    assert (tmp_path / name).read_text() == (GENERATED / name).read_text(), (
        f"stale {name}: run `make proto` and commit the result"
    )


@pytest.mark.parametrize("schema", WIRE_SCHEMAS)
def test_codec_field_tables_are_fresh(tmp_path: Path, schema: str) -> None:
    """What the codec reads and verifies by (proto_gen/<name>_schema.py) matches the schema."""
    from anvil_core.codec import fbs_schema

    fbs_schema.main([str(ROOT / "proto" / schema), str(tmp_path)])
    name = schema.removesuffix(".fbs") + "_schema.py"
    assert (tmp_path / name).read_text() == (GENERATED / name).read_text(), (
        f"stale {name}: run `make proto` and commit the result"
    )
