"""One `pgsched serve` for every database of a cluster: `serve --all-databases` (TimescaleDB's launcher).

Owns finding the databases where pgsched is installed, running one scheduler process for each
(`pgsched serve --dsn <that database>`, a child of this one), sharing `--max-workers` between them,
and following the cluster: a database where `pgsched init` has just run gets its scheduler at the
next look (every `poll` seconds), one that was dropped loses it, a scheduler that exits is started
again after a backoff. Each child is an ordinary instance, so every single-database guarantee
holds, and several launchers (or a launcher and plain `serve`s) on one cluster stay exactly-once.

Fairness is by partition, not by demand: each database gets `max_workers // n` workers (the first
`max_workers % n` in name order one more, at least one each), so a database whose jobs keep every
worker busy cannot delay another's. When the number of databases changes, a scheduler whose share
changed is stopped gracefully (SIGTERM: it lets its runs finish) and started again with the new one.

A database is dropped only when no session is connected to it: `DROP DATABASE ... WITH (FORCE)`
ends the scheduler's sessions, and the launcher then stops that scheduler.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, Any

import psycopg
import psycopg.conninfo

from pgsched.config import pin_search_path, redact

log = logging.getLogger("pgsched.multidb")


def shares(total: int, databases: Sequence[str]) -> dict[str, int]:
    """Workers per database: `total` split evenly, the remainder to the first in name order, at least 1."""
    names = sorted(databases)
    if not names:
        return {}
    base, extra = divmod(total, len(names))
    return {name: max(1, base + (1 if i < extra else 0)) for i, name in enumerate(names)}


def database_dsn(dsn: str, dbname: str) -> str:
    """`dsn` with its database replaced."""
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in params.items() if v is not None})


def default_workers(dsn: str) -> int | None:
    """The launcher's default --max-workers, shared by its databases: the machine's, within the
    share of the cluster's connections one instance takes (settings.default_max_workers). None
    while the cluster cannot be reached: the launcher asks again at its next look."""
    from pgsched.settings import default_max_workers
    from pgsched.store import CONNECTION_BUDGET

    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=5, application_name="pgsched launcher") as conn:
            pin_search_path(conn)
            row = conn.execute(f"SELECT {CONNECTION_BUDGET}").fetchone()
    except psycopg.Error as e:
        log.warning("launcher: cannot read the cluster's max_connections, for the default worker count (%s)",
                    str(e).strip().splitlines()[0] if str(e) else e)
        return None
    return default_max_workers(connections=int(row[0]) if row else None)


def installed_databases(dsn: str) -> list[str]:
    """The databases of the cluster at `dsn` that accept connections and have pgsched installed.

    A database this role may not connect to, or that is dropped meanwhile, is left out.
    """
    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        pin_search_path(conn)
        names = [str(r[0]) for r in conn.execute(
            "SELECT datname FROM pg_catalog.pg_database WHERE datallowconn AND NOT datistemplate ORDER BY 1")]
    found = []
    for name in names:
        try:
            with psycopg.connect(database_dsn(dsn, name), autocommit=True, connect_timeout=5,
                                 application_name="pgsched launcher") as conn:
                pin_search_path(conn)
                row = conn.execute("SELECT pg_catalog.to_regclass('pgsched.migration') IS NOT NULL").fetchone()
        except psycopg.Error as e:
            log.debug("database %s skipped: %s", name, str(e).strip().splitlines()[0] if str(e) else e)
            continue
        if row and row[0]:
            found.append(name)
    return found


@dataclass
class Child:
    """The scheduler process of one database."""

    dbname: str
    workers: int
    proc: subprocess.Popen[bytes]
    started: float = field(default_factory=time.monotonic)
    stopping: bool = False


class Launcher:
    """Runs and follows one scheduler process per database (see the module docstring)."""

    def __init__(self, dsn: str, max_workers: int | None, serve_args: Sequence[str] = (), poll: float = 5.0,
                 log_format: str = "text") -> None:
        self.dsn = dsn
        self.max_workers = max_workers  # None: the default, read from the cluster (default_workers)
        self.serve_args = list(serve_args)
        self.poll = poll
        self.log_format = log_format
        self.children: dict[str, Child] = {}
        self._failures: dict[str, tuple[int, float]] = {}  # dbname -> (consecutive quick exits, not before)
        self._stop = threading.Event()

    # -- the loop --------------------------------------------------------------------
    def run(self) -> None:
        said = False
        while not self._stop.is_set():
            if self.max_workers is None:
                self.max_workers = default_workers(self.dsn)
            if self.max_workers is not None and not said:
                said = True
                log.info("launcher: one scheduler per database of %s, %d workers in all", redact(self.dsn),
                         self.max_workers)
            try:
                # Not before the worker count is known: a child started with the machine's count
                # could take more of the cluster's connections than its share.
                wanted = installed_databases(self.dsn) if self.max_workers is not None else None
            except psycopg.Error as e:
                log.warning("launcher: cannot list the databases (%s); retrying", str(e).strip().splitlines()[0])
                wanted = None
            self._reap()
            if wanted is not None:
                self._reconcile(wanted)
            self._stop.wait(self.poll)
        self._stop_all()

    def stop(self) -> None:
        self._stop.set()

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, lambda *_: self.stop())
        signal.signal(signal.SIGINT, lambda *_: self.stop())
        signal.signal(signal.SIGHUP, lambda *_: self._forward(signal.SIGHUP))

    # -- reconciling -------------------------------------------------------------------
    def _reconcile(self, wanted: list[str]) -> None:
        assert self.max_workers is not None  # run() lists the databases only once it is known
        target = shares(self.max_workers, wanted)
        for name, child in list(self.children.items()):
            if child.stopping:
                continue
            if name not in target:
                log.info("launcher: database %s no longer has pgsched (or is gone): stopping its scheduler", name)
                self._terminate(child)
            elif target[name] != child.workers:
                log.info("launcher: database %s's share is now %d workers (was %d): restarting its scheduler",
                         name, target[name], child.workers)
                self._terminate(child)
        for name, workers in target.items():
            if name in self.children:
                continue
            _, not_before = self._failures.get(name, (0, 0.0))
            if time.monotonic() < not_before:
                continue
            self.children[name] = self._spawn(name, workers)

    def _reap(self) -> None:
        for name, child in list(self.children.items()):
            code = child.proc.poll()
            if code is None:
                continue
            del self.children[name]
            if child.stopping:
                continue
            ran = time.monotonic() - child.started
            quick = self._failures.get(name, (0, 0.0))[0] + 1 if ran < 30 else 1
            delay = min(60.0, 2.0 ** quick)
            self._failures[name] = (quick, time.monotonic() + delay)
            log.warning("launcher: the scheduler of database %s exited with %s after %.1fs; starting it again "
                        "in %.0fs", name, code, ran, delay)

    def _spawn(self, name: str, workers: int) -> Child:
        argv = [sys.executable, "-m", "pgsched", "serve",
                "--max-workers", str(workers), "--log-format", self.log_format, *self.serve_args]
        # Its own session: a signal to the launcher's terminal does not reach the children twice.
        # Without PGSCHED_ALL_DATABASES, which made this process a launcher and would make each child one.
        # The DSN goes in the environment, not on the command line, which every local user can
        # read (ps): it may hold a password.
        env = {k: v for k, v in os.environ.items() if k != "PGSCHED_ALL_DATABASES"}
        env["PGSCHED_DSN"] = database_dsn(self.dsn, name)
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                start_new_session=True, env=env)
        assert proc.stderr is not None
        threading.Thread(target=self._relay, args=(name, proc.stderr), daemon=True).start()
        log.info("launcher: started the scheduler of database %s (pid %d, %d workers)", name, proc.pid, workers)
        return Child(name, workers, proc)

    def _relay(self, name: str, stream: IO[bytes]) -> None:
        """A child's log lines, on ours, each naming its database (a JSON record gets a "database" key)."""
        for raw in stream:
            line = raw.decode(errors="replace").rstrip("\n")
            if self.log_format == "json":
                try:
                    rec: Any = json.loads(line)
                except ValueError:
                    rec = None
                if isinstance(rec, dict):
                    line = json.dumps({**rec, "database": name})
                else:
                    line = json.dumps({"database": name, "msg": line})
            else:
                line = f"[{name}] {line}"
            sys.stderr.write(line + "\n")
            sys.stderr.flush()

    def _terminate(self, child: Child) -> None:
        child.stopping = True
        with contextlib.suppress(ProcessLookupError):
            child.proc.send_signal(signal.SIGTERM)

    def _forward(self, sig: signal.Signals) -> None:
        for child in self.children.values():
            with contextlib.suppress(ProcessLookupError):
                child.proc.send_signal(sig)

    def _stop_all(self, timeout: float = 60.0) -> None:
        log.info("launcher: stopping %d scheduler(s)", len(self.children))
        for child in self.children.values():
            self._terminate(child)
        deadline = time.monotonic() + timeout
        for child in self.children.values():
            try:
                child.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.proc.kill()
                child.proc.wait()
        self.children.clear()
        log.info("launcher stopped")
