"""What each request carries: model, rows, encoding (KServe v2 JSON or binary), priority, tenant.

Bodies are built once per (priority, tenant) with a fixed-width request id spliced in, so the
generator spends no time on JSON encoding during the run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from anvil_core.priorities import PRIORITIES

__all__ = ["ID_WIDTH", "Workload", "parse_mix", "request_id", "response_id"]

ID_WIDTH = 10  # request ids are zero-padded decimals, so every body of a kind has the same length


def request_id(i: int) -> bytes:
    return f"{i:0{ID_WIDTH}d}".encode()


def parse_mix(text: str) -> dict[int, float]:
    """'1:0.2,2:0.5,3:0.3' -> {1: 0.2, 2: 0.5, 3: 0.3} (weights, normalised); '3' -> {3: 1.0}."""
    out: dict[int, float] = {}
    for part in text.split(","):
        prio, _, weight = part.strip().partition(":")
        p = int(prio)
        if p not in PRIORITIES:
            raise ValueError(f"priority must be 1, 2 or 3, got {p}")
        out[p] = float(weight) if weight else 1.0
    total = sum(out.values())
    if total <= 0:
        raise ValueError("priority weights must sum to more than 0")
    return {p: w / total for p, w in out.items()}


@dataclass
class Workload:
    model: str = "mlp"
    rows: int = 1  # rows per request (the batch dimension a client sends)
    width: int = 16  # features per row (the model's last input dimension)
    input_name: str = "INPUT0"
    priorities: dict[int, float] = field(default_factory=lambda: {2: 1.0})
    tenant_keys: list[str] = field(default_factory=list)  # API keys, round-robin; empty: no key
    timeout_us: int | None = None
    binary: bool = False  # KServe binary tensor extension instead of JSON data
    send_priority: bool = True  # peers other than Anvil do not know `parameters.priority`
    seed: int = 0
    _kinds: dict[tuple[int, int], tuple[bytes, bytes, dict[str, str]]] = field(default_factory=dict)

    @property
    def path(self) -> str:
        return f"/v2/models/{self.model}/infer"

    def pick(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Priority and tenant index of each of `n` requests, drawn reproducibly from the seed."""
        rng = np.random.default_rng(self.seed + 1)
        prios = np.array(sorted(self.priorities), dtype=np.int8)
        weights = np.array([self.priorities[int(p)] for p in prios])
        chosen = rng.choice(prios, size=n, p=weights) if n else np.empty(0, np.int8)
        tenants = np.arange(n) % max(1, len(self.tenant_keys))
        return chosen.astype(np.int8), tenants.astype(np.int16)

    def parts(self, priority: int, tenant: int) -> tuple[bytes, bytes, dict[str, str]]:
        """(body before the id, body after the id, extra headers) for one kind of request."""
        key = (priority, tenant)
        if key not in self._kinds:
            self._kinds[key] = self._build(priority, tenant)
        return self._kinds[key]

    def array(self) -> np.ndarray:
        """The input every request carries: (rows, width) float32 from the seed."""
        return np.random.default_rng(self.seed).standard_normal((self.rows, self.width)).astype(np.float32)

    def _build(self, priority: int, tenant: int) -> tuple[bytes, bytes, dict[str, str]]:
        x = self.array()
        params: dict[str, int] = {}
        if self.send_priority:
            params["priority"] = priority
        if self.timeout_us:
            params["timeout"] = self.timeout_us
        tensor: dict[str, object] = {
            "name": self.input_name,
            "datatype": "FP32",
            "shape": [self.rows, self.width],
        }
        headers = {"Content-Type": "application/json"}
        if self.tenant_keys:
            headers["Authorization"] = f"Bearer {self.tenant_keys[tenant % len(self.tenant_keys)]}"
        tail: bytes = b""
        if self.binary:
            tensor["parameters"] = {"binary_data_size": x.nbytes}
            tail = x.tobytes()
        else:
            tensor["data"] = [round(float(v), 6) for v in x.reshape(-1)]
        doc: dict[str, object] = {"id": "@ID@", "inputs": [tensor]}
        if params:
            doc["parameters"] = params
        text = json.dumps(doc, separators=(",", ":")).encode()
        before, _, after = text.partition(b"@ID@")
        if self.binary:
            headers["Inference-Header-Content-Length"] = str(len(text) - 4 + ID_WIDTH)
            headers["Content-Type"] = "application/octet-stream"
        return before, after + tail, headers


def response_id(body: bytes, binary_header_len: str | None) -> bytes | None:
    """The `id` echoed in a KServe v2 response (JSON or binary), or None when there is none."""
    head = body[: int(binary_header_len)] if binary_header_len else body
    at = head.find(b'"id":')
    if at < 0:
        return None
    start = head.find(b'"', at + 5)
    end = head.find(b'"', start + 1)
    return head[start + 1 : end] if start >= 0 and end > start else None
