"""The rules the scheduler's Python and its SQL both apply, checked to agree: a run's application_name
and the causes of abandoned runs (pgsched.protocol, pgsched.state.AbandonedCause, sql/api/40_scheduler.sql)."""

from __future__ import annotations

import re

from pgsched.protocol import run_app_name
from pgsched.state import AbandonedCause
from tests.integration.helpers import Conn, scalar


def test_a_run_s_application_name_is_the_same_on_both_sides(conn: Conn) -> None:
    for job, run, lease in [(1, 2, 3), (2_147_483_647, 9_000_000_000, 12)]:
        assert scalar(conn, "SELECT pgsched._run_app_name(%s, %s, %s)", (job, run, lease)) == \
            run_app_name(job, run, lease)


def test_abandoned_run_causes_are_the_enum_s_values(conn: Conn) -> None:
    body = str(scalar(conn, "SELECT pg_get_functiondef('pgsched._abandoned_runs_v2'::regproc)"))
    case = body[body.index("CASE"):body.index("END AS cause")]
    causes = set(re.findall(r"THEN '([a-z_]+)'", case))
    assert causes == {c.value for c in AbandonedCause}, causes
