"""The worker's events (pgsched.protocol): each kind round-trips, and a line that is not an event is refused."""

from __future__ import annotations

import pytest

from pgsched import protocol
from pgsched.protocol import MAX_MESSAGE, Backend, Done, Failed, Lost, ProtocolError, Ready


@pytest.mark.parametrize("event", [
    Ready(pid=10, backend_pid=20, role="alice"),
    Backend(run_id=5, backend_pid=21, role=None),
    Backend(run_id=6, backend_pid=22, role="bob", database="app", parked=[["alice", None], ["carol", "app"]]),
    Done(10, ok=True, parked=[]),
    Done(7, ok=True, rows_affected=3, result={"a": [1, 2]}, scopes=["eu", "us"]),
    Done(8, ok=False, sqlstate="22012", message="division by zero", lost=True),
    Done(9, ok=False, owner_unusable=True, sqlstate="28000", message="no login"),
    Lost(),
    Failed("cannot connect"),
])
def test_each_event_kind_round_trips(event: protocol.Event) -> None:
    line = protocol.encode(event)
    assert "\n" not in line
    assert protocol.decode(line.encode()) == event


@pytest.mark.parametrize("line", [b"not json", b"[1]", b'{"event": "nope"}', b'{"run_id": 1}',
                                  b'{"event": "done", "ok": true}', b'{"event": "ready", "pid": 1}',
                                  b'{"event": "backend", "run_id": 1, "backend_pid": 2, "parked": [["a"]]}',
                                  b'{"event": "backend", "run_id": 1, "backend_pid": 2, "parked": "a"}',
                                  b'{"event": "done", "run_id": 1, "ok": true, "parked": [[1, null]]}'])
def test_a_line_that_is_not_an_event_is_refused(line: bytes) -> None:
    with pytest.raises(ProtocolError):
        protocol.decode(line)


def test_unknown_fields_are_ignored_so_a_newer_worker_can_add_some() -> None:
    assert protocol.decode(b'{"event": "lost", "extra": 1}') == Lost()


def test_messages_are_capped_once() -> None:
    assert protocol.cap("x" * MAX_MESSAGE) == "x" * MAX_MESSAGE
    long = protocol.cap("y" * (MAX_MESSAGE + 1))
    assert len(long) == MAX_MESSAGE and long.endswith("...")


def test_run_app_name_names_job_run_and_lease() -> None:
    assert protocol.run_app_name(3, 4, 5) == "pgsched job 3 run 4 lease 5"
