"""The rule that holds back closes of ended runs to share a round trip (pgsched.dispatch.closes_wait),
with an explicit clock."""

from __future__ import annotations

from pgsched.dispatch import CLOSE_WAIT_S, SessionKey, closes_wait, pair_by_session


def test_an_ended_run_waits_for_others_at_most_close_wait() -> None:
    assert closes_wait(1, since=100.0, now=100.0, max_workers=8)
    assert closes_wait(1, since=100.0, now=100.0 + CLOSE_WAIT_S / 2, max_workers=8)
    assert not closes_wait(1, since=100.0, now=100.0 + CLOSE_WAIT_S, max_workers=8)
    assert not closes_wait(1, since=100.0, now=100.0 + 5.0, max_workers=8)


def test_two_claims_worth_of_ended_runs_are_closed_at_once() -> None:
    assert closes_wait(15, since=100.0, now=100.0, max_workers=8)
    assert not closes_wait(16, since=100.0, now=100.0, max_workers=8)
    assert not closes_wait(2, since=100.0, now=100.0, max_workers=1)
    assert closes_wait(1, since=100.0, now=100.0, max_workers=1)


def test_runs_go_to_workers_in_their_owners_session_then_to_those_keeping_one_parked() -> None:
    a: SessionKey = ("alice", None)
    b: SessionKey = ("bob", None)
    c: SessionKey = ("carol", "other_db")
    erin: SessionKey = ("erin", None)
    workers: list[tuple[SessionKey, frozenset[SessionKey]]] = [
        (a, frozenset()), (b, frozenset({c})), (c, frozenset()), (("dave", None), frozenset({a, b}))]
    # c's run takes worker 2 (its session), not 1 (parked): parked sessions come second.
    assert pair_by_session([c, a, b], workers) == [2, 0, 1]
    # A second run of a finds the worker that keeps a parked one before any other.
    assert pair_by_session([a, a], workers) == [0, 3]
    # Runs with nobody's session take the rest in order.
    assert pair_by_session([erin, a, erin], workers) == [1, 0, 2]
    assert pair_by_session([], workers) == []
