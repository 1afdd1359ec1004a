"""The rule that holds back closes of ended runs to share a round trip (pgsched.dispatch.closes_wait),
with an explicit clock."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from pgsched.dispatch import CLOSE_WAIT_S, SessionKey, closes_wait, held_wakeups, pair_by_session
from pgsched.store import Finish


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


def test_runs_are_paired_to_keep_as_many_sessions_as_can_be() -> None:
    a: SessionKey = ("alice", None)
    b: SessionKey = ("bob", None)
    c: SessionKey = ("carol", None)
    # Taken in turn, a's run would take worker 0 and leave b's none that keeps its session.
    assert pair_by_session([a, b], [(c, frozenset({a, b})), (c, frozenset({a}))]) == [1, 0]
    # a's run leaves worker 0's current session for worker 1, which keeps a parked, so that b's
    # run finds its parked session on worker 0.
    assert pair_by_session([a, b], [(a, frozenset({b})), (c, frozenset({a}))]) == [1, 0]
    # No needless move: b's run could take worker 0 by moving a's to worker 1, but worker 2, free,
    # keeps b parked too.
    assert pair_by_session([a, b], [(a, frozenset({b})), (c, frozenset({a})), (c, frozenset({b}))]) == [0, 2]
    # More workers than runs: the ones left over are simply not used.
    assert pair_by_session([b], [(a, frozenset()), (c, frozenset({b})), (b, frozenset())]) == [2]


def test_pairing_many_workers_does_not_recurse() -> None:
    """--max-workers takes up to 1,000: the search for a worker is iterative, however deep."""
    a: SessionKey = ("alice", None)
    b: SessionKey = ("bob", None)
    c: SessionKey = ("carol", None)
    # A chain as deep as the workers: b's run could only take a worker in a's session by moving its
    # run to another, all taken.
    n = 1000
    pairs = pair_by_session([a] * (n - 1) + [b], [(a, frozenset({b}))] * (n - 1) + [(c, frozenset())])
    assert pairs == list(range(n))
    # Half of the runs cannot keep their session (a failed search is not repeated for the next
    # run: repeated, these searches took 3.7 s).
    workers = [(a, frozenset({b}))] * (n // 2) + [(c, frozenset())] * (n // 2)
    pairs = pair_by_session([a] * (n // 2) + [b] * (n // 2), workers)
    assert sorted(pairs) == list(range(n)) and pairs[: n // 2] == list(range(n // 2))


_KEYS = [("r0", None), ("r1", None), ("r2", "db"), ("r3", None)]


@given(st.lists(st.tuples(st.sampled_from(_KEYS), st.frozensets(st.sampled_from(_KEYS), max_size=3)),
                min_size=1, max_size=6).flatmap(
    lambda ws: st.tuples(st.lists(st.sampled_from(_KEYS), min_size=len(ws), max_size=len(ws)), st.just(ws))))
def test_pairing_keeps_the_most_sessions_possible(case: tuple[list[SessionKey],
                                                              list[tuple[SessionKey, frozenset[SessionKey]]]]) -> None:
    runs, workers = case
    pairs = pair_by_session(runs, workers)
    assert sorted(pairs) == list(range(len(workers)))  # each worker one run

    def held(assignment: Sequence[int]) -> int:
        return sum(1 for r, i in enumerate(assignment) if runs[r] == workers[i][0] or runs[r] in workers[i][1])

    # As many runs find their session as in the best of every assignment (a brute force).
    assert held(pairs) == max(held(p) for p in itertools.permutations(range(len(workers))))


def test_closes_held_back_keep_their_next_starts_and_scope_retries_as_wake_ups() -> None:
    """A claim made while they wait does not know them: the scheduler keeps them itself."""
    t = datetime(2030, 6, 1, 12, tzinfo=UTC)
    plan = Finish(run_id=1, outcome="success", sqlstate=None, message=None, next_start=t + timedelta(minutes=1),
                  finished_at=t)
    scope = Finish(run_id=2, outcome="failure", sqlstate="P0001", message="x", next_start=None, finished_at=t,
                   retry_at=t + timedelta(seconds=1))
    done = Finish(run_id=3, outcome="success", sqlstate=None, message=None, next_start=None, finished_at=t)
    assert held_wakeups([plan, scope, done]) == [t + timedelta(minutes=1), t + timedelta(seconds=1)]
