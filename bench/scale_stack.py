"""One stack per configuration for bench/gpu_scale.py: `python -m anvil_client.cli up --no-restart` in
a fresh run root on private ports, with ANVIL_GPUS and ANVIL_EXECUTORS_PER_GPU (the `gpu` profile)
or `--scale executor=N` (the `cpu` profile, CPU executors standing in for GPUs); stopped with SIGINT
like Ctrl-C, the launcher stopping its children.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from anvil_client.launcher import PORT_STRIDE, port_free, private_port_env

__all__ = ["ScaleConfig", "ScaleStack", "StackFailed"]

ROOT = Path(__file__).resolve().parents[1]
STOP_GRACE_S = 60.0  # the launcher stops every child (SIGTERM, then SIGKILL after its own grace)


@dataclass(frozen=True)
class ScaleConfig:
    """One row group of the bench: executors on `gpus` (indices into the visible GPUs), `per_gpu`
    executor processes on each (ANVIL_EXECUTORS_PER_GPU), `lanes` compute lanes in each executor
    (ANVIL_LANES: CUDA streams in one process)."""

    gpus: tuple[int, ...]
    per_gpu: int = 1
    lanes: int = 1

    @property
    def label(self) -> str:
        lanes = f",lanes={self.lanes}" if self.lanes != 1 else ""
        return f"gpus={'+'.join(map(str, self.gpus))},epg={self.per_gpu}{lanes}"

    @property
    def executors(self) -> int:
        return len(self.gpus) * self.per_gpu


def _private_ports(executors: int, attempts: int = 20) -> dict[str, str]:
    """private_port_env, redrawn until the ports of the executors after the first (executor metrics
    port + PORT_STRIDE x k, which the launcher derives and nobody checked) are free as well."""
    for _ in range(attempts):
        ports = private_port_env(ROOT / "compose.yaml")
        base = int(ports["ANVIL_EXECUTOR_METRICS_PORT"])
        derived = [base + PORT_STRIDE * k for k in range(1, executors)]
        if not set(map(str, derived)) & set(ports.values()) and all(map(port_free, derived)):
            return ports
    raise StackFailed(f"no free metrics ports for {executors} executors after {attempts} draws")


class StackFailed(RuntimeError):
    """The stack did not come up; the message carries the tail of the launcher's output."""


class ScaleStack:
    def __init__(self, cfg: ScaleConfig, profile: str, run_root: Path, artifact_dir: Path) -> None:
        self.cfg = cfg
        self.profile = profile
        self.run_root = run_root
        ports = _private_ports(cfg.executors)
        self.env = dict(os.environ)  # the caller's ANVIL_* settings (precision, gateway workers) hold
        self.env.pop("ANVIL_REDIS_URL", None)  # an embedded Redis of its own: nothing left from before
        self.env.update(ports)
        self.env.update(
            {
                "ANVIL_RUN_ROOT": str(run_root),
                "ANVIL_PROFILES": profile,
                # deployed artifacts outlive a configuration's stack: the compiler re-indexes a
                # directory it finds (anvil_compiler.cache), so a model compiles once per bench run
                "ANVIL_ARTIFACT_DIR": str(artifact_dir),
                "ANVIL_COMPILER_URL": f"http://127.0.0.1:{ports['ANVIL_COMPILER_PORT']}",
                "PYTHONUNBUFFERED": "1",
            }
        )
        self.argv = [sys.executable, "-m", "anvil_client.cli", "up", "--no-restart"]
        if profile == "gpu":
            self.env["ANVIL_GPUS"] = ",".join(map(str, cfg.gpus))
            self.env["ANVIL_EXECUTORS_PER_GPU"] = str(cfg.per_gpu)
            self.env["ANVIL_LANES"] = str(cfg.lanes)
        else:  # CPU executors stand in for the GPUs' executors
            self.env.pop("ANVIL_GPUS", None)
            self.env.setdefault("ANVIL_MODELS", "identity,mlp")  # not the built-in MiniLM as well
            self.argv += ["--scale", f"executor={cfg.executors}"]
        self.url = f"http://127.0.0.1:{ports['ANVIL_HTTP_PORT']}"
        self.log = run_root / "up.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def client_env(self) -> dict[str, str]:
        """What `anvil deploy` (a subprocess of the bench) needs to find this stack."""
        keys = ("ANVIL_RUN_ROOT", "ANVIL_COMPILER_URL")
        return {k: self.env[k] for k in keys}

    def start(self, timeout_s: float) -> float:
        """Starts the stack and waits until the launcher calls it ready and the gateway answers
        ready; returns the seconds it took. Raises StackFailed (and stops what started)."""
        self.run_root.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [*self.argv, "--timeout", str(int(max(timeout_s, 10)))],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C of the bench reaches the launcher through stop() only
            )
        deadline = t0 + timeout_s
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                raise StackFailed(f"`anvil up` exited with {self.proc.returncode}: {self.tail()}")
            if self._ready():
                return time.perf_counter() - t0
            time.sleep(0.5)
        self.stop()
        raise StackFailed(f"not ready after {timeout_s:.0f} s: {self.tail()}")

    def _ready(self) -> bool:
        state = self.state()
        if not state.get("ready"):
            return False
        try:
            return httpx.get(self.url + "/v2/health/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def state(self) -> dict[str, Any]:
        try:
            doc: dict[str, Any] = json.loads((self.run_root / "current.json").read_text())
        except (OSError, ValueError):
            return {}
        return doc

    def services(self) -> dict[str, dict[str, Any]]:
        return {s["name"]: s for s in self.state().get("services", []) if s.get("pid")}

    def pids(self) -> dict[str, int]:
        """{service name: pid}, the embedded Redis as `redis`."""
        out = {name: int(s["pid"]) for name, s in self.services().items()}
        if self.state().get("redis_pid"):
            out["redis"] = int(self.state()["redis_pid"])
        return out

    def executor_ports(self) -> dict[str, str]:
        """{executor name: metrics port}: `executor`, `executor.1` (cpu) or `executor-gpu0`,
        `executor-gpu0.1`, `executor-gpu1` (gpu)."""
        return {
            name: s["env"]["ANVIL_METRICS_PORT"]
            for name, s in self.services().items()
            if name.startswith("executor") and s["env"].get("ANVIL_METRICS_PORT")
        }

    def scheduler_port(self) -> str:
        return str(self.services()["scheduler"]["env"]["ANVIL_METRICS_PORT"])

    def tail(self, n: int = 2500) -> str:
        try:
            return self.log.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return "(no launcher log)"

    def stop(self) -> float:
        """SIGINT to the launcher (it stops its children, Redis last); SIGKILL of its process group
        only if it has not finished after STOP_GRACE_S. Returns the seconds it took."""
        t0 = time.perf_counter()
        if self.proc is None or self.proc.poll() is not None:
            return 0.0
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        return time.perf_counter() - t0
