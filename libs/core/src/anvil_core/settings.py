"""Typed settings shared by every service; each service subclasses `ServiceSettings`.

Every field can be overridden from the environment as ``ANVIL_<FIELD>`` (upper case), e.g.
``ANVIL_REDIS_URL``. compose.yaml sets the same variables, so `make up` and containers agree.
"""

from __future__ import annotations

import os
import socket
import uuid
from typing import Annotated, ClassVar, Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from anvil_core.curve import HINT, CurveClient, CurveError, CurveServer, parse_public_keys, read_secret_key
from anvil_core.priorities import DEFAULT_SLO_MS
from anvil_core.redis_conn import RedisAuth, load_redis_auth

__all__ = ["COMPILER_API_KEY_FILE", "ServiceSettings", "redact_url"]

# The compiler API's key in a secrets directory (`anvil up`: generated per run; compose: a secret).
COMPILER_API_KEY_FILE = "compiler_api_key"


def _default_service_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class ServiceSettings(BaseSettings):
    """Settings every Anvil process reads at start-up."""

    model_config = SettingsConfigDict(env_prefix="ANVIL_", frozen=True, extra="ignore")
    # This service's Redis user (anvil_core.redis_acl), used when its password file is in secrets_dir.
    REDIS_ROLE: ClassVar[str] = ""

    # Where the registry lives. The launcher starts an embedded server when this is unset.
    redis_url: str = "redis://127.0.0.1:6379/0"
    # Unique per process; the registry key is anvil:svc:{kind}:{service_id}.
    service_id: str = Field(default_factory=_default_service_id)
    log_level: str = "INFO"
    # Heartbeat every interval; the key expires after ttl, so a killed service disappears from
    # the registry within ttl. 3 heartbeats per TTL tolerates one late beat without flapping.
    heartbeat_interval_ms: int = 1000
    heartbeat_ttl_ms: int = 3000
    # Prometheus /metrics port of this process (Triton's default 8002 belongs to the gateway).
    metrics_port: int = 8002
    # Interface to bind sockets on, and the host name other services use to reach this one.
    bind_host: str = "0.0.0.0"
    advertise_host: str = "127.0.0.1"
    # ZeroMQ CURVE on the internal links (gateway <-> scheduler <-> executor): every message
    # encrypted, and the scheduler admits only peers holding the stack's keys (anvil_core.curve,
    # docs/security.md). Off only to measure what it costs (bench/gateway_overhead.py).
    zmq_curve: bool = True
    # Secret files: {role}.key_secret and redis_password (`anvil up`: <run dir>/secrets, 0700;
    # compose: /run/secrets, from compose secrets).
    secrets_dir: str = ""
    # Public keys, 64 hex digits (not secret): the scheduler's, and the gateways' / executors' that the
    # scheduler admits (comma-separated: each key listed is admitted).
    curve_scheduler_public: str = ""
    curve_gateway_public: str = ""
    curve_executor_public: str = ""
    # One host (`anvil up` sets it to <run dir>/links): the links use ipc sockets in this directory
    # (0700: only this user can connect; nothing is encrypted or leaves the host) instead of tcp
    # with CURVE, which stays open for peers on other hosts. Empty: tcp with CURVE.
    link_ipc_dir: str = ""
    # One host (link_ipc_dir set): how the gateway and the executors reach the scheduler. "unix":
    # plain Unix stream sockets in that directory (anvil_core.unix_link: no ZeroMQ I/O threads, one
    # wake-up per message instead of four; identity c1 p50 1.27-1.36 ms against 1.75-1.78 over
    # "zmq", its ipc ZeroMQ sockets, in one interleaved run: docs/scheduler.md). The scheduler
    # serves both; without link_ipc_dir (compose, other hosts) links are tcp with CURVE either way.
    link_transport: Literal["zmq", "unix"] = "unix"
    # Direct requests (docs/scheduler.md "Direct requests"; Unix links only): a gateway with nothing
    # else in flight sends a request itself to the executor that last answered its model, on that
    # executor's direct socket in the link directory; the executor runs it only when idle and the
    # model is fast (its inline rule), else answers "busy" and the gateway sends it through the
    # scheduler. Two hops and the scheduler's loop fewer for a lone request. The gateway and the
    # executors both read it; false: every request goes through the scheduler.
    direct_requests: bool = True
    # ... and only a request of at most this many rows (the first input's batch dimension; sentences
    # for /v1/embeddings): a larger one gains little from the hops it skips and loses being batched
    # with others (MiniLM, 32 sentences a request on the H200: c64 -5 to -8% when they went direct).
    direct_max_rows: Annotated[int, Field(ge=1, le=4096)] = 1
    # The cyclic garbage collector (anvil_core.runtime.settle_gc, issue #19). gc_freeze: once started,
    # the objects of the start-up (modules, the app, loaded models: they live as long as the process)
    # leave the collector's generations, so a collection walks only what serving allocated since
    # (one of them dropped later, e.g. an unloaded built-in model, is freed by reference counting;
    # a reference cycle among them would stay).
    # gc_gen0_threshold: allocations between young collections (CPython's default 700); most of a
    # request's objects die by reference counting before a collection sees them, so fewer
    # collections is less work for the same garbage.
    gc_freeze: bool = True
    gc_gen0_threshold: int = 700
    # Redis credentials: this user and password, else <secrets_dir>/redis_password, else the URL's own.
    redis_username: str = ""
    redis_password: SecretStr | None = None
    # Priority classes' SLOs (anvil_core.priorities): deadline = arrival + SLO of the class at the
    # gateway, EDF and shedding at the scheduler, priority 1's target at qos. Every service reads the
    # same ANVIL_SLO_P*_MS (compose sets them once for all).
    slo_p1_ms: int = DEFAULT_SLO_MS[1]  # interactive
    slo_p2_ms: int = DEFAULT_SLO_MS[2]  # standard (the default class)
    slo_p3_ms: int = DEFAULT_SLO_MS[3]  # batch

    def slo_ms(self, priority: int) -> int:
        """The SLO of `priority` (1..3) in ms; KeyError for any other."""
        return {1: self.slo_p1_ms, 2: self.slo_p2_ms, 3: self.slo_p3_ms}[priority]

    @property
    def heartbeat_interval_s(self) -> float:
        return self.heartbeat_interval_ms / 1000.0

    @property
    def heartbeat_ttl_s(self) -> float:
        return self.heartbeat_ttl_ms / 1000.0

    @property
    def redis_auth(self) -> RedisAuth:
        password = self.redis_password.get_secret_value() if self.redis_password else None
        return load_redis_auth(password, self.secrets_dir, self.redis_username, self.REDIS_ROLE)

    def curve_client(self, role: str) -> CurveClient | None:
        """CURVE options of this process's client socket as `role`; None when CURVE is off or the
        link is an ipc socket. Raises CurveError (naming the file or setting) when a key is missing
        or malformed."""
        if not self.zmq_curve or self.link_ipc_dir:
            return None
        servers = parse_public_keys(self.curve_scheduler_public, "ANVIL_CURVE_SCHEDULER_PUBLIC")
        if len(servers) != 1:
            raise CurveError(
                f"ANVIL_CURVE_SCHEDULER_PUBLIC must hold one key, it holds {len(servers)}; {HINT}"
            )
        return CurveClient(read_secret_key(self.secrets_dir, role), next(iter(servers)))

    def curve_server(self, domain: str) -> CurveServer | None:
        """CURVE options of the scheduler's port for clients of `domain` (gateway, executor)."""
        if not self.zmq_curve:
            return None
        return CurveServer(read_secret_key(self.secrets_dir, "scheduler"), domain)

    def curve_admitted(self, role: str) -> frozenset[bytes]:
        """The public keys of `role` that the scheduler admits (Z85, as ZAP compares them);
        CurveError when none is set."""
        name = f"ANVIL_CURVE_{role.upper()}_PUBLIC"
        keys = parse_public_keys(getattr(self, f"curve_{role}_public"), name)
        if not keys:
            raise CurveError(f"ZeroMQ CURVE is on but {name} is unset: no {role} could connect; {HINT}")
        return keys


def redact_url(url: str) -> str:
    """Strip the password from a URL before it is logged (``redis://:secret@h`` → ``redis://:***@h``)."""
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    user = creds.split(":", 1)[0] if ":" in creds else creds
    return f"{scheme}://{user}:***@{host}"
