"""pgsched.store against a real database: what it writes when a run's report is not clean."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from pgsched.clock import DbClock
from pgsched.store import Finish, Store
from tests.integration.helpers import SETUP_SQL

Conn = psycopg.Connection[tuple[Any, ...]]


def test_a_result_or_message_jsonb_refuses_is_cleaned_not_left_to_block_the_batch(db: str, conn: Conn) -> None:
    """NaN in a Python handler's result or a NUL in an error message would make PostgreSQL refuse the
    whole batch of closes (and the scheduler would retry it forever): each is cleaned instead."""
    conn.execute(SETUP_SQL)
    ids = []
    for _ in range(3):  # three jobs, one run each in progress
        job = conn.execute("SELECT pgsched.add_job('ok_fn', '1 hour')").fetchone()
        assert job is not None
        run = conn.execute("SELECT pgsched._mark_start(%s, now(), 'manual')", (job[0],)).fetchone()
        assert run is not None
        ids.append(int(run[0]))
    store = Store(db, DbClock())
    try:
        now = datetime.now(UTC)
        closed = [c is not None for c in store.close_runs([
            Finish(run_id=ids[0], outcome="success", sqlstate=None, message=None, next_start=None, finished_at=now,
                   result={"ratio": float("nan"), "ok": 1}),
            Finish(run_id=ids[1], outcome="failure", sqlstate="XX000", message="bad\x00byte", next_start=None,
                   finished_at=now, result=None),
            Finish(run_id=ids[2], outcome="success", sqlstate=None, message=None, next_start=None, finished_at=now,
                   result={"k\x00ey": ["v\x00", 2]}),
        ])]
    finally:
        store.close()
    assert closed == [True, True, True]
    rows = {r[0]: r[1:] for r in conn.execute(
        "SELECT run_id, outcome, message, result FROM pgsched.job_run WHERE run_id = ANY (%s)", (ids,))}
    assert rows[ids[0]][0] == "success" and "not representable as JSON" in rows[ids[0]][2]["invalid_result"]
    assert rows[ids[1]][:2] == ("failure", "bad\\0byte")
    assert rows[ids[2]][2] == {"k\\0ey": ["v\\0", 2]}


class Recording(Store):
    """A Store that keeps the payloads its scheduler would act on (not the ones it drops)."""

    def __init__(self, dsn: str) -> None:
        self.heard: list[str] = []
        super().__init__(dsn, DbClock())

    def _note(self, payload: str) -> None:
        self.heard.append(payload)
        super()._note(payload)


def heard(store: Recording, payload: str) -> bool:
    """Whether `payload` reached `store`, waiting up to 10 s for another session's notification
    (delivered when the listening session next idles: a round trip and a drain take it in)."""
    deadline = time.monotonic() + 10
    while payload not in store.heard and time.monotonic() < deadline:
        store.conn.execute("SELECT 1")
        store.drain_notifies()
        time.sleep(0.01)
    return payload in store.heard


def _key_waiting(conn: Conn, store: Store) -> tuple[int, int]:
    """Two due jobs on one concurrency key of limit 1, the first's run claimed: (instance, its run)."""
    conn.execute(SETUP_SQL)
    conn.execute("SELECT pgsched.set_concurrency_limit('k', 1)")
    for _ in range(2):
        conn.execute("SELECT pgsched.add_job('ok_fn', '1 hour', concurrency_key => 'k')")
    conn.execute("UPDATE pgsched.job_stat SET next_start = now() - interval '1 second'")
    instance = store.register_instance("h", 1, "test", 2)
    [first], _, _ = store.claim(instance, [(101, 0)])
    return instance, first.run_id


def _ended(run_id: int) -> Finish:
    return Finish(run_id=run_id, outcome="success", sqlstate=None, message=None,
                  next_start=datetime.now(UTC) + timedelta(hours=1), finished_at=datetime.now(UTC), result=None)


FREED = "concurrency_key:free"


def test_a_claim_that_took_what_its_own_close_freed_is_not_woken_by_that_close(db: str, conn: Conn) -> None:
    """A close that frees a concurrency key others wait for notifies every scheduler
    ('concurrency_key:free'). The one whose claim closed the run in its own transaction and took the
    waiting job is not woken by it (its claim already said what is due: re-reading the plan each
    round cost 1 ms a round with 10,000 scope runs queued); every other listener is, and a close
    alone (no claim after it) wakes its own scheduler too."""
    store, peer = Recording(db), Recording(db)
    try:
        instance, run_id = _key_waiting(conn, store)
        claimed, next_due, closes = store.claim(instance, [(101, 0), (102, 0)], finishing=[_ended(run_id)])
        assert closes[0] is not None
        assert len(claimed) == 1 and claimed[0].run_id != run_id  # the job waiting for the key
        assert next_due is not None  # nothing else due: the first job's next plan, an hour ahead
        # Its own notification is in by the time the claim returns (sent before the commit's reply).
        store.drain_notifies()
        assert FREED not in store.heard
        assert heard(peer, FREED)  # the others hear it
        # A close without a claim: its own scheduler hears it (the claim after it has to look).
        # The first job is due again and waits for the key the second's run holds.
        conn.execute("UPDATE pgsched.job_stat SET next_start = now() - interval '1 second' "
                     "WHERE job_id <> (SELECT job_id FROM pgsched.job_run WHERE run_id = %s)", (claimed[0].run_id,))
        store.close_runs([_ended(claimed[0].run_id)])
        store.drain_notifies()
        assert store.heard.count(FREED) == 1
    finally:
        store.close()
        peer.close()


def test_a_claim_that_took_nothing_after_its_own_close_hears_that_close(db: str, conn: Conn) -> None:
    """The same close, in a claim that takes nothing (another scheduler's open transaction holds the
    waiting job's row): the notification is kept, so the scheduler looks again."""
    store = Recording(db)
    try:
        instance, run_id = _key_waiting(conn, store)
        with psycopg.connect(db) as holder:
            holder.execute("SELECT 1 FROM pgsched.job_stat WHERE state = 'scheduled' FOR UPDATE")
            claimed, _, closes = store.claim(instance, [(101, 0)], finishing=[_ended(run_id)])
            holder.rollback()
        assert closes[0] is not None and claimed == []
        assert store.notified or store.drain_notifies() > 0
        assert FREED in store.heard
    finally:
        store.close()


def test_while_waiting_runs_while_the_claim_is_on_the_database(db: str, conn: Conn) -> None:
    """The scheduler writes its held log records while its claim runs (pgsched.logs.HeldRecords): the
    callback comes once the statements are sent, before their results. Here the claim waits for the
    keyed claims' advisory lock, which another session holds until the callback has seen it waiting;
    a callback called after the results would come too late (the claim's lock_timeout, 1 s, ends it).
    And the claim's transaction is committed without waiting for the callback: its session goes idle
    (a callback before the Sync would keep the claim's locks, the advisory lock too, as long as
    it takes)."""
    store = Store(db, DbClock())
    holder = psycopg.connect(db, autocommit=True)
    seen: list[tuple[str, str]] = []
    try:
        conn.execute(SETUP_SQL)
        conn.execute("SELECT pgsched.set_concurrency_limit('k', 1)")
        job = conn.execute("SELECT pgsched.add_job('ok_fn', '1 hour', concurrency_key => 'k')").fetchone()
        assert job is not None
        conn.execute("UPDATE pgsched.job_stat SET next_start = now() - interval '1 second'")
        instance = store.register_instance("h", 1, "test", 2)
        holder.execute("SELECT pg_advisory_lock(7401295312)")

        def while_waiting() -> None:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                row = holder.execute("SELECT wait_event_type, query FROM pg_stat_activity WHERE pid = %s",
                                     (store.conn.info.backend_pid,)).fetchone()
                if row is not None and row[0] == "Lock":
                    seen.append((row[0], row[1]))
                    break
                time.sleep(0.01)
            holder.execute("SELECT pg_advisory_unlock(7401295312)")
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                row = holder.execute("SELECT state, backend_xid FROM pg_stat_activity WHERE pid = %s",
                                     (store.conn.info.backend_pid,)).fetchone()
                if row is not None and row[0] == "idle":
                    seen.append(("committed", str(row[1])))
                    break
                time.sleep(0.01)

        claimed, _, _ = store.claim(instance, [(101, 0)], while_waiting=while_waiting)
    finally:
        store.close()
        holder.close()
    assert seen[0][0] == "Lock" and "_claim_v2" in seen[0][1]
    assert seen[1:] == [("committed", "None")], seen
    assert [c.job_id for c in claimed] == [job[0]]


def test_a_close_the_database_refuses_claims_nothing_and_leaves_the_session_usable(db: str, conn: Conn) -> None:
    """The close and the claim are one transaction, its Sync sent before the caller's work: a close
    that fails raises, claims nothing (the due job stays due), and the session takes the next claim."""
    store = Store(db, DbClock())
    try:
        conn.execute(SETUP_SQL)
        job = conn.execute("SELECT pgsched.add_job('ok_fn', '1 hour')").fetchone()
        assert job is not None
        conn.execute("UPDATE pgsched.job_stat SET next_start = now() - interval '1 second'")
        instance = store.register_instance("h", 1, "test", 2)
        bad = Finish(run_id=1, outcome="no such outcome", sqlstate=None, message=None, next_start=None,
                     finished_at=datetime.now(UTC), result=None)
        try:
            store.claim(instance, [(101, 0)], finishing=[bad], while_waiting=lambda: None)
        except psycopg.Error as e:
            refused: psycopg.Error | None = e
        else:
            refused = None
        assert refused is not None
        assert conn.execute("SELECT count(*) FROM pgsched.job_run").fetchone() == (0,)
        claimed, _, _ = store.claim(instance, [(101, 0)])
        assert [c.job_id for c in claimed] == [job[0]]
    finally:
        store.close()
