"""Sign-in throttling (pgsched/web/throttle.py) with an explicit clock: the two limits, the sliding
window, attempts counted as they begin, what a success and a forgiven attempt take back, clients
by address (IPv6 by /64), and the table's bound."""

from __future__ import annotations

import threading

from pgsched.web.throttle import SignInThrottle, client_of


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_role_is_refused_after_its_limit_until_the_oldest_attempt_leaves_the_window() -> None:
    clock = Clock()
    t = SignInThrottle(per_role=3, per_client=10, window=60.0, clock=clock)
    for _ in range(3):
        assert t.begin("10.0.0.1", "alice") == 0.0
        clock.now += 10
    # attempts at 1000, 1010, 1020; now 1030: free again at 1060
    assert t.begin("10.0.0.1", "alice") == 30.0
    assert t.begin("10.0.0.1", "bob") == 0.0  # another role from the same client
    assert t.begin("10.0.0.2", "alice") == 0.0  # the same role from elsewhere
    clock.now = 1059.9
    assert t.begin("10.0.0.1", "alice") > 0
    clock.now = 1060.0
    assert t.begin("10.0.0.1", "alice") == 0.0  # counted: back at the limit, free when 1010's leaves
    assert t.begin("10.0.0.1", "alice") == 10.0


def test_attempts_count_as_they_begin_so_a_burst_gets_only_the_limit_through() -> None:
    t = SignInThrottle(per_role=5, per_client=20, window=60.0, clock=Clock())
    through: list[bool] = []
    start = threading.Barrier(50)

    def attempt() -> None:
        start.wait()
        through.append(t.begin("10.0.0.1", "alice") == 0.0)

    threads = [threading.Thread(target=attempt) for _ in range(50)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert through.count(True) == 5


def test_a_client_trying_many_roles_is_refused_for_all_of_them() -> None:
    t = SignInThrottle(per_role=3, per_client=5, window=60.0, clock=Clock())
    for i in range(5):
        assert t.begin("10.0.0.1", f"role{i}") == 0.0
    assert t.begin("10.0.0.1", "someone_else") == 60.0
    assert t.begin("10.0.0.9", "someone_else") == 0.0


def test_a_success_clears_its_role_and_a_forgiven_attempt_is_taken_back() -> None:
    t = SignInThrottle(per_role=2, per_client=3, window=60.0, clock=Clock())
    t.begin("c", "alice")
    t.begin("c", "alice")
    assert t.begin("c", "alice") > 0
    t.accepted("c", "alice")
    assert t.begin("c", "alice") == 0.0  # the client's count: 1 (the success taken back), now 2
    t.forgive("c", "alice")  # the server was down: not a guess; the client's count 1 again
    assert t.begin("c", "bob") == 0.0
    assert t.begin("c", "carol") == 0.0  # the client's third
    assert t.begin("c", "dave") == 60.0


def test_a_client_is_its_address_and_an_ipv6_one_its_slash_64() -> None:
    assert client_of("192.0.2.7") == "192.0.2.7"
    assert client_of("2001:db8:1:2:aaaa::1") == client_of("2001:db8:1:2:ffff::9") == "2001:db8:1:2::/64"
    assert client_of("2001:db8:1:3::1") != client_of("2001:db8:1:2::1")
    assert client_of("::ffff:192.0.2.7") == "192.0.2.7"
    assert client_of(None) == "unknown"
    assert client_of("testclient") == "testclient"


def test_the_table_stays_within_its_bound_and_keeps_the_newest() -> None:
    clock = Clock()
    t = SignInThrottle(per_role=5, per_client=5, window=60.0, clock=clock, max_keys=100)
    for i in range(1000):
        t.begin(f"10.0.{i // 256}.{i % 256}", "alice")
        clock.now += 0.001
        assert len(t._attempts) <= 100
    last = "10.0.3.231"
    assert (last, "alice") in t._attempts and (last, None) in t._attempts
    # asking when nothing may be let through creates nothing either
    for _ in range(5):
        t.begin("192.168.0.1", "x")
    size = len(t._attempts)
    for _ in range(100):
        assert t.begin("192.168.0.1", "x") > 0
    assert len(t._attempts) == size


def test_every_refusal_is_a_guess_but_those_known_to_say_nothing_of_the_credentials() -> None:
    """The server's messages are in its lc_messages: a refusal in words the dashboard does not know
    counts (a German "password authentication failed" too); only the server unreachable, full,
    starting or stopping do not (the client's own timeout does)."""
    import psycopg

    from pgsched.web.sessions import is_guess

    def refused(text: str) -> psycopg.OperationalError:
        return psycopg.OperationalError(text)

    assert is_guess(refused('FATAL:  password authentication failed for user "alice"'))
    assert is_guess(refused("FATAL:  Passwort-Authentifizierung für Benutzer »alice« fehlgeschlagen"))
    assert is_guess(refused('FATAL:  no pg_hba.conf entry for host "10.0.0.1", user "alice"'))
    assert not is_guess(refused('connection to server at "127.0.0.1", port 1 failed: Connection refused'))
    assert not is_guess(refused("FATAL:  sorry, too many clients already"))
    assert not is_guess(refused("FATAL:  the database system is starting up"))
    # The client's timeout counts: PostgreSQL's auth_delay holds only a wrong password's refusal.
    assert is_guess(refused("timeout expired"))
    assert not is_guess(refused('connection to server on socket "/x/.s.PGSQL.5432" failed: No such file or directory'))


def test_a_refusal_is_a_guess_if_any_host_of_the_dsn_was_asked_for_the_credentials() -> None:
    """psycopg tries each host and address of a DSN and joins their failures: one refused for a
    harmless reason does not make the others' wrong password harmless."""
    import psycopg

    from pgsched.web.sessions import is_guess

    joined = ('connection failed: connection to server at "127.0.0.1", port 5432 failed: FATAL:  password '
              'authentication failed for user "alice"\nMultiple connection attempts failed. All failures were:\n'
              "- host: 'localhost', port: '5432', hostaddr: '::1': connection failed: connection to server at "
              '"::1", port 5432 failed: Connection refused\n\tIs the server running on that host and accepting '
              "TCP/IP connections?\n- host: 'localhost', port: '5432', hostaddr: '127.0.0.1': connection failed: "
              'connection to server at "127.0.0.1", port 5432 failed: FATAL:  password authentication failed for '
              'user "alice"')
    assert is_guess(psycopg.OperationalError(joined))
    harmless = joined.replace('FATAL:  password authentication failed for user "alice"', "Connection refused")
    assert not is_guess(psycopg.OperationalError(harmless))


def test_a_forgiven_attempt_leaves_no_key_behind() -> None:
    t = SignInThrottle(clock=Clock())
    t.begin("c", "x" * 1000)
    t.forgive("c", "x" * 1000)
    assert t._attempts == {}
    t.begin("c", "alice")
    t.accepted("c", "alice")
    assert t._attempts == {}
    assert "_attempts" not in repr(t)
