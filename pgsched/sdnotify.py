"""The systemd notification protocol (sd_notify(3)) with the standard library, for
contrib/systemd/pgsched@.service (Type=notify): READY=1 once the workers are connected (or,
connected to a standby, once it is known to be one: it then idles until promoted, and a start
that never ends would have systemd kill it), WATCHDOG=1 every half WATCHDOG_USEC while the loop
turns, STOPPING=1 on shutdown.

The variables are taken out of the environment when read (sd_notify's unset_environment),
so the workers and the jobs they run do not inherit them: only the scheduler speaks.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import MutableMapping

log = logging.getLogger("pgsched.scheduler")


class Notifier:
    """Datagrams to the service manager's NOTIFY_SOCKET; a failed send is logged once, never raised."""

    def __init__(self, address: str, watchdog_s: float | None) -> None:
        # '@name' is an abstract socket: its name begins with a NUL byte.
        self.address = "\0" + address[1:] if address.startswith("@") else address
        self.watchdog_s = watchdog_s
        self.next_ping = time.monotonic()
        self._warned = False
        self._ready_sent = False

    @classmethod
    def from_env(cls, environ: MutableMapping[str, str] | None = None) -> Notifier | None:
        """The notifier the environment asks for (None without NOTIFY_SOCKET); the variables are removed."""
        env = os.environ if environ is None else environ
        address = env.pop("NOTIFY_SOCKET", "")
        usec, pid = env.pop("WATCHDOG_USEC", ""), env.pop("WATCHDOG_PID", "")
        if not address:
            return None
        watchdog = None
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            watchdog = int(usec) / 1e6
        return cls(address, watchdog)

    def send(self, state: str) -> bool:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
                s.connect(self.address)
                s.sendall(state.encode())
            return True
        except OSError as e:
            if not self._warned:
                self._warned = True
                log.warning("cannot notify the service manager at %r: %s", self.address.lstrip("\0"), e)
            return False

    def ready(self, status: str) -> None:
        """READY=1 the first time, with the status; after that the status only."""
        self.send(f"STATUS={status}" if self._ready_sent else f"READY=1\nSTATUS={status}")
        self._ready_sent = True

    def stopping(self) -> None:
        self.send("STOPPING=1\nSTATUS=stopping")

    def tick(self) -> None:
        """After a round of the loop: WATCHDOG=1 when half the watchdog interval has passed."""
        if self.watchdog_s is None:
            return
        now = time.monotonic()
        if now >= self.next_ping:
            self.send("WATCHDOG=1")
            self.next_ping = now + self.watchdog_s / 2

    def wait_limit(self) -> float | None:
        """Seconds until the next WATCHDOG=1 is due (None: no watchdog): the loop must wake by then."""
        return None if self.watchdog_s is None else self.next_ping - time.monotonic()
