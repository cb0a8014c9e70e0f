"""deploy/grafana/anvil.json queries only what the services export, and deploy/ fits compose.yaml.

The metric names come from the running stack: every service's /metrics is scraped (after a little
traffic) and each `# TYPE` family is expanded into the sample names Prometheus stores (a histogram
`h`: h_bucket, h_count, h_sum), so a renamed or removed metric fails here, not on a blank panel.
Every panel's PromQL (and each variable's `label_values`) is parsed with a real PromQL parser.
The file checks (no stack) come first.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import promql_parser
import pytest
import yaml

from anvil_client.compose_file import load_services

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "anvil.json"
PROVISIONING = ROOT / "deploy" / "grafana" / "provisioning"
PROMETHEUS = ROOT / "deploy" / "prometheus" / "prometheus.yml"
# Series Prometheus makes itself for every target (not the services'); the dashboard may use them.
SCRAPER_SERIES = {"up"}
# What the dashboard must show (issue 20): a family of the topic has to appear in some query.
TOPICS = {
    "throughput": "anvil_inference_request_success_total",
    "latency per model": "anvil_inference_request_duration_us_bucket",
    "latency per priority": "anvil_gateway_hop_us_bucket",
    "SLO attainment": "anvil_scheduler_slo_attainment",
    "queue depth": "anvil_scheduler_queue_depth",
    "batch size": "anvil_scheduler_batch_size_bucket",
    "shed by reason": "anvil_scheduler_shed_total",
    "429 by reason": "anvil_admission_rejected_total",
    "executor utilisation": "anvil_executor_compute_duration_us_sum",
    "qos throttles": "anvil_qos_rate_rps",
    "dropped messages": "anvil_dropped_messages_total",
}


def _dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return doc


def _panels(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in doc["panels"]:
        yield panel
        yield from panel.get("panels", [])  # a collapsed row keeps its panels inside


def _queries(doc: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable (label_values' metric)."""
    for panel in _panels(doc):
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} target {target['refId']}", target["expr"]
    for var in doc["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query.strip())
            assert match, f"variable {var['name']}: only label_values(<selector>, <label>) is supported"
            yield f"variable {var['name']}", match.group(1)


def _grafana_to_promql(expr: str) -> str:
    """Grafana's interval variables become a duration; other variables stay inside label strings."""
    return re.sub(r"\$(?:__\w+|\{__\w+\})", "5m", expr)


def selectors(expr: str) -> list[tuple[str, set[str]]]:
    """(metric name, label names matched) of every vector selector in `expr` (parsed, not grepped)."""
    found: list[tuple[str, set[str]]] = []

    def visit(node: Any) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            labels = {m.name for m in node.matchers.matchers}
            name = node.name or next(
                (
                    m.value
                    for m in node.matchers.matchers
                    if m.name == "__name__" and m.op == promql_parser.MatchOp.Equal
                ),
                None,
            )
            assert name, f"a selector without a fixed metric name: {expr}"
            found.append((name, labels - {"__name__"}))
        return True

    promql_parser.walk(promql_parser.parse(_grafana_to_promql(expr)), visit)
    return found


def test_selectors_reads_names_and_labels_through_functions_and_aggregations() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (model, le) (rate(a_bucket{model=~"$model"}[$__rate_interval])))'
        ' / on () group_left sum(b) or vector(0) + count(label_replace(c{x=\'1\'}, "y", "$1", "x", "(.*)"))'
    )
    assert selectors(expr) == [("a_bucket", {"model"}), ("b", set()), ("c", {"x"})]
    with pytest.raises(ValueError):
        selectors("sum(rate(a[5m])")  # unbalanced: a parse error, not an empty list


def test_every_panel_uses_the_datasource_variable_and_parses() -> None:
    doc = _dashboard()
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert (
        variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    )
    ids = [p["id"] for p in _panels(doc)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    graphs = [p for p in _panels(doc) if p["type"] != "row"]
    assert len(graphs) >= 20
    for panel in graphs:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
    for where, expr in _queries(doc):
        assert selectors(expr), f"{where}: no metric in {expr!r}"


def test_the_dashboard_covers_each_topic() -> None:
    used = {name for _, expr in _queries(_dashboard()) for name, _ in selectors(expr)}
    missing = {topic: metric for topic, metric in TOPICS.items() if metric not in used}
    assert not missing, f"topics without a panel: {missing}"


def _compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "compose.yaml").read_text())
    return doc


def test_prometheus_scrapes_each_service_at_its_compose_metrics_port() -> None:
    services = load_services(ROOT / "compose.yaml", {}, {"cpu", "gpu", "gpu-x2"})
    ports = {
        name: svc.environment["ANVIL_METRICS_PORT"]
        for name, svc in services.items()
        if "ANVIL_METRICS_PORT" in svc.environment
    }
    config = yaml.safe_load(PROMETHEUS.read_text())
    scraped: dict[str, str] = {}
    for job in config["scrape_configs"]:
        for static in job.get("static_configs", []):
            for target in static["targets"]:
                host, port = target.split(":")
                scraped[host] = port
        for dns in job.get("dns_sd_configs", []):
            for host in dns["names"]:
                scraped[host] = str(dns["port"])
    assert scraped == ports


def test_grafana_provisioning_matches_the_compose_mounts() -> None:
    source = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yaml").read_text())
    (ds,) = source["datasources"]
    assert ds["type"] == "prometheus" and ds["url"] == "http://prometheus:9090"
    (provider,) = yaml.safe_load((PROVISIONING / "dashboards" / "anvil.yaml").read_text())["providers"]
    services = _compose()["services"]
    mounts = {m.split(":")[0]: m.split(":")[1] for m in services["grafana"]["volumes"]}
    assert mounts["./deploy/grafana/anvil.json"] == f"{provider['options']['path']}/anvil.json"
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    assert mounts == {k: v for k, v in mounts.items() if (ROOT / k).exists()}, "a mounted file is missing"
    prom = {m.split(":")[0]: m.split(":")[1] for m in services["prometheus"]["volumes"]}
    assert prom["./deploy/prometheus/prometheus.yml"] == "/etc/prometheus/prometheus.yml"


def test_observability_services_are_optional_and_local_only() -> None:
    services = _compose()["services"]
    for name in ("prometheus", "grafana"):
        svc = services[name]
        assert svc["profiles"] == ["observability"], name
        assert "command" not in svc, f"{name}: `anvil up` would try to run it as a local process"
        assert all(p.startswith("127.0.0.1:") for p in svc["ports"]), f"{name} publishes beyond localhost"


# --- against the running stack ---


def _exported(text: str) -> dict[str, set[str]]:
    """Sample name -> label names seen, for every family a /metrics text declares (with or without
    samples yet): the names Prometheus stores for each `# TYPE` line."""
    out: dict[str, set[str]] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            names = {name}
            if kind == "histogram":
                names = {f"{name}_bucket", f"{name}_count", f"{name}_sum"}
            elif kind == "summary":
                names |= {f"{name}_count", f"{name}_sum"}
            elif kind == "counter" and not name.endswith("_total"):
                names = {f"{name}_total"}
            for n in names:
                out.setdefault(n, set())
        elif line and not line.startswith("#"):
            match = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s", line)
            if match:
                labels = set(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="', match.group(2) or ""))
                out.setdefault(match.group(1), set()).update(labels)
    return out


def _scrape(stack: Any) -> Iterator[tuple[str, str]]:
    """(service, /metrics text) of every service with a metrics port: a local stack's from the
    launcher's state, the containers' (`make test-compose`) from their addresses on the network."""
    if callable(stack.state):  # ComposeStack: state(service) is a container's state
        for name in stack.services():
            if "ANVIL_METRICS_PORT" in stack.service_env(name):
                yield name, stack.metrics(name)
        return
    for svc in stack.state["services"]:
        port = svc["env"].get("ANVIL_METRICS_PORT")
        if port is not None:
            yield svc["name"], httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text


@pytest.mark.integration
def test_every_query_names_a_metric_the_running_services_export(stack: Any) -> None:
    if not hasattr(stack, "state"):
        pytest.skip("reads the services' metrics ports from the local launcher's state")
    with httpx.Client(base_url=stack.url, timeout=10) as http:  # traffic: labelled series get samples
        x = np.ones((1, 16), np.float32).tolist()
        for priority in (1, 2, 3):
            body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": x}]}
            body["parameters"] = {"priority": priority}
            assert http.post("/v2/models/mlp/infer", json=body).status_code == 200
    exported: dict[str, set[str]] = {}
    scraped = []
    for name, text in _scrape(stack):
        scraped.append(name)
        for metric, labels in _exported(text).items():
            exported.setdefault(metric, set()).update(labels)
    assert {"gateway", "scheduler", "executor", "qos"} <= set(scraped)

    problems = []
    for where, expr in _queries(_dashboard()):
        for name, labels in selectors(expr):
            if name in SCRAPER_SERIES:
                continue
            if name not in exported:
                problems.append(f"{where}: {name} is not exported by {scraped}")
            elif exported[name] and not labels <= exported[name] | {"instance", "job"}:
                problems.append(f"{where}: {name} has no label {sorted(labels - exported[name])}")
    assert not problems, "\n".join(problems)
