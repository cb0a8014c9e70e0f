"""UnloadedView (anvil_scheduler/unloaded.py): which reads of the registry's UNLOADED marks apply,
and how requests parked for a fresh read settle."""

from __future__ import annotations

import pytest

from anvil_scheduler import unloaded
from anvil_scheduler.unloaded import MAX_PARKED, MAX_WAIT_S, UnloadedView


def test_a_read_applies_unless_a_request_came_after_it_began() -> None:
    v = UnloadedView()
    v.seen("a", 5.0)
    v.apply({"a", "b"}, 4.0)  # "a" was asked for at 5.0, after this read began
    assert v.models == {"b"}
    v.apply({"a", "b"}, 6.0)  # begun after the request: applies
    assert v.models == {"a", "b"}
    v.seen("a", 7.0)
    v.apply({"a", "b"}, 6.5)  # held unloaded already: a late request does not bring it back
    assert v.models == {"a", "b"}


def test_an_older_read_never_replaces_a_newer_one() -> None:
    v = UnloadedView()
    v.apply(set(), 10.0)
    v.apply({"a"}, 9.0)  # asked earlier, came back later
    assert v.models == frozenset() and v.read_started == 10.0


def test_parked_requests_settle_by_the_read_begun_after_them() -> None:
    v = UnloadedView()
    v.apply({"gone", "back"}, 1.0)
    assert v.park(2.0, "gone", "g") is True  # the first asks for a read
    assert v.park(2.1, "back", "b") is False  # one is already asked
    refused, handle, ask = v.settle(2.2)
    assert (refused, handle, ask) == ([], [], False)  # no read since they came
    v.apply({"gone"}, 2.5)
    refused, handle, ask = v.settle(2.6)
    assert [p.args for p in refused] == [("g",)] and [p.args for p in handle] == [("b",)]
    assert not ask and v.parked == 0


def test_a_parked_request_no_read_settles_hears_not_found_after_max_wait() -> None:
    v = UnloadedView()
    v.apply({"m"}, 1.0)
    v.park(2.0, "m", "x")
    refused, _, ask = v.settle(2.0 + unloaded.REASK_S + 0.01)  # the read never came back: ask again
    assert refused == [] and ask
    refused, _, _ = v.settle(2.0 + MAX_WAIT_S)
    assert [p.args for p in refused] == [("x",)] and v.parked == 0


def test_a_flood_for_an_unloaded_model_is_not_parked_without_bound() -> None:
    v = UnloadedView()
    v.apply({"m"}, 0.0)
    for i in range(MAX_PARKED):
        assert v.park(1.0, "m", i) is not None
    assert v.park(1.0, "m", "one too many") is None


@pytest.mark.parametrize("started", [0.5, 1.5])
def test_a_model_never_asked_for_applies_from_any_read(started: float) -> None:
    v = UnloadedView()
    v.apply({"quiet"}, started)
    assert v.models == {"quiet"}


def test_revived_names_what_came_back_once() -> None:
    v = UnloadedView()
    v.apply({"a", "b"}, 1.0)
    assert v.revived() == frozenset()
    v.apply({"b"}, 2.0)  # "a" deployed again
    assert v.revived() == {"a"}
    assert v.revived() == frozenset()  # said once
