"""Compiler settings (env: ANVIL_<FIELD>)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from anvil_core.settings import COMPILER_API_KEY_FILE, ServiceSettings

__all__ = ["CompilerSettings"]


class CompilerSettings(ServiceSettings):
    REDIS_ROLE: ClassVar[str] = "compiler"
    http_port: int = 8010  # compile API
    metrics_port: int = 8005
    artifact_dir: str = "/var/lib/anvil/artifacts"  # the compose volume; `make up` points it at the run dir
    # Compiles running at once; each is one worker process (INT4 quantization and nvcc are CPU
    # bound, so more than the host's cores only makes each slower).
    max_concurrent_jobs: int = 1
    # A job still running after this is killed and reported failed (nvcc on a large model is ~1 min).
    job_timeout_s: float = 600.0
    # Largest model (upload or server-side file), and largest calibration upload, in MiB
    # (all-MiniLM-L6-v2 is 87 MiB of fp32 safetensors). An upload stream is cut off at 2x this.
    max_model_mib: int = 2048
    # The directory a server-side `path` must lie under (symlinks resolved, then opened without
    # following any). "": `<artifact_dir>/models`, made at start.
    model_root: str = ""
    # The API key every route but /v1/health requires: this, else the compiler_api_key file of
    # secrets_dir (`anvil up` makes one per run, compose a secret: on by default). Empty and no
    # file: no key (a compiler reachable by anyone). `anvil deploy` sends it. With require_api_key
    # (the gateway's ANVIL_REQUIRE_API_KEY), the tenants' API keys (`anvil tenant add`,
    # anvil:tenants) are accepted too, and a key is required even without this one.
    compiler_api_key: str = ""
    require_api_key: bool = False
    # Jobs kept for GET /v1/jobs/{id}: finished ones for this long, at most this many (oldest
    # dropped first); submissions beyond max_pending_jobs queued or running get 429.
    finished_job_ttl_s: float = 3600.0
    max_finished_jobs: int = 256
    max_pending_jobs: int = 16

    @property
    def model_root_path(self) -> Path:
        return Path(self.model_root) if self.model_root else Path(self.artifact_dir) / "models"

    @property
    def max_model_bytes(self) -> int:
        return self.max_model_mib << 20

    def api_key(self) -> str:
        """The key clients must present ("": none): compiler_api_key, else the secrets file."""
        if self.compiler_api_key or not self.secrets_dir:
            return self.compiler_api_key
        path = Path(self.secrets_dir) / COMPILER_API_KEY_FILE
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            return ""
        except OSError as exc:  # present but unreadable: fail the start, never run open
            raise PermissionError(f"cannot read the compiler API key file {path}: {exc.strerror}") from None
