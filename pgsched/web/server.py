"""Running the dashboard: the listen address (HOST:PORT, [v6]:PORT), the --single-user rule
(loopback only: it skips sign-in, so anyone who reaches the port is the DSN's role), and
uvicorn. Needs the `pgsched[web]` extra."""

from __future__ import annotations

import ipaddress

from pgsched.errors import ConfigError


def parse_listen(text: str) -> tuple[str, int]:
    """('127.0.0.1', 8080) from '127.0.0.1:8080'; ConfigError naming --listen otherwise."""
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--listen: {text!r} is not HOST:PORT (e.g. 127.0.0.1:8080 or [::1]:8080)")
    return host, int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(dsn: str, listen: str, *, single_user: bool, idle: float, lifetime: float,
          secure_cookies: bool = False) -> None:
    host, port = parse_listen(listen)
    if single_user and not is_loopback(host):
        raise ConfigError(f"--single-user: refusing to listen on {host}: without sign-in the dashboard acts as "
                          "the DSN's role, so it listens on loopback only (127.0.0.1, ::1 or localhost)")
    import uvicorn

    from pgsched.web.app import create_app

    app = create_app(dsn, single_user=single_user, idle=idle, lifetime=lifetime, secure_cookies=secure_cookies)
    uvicorn.run(app, host=host, port=port, log_level="info", proxy_headers=False, server_header=False)
