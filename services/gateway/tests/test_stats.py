"""Per-model statistics in Triton's meaning: requests and inferences per request, executions and
batch_stats per batch (counted once, by the answer with batch index 0), only for known models."""

from __future__ import annotations

import json

from anvil_core import codec
from anvil_core.codec import pb
from anvil_gateway.stats import Stats, add_peer


def _resp(
    model: str = "m", size: int = 0, index: int = 0, times: tuple[int, int, int] = (0, 0, 0), **kw: int
) -> pb.InferResponseT:
    """An answer as the gateway reads it (built and verified by the codec)."""
    timing = codec.BatchTiming(size, *times, exec_queue_us=kw.pop("exec_queue_us", 0)) if size else None
    env = codec.build_response(
        request_id="r", trace_id="", model=model, version="1", batch=timing, batch_index=index, **kw
    )
    return codec.read_response(env)


def test_a_batch_of_three_requests_counts_one_execution_and_six_inferences() -> None:
    st = Stats()
    answers = [_resp(size=6, index=i, times=(10, 200, 30), queue_us=5 + i, exec_queue_us=1) for i in range(3)]
    for rows, resp in zip((1, 3, 2), answers, strict=True):
        st.executed(resp)
        st.success("m", "1", rows, total_ns=1_000_000, resp=resp)
    (doc,) = st.doc([("m", "1")])["model_stats"]
    assert (doc["inference_count"], doc["execution_count"]) == (6, 1)
    assert doc["batch_stats"] == [
        {
            "batch_size": 6,
            "compute_input": {"count": 1, "ns": 10_000},
            "compute_infer": {"count": 1, "ns": 200_000},
            "compute_output": {"count": 1, "ns": 30_000},
        }
    ]
    s = doc["inference_stats"]
    # per request: each of the three counts its batch's times, as Triton does
    assert s["compute_infer"] == {"count": 3, "ns": 600_000}
    assert s["compute_input"] == {"count": 3, "ns": 30_000} and s["compute_output"]["ns"] == 90_000
    assert s["queue"] == {"count": 3, "ns": (6 + 7 + 8) * 1000}  # scheduler + executor queue
    assert s["success"] == {"count": 3, "ns": 3_000_000}
    assert doc["last_inference"] > 0


def test_batch_sizes_get_one_entry_each_and_add_up_to_the_inferences() -> None:
    st = Stats()
    for size in (4, 1, 4, 2):
        for i in range(size):  # one-row requests: one answer per row
            resp = _resp(size=size, index=i, times=(1, 2, 3))
            st.executed(resp)
            st.success("m", "1", 1, 100, resp)
    (doc,) = st.doc([("m", "1")])["model_stats"]
    sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in doc["batch_stats"]}
    assert sizes == {1: 1, 2: 1, 4: 2} and doc["execution_count"] == 4
    assert sum(size * count for size, count in sizes.items()) == doc["inference_count"] == 11
    assert [b["batch_size"] for b in doc["batch_stats"]] == [1, 2, 4]


def test_failures_and_answers_without_batch_measurements() -> None:
    st = Stats()
    st.failure("m", "1", total_ns=50)
    old = _resp(queue_us=3, compute_us=700)  # an executor that does not split its time
    st.executed(old)
    st.success("m", "1", 1, 900, old)
    (doc,) = st.doc([("m", "1")])["model_stats"]
    s = doc["inference_stats"]
    assert s["fail"] == {"count": 1, "ns": 50}
    assert s["compute_infer"] == {"count": 1, "ns": 700_000} and s["compute_input"] == {"count": 1, "ns": 0}
    assert doc["execution_count"] == 0 and doc["batch_stats"] == []


def test_only_known_models_are_counted_and_unknown_ones_read_as_zeros() -> None:
    st = Stats(known=lambda name, version: (name, version) == ("m", "1"))
    st.executed(_resp(model="crafted", size=2, times=(1, 1, 1)))
    st.executed(_resp(model="m", size=2, times=(1, 1, 1)))
    assert list(st.models) == [("m", "1")]
    fresh = st.model_doc("other", "1")
    assert fresh["execution_count"] == 0 and fresh["batch_stats"] == []
    assert fresh["inference_stats"]["success"] == {"count": 0, "ns": 0}


def _share(executions: int, rows: int) -> Stats:
    """A gateway's share: `executions` batches of `rows` one-row requests each."""
    st = Stats()
    for _ in range(executions):
        for i in range(rows):
            resp = _resp(size=rows, index=i, times=(1, 2, 3), queue_us=4)
            st.executed(resp)
            st.success("m", "1", 1, 1000, resp)
    return st


def test_the_shares_of_several_gateways_add_up() -> None:
    a, b = _share(2, 4), _share(3, 2)
    (doc,) = a.doc([("m", "1")])["model_stats"]
    (peer,) = json.loads(json.dumps(b.snapshot()))  # as it travels through Redis
    assert add_peer(doc, peer)
    assert (doc["inference_count"], doc["execution_count"]) == (8 + 6, 5)
    assert {x["batch_size"]: x["compute_infer"]["count"] for x in doc["batch_stats"]} == {2: 3, 4: 2}
    assert doc["inference_stats"]["success"] == {"count": 14, "ns": 14_000}
    assert doc["inference_stats"]["queue"] == {"count": 14, "ns": 14 * 4000}


def test_a_malformed_peer_share_changes_nothing() -> None:
    (doc,) = _share(1, 2).doc([("m", "1")])["model_stats"]
    before = json.dumps(doc)
    (good,) = _share(1, 2).snapshot()
    bad_entries: list[object] = [
        None,
        {},
        {**good, "inference_count": -1},
        {**good, "execution_count": "7"},
        {**good, "inference_stats": {**good["inference_stats"], "queue": {"count": 1, "ns": -5}}},
        {
            **good,
            "batch_stats": [
                {
                    "batch_size": 0,
                    **{
                        k: {"count": 1, "ns": 1} for k in ("compute_input", "compute_infer", "compute_output")
                    },
                }
            ],
        },
        {**good, "batch_stats": [{"batch_size": 2}]},
    ]
    for bad in bad_entries:
        assert not add_peer(doc, bad)
    assert json.dumps(doc) == before
