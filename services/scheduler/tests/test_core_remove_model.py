"""An undeployed model leaves the core: its queued requests come back to be answered (none dropped),
its state is freed, a batch of it still in flight completes or fails without error, and the model
can be registered again from scratch."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from anvil_scheduler.core import (
    AimdPolicy,
    BatchingPolicy,
    EdfPidPolicy,
    ExecutorSpec,
    FixedDelayConfig,
    FixedDelayPolicy,
    ProfilePrior,
    RequestState,
    SchedulerConfig,
    SchedulerCore,
)

PRIOR = ProfilePrior(base_us=4000, per_item_us=1000)


def make_core(policy: BatchingPolicy) -> SchedulerCore:
    cfg = SchedulerConfig(slack_guard_us=1000, slack_guard_fraction=0.0, dispatch_lead_us=0)
    core = SchedulerCore(policy, cfg, PRIOR)
    for model in ("m", "keep"):
        core.register_model(model, 8)
    core.register_executor(ExecutorSpec("e0", "gpu", 8, frozenset({"m", "keep"}), credits=1), 0.0)
    return core


POLICIES = {
    "edf_pid": EdfPidPolicy,
    "aimd": AimdPolicy,
    "fixed_delay": lambda: FixedDelayPolicy(FixedDelayConfig(8, 0)),  # releases at once
}


@pytest.mark.parametrize("policy", POLICIES.values(), ids=list(POLICIES))
@pytest.mark.parametrize("in_flight_ends", ["done", "failed", "lost"])
def test_removal_answers_the_queue_and_frees_the_model(
    policy: Callable[[], BatchingPolicy], in_flight_ends: str
) -> None:
    core = make_core(policy())
    reqs = [core.new_request(f"r{i}", "m", 1 + i % 3, 0.0) for i in range(12)]
    for r in reqs[:1]:
        core.admit(r, 0.0)
    (running,) = core.poll(0.0).batches  # one credit: the rest wait in the queue
    for r in reqs[1:]:
        core.admit(r, 0.0)
    queued = [r for r in reqs if r.state is RequestState.QUEUED]
    assert queued

    assert "m" in {model for model, _ in core.profiles.keys()}  # noqa: SIM118 (a method)
    failed = core.remove_model("m", 0.001)

    assert sorted(r.request_id for r in failed) == sorted(r.request_id for r in queued)  # none dropped
    assert all(r.state is RequestState.FAILED for r in failed)
    assert "m" not in core.models() and "keep" in core.models()
    assert all("m" not in s.models for s in core.pool.specs())
    assert "m" not in {model for model, _ in core.profiles.keys()}  # noqa: SIM118 (a method)
    assert core.remove_model("m", 0.001) == ()  # twice is nothing
    # the batch that was running when the model went is still tracked, and ends without error
    assert core.accounting(0.001).in_flight_requests == running.size
    if in_flight_ends == "done":
        done = core.on_batch_done(running.batch_id, "e0", 0.004, 0.005)
        assert [r.request_id for r in done.answered] == running.request_ids
    elif in_flight_ends == "failed":
        rel = core.on_batch_failed(running.batch_id, "e0", 0.005, retryable=True)
        assert [r.request_id for r in rel.failed] == running.request_ids and not rel.requeued
    else:
        rel = core.on_executor_lost("e0", 0.005)
        assert [r.request_id for r in rel.failed] == running.request_ids and not rel.requeued
    assert core.idle_violations(0.005) == []
    assert "m" not in {model for model, _ in core.profiles.keys()}  # noqa: SIM118 (a method)

    # deployed again: a fresh model that serves
    core.register_model("m", 4)
    core.register_executor(ExecutorSpec("e0", "gpu", 8, frozenset({"m", "keep"}), credits=1), 0.006)
    again = core.new_request("again", "m", 2, 0.006)
    core.admit(again, 0.006)
    (batch,) = core.poll(0.006).batches
    assert batch.request_ids == ["again"] and core.policy.max_batch("m") == 4
    core.on_batch_done(batch.batch_id, "e0", 0.004, 0.011)
    assert core.idle_violations(0.011) == []


def test_removing_one_model_leaves_another_model_queued_work_alone() -> None:
    core = make_core(EdfPidPolicy())
    core.admit(core.new_request("k0", "keep", 2, 0.0), 0.0)
    core.admit(core.new_request("m0", "m", 2, 0.0), 0.0)
    assert [r.request_id for r in core.remove_model("m", 0.0)] == ["m0"]
    assert core.queue_depth().get(("m", 2)) is None
    batches = core.poll(0.0).batches
    for b in batches:
        core.on_batch_done(b.batch_id, "e0", 0.004, 0.01)
    assert core.idle_violations(0.01) == [] and core.accounting(0.01).open_requests == 0
