"""OpenTelemetry tracing for the gateway, scheduler and executor: one setup, off unless configured.

Off (the default) costs nothing on the hot path: the OpenTelemetry SDK is not imported, ``ON`` is
False, ``span()`` returns one shared no-op context manager and ``traceparent()`` returns None, so
no trace context is written into the wire messages. Call sites that would build attributes test
``tracing.ON`` first (read it as ``tracing.ON``, not ``from ... import ON``: ``setup`` sets it).

On when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set, and
neither ``OTEL_SDK_DISABLED=true`` nor ``OTEL_TRACES_EXPORTER=none``: spans go to that endpoint over
OTLP/HTTP (protobuf) through a batching processor (a background thread; the request path only
queues a finished span). The SDK reads the other standard variables itself: ``OTEL_SERVICE_NAME``
(default here ``anvil-<service>``), ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER`` /
``OTEL_TRACES_SAMPLER_ARG`` (default ``parentbased_always_on``), ``OTEL_EXPORTER_OTLP_HEADERS``,
``OTEL_EXPORTER_OTLP_TIMEOUT``, ``OTEL_BSP_*``. docs/observability.md lists the spans.

Between services the context travels as a W3C ``traceparent`` string in the wire messages
(``InferRequest.traceparent``, ``Batch.traceparent``); ``parent``/``link`` turn one back into a
context. A malformed value is ignored (the span starts its own trace), never an error.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from typing import Any

from anvil_core.logs import get_logger

__all__ = [
    "ON",
    "current_trace_id",
    "enabled_by",
    "install",
    "link",
    "parent",
    "record",
    "sampled",
    "server_span",
    "setup",
    "shutdown",
    "span",
    "span_context",
    "traceparent",
    "traceparent_of",
    "wall_ns",
]

log = get_logger("anvil.tracing")

ON = False  # set by setup()/install(); read as tracing.ON
_tracer: Any = None
_provider: Any = None
_NULL: AbstractContextManager[None] = nullcontext()  # reusable: entering it does nothing
# False inside a root span the sampler dropped: its children are skipped (not made non-recording)
_RECORDING: ContextVar[bool] = ContextVar("anvil_tracing_recording", default=True)
# version 00: trace id (32 hex, not all zero), parent span id (16 hex, not all zero), flags (2 hex)
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


def enabled_by(env: Mapping[str, str]) -> bool:
    """Whether the standard OTel variables in `env` ask for OTLP trace export."""
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if not endpoint or env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() != "none"


def setup(service: str, env: Mapping[str, str] | None = None) -> bool:
    """Called once at a service's start: export spans over OTLP/HTTP when `env` (default
    os.environ) asks for it. Returns whether tracing is on. Without the SDK installed it says so
    once and stays off."""
    env = os.environ if env is None else env
    if not enabled_by(env):
        return False
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        log.warning("OTEL_EXPORTER_OTLP_ENDPOINT is set but the OpenTelemetry SDK is not installed: "
                    "tracing stays off", extra={"err": str(exc)})  # fmt: skip
        return False
    attrs = {"anvil.service": service}
    if not env.get("OTEL_SERVICE_NAME"):
        attrs["service.name"] = f"anvil-{service}"
    provider = TracerProvider(resource=Resource.create(attrs))  # sampler: OTEL_TRACES_SAMPLER
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    install(provider)
    log.info("tracing on: OTLP/HTTP export", extra={"service": service})
    return True


def install(provider: Any) -> None:
    """Trace through `provider` (an SDK TracerProvider): setup's, or a test's in-memory one."""
    global ON, _tracer, _provider
    _provider = provider
    _tracer = provider.get_tracer("anvil")
    ON = True


def shutdown() -> None:
    """Flush the spans still queued and turn tracing off (a service's exit; tests)."""
    global ON, _tracer, _provider
    if _provider is not None:
        _provider.shutdown()
    ON, _tracer, _provider = False, None, None


def span(name: str) -> AbstractContextManager[Any]:
    """A child span of the current one around a block (the shared no-op when off, or inside a
    `server_span` that is not sampled)."""
    if not ON or not _RECORDING.get():
        return _NULL
    return _tracer.start_as_current_span(name)  # type: ignore[no-any-return]


@contextmanager
def server_span(name: str, header: str | None, attributes: Mapping[str, Any]) -> Iterator[Any]:
    """The root span of a request received from a client (kind SERVER), a child of the client's
    W3C `traceparent` header when it parses. Call only when ON."""
    from opentelemetry.trace import SpanKind

    with _tracer.start_as_current_span(
        name, context=parent(header), kind=SpanKind.SERVER, attributes=attributes
    ) as s:
        token = _RECORDING.set(s.is_recording())  # unsampled: the next hops see flag 00, skip too
        try:
            yield s
        finally:
            _RECORDING.reset(token)


def traceparent() -> str | None:
    """The current span's context as a W3C traceparent, for the next hop; None when off."""
    if not ON:
        return None
    from opentelemetry import trace

    return traceparent_of(trace.get_current_span())


def current_trace_id() -> str | None:
    """The current span's trace id (32 hex), to echo to the client; None when off or outside a span."""
    if not ON:
        return None
    from opentelemetry import trace

    ctx = trace.get_current_span().get_span_context()
    return f"{ctx.trace_id:032x}" if ctx.is_valid else None


def traceparent_of(s: Any) -> str | None:
    """A span's context as a W3C traceparent (None when it has no valid context)."""
    ctx = s.get_span_context()
    if not ctx.is_valid:
        return None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def span_context(header: Any) -> Any:
    """The remote SpanContext a W3C traceparent names (None when it does not parse); a
    SpanContext passes through, so callers parse a context once and hand it on."""
    if header is None or header == "":
        return None
    if not isinstance(header, str):
        return header
    m = _TRACEPARENT.fullmatch(header.strip())
    if m is None or m.group(1) == "ff":
        return None
    trace_id, span_id = int(m.group(2), 16), int(m.group(3), 16)
    if trace_id == 0 or span_id == 0:
        return None
    from opentelemetry.trace import SpanContext, TraceFlags

    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(int(m.group(4), 16) & 1))


def parent(header: Any) -> Any:
    """An OTel Context whose span is the remote one `header` (a traceparent or a SpanContext)
    names; None (a new trace) when it does not parse."""
    ctx = span_context(header)
    if ctx is None:
        return None
    from opentelemetry import trace

    return trace.set_span_in_context(trace.NonRecordingSpan(ctx))


def link(header: Any, attributes: Mapping[str, Any] | None = None) -> Any:
    """A span Link to the remote span `header` (a traceparent or a SpanContext) names (None when
    it does not parse)."""
    ctx = span_context(header)
    if ctx is None:
        return None
    from opentelemetry.trace import Link

    return Link(ctx, attributes=dict(attributes or {}))


def sampled(header: Any) -> bool:
    """Whether `header` (a traceparent or a SpanContext) parses and its sampled flag is set."""
    ctx = span_context(header)
    return ctx is not None and ctx.trace_flags.sampled


def record(
    name: str,
    start_ns: int,
    end_ns: int,
    *,
    parent_of: Any = None,
    links: Sequence[Any] = (),
    attributes: Mapping[str, Any] | None = None,
) -> Any:
    """A finished span whose times were measured already (wall-clock ns since the epoch), e.g. a
    queue wait known only when it ends. `parent_of`: a Context (``parent``) or a span; returns the
    span (ended), whose context its children and the next hop use. Call only when ON."""
    from opentelemetry import trace

    ctx = parent_of
    if ctx is not None and not isinstance(ctx, dict) and hasattr(ctx, "get_span_context"):
        ctx = trace.set_span_in_context(ctx)
    s = _tracer.start_span(
        name,
        context=ctx,
        links=[x for x in links if x is not None],
        attributes=dict(attributes or {}),
        start_time=start_ns,
    )
    s.end(end_time=max(start_ns, end_ns))
    return s


def wall_ns(perf_ns: int, now_perf_ns: int | None = None, now_wall_ns: int | None = None) -> int:
    """A perf_counter_ns stamp as wall-clock ns since the epoch (spans carry wall times)."""
    now_perf = time.perf_counter_ns() if now_perf_ns is None else now_perf_ns
    now_wall = time.time_ns() if now_wall_ns is None else now_wall_ns
    return now_wall - (now_perf - perf_ns)
