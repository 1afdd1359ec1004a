"""Sign-in throttling: how many sign-ins the dashboard lets one client try before it stops asking
PostgreSQL for a while, so that the sign-in form cannot be used to guess passwords at the speed of
the server.

Two limits over a sliding window: attempts from one client for one role (a person mistyping;
someone guessing that role's password), and attempts from one client for any role (someone trying
many roles). An attempt counts from the moment it is let through (`begin`), so that requests sent
at once cannot all pass before the first is refused; it is taken back when it turns out not to be
a guess (`forgive`: the server was down or full, the form was incomplete), and a sign-in that
succeeds clears its (client, role) count (`accepted`). A throttled attempt is answered without
opening a connection, and says when the next one will be taken.

A client is its address, an IPv6 one by its /64 (one host usually has a whole /64 to pick from),
so a guesser elsewhere cannot lock a person out; behind a proxy every client has the proxy's
address and the limits are shared (PostgreSQL's `auth_delay` still applies to every client).
State lives in the server's memory, bounded in size.
"""

from __future__ import annotations

import heapq
import ipaddress
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

PER_ROLE = 5
PER_CLIENT = 20
WINDOW_S = 300.0
MAX_KEYS = 10_000

Key = tuple[str, str | None]  # (client, role) for the first limit, (client, None) for the second


def client_of(address: str | None) -> str:
    """The throttle's client for a peer address: the address itself, an IPv6 one's /64."""
    if not address:
        return "unknown"
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


@dataclass
class SignInThrottle:
    """Sign-in attempts per (client, role) and per client, in the last `window` seconds."""

    per_role: int = PER_ROLE
    per_client: int = PER_CLIENT
    window: float = WINDOW_S
    clock: Callable[[], float] = time.monotonic
    max_keys: int = MAX_KEYS
    # key -> the times of its counted attempts still in the window, oldest first.
    _attempts: dict[Key, deque[float]] = field(default_factory=dict, init=False, repr=False)
    # Sign-ins are handled in several threads at once (Starlette runs sync handlers in a pool).
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def begin(self, client: str, role: str) -> float:
        """Seconds until `client` may try `role` again; 0 when it may now, the attempt then counted."""
        with self._lock:
            now = self.clock()
            wait = max(self._wait((client, role), self.per_role, now),
                       self._wait((client, None), self.per_client, now))
            if wait > 0:
                return wait
            for key in ((client, role), (client, None)):
                self._attempts.setdefault(key, deque()).append(now)
            if len(self._attempts) > self.max_keys:
                self._forget(now)
            return 0.0

    def forgive(self, client: str, role: str) -> None:
        """Take back an attempt that was not a guess."""
        with self._lock:
            for key in ((client, role), (client, None)):
                self._take_back(key)

    def accepted(self, client: str, role: str) -> None:
        """A sign-in succeeded: the role's count from this client starts again."""
        with self._lock:
            self._attempts.pop((client, role), None)
            self._take_back((client, None))

    def _take_back(self, key: Key) -> None:
        # The newest: which of the attempts in flight it was does not change the count. A key left
        # with none goes, so that what was never counted is not kept.
        times = self._attempts.get(key)
        if times:
            times.pop()
        if not times:
            self._attempts.pop(key, None)

    def _wait(self, key: Key, limit: int, now: float) -> float:
        times = self._attempts.get(key)
        if times is None:
            return 0.0
        while times and times[0] <= now - self.window:
            times.popleft()
        if len(times) < limit:
            return 0.0
        # Free again when the attempt that brought it to its limit leaves the window.
        return times[-limit] + self.window - now

    def _forget(self, now: float) -> None:
        """Back within max_keys: first what has left the window, then the least recent tenth."""
        for key in [k for k, t in self._attempts.items() if not t or t[-1] <= now - self.window]:
            del self._attempts[key]
        excess = len(self._attempts) - self.max_keys
        if excess > 0:
            n = max(excess, self.max_keys // 10)
            for key in heapq.nsmallest(n, self._attempts, key=lambda k: self._attempts[k][-1]):
                del self._attempts[key]
