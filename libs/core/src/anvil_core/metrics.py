"""Prometheus exposition for every service on its own metrics port (gateway: 8002, like Triton)."""

from __future__ import annotations

from prometheus_client import Gauge, Info, start_http_server

__all__ = ["serve_metrics", "service_up"]

service_up = Gauge("anvil_service_up", "1 while this process runs", ["kind", "id"])
_info = Info("anvil_build", "Anvil build information")


def serve_metrics(port: int, kind: str, service_id: str, host: str = "0.0.0.0") -> None:
    """Start the /metrics HTTP server in a daemon thread (port 0 is allowed: an ephemeral port)."""
    start_http_server(port, addr=host)
    service_up.labels(kind=kind, id=service_id).set(1)
    _info.info({"kind": kind, "version": "0.1.0"})
