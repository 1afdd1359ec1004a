"""The extension's files are generated from sql/ (pgsched/extension.py): one source, in init's order."""

from __future__ import annotations

import pytest

from pgsched import __version__, extension, migrate
from pgsched.errors import SchemaVersionMismatch


def test_install_script_is_init_on_an_empty_database_in_the_same_order() -> None:
    built = extension.scripts()
    assert set(built.files) == {"pgsched.control", f"pgsched--{__version__}.sql",
                                f"pgsched--0.1.0--{__version__}.sql"}
    assert f"default_version = '{__version__}'" in built.files["pgsched.control"]
    script = built.files[f"pgsched--{__version__}.sql"]
    assert script.index("pgsched was set up in this database by `pgsched init`") < script.index("CREATE TABLE")
    # Every migration, then every API file of the plain-SQL path, each in order and whole.
    places = [script.index(m.text) for m in migrate.migrations()]
    places += [script.index(f.read_text()) for f in migrate.api_files(False)]
    assert places == sorted(places)
    for m in migrate.migrations():
        assert f"INSERT INTO {migrate.ledger(m.version)} (version, name, checksum) VALUES ({m.version}, " \
               f"'{m.name}', '{m.checksum}');" in script
    # The plain-SQL path only: none of plpython/'s definitions.
    plpython = set(migrate.api_files(True)) - set(migrate.api_files(False))
    assert plpython and not any(f.read_text() in script for f in plpython)
    # Every view and trigger replaced (pgsched._replace_if_changed), from before the first API file.
    on = script.index("set_config('pgsched.replace_all', 'on', true)")
    assert on < script.index("-- sql/api/00_api.sql") < script.index("set_config('pgsched.replace_all', 'off', true)")
    for table in extension.CONFIG_TABLES:
        # a plain table's rows only: job_run is partitioned (its default partition is marked)
        assert f"WHERE c.oid = pg_catalog.to_regclass('{table}') AND c.relkind = 'r';" in script


def test_update_script_has_only_the_migrations_the_earlier_release_lacks() -> None:
    update = extension.scripts().files[f"pgsched--0.1.0--{__version__}.sql"]
    for m in migrate.migrations():
        assert (m.text in update) == (m.version > extension.EARLIER_RELEASES["0.1.0"]), m.name
    assert update.index("pgsched.functions_before") < update.index("DROP ROUTINE")
    assert "set_config('pgsched.replace_in_place', 'on', true)" in update
    assert update.index("set_config('pgsched.replace_all', 'on', true)") < update.index("-- sql/api/00_api.sql")


def test_a_version_that_is_not_a_release_is_refused() -> None:
    with pytest.raises(extension.ExtensionError,
                       match=r"version: '1.0' is not a release version \(accepted form: N.N.N\)"):
        extension.scripts("1.0")


@pytest.mark.parametrize(("text", "major"), [("PostgreSQL 15.10 (Debian 15.10-0+deb12u1) on x86_64", 15),
                                             ("PostgreSQL 18.1", 18), ("PostgreSQL 16beta2", 16)])
def test_supported_server_versions(text: str, major: int) -> None:
    assert migrate.check_server_version(text) == major


def test_an_older_server_is_refused_by_name() -> None:
    with pytest.raises(SchemaVersionMismatch, match="PostgreSQL 14, which pgsched does not support: it needs "
                                                    "PostgreSQL 15 or later"):
        migrate.check_server_version("PostgreSQL 14.11 on x86_64-pc-linux-gnu")
    with pytest.raises(SchemaVersionMismatch, match="cannot read"):
        migrate.check_server_version("EnterpriseDB 9")
