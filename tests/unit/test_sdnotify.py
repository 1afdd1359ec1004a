"""sd_notify over NOTIFY_SOCKET (pgsched/sdnotify.py), against a socket the test opens."""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pgsched.sdnotify import Notifier


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    path = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind(path)
        s.settimeout(2)
        yield path, s


def test_from_env_reads_and_removes_the_variables(listener: tuple[str, socket.socket]) -> None:
    path, s = listener
    env = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid()), "OTHER": "x"}
    n = Notifier.from_env(env)
    assert n is not None and n.watchdog_s == 30.0
    assert env == {"OTHER": "x"}  # workers and jobs inherit none of them
    n.ready("3 workers connected")
    assert s.recv(1024) == b"READY=1\nSTATUS=3 workers connected"
    n.stopping()
    assert s.recv(1024) == b"STOPPING=1\nSTATUS=stopping"


def test_no_socket_no_notifier_and_a_watchdog_for_another_pid_is_not_ours(
        listener: tuple[str, socket.socket]) -> None:
    assert Notifier.from_env({}) is None
    n = Notifier.from_env({"NOTIFY_SOCKET": listener[0], "WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"})
    assert n is not None and n.watchdog_s is None and n.wait_limit() is None


def test_watchdog_pings_every_half_interval(listener: tuple[str, socket.socket]) -> None:
    path, s = listener
    n = Notifier.from_env({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "200000"})
    assert n is not None
    n.tick()
    assert s.recv(64) == b"WATCHDOG=1"
    limit = n.wait_limit()
    assert limit is not None and 0.05 < limit <= 0.1
    n.tick()  # not due yet: nothing sent
    s.settimeout(0.02)
    with pytest.raises(TimeoutError):
        s.recv(64)
    time.sleep(limit)
    n.tick()
    assert s.recv(64) == b"WATCHDOG=1"


def test_abstract_socket_and_a_gone_socket(tmp_path: Path) -> None:
    name = f"pgsched-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind("\0" + name)
        s.settimeout(2)
        n = Notifier.from_env({"NOTIFY_SOCKET": "@" + name})
        assert n is not None and n.send("READY=1")
        assert s.recv(64) == b"READY=1"
    gone = Notifier(str(tmp_path / "nobody.sock"), None)
    assert gone.send("READY=1") is False  # logged once, never raised
