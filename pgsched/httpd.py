"""`serve --http HOST:PORT`: /metrics (Prometheus text format, prometheus-client), /healthz and
/readyz, served from a thread of the scheduler process.

The loop's own numbers (runs by outcome, durations, start lags, rounds, workers) are read
from pgsched.metrics.LoopMetrics and the loop's state at scrape time: nothing is computed per
run beyond a few additions. The catalog's numbers (jobs by state, each job's last success)
are read at scrape time on a connection of this thread's own, never the loop's, under lock and
statement timeouts (any role may lock the catalog): left out when they cannot be read in time.
Per-job series stop above `metrics_max_jobs` jobs (README "Metrics"), so that a scrape stays small.

Each connection costs the scheduler's process a thread and a file descriptor, so the server keeps
at most MAX_CONNECTIONS and times each one out after CONNECTION_TIMEOUT_S without traffic.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, cast

import psycopg
import psycopg.conninfo

from pgsched.config import pin_search_path
from pgsched.errors import ConfigError, first_line
from pgsched.metrics import LoopMetrics

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from pgsched.loop_state import LoopState

log = logging.getLogger("pgsched.http")

OUTCOMES = ("success", "failure", "timeout", "crash", "cancelled", "skipped")
STATES = ("scheduled", "starting", "terminating", "disabled")

# A connection's socket timeout, for each read and write: a client that sends nothing (or stops
# reading) is dropped after it. Read when a connection opens (tests lower it).
CONNECTION_TIMEOUT_S = 10.0
# Connections open at once. Beyond, the oldest one still waiting for its request is closed to
# make room (a scraper sends its request at once, so an idle flood cannot keep it out); when all
# are serving a request, the new one is closed, without a thread started for it.
MAX_CONNECTIONS = 32
# The listen backlog: a burst of connections is accepted (and capped) rather than left to retry.
LISTEN_BACKLOG = 128
# The catalog's read for a scrape (CatalogReader): a lock it waits for more than LOCK_TIMEOUT_S,
# or a statement longer than STATEMENT_TIMEOUT_S, and the scrape goes without the catalog's series.
# Read when the connection opens (tests change them).
LOCK_TIMEOUT_S = 1.0
STATEMENT_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 5
# TCP keepalives of that connection (libpq's parameters), unless its DSN sets them.
KEEPALIVES = {"keepalives": "1", "keepalives_idle": "30", "keepalives_interval": "10", "keepalives_count": "3"}
# How long stopping waits for the cancel of a read in progress, then for the read to end.
CLOSE_WAIT_S = 2.0
# At most one warning per this many seconds that the cap is reached (a flood would repeat it).
FULL_WARNING_EVERY_S = 60.0


def parse_address(text: str) -> tuple[str, int]:
    """'HOST:PORT' ('[::1]:9187' for IPv6; ':9187' for every interface); ConfigError otherwise."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"--http: {text!r} is not HOST:PORT; e.g. 127.0.0.1:9187, [::1]:9187 or :9187")
    return host, int(port)


@dataclass(frozen=True)
class Listen:
    """Where the server listens: the socket's family and address; dual_stack: an IPv6 socket
    that takes IPv4 too (IPV6_V6ONLY off)."""

    family: socket.AddressFamily
    address: tuple[Any, ...]
    dual_stack: bool = False


def resolve_listen(host: str, port: int) -> Listen:
    """Every interface for an empty host: IPv6 and IPv4 on one socket where the system can,
    else IPv4. Otherwise the family of the host's address (getaddrinfo): IPv4 first for a name
    that has both (what 0.2.0 bound: one socket, one address). ConfigError when unresolvable."""
    if not host:
        if socket.has_dualstack_ipv6():
            return Listen(socket.AF_INET6, ("::", port), dual_stack=True)
        return Listen(socket.AF_INET, ("0.0.0.0", port))
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise ConfigError(f"--http: cannot resolve {host!r}: {e.strerror}") from None
    family, _, _, _, address = min(found, key=lambda f: f[0] != socket.AF_INET)  # the first IPv4, or the first
    return Listen(family, tuple(address))


class CatalogReader:
    """The catalog's numbers for a scrape, on a connection of the HTTP thread (re-opened when lost),
    read through pgsched.job_stats (security_invoker): the jobs the connection's role may see, under
    the same row-level security as every other view. With the scheduler's DSN that is every job;
    serve --metrics-dsn names a role that sees fewer.

    Any role may lock pgsched.job (PUBLIC has UPDATE on it), so a read is bounded: lock_timeout
    and statement_timeout on the session, TCP keepalives against a server gone silent; a scrape
    that cannot read in time goes without the catalog's series. close() cancels a read in
    progress rather than waiting for it."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.conn: psycopg.Connection[tuple[Any, ...]] | None = None
        self.lock = threading.Lock()  # one read at a time; held for the read
        self.closed = False

    def read(self, max_jobs: int) -> tuple[dict[str, int], list[tuple[int, str, float]] | None] | None:
        """(jobs by state, per job (id, name, last success epoch) or None above max_jobs); None: not
        readable now (unreachable, locked, another scrape reading, closed)."""
        # Another scrape reading (blocked, say) is waited for no longer than a lock would be.
        if not self.lock.acquire(timeout=LOCK_TIMEOUT_S):
            log.warning("metrics: the catalog's series left out: another scrape is still reading them")
            return None
        try:
            if self.closed:
                return None
            if self.conn is None or self.conn.closed:
                self.conn = self._connect()
            return self._query(self.conn, max_jobs)
        except psycopg.Error as e:
            (log.debug if self.closed else log.warning)("metrics: cannot read the catalog: %s", first_line(e))
            # A timeout or a cancel leaves the session usable; anything that broke it, a new one.
            if self.conn is not None and (self.conn.broken or self.closed):
                self.conn.close()
                self.conn = None
            return None
        finally:
            self.lock.release()

    def _connect(self) -> psycopg.Connection[tuple[Any, ...]]:
        # Keepalives unless the DSN sets its own: a read waiting on a server that vanished from the
        # network would otherwise wait for TCP's retransmissions to give up (many minutes).
        given = psycopg.conninfo.conninfo_to_dict(self.dsn)
        dsn = psycopg.conninfo.make_conninfo(self.dsn, **{k: v for k, v in KEEPALIVES.items() if k not in given})
        conn = psycopg.connect(dsn, autocommit=True, application_name="pgsched metrics",
                               connect_timeout=CONNECT_TIMEOUT_S)
        try:
            pin_search_path(conn)
            # Parameters of set_config, not SQL text; for this session, every read.
            conn.execute("SELECT pg_catalog.set_config('lock_timeout', %s, false), "
                         "       pg_catalog.set_config('statement_timeout', %s, false)",
                         (f"{round(LOCK_TIMEOUT_S * 1000)}ms", f"{round(STATEMENT_TIMEOUT_S * 1000)}ms"))
        except BaseException:
            conn.close()
            raise
        return conn

    @staticmethod
    def _query(conn: psycopg.Connection[tuple[Any, ...]],
               max_jobs: int) -> tuple[dict[str, int], list[tuple[int, str, float]] | None]:
        states = {str(s): int(n) for s, n in conn.execute(
            "SELECT state, count(*) FROM pgsched.job_stats GROUP BY state")}
        if sum(states.values()) > max_jobs:
            return states, None
        last = [(int(j), str(name), float(t)) for j, name, t in conn.execute(
            "SELECT job_id, job_name, extract(epoch FROM last_successful_finish)::float8 "
            "  FROM pgsched.job_stats WHERE last_successful_finish IS NOT NULL ORDER BY job_id")]
        return states, last

    def close(self) -> None:
        """Close the connection; a read in progress is cancelled, and waited for CLOSE_WAIT_S at
        most (the scheduler is stopping: a read that will not end is left to the process' exit)."""
        self.closed = True  # no read starts from now on
        conn = self.conn
        if self.lock.locked() and conn is not None and not conn.closed:
            try:
                conn.cancel_safe(timeout=CLOSE_WAIT_S)
            except psycopg.Error as e:
                log.debug("metrics: cannot cancel the catalog's read: %s", first_line(e))
        if not self.lock.acquire(timeout=CLOSE_WAIT_S):
            log.warning("metrics: a read of the catalog did not end on cancel; left to the process' exit")
            return
        try:
            if self.conn is not None:
                self.conn.close()
                self.conn = None
        finally:
            self.lock.release()


class Exporter:
    """A prometheus-client collector over the scheduler's state and the catalog."""

    def __init__(self, sched: LoopState, catalog: CatalogReader) -> None:
        self.sched = sched
        self.catalog = catalog

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        s, m = self.sched, self.sched.metrics
        assert m is not None
        yield GaugeMetricFamily("pgsched_up", "1 while the scheduler is connected to its database, else 0",
                                value=1.0 if s.store is not None else 0.0)
        runs = CounterMetricFamily("pgsched_runs", "Runs ended by this scheduler, by outcome", labels=["outcome"])
        counts = dict(m.runs)
        for outcome in sorted({*OUTCOMES, *map(str, counts)}):
            runs.add_metric([outcome], float(counts.get(outcome, 0)))
        yield runs
        for name, doc, h in (
                ("pgsched_run_duration_seconds", "Run durations (start to end), runs of this scheduler", m.duration),
                ("pgsched_start_lag_seconds", "Start lag (start - plan time), runs of this scheduler", m.lag),
                ("pgsched_loop_seconds", "Duration of one round of the scheduler loop", m.loop)):
            yield HistogramMetricFamily(name, doc, buckets=h.cumulative(), sum_value=h.sum)
        workers = list(s.workers.values())
        busy = sum(1 for w in workers if w.run is not None)
        g = GaugeMetricFamily("pgsched_workers", "Worker processes of this scheduler", labels=["state"])
        g.add_metric(["busy"], float(busy))
        g.add_metric(["idle"], float(len(workers) - busy))
        yield g
        read = self.catalog.read(s.settings.metrics_max_jobs)
        if read is None:
            return
        states, last = read
        jobs = GaugeMetricFamily("pgsched_jobs", "Jobs in the catalog, by state", labels=["state"])
        for state in STATES:
            jobs.add_metric([state], float(states.get(state, 0)))
        yield jobs
        yield GaugeMetricFamily("pgsched_job_series_exported",
                                "1 if per-job series are exported, 0 above metrics_max_jobs jobs",
                                value=0.0 if last is None else 1.0)
        if last is not None:
            ls = GaugeMetricFamily("pgsched_job_last_success_timestamp_seconds",
                                   "When each job's last successful run ended (Unix time)",
                                   labels=["job_id", "job_name"])
            for job_id, job_name, t in last:
                ls.add_metric([str(job_id), job_name], t)
            yield ls


def health(sched: LoopState) -> tuple[int, str]:
    """/healthz: the loop has ticked within dead_after (what peers allow a heartbeat)."""
    m = sched.metrics
    assert m is not None
    age = time.monotonic() - m.last_tick
    if age <= sched.settings.dead_after:
        return 200, f"ok: the loop ticked {age:.1f}s ago\n"
    return 503, f"the loop has not ticked for {age:.1f}s\n"


def readiness(sched: LoopState) -> tuple[int, str]:
    """/readyz: healthy (a hung loop stays connected, but runs nothing), connected to a writable
    primary with a compatible schema (checked on every connect), not stopping."""
    if sched.stopping:
        return 503, "stopping\n"
    code, text = health(sched)
    if code != 200:
        return code, text
    if sched.store is None:
        return 503, "not connected to the database\n"
    if sched.standby:
        return 503, "the server is a standby (read-only)\n"
    if sched.instance_id is None:
        return 503, "starting\n"
    return 200, "ready\n"


class Connections:
    """The server's open connections, oldest first, each marked once its request has been read:
    never more than MAX_CONNECTIONS."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.open: dict[socket.socket, bool] = {}  # connection -> its request has been read
        self.warned_at = -FULL_WARNING_EVERY_S

    def admit(self, conn: socket.socket) -> bool:
        """Room for `conn`, made if need be by closing the oldest connection still waiting for its
        request; False when every one is serving a request."""
        with self.lock:
            if len(self.open) >= MAX_CONNECTIONS:
                idle = next((c for c, asked in self.open.items() if not asked), None)
                self._warn_full(idle is not None)
                if idle is None:
                    return False
                del self.open[idle]
                # Its thread, blocked reading, sees the end of the stream and ends. (A socket
                # closed meanwhile has no descriptor any more: this cannot touch another's.)
                with contextlib.suppress(OSError):
                    idle.shutdown(socket.SHUT_RDWR)
            self.open[conn] = False
            return True

    def asked(self, conn: socket.socket) -> None:
        """`conn` has sent its request: it is served, no longer closed to make room."""
        with self.lock:
            if conn in self.open:
                self.open[conn] = True

    def ended(self, conn: socket.socket) -> None:
        with self.lock:
            self.open.pop(conn, None)

    def _warn_full(self, evicting: bool) -> None:
        now = time.monotonic()
        if now - self.warned_at >= FULL_WARNING_EVERY_S:
            self.warned_at = now
            log.warning("http: %d connections open (the most served at once): %s", MAX_CONNECTIONS,
                        "closing the oldest idle one" if evicting else "refusing a new one")


@dataclass
class Site:
    """What the handler answers from: the scheduler's state and /metrics' body and type."""

    sched: LoopState
    metrics: Callable[[], bytes]
    metrics_type: str


class Server(ThreadingHTTPServer):
    """ThreadingHTTPServer with a thread per connection, at most MAX_CONNECTIONS of them."""

    daemon_threads = True
    # stop() does not wait for the connections' threads (an idle one may take
    # CONNECTION_TIMEOUT_S); they are daemons, and end with their connection or the process.
    block_on_close = False
    request_queue_size = LISTEN_BACKLOG

    def __init__(self, listen: Listen, site: Site) -> None:
        self.address_family = listen.family  # read by TCPServer.__init__, which makes the socket
        self.dual_stack = listen.dual_stack
        self.site = site
        self.connections = Connections()
        super().__init__(listen.address, Handler)

    def server_bind(self) -> None:
        if self.dual_stack:  # whatever the system's default (net.ipv6.bindv6only)
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()

    @property
    def url(self) -> str:
        host, port = str(self.server_address[0]), int(self.server_address[1])
        return f"http://[{host}]:{port}" if self.address_family == socket.AF_INET6 else f"http://{host}:{port}"

    def process_request(self, request: Any, client_address: Any) -> None:
        conn = cast(socket.socket, request)
        if not self.connections.admit(conn):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.connections.ended(conn)  # no thread started: its slot is free again
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.connections.ended(cast(socket.socket, request))

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection's error, logged through pgsched.http: socketserver's own prints a traceback
        to stderr, lines that are not JSON under --log-format json. A client that left or stalled
        is its own business (debug); anything else is an error of ours."""
        e = sys.exc_info()[1]
        if isinstance(e, ConnectionError | TimeoutError):  # BrokenPipeError, ConnectionResetError, ...
            log.debug("http: the client left or stalled (%s): %s", client_address, e)
        else:
            log.exception("http: error answering %s", client_address)


class Handler(BaseHTTPRequestHandler):
    """/metrics, /healthz and /readyz (HTTP/1.0: one request per connection)."""

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(CONNECTION_TIMEOUT_S)

    @property
    def site(self) -> Site:
        return cast(Server, self.server).site

    def parse_request(self) -> bool:
        ok = super().parse_request()
        if ok:
            cast(Server, self.server).connections.asked(self.connection)
        return ok

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            code, body, ctype = 200, self.site.metrics(), self.site.metrics_type
        elif path in ("/healthz", "/readyz"):
            code, text = health(self.site.sched) if path == "/healthz" else readiness(self.site.sched)
            body, ctype = text.encode(), "text/plain; charset=utf-8"
        else:
            code, body, ctype = 404, b"not found: /metrics, /healthz, /readyz\n", "text/plain; charset=utf-8"
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http: " + format, *args)


class HttpServer:
    """The listening server and its thread."""

    def __init__(self, server: Server, catalog: CatalogReader) -> None:
        self.server = server
        self.catalog = catalog
        self.thread = threading.Thread(target=server.serve_forever, name="pgsched-http", daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.catalog.close()


def start_http(address: str, sched: LoopState, catalog_dsn: str | None = None) -> HttpServer:
    """Serve /metrics, /healthz and /readyz on `address` for this scheduler; turns its metrics on.
    The catalog's series are read as `catalog_dsn`'s role (default: the scheduler's)."""
    try:
        from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
    except ImportError:
        raise ConfigError("--http needs prometheus-client: pip install 'pgsched[http]'") from None
    host, port = parse_address(address)
    sched.metrics = LoopMetrics()
    catalog = CatalogReader(catalog_dsn or sched.settings.dsn)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Exporter(sched, catalog))
    site = Site(sched, lambda: generate_latest(registry), CONTENT_TYPE_LATEST)
    listen = resolve_listen(host, port)
    try:
        server = Server(listen, site)
    except OSError as e:
        raise ConfigError(f"--http: cannot listen on {address}: {e.strerror or e}") from None
    log.info("serving /metrics, /healthz and /readyz on %s%s", server.url,
             " (IPv6 and IPv4)" if listen.dual_stack else "")
    return HttpServer(server, catalog)
