"""--config FILE: the scheduler settings and the `serve` options a TOML file may hold."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgsched.config import read_serve_options, read_settings_file
from pgsched.errors import ConfigError


def write(tmp_path: Path, text: str) -> str:
    p = tmp_path / "pgsched.toml"
    p.write_text(text)
    return str(p)


def test_settings_and_serve_options_are_read_apart(tmp_path: Path) -> None:
    path = write(tmp_path, 'max_workers = 3\nmetrics_max_jobs = 50\ndsn = "host=db dbname=jobs user=pgsched"\n'
                           'log_format = "json"\nlog_level = "debug"\napp = "myapp.jobs"\nhttp = "127.0.0.1:9187"\n')
    assert read_settings_file(path) == {"max_workers": 3, "metrics_max_jobs": 50}
    assert read_serve_options(path) == {"dsn": "host=db dbname=jobs user=pgsched", "log_format": "json",
                                        "log_level": "debug", "app": ["myapp.jobs"], "http": "127.0.0.1:9187"}
    assert read_serve_options(write(tmp_path, 'app = ["a", "b"]\n')) == {"app": ["a", "b"]}


def test_metrics_dsn_is_a_serve_option(tmp_path: Path) -> None:
    """README: the file takes any `serve` option; --metrics-dsn was refused as an unknown setting."""
    path = write(tmp_path, 'http = ":9187"\nmetrics_dsn = "host=db dbname=jobs user=metrics_reader"\n')
    assert read_settings_file(path) == {}
    assert read_serve_options(path) == {"http": ":9187", "metrics_dsn": "host=db dbname=jobs user=metrics_reader"}


@pytest.mark.parametrize("text, message", [
    ('dsn = "host=db password=hunter2"\n', "may not hold a password"),
    ('dsn = "postgresql://u:hunter2@db/jobs"\n', "may not hold a password"),
    ('metrics_dsn = "host=db password=hunter2"\n', "metrics_dsn may not hold a password"),
    ('metrics_dsn = "postgresql://reader:hunter2@db/jobs"\n', "metrics_dsn may not hold a password"),
    ("metrics_dsn = \"host='db\"\n", "metrics_dsn is not a valid libpq connection string"),
    ("metrics_dsn = 1\n", "metrics_dsn must be a string"),
    ("http = 9187\n", "http must be a string"),
    ("app = [1]\n", "app must be a module name"),
])
def test_bad_serve_options_are_refused_without_echoing_a_password(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as e:
        read_serve_options(write(tmp_path, text))
    assert "hunter2" not in str(e.value)


def test_an_unknown_key_names_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown setting 'max_wrokers'.*log_format.*max_workers"):
        read_settings_file(write(tmp_path, "max_wrokers = 3\n"))


def test_purge_interval_may_be_zero_to_turn_the_purge_off_and_nothing_else_may(tmp_path: Path) -> None:
    assert read_settings_file(write(tmp_path, "purge_interval = 0\n")) == {"purge_interval": 0.0}
    assert read_settings_file(write(tmp_path, "purge_interval = 60\n")) == {"purge_interval": 60.0}
    with pytest.raises(ConfigError, match=r"purge_interval must be a positive number or 0 \(off\), not -1"):
        read_settings_file(write(tmp_path, "purge_interval = -1\n"))
    with pytest.raises(ConfigError, match="max_workers must be a positive number, not 0"):
        read_settings_file(write(tmp_path, "max_workers = 0\n"))



@pytest.mark.parametrize("value", ["nan", "inf", "+inf", "-inf"])
def test_a_setting_is_a_finite_number(tmp_path: Path, value: str) -> None:
    """TOML has nan and inf; no comparison refused nan, and an infinite wait is none."""
    with pytest.raises(ConfigError, match=f"shutdown_timeout must be a positive number, not {value.lstrip('+')}"):
        read_settings_file(write(tmp_path, f"shutdown_timeout = {value}\n"))
