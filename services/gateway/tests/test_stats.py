"""Per-model statistics in Triton's shape: perf_analyzer requires equal compute counts."""

from __future__ import annotations

from anvil_gateway.stats import Stats


def test_compute_counts_agree_and_times_add_up() -> None:
    st = Stats()
    st.success("m", "1", rows=4, total_ns=1000, queue_ns=200, compute_ns=500)
    st.success("m", "1", rows=1, total_ns=3000, queue_ns=100, compute_ns=700)
    st.failure("m", "1", total_ns=50)
    doc = st.doc([("m", "1"), ("other", "1")])["model_stats"]
    s = doc[0]["inference_stats"]
    assert {s[k]["count"] for k in ("compute_input", "compute_infer", "compute_output")} == {2}
    assert s["compute_infer"]["ns"] == 1200 and s["queue"]["ns"] == 300
    assert s["success"] == {"count": 2, "ns": 4000} and s["fail"] == {"count": 1, "ns": 50}
    assert doc[0]["inference_count"] == 5 and doc[0]["execution_count"] == 2
    assert doc[1]["inference_stats"]["success"]["count"] == 0
