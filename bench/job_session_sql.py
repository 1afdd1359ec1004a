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

from common import cluster, pgbench_tps

from pgsched import worker

# The worker's own set-up statement (pgsched.worker.SET_UP) with a run's values as literals, then
# the job's call and the reset, as one run's session sees them.
SET_UP_VALUES = ("'pgsched job 1 run 1 lease 1'", "'1'", "'2026-12-06 00:00:00+00'", "''")
SCRIPTS = {
    "job_session": f"SELECT {worker.SET_UP % SET_UP_VALUES}, public.mark(1, NULL);\nDISCARD ALL;\n",
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
            for n in clients:
                for protocol in ("simple", "extended"):
                    tps = pgbench_tps(c, text, n, args.seconds, protocol=protocol)
                    print(json.dumps({"script": name, "clients": n, "protocol": protocol, "per_s": round(tps)}),
                          flush=True)


if __name__ == "__main__":
    main()
