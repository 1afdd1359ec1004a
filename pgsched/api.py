"""The version of the internal API: the contract between pgsched's SQL and its Python.

The scheduler (pgsched/store.py, pgsched/pyjob.py) reaches the database only through
internal functions (`pgsched._claim`, `pgsched._heartbeat_v2`, ...) that `pgsched init`
re-applies from sql/api/ on every upgrade. Their names, arguments, results and the data
passed through them (the JSON of `_finish_runs`, `_catch_up_v2` and `_deploy_code_jobs`, the
workers' `application_name`, the `pgsched.*` session settings) are that contract; its
version is API_VERSION here and `pgsched._api()` (sql/api/00_api.sql) in the database.
A test (tests/integration/test_api_version.py) checks that the two agree.

Why a version at all: several `pgsched serve` instances run against one database for
high availability, so an upgrade replaces them one at a time, and `init` of the new
release runs while the old release's instances are still working. So:

* Release N+1's SQL serves the API of release N as well as its own: `pgsched._api()`
  returns (api_version, oldest_api_served, release), and a scheduler of API k works on a
  schema with oldest_api_served <= k <= api_version (the window, two APIs wide).
* The compatibility rule, for every internal function the previous API calls: keep its
  name; keep its arguments exactly (one more, even trailing with a default, makes another
  function to PostgreSQL: init would drop the old one, and an old instance's statement that
  looked it up before init's commit fails after it, "cache lookup failed for function");
  keep its result columns exactly, a returned row type's included (names, types, order: a
  running instance's prepared `SELECT *` re-plans on the new definition, and fails with
  "cached plan must not change result type" if the shape changed, at every claim in
  0.1.0's pipelined claim); keep reading the data the previous release sends. A function
  that keeps its arguments and result is replaced in place by init (the same oid: see
  migrate._apply_api), the smoothest change for running instances.
  A change that cannot follow the rule gets a new function (a new name), and the
  previous definition is kept beside it, in a file of its own in sql/api/ that the next
  release deletes. tests/integration/test_api_compat.py checks the rule against the
  previous release's own schema and calls (reached through git).
* `init` drops the internal functions that this release's files do not define (see
  migrate._drop_leftovers): whatever no release in the window calls, with no list to keep.
* An instance checks the window when it connects, on every reconnect and after any SQL
  error; outside it, it stops with one message naming both versions (SchemaVersionMismatch),
  never a loop of SQL errors.
* Release 0.1.0 (API 1) predates this: its schema has no `pgsched._api()`, and its
  instances check only that the highest version in pgsched.migration is theirs. So the
  migrations after its five are recorded in a second ledger it does not read
  (migrate.ledger), and each must leave API 1's functions working; from API 2 on, a release
  that adds a migration bumps the API (an instance accepts migrations newer than its own
  only from a newer API that serves it).
"""

from __future__ import annotations

from dataclasses import dataclass

from pgsched import __version__
from pgsched.errors import SchemaVersionMismatch

# The API each release speaks, this one's last: add a line with every release (bump the API
# when the release changes the contract above or adds a migration). init reads it to tell
# whether a running instance's release is still served (instances_left_behind).
RELEASE_API: dict[str, int] = {"0.1.0": 1, "0.2.0": 2}

# The API this code speaks, and the oldest whose calls this release's SQL still answers (the
# window is two APIs wide): both as pgsched._api() in sql/api/00_api.sql says them (a test
# checks that they agree).
API_VERSION = RELEASE_API[__version__]
OLDEST_API_SERVED = API_VERSION - 1


@dataclass(frozen=True)
class SchemaApi:
    """What a database's pgsched._api() says: its API, the oldest API it still serves, its release."""

    api_version: int
    oldest_api_served: int
    release: str

    def serves(self, api: int) -> bool:
        return self.oldest_api_served <= api <= self.api_version

    def describe(self) -> str:
        window = (f"serving API {self.api_version} only" if self.oldest_api_served == self.api_version
                  else f"serving API {self.oldest_api_served} to {self.api_version}")
        return f"the database's pgsched API is {self.api_version} (release {self.release}, {window})"


# A schema installed by release 0.1.0, the last without pgsched._api().
API_1 = SchemaApi(api_version=1, oldest_api_served=1, release="0.1.0")


def check(schema: SchemaApi) -> None:
    """Raise SchemaVersionMismatch, naming both versions, unless `schema` serves this code's API."""
    if schema.serves(API_VERSION):
        return
    if schema.api_version < API_VERSION:
        fix = f"run `pgsched init` of pgsched {__version__} on this database first"
    else:
        fix = f"replace this instance with pgsched {schema.release} (or another release that speaks its API)"
    raise SchemaVersionMismatch(f"{schema.describe()}; this pgsched {__version__} speaks API {API_VERSION}: {fix}")


@dataclass(frozen=True)
class LiveInstance:
    """A scheduler instance pgsched.instances says is alive, and the release it registered with."""

    instance_id: int
    host: str
    pid: int
    release: str


def instances_left_behind(instances: list[LiveInstance], oldest_api_served: int) -> list[LiveInstance]:
    """The instances whose release speaks an API older than `oldest_api_served`: a schema that
    serves no older API would answer their calls with SQL errors. A release this code does not
    know is newer than it, and so not left behind."""
    return [i for i in instances if RELEASE_API.get(i.release, oldest_api_served) < oldest_api_served]
