"""serve --all-databases' sharing of workers between databases (pgsched.multidb.shares)."""

from __future__ import annotations

from pgsched.multidb import database_dsn, shares


def test_workers_are_split_evenly_the_remainder_to_the_first_names() -> None:
    assert shares(8, ["b", "a", "c"]) == {"a": 3, "b": 3, "c": 2}
    assert shares(8, ["a", "b"]) == {"a": 4, "b": 4}
    assert sum(shares(10, [f"d{i}" for i in range(4)]).values()) == 10


def test_every_database_gets_a_worker_even_when_there_are_more_databases_than_workers() -> None:
    assert shares(2, ["a", "b", "c"]) == {"a": 1, "b": 1, "c": 1}


def test_no_database_no_share() -> None:
    assert shares(8, []) == {}


def test_a_database_dsn_keeps_everything_but_the_database() -> None:
    got = database_dsn("host=/tmp port=5433 dbname=postgres user=u target_session_attrs=read-write", "app")
    assert "dbname=app" in got and "port=5433" in got and "target_session_attrs=read-write" in got
    assert "postgres" not in got.replace("user=u", "")
