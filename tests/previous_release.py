"""The previous release (0.1.0, API 1), reached through git, for the upgrade tests.

`source()` is its tree (`git archive` of its commit) and `venv()` a virtual environment
with it installed (`pip install` of that tree: its own dependencies, its own console
script). Both are built once per machine under <repo>/.cache/ (ignored by git), keyed by
the commit, under a file lock so that concurrent test sessions build them once; a build
that was interrupted is found unfinished (no stamp file) and redone.

A process of the old release must not import this checkout's code: `old_env()` is the
environment without PYTHONPATH (which the test set-up may point at this checkout) and with
PYTHONSAFEPATH=1, because the old scheduler starts its workers as `python -m pgsched.worker`,
which would otherwise put the current directory (this checkout, when the tests run from it)
first on sys.path.

A clone without that commit (a shallow one) skips these tests with the reason; anything
else that fails (git, pip) fails the test.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

RELEASE = "0.1.0"
API = 1
COMMIT = "9971113afd48d9a4820d6b4974fa13cfce7cea8b"

REPO = Path(__file__).resolve().parent.parent
CACHE = REPO / ".cache" / f"pgsched-{RELEASE}-{COMMIT[:12]}"
STAMP = ".complete"


# What a process of the old release changes in this process's environment (None: removed).
ENV_CHANGES: dict[str, str | None] = {"PYTHONPATH": None, "VIRTUAL_ENV": None, "PYTHONSAFEPATH": "1"}


def old_env(**extra: str) -> dict[str, str]:
    """This process's environment for a process of the old release (see the module's docstring)."""
    merged = {**os.environ, **ENV_CHANGES, **extra}
    return {k: v for k, v in merged.items() if v is not None}


def _require_commit() -> None:
    if shutil.which("git") is None:
        pytest.skip(f"git is not installed: release {RELEASE} is reached through the git history")
    found = subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{COMMIT}^{{commit}}"],
                           capture_output=True, check=False)
    if found.returncode != 0:
        pytest.skip(f"release {RELEASE} (commit {COMMIT[:12]}) is not in this clone's git history "
                    "(a shallow clone? `git fetch --unshallow`)")


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    with open(CACHE.parent / f"{CACHE.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _built(path: Path) -> bool:
    return (path / STAMP).is_file()


def source() -> Path:
    """The old release's source tree (sql/ beside pgsched/, as in a checkout)."""
    _require_commit()
    path = CACHE / "src"
    with _locked():
        if not _built(path):
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir(parents=True)
            archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", COMMIT],
                                     capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", str(path)], input=archive, check=True)
            (path / STAMP).write_text(COMMIT)
    return path


def venv() -> Path:
    """A virtual environment with the old release installed; its console script is bin/pgsched."""
    src = source()
    path = CACHE / "venv"
    with _locked():
        if not _built(path):
            shutil.rmtree(path, ignore_errors=True)
            # Built in place: a venv's scripts name its interpreter by absolute path.
            subprocess.run([sys.executable, "-m", "venv", str(path)], env=old_env(), check=True,
                           capture_output=True)
            pip = subprocess.run([str(path / "bin" / "python"), "-m", "pip", "install", "--quiet", str(src)],
                                 env=old_env(), capture_output=True, text=True, check=False)
            if pip.returncode != 0:
                raise RuntimeError(f"cannot install release {RELEASE} into {path}:\n{pip.stderr[-3000:]}")
            (path / STAMP).write_text(COMMIT)
    version = subprocess.run([str(path / "bin" / "pgsched"), "--version"], env=old_env(),
                             capture_output=True, text=True, check=True).stdout
    assert RELEASE in version, version
    return path


def init(dsn: str) -> None:
    """`pgsched init` of the old release on `dsn` (its own migrate.py and sql/, run from its tree)."""
    result = subprocess.run(
        [sys.executable, "-c", "import sys, psycopg; from pgsched import migrate; "
         "c = psycopg.connect(sys.argv[1], autocommit=True); migrate.init(c); c.close()", dsn],
        env=old_env(PYTHONPATH=str(source())), cwd=source(), capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def check_version(dsn: str) -> str:
    """What the old release's own check on (re)connect says of the schema at `dsn`: '' if it accepts it,
    else its error message."""
    result = subprocess.run(
        [sys.executable, "-c", "import sys, psycopg; from pgsched import migrate; "
         "c = psycopg.connect(sys.argv[1], autocommit=True); migrate.check_version(c); c.close()", dsn],
        env=old_env(PYTHONPATH=str(source())), cwd=source(), capture_output=True, text=True, check=False)
    return "" if result.returncode == 0 else result.stderr.strip().splitlines()[-1]
