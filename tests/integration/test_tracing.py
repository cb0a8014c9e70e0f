"""OpenTelemetry spans of one request through gateway -> scheduler -> executor.

In process, with an in-memory exporter: the span code of the three hops, joined by the W3C
contexts the wire messages carry. Against the real stack: the services export over OTLP/HTTP to a
receiver in this test (protobuf, decoded with opentelemetry-proto), and a request sent with a known
`traceparent` has its spans there, in that trace, parented and linked as docs/observability.md says.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import numpy as np
import pytest

from anvil_core import codec, tracing
from anvil_core.codec import pb
from anvil_core.tensors import HostTensor
from anvil_executor.batch_runner import run_batch
from anvil_executor.models import load_builtin
from anvil_scheduler import spans as scheduler_spans
from anvil_scheduler.core.request import Batch, Request

sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

pytestmark = pytest.mark.integration

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
CLIENT_TP = f"00-{TRACE}-{CLIENT_SPAN}-01"
MLP_ROW = [0.5] * 16


def _mlp_request(rid: str, traceparent: str | None) -> list[Any]:
    payloads: list[Any] = []
    x = HostTensor.from_array("INPUT0", "FP32", np.ones((1, 16), np.float32))
    env = codec.build_request(
        request_id=rid,
        trace_id=TRACE,
        model="mlp",
        version="",
        priority=2,
        deadline_unix_ns=time.time_ns() + 10**10,
        tenant="default",
        inputs=codec.tensor_frames([x], payloads),
        traceparent=traceparent,
    )
    return [env, *payloads]


@pytest.fixture
def memory_spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = sdk_trace.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    yield exporter
    tracing.shutdown()


def test_one_requests_spans_join_across_the_three_hops_in_process(memory_spans: InMemorySpanExporter) -> None:
    # gateway: the root span (the client's child); its context goes on the wire, then the wait
    with tracing.server_span("gateway.infer", CLIENT_TP, {"anvil.model": "mlp"}):
        parts = _mlp_request("r1", tracing.traceparent())
        with tracing.span("gateway.dispatch"):
            pass
    other = _mlp_request("r2", None)  # an untraced neighbour in the same batch (e.g. ZeroCopy)
    dropped = _mlp_request("r3", f"00-{'1' * 32}-{CLIENT_SPAN}-00")  # one its client did not sample
    # scheduler: the requests as it reads them, queued, then dispatched in a batch of three
    contexts = [codec.read_request(p[0]).traceparent or "" for p in (parts, other, dropped)]
    now = time.monotonic()
    reqs = [Request(rid, "mlp", 2, now - 0.002, now + 1) for rid in ("r1", "r2", "r3")]
    batch = Batch(7, "mlp", "ex-1", "cpu", reqs, formed_s=now, opened_s=now, predicted_exec_s=0.001)
    batch_tp = scheduler_spans.record(batch, contexts, now, "ex-1")
    counts = [len(parts), len(other), len(dropped)]
    msg = pb.BatchT(batchId="7", model="mlp", frameCounts=counts, queueUs=[5, 5, 5])
    msg.traceparent = batch_tp
    # executor: the batch, its requests' contexts read from their own envelopes
    result, _ = run_batch({"mlp": load_builtin("mlp", 8)}, msg, [*parts, *other, *dropped], "ex-1", "cpu")
    assert result.error is None

    finished = memory_spans.get_finished_spans()
    by = {s.name: s for s in finished}
    assert len(finished) == len(by)  # one of each
    assert set(by) == {
        "gateway.infer",
        "gateway.dispatch",
        "scheduler.queue",
        "scheduler.batch",
        "executor.batch",
        "executor.copy_in",
        "executor.compute",
        "executor.copy_out",
    }  # fmt: skip  (one queue span: the untraced and the unsampled neighbours have none)
    trace_ids = {f"{s.context.trace_id:032x}" for s in by.values()}
    assert trace_ids == {TRACE}

    def parent_of(name: str) -> str:
        pid = by[name].parent.span_id
        return next((n for n, s in by.items() if s.context.span_id == pid), f"{pid:016x}")

    assert parent_of("gateway.infer") == CLIENT_SPAN
    assert parent_of("gateway.dispatch") == "gateway.infer"
    assert parent_of("scheduler.queue") == "gateway.infer"
    assert parent_of("scheduler.batch") == "gateway.infer"  # the first sampled request's
    assert parent_of("executor.batch") == "scheduler.batch"
    for part in ("executor.copy_in", "executor.compute", "executor.copy_out"):
        assert parent_of(part) == "executor.batch"
    root = by["gateway.infer"].context.span_id
    for batch_span in ("scheduler.batch", "executor.batch"):
        assert [link.context.span_id for link in by[batch_span].links] == [root]
    assert by["executor.batch"].attributes["anvil.batch.requests"] == 3
    b, parts_ = (
        by["executor.batch"],
        [by[n] for n in ("executor.copy_in", "executor.compute", "executor.copy_out")],
    )
    assert b.start_time <= parts_[0].start_time <= parts_[0].end_time <= parts_[1].start_time
    assert parts_[1].end_time <= parts_[2].start_time <= parts_[2].end_time <= b.end_time


# ---- the real stack, exporting to a receiver in this test ------------------------------------------
@dataclass
class _Receiver:
    """Accepts OTLP/HTTP protobuf trace exports (POST /v1/traces) and keeps the spans."""

    spans: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    posts: int = 0

    def take(self, body: bytes) -> None:
        req = trace_service_pb2.ExportTraceServiceRequest()
        req.ParseFromString(body)
        with self.lock:
            self.posts += 1
            for rs in req.resource_spans:
                attrs = {a.key: a.value.string_value for a in rs.resource.attributes}
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        self.spans.append(
                            {
                                "service": attrs.get("service.name", ""),
                                "name": s.name,
                                "trace": s.trace_id.hex(),
                                "span": s.span_id.hex(),
                                "parent": s.parent_span_id.hex(),
                                "links": [(x.trace_id.hex(), x.span_id.hex()) for x in s.links],
                                "attrs": {a.key: str(a.value) for a in s.attributes},
                                "start": s.start_time_unix_nano,
                                "end": s.end_time_unix_nano,
                            }
                        )

    def of(self, trace: str) -> list[dict[str, Any]]:
        with self.lock:
            return [s for s in self.spans if s["trace"] == trace]


@pytest.fixture
def receiver() -> Iterator[tuple[_Receiver, str]]:
    rec = _Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            if self.path != "/v1/traces" or self.headers.get("content-type") != "application/x-protobuf":
                self.send_response(404)
                self.end_headers()
                return
            rec.take(body)
            out = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield rec, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_the_services_export_a_requests_spans_to_an_otlp_receiver(
    receiver: tuple[_Receiver, str], new_local_stack: Callable[..., Any], waiter: Callable[..., float]
) -> None:
    rec, endpoint = receiver
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}
    stack = new_local_stack(env)
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": MLP_ROW}]}
    unsampled = "11111111111111111111111111111111"
    with httpx.Client(base_url=stack.url, timeout=30) as http:
        r = http.post(
            "/v2/models/mlp/infer", json=body, headers={"traceparent": f"00-{unsampled}-{CLIENT_SPAN}-00"}
        )
        assert r.status_code == 200, r.text
        r = http.post("/v2/models/mlp/infer", json=body, headers={"traceparent": CLIENT_TP})
        assert r.status_code == 200, r.text
        assert r.headers["x-anvil-trace-id"] == TRACE
        fresh = http.post("/v2/models/mlp/infer", json=body)  # no context: the gateway starts a trace
        assert fresh.status_code == 200, fresh.text

    wanted = {
        ("anvil-gateway", "gateway.infer"), ("anvil-gateway", "gateway.parse"),
        ("anvil-gateway", "gateway.admit"), ("anvil-gateway", "gateway.dispatch"),
        ("anvil-gateway", "gateway.answer"),
        ("anvil-scheduler", "scheduler.queue"), ("anvil-scheduler", "scheduler.batch"),
        ("anvil-executor", "executor.batch"), ("anvil-executor", "executor.copy_in"),
        ("anvil-executor", "executor.compute"), ("anvil-executor", "executor.copy_out"),
    }  # fmt: skip
    waiter(lambda: wanted <= {(s["service"], s["name"]) for s in rec.of(TRACE)}, 30, "the request's spans")
    spans = rec.of(TRACE)
    by = {s["name"]: s for s in spans}
    assert len(spans) == len(wanted), " ".join(sorted(s["name"] for s in spans))  # one of each
    assert by["gateway.infer"]["parent"] == CLIENT_SPAN
    for name in ("gateway.parse", "gateway.admit", "gateway.dispatch", "gateway.answer"):
        assert by[name]["parent"] == by["gateway.infer"]["span"], name
    root = by["gateway.infer"]["span"]
    assert by["scheduler.queue"]["parent"] == root and by["scheduler.batch"]["parent"] == root
    assert by["executor.batch"]["parent"] == by["scheduler.batch"]["span"]
    assert by["executor.batch"]["links"] == by["scheduler.batch"]["links"] == [(TRACE, root)]
    for name in ("executor.copy_in", "executor.compute", "executor.copy_out"):
        assert by[name]["parent"] == by["executor.batch"]["span"]
    # the trace the gateway started is the one it echoed
    waiter(lambda: len(rec.of(fresh.headers["x-anvil-trace-id"])) >= 5, 30, "the fresh trace's spans")
    # the unsampled request ran first: each service exports in order, so its spans would be here
    assert rec.of(unsampled) == []
