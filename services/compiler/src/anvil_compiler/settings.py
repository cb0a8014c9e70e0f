"""Compiler settings (env: ANVIL_<FIELD>)."""

from __future__ import annotations

from anvil_core.settings import ServiceSettings

__all__ = ["CompilerSettings"]


class CompilerSettings(ServiceSettings):
    http_port: int = 8010  # compile API
    metrics_port: int = 8005
    artifact_dir: str = "/var/lib/anvil/artifacts"  # the compose volume; `make up` points it at the run dir
