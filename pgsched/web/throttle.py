"""Sign-in throttling: how many refused sign-ins the dashboard takes from one client before it
stops asking PostgreSQL for a while, so that the sign-in form cannot be used to guess passwords at
the speed of the server.

Two limits, over a sliding window: refused attempts from one client address for one role (a
person mistyping; someone guessing that role's password), and refused attempts from one client
address for any role (someone trying many roles). A throttled attempt is answered without opening
a connection, and says when the next one will be taken. A sign-in that succeeds clears its
(client, role) count. Counts are per client address, so a guesser elsewhere cannot lock a person
out; behind a proxy every client has the proxy's address and the limits are shared (PostgreSQL's
`auth_delay` still applies to every client). State lives in the server's memory, bounded in size.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

PER_ROLE = 5
PER_CLIENT = 20
WINDOW_S = 300.0
MAX_KEYS = 10_000


@dataclass
class SignInThrottle:
    """Refused sign-ins per (client, role) and per client, in the last `window` seconds."""

    per_role: int = PER_ROLE
    per_client: int = PER_CLIENT
    window: float = WINDOW_S
    clock: Callable[[], float] = time.monotonic
    max_keys: int = MAX_KEYS
    # key -> the times of its refused attempts still in the window, oldest first; a key is
    # (client, role) for the first limit and (client, None) for the second.
    _refused: dict[tuple[str, str | None], deque[float]] = field(default_factory=dict)
    # Sign-ins are handled in several threads at once (Starlette runs sync handlers in a pool).
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def wait(self, client: str, role: str) -> float:
        """Seconds until `client` may try `role` again; 0 when it may now."""
        with self._lock:
            now = self.clock()
            return max(self._wait((client, role), self.per_role, now),
                       self._wait((client, None), self.per_client, now))

    def refused(self, client: str, role: str) -> None:
        with self._lock:
            now = self.clock()
            for key in ((client, role), (client, None)):
                times = self._refused.setdefault(key, deque())
                self._drop_old(times, now)
                times.append(now)
            if len(self._refused) > self.max_keys:
                self._forget(now)

    def accepted(self, client: str, role: str) -> None:
        with self._lock:
            self._refused.pop((client, role), None)

    def _wait(self, key: tuple[str, str | None], limit: int, now: float) -> float:
        times = self._refused.get(key)
        if times is None:
            return 0.0
        self._drop_old(times, now)
        if len(times) < limit:
            return 0.0
        # Free again when the attempt that brought it to its limit leaves the window.
        return times[-limit] + self.window - now

    def _drop_old(self, times: deque[float], now: float) -> None:
        while times and times[0] <= now - self.window:
            times.popleft()

    def _forget(self, now: float) -> None:
        """Keep the table within max_keys: first what has left the window, then the least recent."""
        for key in [k for k, t in self._refused.items() if not t or t[-1] <= now - self.window]:
            del self._refused[key]
        excess = len(self._refused) - self.max_keys
        if excess > 0:
            for key in sorted(self._refused, key=lambda k: self._refused[k][-1])[:excess]:
                del self._refused[key]
