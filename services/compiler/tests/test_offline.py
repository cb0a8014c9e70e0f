"""`python -m anvil_compiler.offline`: an ONNX file or an HF directory into a content-addressed
artifact, one JSON status line a stage and a final line; a bad source exits 1 with the reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from onnx_models import mismatched_bytes, mlp_bytes

from anvil_compiler import offline


def _lines(capsys: pytest.CaptureFixture[str]) -> list[dict[str, object]]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_an_onnx_file_compiles_once_then_is_found(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "m.onnx"
    src.write_bytes(mlp_bytes())
    args = ["--onnx", str(src), "--out-root", str(tmp_path / "out"), "--name", "m", "--no-build"]
    assert offline.main([*args, "--options", '{"quantize": false}']) == 0
    lines = _lines(capsys)
    assert next(d["stage"] for d in lines if "stage" in d) == "import"
    final = lines[-1]
    assert final["cached"] is False and Path(str(final["path"])).joinpath("manifest.json").is_file()
    assert offline.main([*args, "--options", '{"quantize": false}']) == 0
    again = _lines(capsys)
    assert again == [{**final, "cached": True, "compile_s": 0.0}]
    assert offline.main([*args, "--options", '{"quantize": true}']) == 0  # other options: another id
    assert _lines(capsys)[-1]["artifact"] != final["artifact"]


def test_a_bad_onnx_file_exits_1_with_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "bad.onnx"
    src.write_bytes(mismatched_bytes())
    assert offline.main(["--onnx", str(src), "--out-root", str(tmp_path), "--name", "bad", "--no-build"]) == 1
    last = _lines(capsys)[-1]
    assert "CompileError" in str(last["error"])
    assert not [p for p in tmp_path.iterdir() if p.name != "bad.onnx"]  # no half artifact left


def test_one_source_exactly(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        offline.main(["--hf", str(tmp_path), "--onnx", str(tmp_path / "m"), "--out-root", ".", "--name", "m"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit):
        offline.main(["--out-root", ".", "--name", "m"])
