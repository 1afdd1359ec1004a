"""The job sessions' share of a run at the database's limit: pgbench running what a worker sends
for a trivial run (issue 13).

    ./dev bench job_session_sql [--seconds 8] [--clients 8,24]

A fresh cluster (no schema: the job sessions need none) and pgbench, a C client, running as
many transactions as it can of two scripts in turn: `job_session`, a function job's run as a
worker's session sees it (the run's set-up of `application_name` and the three `pgsched.*`
settings with the call of the bench's `mark` function, which inserts a row, then `DISCARD ALL`),
and `insert`, the job's `INSERT` alone. Each with --clients connections, in the simple and the
extended protocol. What it leaves out is everything of the scheduler's: the claims and closes,
the scheduler, its workers. So 1,000 runs' job sessions alone take 1,000 / `job_session`'s rate
of the whole machine. One JSON object a script, clients and protocol.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

from common import cluster

SCRIPTS = {
    "job_session": "SELECT pg_catalog.set_config('application_name', 'pgsched job 1 run 1 lease 1', false), "
                   "pg_catalog.set_config('pgsched.run_id', '1', false), "
                   "pg_catalog.set_config('pgsched.plan_time', '2026-12-06 00:00:00+00', false), "
                   "pg_catalog.set_config('pgsched.scope', '', false), public.mark(1, NULL);\nDISCARD ALL;\n",
    "insert": "INSERT INTO bench_start (job_id) VALUES (1);\n",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=int, default=8)
    ap.add_argument("--clients", default="8,24", help="pgbench's clients, a comma-separated list")
    args = ap.parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    with cluster(install=False) as (c, _):
        for name, text in SCRIPTS.items():
            script = Path(tempfile.mkstemp(suffix=".sql")[1])
            script.write_text(text)
            os.chmod(script, 0o644)  # pgbench may run as the cluster's owner
            for n in clients:
                for protocol in ("simple", "extended"):
                    out = subprocess.run(
                        [str(c.bindir / "pgbench"), "-n", "-M", protocol, "-c", str(n), "-j", "2",
                         "-T", str(args.seconds), "-f", str(script), "-h", str(c.socket_dir), "-p", str(c.port),
                         "-U", "postgres", "postgres"], capture_output=True, text=True, check=True).stdout
                    tps = next(float(line.split()[2]) for line in out.splitlines() if line.startswith("tps ="))
                    print(json.dumps({"script": name, "clients": n, "protocol": protocol, "per_s": round(tps)}),
                          flush=True)
            script.unlink()


if __name__ == "__main__":
    main()
