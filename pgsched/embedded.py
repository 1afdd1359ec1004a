"""A local PostgreSQL cluster made from the installed server binaries.

Owns initdb, start, stop and restart of a throwaway or per-user cluster: the one
`pgsched serve` starts when no DSN is configured, and the one the test suite
starts for itself. PostgreSQL refuses to run as root, so when we are root the
server runs as the `postgres` system user and owns its data directory.

The postmaster gets a PYTHONPATH with a copy of pgsched's pure schedule modules
(refreshed at every start, owned by the server's user), so that the PL/Python
functions in plpython/ import the same schedule code the scheduler uses wherever
the checkout lives and whatever its permissions.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg.conninfo

from pgsched.errors import ClusterError

SUPERUSER = "postgres"


def find_bindir() -> Path:
    """The directory of the newest installed PostgreSQL server binaries."""
    env = os.environ.get("PGSCHED_PG_BINDIR")
    if env and (Path(env) / "postgres").exists():
        return Path(env)
    candidates = sorted(
        (Path(p).parent for p in glob.glob("/usr/lib/postgresql/*/bin/postgres")),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    if candidates:
        return candidates[-1]
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        path = Path(out.stdout.strip())
        if (path / "postgres").exists():
            return path
    raise ClusterError("no PostgreSQL server binaries found: install PostgreSQL 15+ or set PGSCHED_PG_BINDIR")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# The modules PL/Python imports: pure, standard library only. The package's own
# __init__ is not copied (it exports the application API, which needs psycopg).
PLPYTHON_MODULES = ("schedule.py", "cron.py")


def default_home() -> Path:
    """Per-user home of the embedded cluster (root's is a system directory the postgres user can reach)."""
    if os.environ.get("PGSCHED_HOME"):
        return Path(os.environ["PGSCHED_HOME"])
    if os.geteuid() == 0:
        return Path("/var/lib/pgsched")
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "pgsched"


@dataclass
class Cluster:
    """One PostgreSQL cluster in `datadir`, listening on a Unix socket in it and on 127.0.0.1:port."""

    datadir: Path
    port: int = 0
    settings: dict[str, str] = field(default_factory=dict)
    bindir: Path = field(default_factory=find_bindir)
    run_as: str | None = None

    def __post_init__(self) -> None:
        if self.run_as is None and os.geteuid() == 0:
            self.run_as = "postgres"
        if not self.port:
            self.port = self._saved_port() or free_port()

    # -- paths and connection ---------------------------------------------------
    @property
    def socket_dir(self) -> Path:
        return self.datadir

    @property
    def logfile(self) -> Path:
        return self.datadir.parent / f"{self.datadir.name}.log"

    def dsn(self, dbname: str = "postgres", user: str = SUPERUSER) -> str:
        return psycopg.conninfo.make_conninfo(
            host=str(self.socket_dir), port=str(self.port), dbname=dbname, user=user
        )

    def stop_command(self) -> str:
        as_user = f"runuser -u {self.run_as} -- " if self.run_as else ""
        return f"{as_user}{self.bindir}/pg_ctl -D {self.datadir} stop"

    def psql_command(self, dbname: str) -> str:
        return f"psql -h {self.socket_dir} -p {self.port} -U {SUPERUSER} {dbname}"

    # -- lifecycle --------------------------------------------------------------
    def exists(self) -> bool:
        return (self.datadir / "PG_VERSION").exists()

    def initdb(self) -> None:
        if self.exists():
            return
        self.datadir.parent.mkdir(parents=True, exist_ok=True)
        self.datadir.mkdir(mode=0o700, exist_ok=True)
        self._chown(self.datadir.parent)
        self._chown(self.datadir)
        self._run(
            [str(self.bindir / "initdb"), "-D", str(self.datadir), "-U", SUPERUSER, "--auth=trust",
             "-E", "UTF8", "--locale=C.UTF-8", "--no-sync"],
        )
        conf = {
            "port": str(self.port),
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{self.socket_dir}'",
            "max_connections": "300",
            "shared_buffers": "256MB",
            "timezone": "'UTC'",
            **self.settings,
        }
        with open(self.datadir / "postgresql.conf", "a") as f:
            f.write("\n# pgsched embedded cluster\n")
            for key, value in conf.items():
                f.write(f"{key} = {value}\n")
        (self.datadir.parent / f"{self.datadir.name}.json").write_text(json.dumps({"port": self.port}))

    def start(self, timeout: float = 30.0) -> None:
        if self.running():
            return
        env = dict(os.environ)
        env["PYTHONPATH"] = str(self._install_python_modules())
        self._touch_log()
        self._run(
            [str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-l", str(self.logfile),
             "-w", "-t", str(int(timeout)), "-o", f"-p {self.port}", "start"],
            env=env,
        )

    def stop(self, mode: str = "fast") -> None:
        if not self.running():
            return
        self._run([str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-m", mode, "-w", "stop"])

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def running(self) -> bool:
        pid = self.postmaster_pid()
        if pid is None:
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True

    def postmaster_pid(self) -> int | None:
        try:
            first = (self.datadir / "postmaster.pid").read_text().splitlines()[0]
        except (FileNotFoundError, IndexError):
            return None
        return int(first) if first.strip().isdigit() else None

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.dsn(), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.datadir, ignore_errors=True)

    # -- replication ------------------------------------------------------------------
    def standby(self, datadir: Path, port: int = 0) -> Cluster:
        """A streaming-replication standby of this running cluster, in `datadir` (not started).

        pg_basebackup -R copies the data and writes standby.signal and primary_conninfo; the
        copy's configuration is this cluster's, so it gets its own port (`port`, or a free one)
        and socket directory. A failed primary is re-seeded this way, in its own directory and
        port, so that a client's multi-host DSN names both servers whichever is the primary.
        """
        replica = Cluster(datadir=datadir, port=port or free_port(), settings=dict(self.settings),
                          bindir=self.bindir, run_as=self.run_as)
        datadir.parent.mkdir(parents=True, exist_ok=True)
        self._chown(datadir.parent)
        self._run([str(self.bindir / "pg_basebackup"), "-h", str(self.socket_dir), "-p", str(self.port),
                   "-U", SUPERUSER, "-D", str(datadir), "-R", "-X", "stream", "--checkpoint=fast"])
        with open(datadir / "postgresql.conf", "a") as f:
            f.write(f"\n# standby of {self.datadir}\nport = {replica.port}\n"
                    f"unix_socket_directories = '{replica.socket_dir}'\n")
        (datadir.parent / f"{datadir.name}.json").write_text(json.dumps({"port": replica.port}))
        return replica

    def promote(self, timeout: float = 30.0) -> None:
        """Make this standby a primary (pg_ctl promote, waiting until it accepts writes)."""
        self._run([str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-w", "-t", str(int(timeout)), "promote"])

    def kill(self) -> None:
        """kill -9 of the postmaster and every process of it at once: the server as a failed machine
        leaves it (a postmaster killed alone leaves its backends serving their clients for a while)."""
        pid = self.postmaster_pid()
        if pid is None:
            return
        children = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError, IndexError, ValueError):
                    stat = Path(f"/proc/{entry}/stat").read_text()
                    if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                        children.append(int(entry))
        for p in (pid, *children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)

    # -- internals ----------------------------------------------------------------
    def _install_python_modules(self) -> Path:
        import pgsched

        src = Path(pgsched.__file__).resolve().parent
        base = self.datadir.parent / f"{self.datadir.name}.python"
        dest = base / "pgsched"
        dest.mkdir(parents=True, exist_ok=True)
        for name in PLPYTHON_MODULES:
            shutil.copyfile(src / name, dest / name)
        (dest / "__init__.py").write_text('"""pgsched\'s schedule code, as the server\'s PL/Python imports it."""\n')
        for path in (base, dest, dest / "__init__.py", *(dest / n for n in PLPYTHON_MODULES)):
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
            self._chown(path)
        return base

    def _saved_port(self) -> int | None:
        try:
            saved = json.loads((self.datadir.parent / f"{self.datadir.name}.json").read_text())
        except (FileNotFoundError, ValueError):
            return None
        port = saved.get("port")
        return port if isinstance(port, int) else None

    def _touch_log(self) -> None:
        self.logfile.touch(exist_ok=True)
        self._chown(self.logfile)

    def _chown(self, path: Path) -> None:
        if self.run_as:
            pw = pwd.getpwnam(self.run_as)
            os.chown(path, pw.pw_uid, pw.pw_gid)

    def _run(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        proc = subprocess.run(
            argv, capture_output=True, text=True, env=env, user=self.run_as, check=False, cwd="/",
        )
        if proc.returncode != 0:
            tail = ""
            if self.logfile.exists():
                tail = "\n".join(self.logfile.read_text(errors="replace").splitlines()[-20:])
            raise ClusterError(
                f"{Path(argv[0]).name} failed (exit {proc.returncode}): {proc.stderr.strip()}\n{tail}".strip()
            )
