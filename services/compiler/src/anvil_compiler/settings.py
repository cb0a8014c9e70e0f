"""Compiler settings (env: ANVIL_<FIELD>)."""

from __future__ import annotations

from anvil_core.settings import ServiceSettings

__all__ = ["CompilerSettings"]


class CompilerSettings(ServiceSettings):
    http_port: int = 8010  # compile API
    metrics_port: int = 8005
    artifact_dir: str = "/var/lib/anvil/artifacts"  # the compose volume; `make up` points it at the run dir
    # Compiles running at once; each is one worker process (INT4 quantization and nvcc are CPU
    # bound, so more than the host's cores only makes each slower).
    max_concurrent_jobs: int = 1
    # A job still running after this is killed and reported failed (nvcc on a large model is ~1 min).
    job_timeout_s: float = 600.0
    # Largest upload accepted, in MiB (all-MiniLM-L6-v2 is 87 MiB of fp32 safetensors).
    max_model_mib: int = 2048
    # A server-side `path` must lie under this directory ("" disables paths: uploads only).
    model_root: str = "/"
