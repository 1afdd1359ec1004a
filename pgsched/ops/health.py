"""How `pgsched status` judges what it read: healthy, degraded or down, as exit codes 0, 1, 2
(so the command works as a monitoring check). Pure: the rows and the database time come in."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

HEALTHY, DEGRADED, DOWN = 0, 1, 2

# An instance not stopped whose heartbeat is older than the instances view's 10 s but newer
# than this stopped heartbeating recently: degraded. Older ones are crashed instances of the
# past (nobody marks a killed instance stopped), reported but not alarming.
RECENT_DEATH = timedelta(hours=1)


@dataclass
class Verdict:
    code: int
    reasons: list[str] = field(default_factory=list)

    @property
    def word(self) -> str:
        return ("healthy", "degraded", "down")[self.code]


def judge(instances: list[dict[str, Any]], jobs: list[dict[str, Any]], now: datetime) -> Verdict:
    """2: no live instance; 1: a job disabled by pgsched (failures, crashes, cannot run) or an
    instance that stopped heartbeating within RECENT_DEATH; else 0."""
    v = Verdict(HEALTHY)
    alive = [i for i in instances if i["alive"]]
    if not alive:
        v.code = DOWN
        v.reasons.append("no live scheduler instance")
    for i in instances:
        if (not i["alive"] and i["stopped_at"] is None and i["heartbeat_at"] is not None
                and now - i["heartbeat_at"] <= RECENT_DEATH):
            v.code = max(v.code, DEGRADED)
            v.reasons.append(f"instance {i['instance_id']} ({i['host']} pid {i['pid']}) stopped heartbeating "
                             f"at {i['heartbeat_at'].isoformat(timespec='seconds')}")
    for j in jobs:
        if j["state"] == "disabled" and j["disabled_reason"]:
            v.code = max(v.code, DEGRADED)
            v.reasons.append(f"job {j['job_id']} ({j['job_name']}) disabled: {j['disabled_reason']}")
    return v
