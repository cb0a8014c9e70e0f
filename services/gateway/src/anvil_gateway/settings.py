"""Gateway settings (env: ANVIL_<FIELD>)."""

from __future__ import annotations

from typing import ClassVar

from anvil_core.settings import ServiceSettings

__all__ = ["GatewaySettings"]


class GatewaySettings(ServiceSettings):
    REDIS_ROLE: ClassVar[str] = "gateway"
    http_port: int = 8000  # KServe v2 HTTP, Triton's default
    # Processes serving http_port together (SO_REUSEPORT). One process spends ~1-5 ms of CPU per
    # request of 32 sentences on /v1/embeddings (JSON floats dominate), so a GPU host that serves
    # more than a few hundred such requests per second needs several (__main__.py).
    http_workers: int = 1
    metrics_port: int = 8002  # Prometheus, Triton's default
    # KServe v2 / Triton gRPC (grpc_server.py), Triton's default port; 0: no gRPC endpoint. With
    # http_workers > 1 every worker serves it on this port too (SO_REUSEPORT).
    grpc_port: int = 8001
    # Requests of one ModelStreamInfer stream unanswered at a time; past this the stream is not read
    # (HTTP/2 flow control holds the client), so a client that never reads cannot grow our memory.
    grpc_stream_max_pending: int = 1024
    # Largest request body accepted; larger ones get 413 before being read whole. A model whose
    # inputs have fixed sizes gets a tighter limit from its spec (body_limits.py).
    max_body_bytes: int = 64 * 1024 * 1024
    # Bodies with at least this many bytes of JSON are parsed in steps (~0.25 ms each: HTTP JSON on the
    # event loop, yielding between steps; gRPC and embeddings on a parse thread), so the event loop
    # keeps serving (~1.5 ms of parsing per 64 KiB inline). A binary section counts 1/32 per byte.
    parse_offload_bytes: int = 64 * 1024
    # Large bodies parsed at once, and parse threads (each body holds its tensors in memory).
    parse_threads: int = 2
    # Priority classes: deadline = arrival + SLO of the class (ServiceSettings.slo_ms; a request's
    # timeout may only tighten it).
    default_priority: int = 2
    # How often the registry snapshot (scheduler endpoint, model specs, rate limits) is refreshed.
    discovery_interval_ms: int = 250
    # KServe system shared memory maps client-named /dev/shm objects into the gateway: off unless
    # the operator opts in (ANVIL_ALLOW_CLIENT_SHM=1).
    allow_client_shm: bool = False
    # Owners accepted for registered shm objects besides the gateway's own uid (-1: none), and
    # whether an object may grant its group access (a client of another uid in a shared group).
    # Objects that grant others any access are always refused.
    shm_client_uid: int = -1
    shm_allow_group: bool = False
    # Refuse requests without a known API key (tenants: `anvil tenant add`).
    require_api_key: bool = False
    # ZeroCopy ingress: directory of its ipc doorbell socket (anvil-zc.sock, mode 0600). Empty: a
    # private directory (0700) made at start; the endpoint is in this gateway's registry entry.
    zerocopy_dir: str = ""
    # Requests in flight per model at this gateway before new ones get 429 + Retry-After.
    max_inflight_per_model: int = 4096
    # Requests made in one event-loop turn travel to the scheduler together, this many per message
    # at most: fewer messages cost less CPU, but one huge wave leaves nothing for the scheduler to
    # overlap with (1: a message per request).
    bundle_max: int = 8
    # POST /v2/repository/models/{m}/load answers once the model serves (as Triton's does), or 503
    # after this long (a large artifact loads and warms up in seconds to minutes).
    repository_load_wait_ms: int = 120_000
    # Shedding by the gateway's own delay (overload.py, issue #19): while its event loop is this many
    # ms behind, requests of the priority are answered 429 once parsed, so the CPU they would cost goes
    # to priority 1 (never shed here: the scheduler's EDF protects it). 10 ms for batch class: a fifth
    # of priority 1's 50 ms budget, past which the loop is saturated, not jittering (GC pauses and a
    # shared core's run-queue delays stay under ~5 ms); 25 ms for standard, half the budget. 0: never.
    shed_delay_ms_p2: float = 25.0
    shed_delay_ms_p3: float = 10.0
