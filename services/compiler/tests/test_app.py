"""The compiler's HTTP API serves health with the registry's state."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from anvil_compiler.app import create_app
from anvil_compiler.settings import CompilerSettings


def test_health_reports_registry_and_artifact_dir(redis_url: str, tmp_path: Path) -> None:
    settings = CompilerSettings(redis_url=redis_url, artifact_dir=str(tmp_path / "a"), service_id="c1")
    with TestClient(create_app(settings)) as client:
        doc = client.get("/v1/health").json()
    assert doc == {"live": True, "registry": True, "artifact_dir_writable": True}


def test_health_without_redis_says_so(tmp_path: Path) -> None:
    settings = CompilerSettings(
        redis_url="redis://127.0.0.1:1/0", artifact_dir=str(tmp_path), service_id="c2"
    )
    with TestClient(create_app(settings)) as client:
        assert client.get("/v1/health").json()["registry"] is False
