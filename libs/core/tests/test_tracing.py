"""anvil_core.tracing: off costs no import and no work; on, W3C contexts round-trip, links and
measured spans land where they should (an in-memory exporter)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from anvil_core import tracing

sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = sdk_trace.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    yield exporter
    tracing.shutdown()


@pytest.mark.parametrize(
    ("env", "on"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}, False),
    ],
)
def test_the_standard_variables_turn_it_on(env: dict[str, str], on: bool) -> None:
    assert tracing.enabled_by(env) is on


def test_off_no_sdk_is_imported_and_spans_are_one_shared_no_op() -> None:
    """FastAPI and redis-py import parts of OpenTelemetry themselves when installed (the API, the
    SDK's metrics; no-op without a global provider): what tracing adds, the SDK's tracer and the
    exporter, stays out of the services' processes."""
    code = (
        "import sys\n"
        "from anvil_core import tracing\n"
        "import anvil_gateway.app, anvil_scheduler.service, anvil_executor.service\n"
        "assert tracing.setup('gateway', {}) is False and tracing.ON is False\n"
        "assert tracing.span('a') is tracing.span('b') and tracing.traceparent() is None\n"
        "added = ('opentelemetry.sdk.trace', 'opentelemetry.exporter')\n"
        "print(sorted(m for m in sys.modules if m.startswith(added)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_malformed_context_starts_a_new_trace_instead_of_failing(spans: InMemorySpanExporter) -> None:
    for bad in (
        "",
        "garbage",
        TP.replace("-01", "-zz"),
        "00-" + "0" * 32 + "-b7ad6b7169203331-01",
        "ff" + TP[2:],
    ):
        assert tracing.parent(bad) is None and tracing.link(bad) is None
    tracing.record("x", 1_000, 2_000, parent_of=tracing.parent("garbage"))
    (s,) = spans.get_finished_spans()
    assert s.parent is None


def test_contexts_round_trip_and_measured_spans_keep_their_times(spans: InMemorySpanExporter) -> None:
    with tracing.server_span("root", TP, {"k": 1}), tracing.span("child"):
        sent = tracing.traceparent()
        assert tracing.current_trace_id() == TP.split("-")[1]
    assert sent is not None and sent.split("-")[1] == TP.split("-")[1] and sent.endswith("-01")
    top = tracing.record("batch", 5_000, 9_000, parent_of=tracing.parent(sent), links=[tracing.link(TP)])
    tracing.record("part", 6_000, 7_000, parent_of=top)
    by: dict[str, Any] = {s.name: s for s in spans.get_finished_spans()}
    assert by["root"].parent.span_id == int(TP.split("-")[2], 16) and by["root"].parent.is_remote
    assert by["child"].parent.span_id == by["root"].context.span_id
    assert by["batch"].parent.span_id == by["child"].context.span_id
    assert (by["batch"].start_time, by["batch"].end_time) == (5_000, 9_000)
    assert [link.context.span_id for link in by["batch"].links] == [int(TP.split("-")[2], 16)]
    assert by["part"].parent.span_id == by["batch"].context.span_id


def test_an_unsampled_parent_records_nothing_and_passes_its_decision_on(spans: InMemorySpanExporter) -> None:
    unsampled = TP[:-2] + "00"
    assert not tracing.sampled(unsampled) and tracing.sampled(TP)
    tracing.record("x", 1, 2, parent_of=tracing.parent(unsampled))
    with tracing.server_span("root", unsampled, {}):
        assert tracing.span("child") is tracing.span("other")  # skipped: the shared no-op
        sent = tracing.traceparent()
    assert sent is not None and sent.startswith(f"00-{TP.split('-')[1]}-") and sent.endswith("-00")
    assert spans.get_finished_spans() == ()
