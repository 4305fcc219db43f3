"""The databases the store's tests run on: a SQLite file per test, and a throwaway PostgreSQL cluster (Debian's
`postgresql` binaries) started once per session on a free loopback port, with a fresh database per test.

`make test` installs PostgreSQL if it is missing and sets CHOIR_TEST_POSTGRES=1: a cluster that cannot start is
then a failure. Elsewhere the PostgreSQL variants run when the binaries are there, and are skipped when not."""

import glob
import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.server import free_port

REQUIRED = os.environ.get("CHOIR_TEST_POSTGRES") == "1"


def _bin_dir() -> Path | None:
    """The newest installed server's binaries (Debian keeps them out of PATH)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda path: int(path.split("/")[4]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


@dataclass
class Cluster:
    bin_dir: Path
    data: Path
    port: int
    user: str | None  # the system user the server runs as (initdb refuses root), None: this one
    _names = itertools.count()

    def run(self, tool: str, *args: str) -> subprocess.CompletedProcess[str]:
        command = [str(self.bin_dir / tool), *args]
        if self.user is not None:
            command = ["runuser", "-u", self.user, "--", *command]
        return subprocess.run(command, check=True, capture_output=True, text=True, timeout=120)

    def start(self) -> None:
        self.run("initdb", "-D", str(self.data / "db"), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync")
        options = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.data} -c fsync=off "
                   "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
        self.run("pg_ctl", "-D", str(self.data / "db"), "-o", options, "-l", str(self.data / "log"), "-w", "start")

    def stop(self) -> None:
        self.run("pg_ctl", "-D", str(self.data / "db"), "-m", "immediate", "-w", "stop")

    def new_database(self) -> str:
        """A fresh, empty database: its SQLAlchemy async URL."""
        name = f"choir_{os.getpid()}_{next(self._names)}"
        self.run("psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-d", "postgres", "-q",
                 "-c", f"CREATE DATABASE {name}")
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/{name}"


def _unavailable(reason: str) -> None:
    if REQUIRED:
        pytest.fail(f"PostgreSQL is required here (CHOIR_TEST_POSTGRES=1): {reason}", pytrace=False)
    pytest.skip(f"PostgreSQL variant: {reason} (`make test` installs Debian's postgresql)")


@pytest.fixture(scope="session")
def postgres() -> Iterator[Cluster]:
    bin_dir = _bin_dir()
    if bin_dir is None:
        _unavailable("no initdb found")
    assert bin_dir is not None
    data = Path(tempfile.mkdtemp(prefix="choir-pg-"))
    user = None
    if os.geteuid() == 0:  # initdb will not run as root: the package's own user runs the cluster
        try:
            user = "postgres"
            account = pwd.getpwnam(user)
        except KeyError:
            _unavailable("running as root, and there is no `postgres` user to run the server as")
        os.chown(data, account.pw_uid, account.pw_gid)
    cluster = Cluster(bin_dir, data, free_port(), user)
    try:
        cluster.start()
    except subprocess.CalledProcessError as exc:
        log = (data / "log").read_text() if (data / "log").exists() else ""
        shutil.rmtree(data, ignore_errors=True)
        _unavailable(f"the cluster did not start: {exc.stderr.strip()} {log[-500:]}")
    yield cluster
    try:
        cluster.stop()
    finally:
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store's URL, empty: a SQLite file of this test's, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'store.sqlite3'}"
    return request.getfixturevalue("postgres").new_database()


def postgres_or_none(request: pytest.FixtureRequest) -> str | None:
    """A fresh PostgreSQL database for a server under test, or None where there is no PostgreSQL (then the
    server keeps its default SQLite store)."""
    try:
        return request.getfixturevalue("postgres").new_database()
    except pytest.skip.Exception:
        return None
