"""The rule that holds back closes of ended runs to share a round trip (pgsched.dispatch.closes_wait),
with an explicit clock."""

from __future__ import annotations

from pgsched.dispatch import CLOSE_WAIT_S, closes_wait


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
