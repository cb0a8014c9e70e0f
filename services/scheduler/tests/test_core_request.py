"""Deadlines (a timeout tightens, never loosens), config validation, lifecycle transitions."""

import pytest

from anvil_scheduler.core import DEFAULT_PRIORITIES, Request, RequestState, SchedulerConfig

P1, P2, P3 = DEFAULT_PRIORITIES


def test_default_classes() -> None:
    assert [(p.priority, p.slo_ms) for p in DEFAULT_PRIORITIES] == [(1, 50.0), (2, 200.0), (3, 2000.0)]


def test_deadline_is_arrival_plus_slo() -> None:
    r = Request.create("a", "m", P2, arrival_s=10.0)
    assert r.deadline_s == pytest.approx(10.2)
    assert r.budget_s == pytest.approx(0.2)


def test_timeout_tightens_the_deadline() -> None:
    assert Request.create("a", "m", P2, 10.0, timeout_s=0.05).deadline_s == pytest.approx(10.05)


def test_timeout_never_loosens_the_deadline() -> None:
    assert Request.create("a", "m", P1, 10.0, timeout_s=5.0).deadline_s == pytest.approx(10.05)


def test_bad_inputs_are_rejected_with_the_constraint() -> None:
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        Request.create("a", "m", P1, 0.0, timeout_s=0.0)
    with pytest.raises(ValueError, match=r"configured priorities are \[1, 2, 3\]"):
        SchedulerConfig().priority(7)
    with pytest.raises(ValueError, match="unique"):
        SchedulerConfig(priorities=(P1, P1))


def test_lifecycle_allows_only_listed_transitions() -> None:
    r = Request.create("a", "m", P1, 0.0)
    r.advance(RequestState.QUEUED)
    r.advance(RequestState.BATCHED)
    r.advance(RequestState.EXECUTING)
    r.advance(RequestState.QUEUED)  # re-dispatch after an executor loss
    with pytest.raises(AssertionError, match="illegal transition"):
        r.advance(RequestState.DONE)
    r.advance(RequestState.SHED, now_s=1.0)
    assert r.state.terminal and r.finished_s == 1.0
    with pytest.raises(AssertionError):
        r.advance(RequestState.QUEUED)
