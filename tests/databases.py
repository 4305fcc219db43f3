"""The databases the store's tests run on: a SQLite file per test, and a throwaway PostgreSQL cluster (Debian's
`postgresql` binaries) started once per session on a free loopback port, with a fresh database per test.

CHOIR_TEST_POSTGRES=1 (`make test` sets it, after installing PostgreSQL if it is missing) runs the PostgreSQL
variants, and a cluster that cannot start is then a failure. Without it they are skipped, saying so."""

import glob
import itertools
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.integration.server import free_port

REQUIRED = os.environ.get("CHOIR_TEST_POSTGRES") == "1"

# Stops the cluster and removes its directory once its stdin closes: at teardown, or when pytest is killed
# before it (the write end is the session's, and closes with it).
_WATCHDOG = """
import shutil, subprocess, sys
sys.stdin.read()
subprocess.run(sys.argv[2:], capture_output=True, timeout=60)
shutil.rmtree(sys.argv[1], ignore_errors=True)
"""


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
    data: Path  # the cluster (data/db), its log and its unix socket
    user: str | None  # the system user the server runs as (initdb refuses root), None: this one
    durable: bool = False  # commits on disk when acknowledged (synchronous_commit), for a cluster stopped as a crash
    port: int = 0
    _names: Iterator[int] = field(default_factory=itertools.count)

    def command(self, tool: str, *args: str) -> list[str]:
        command = [str(self.bin_dir / tool), *args]
        return command if self.user is None else ["runuser", "-u", self.user, "--", *command]

    def run(self, tool: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.command(tool, *args), check=True, capture_output=True, text=True, timeout=120)

    def start(self) -> None:
        self.run("initdb", "-D", str(self.data / "db"), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync")
        for attempt in range(3):  # a free port can be taken before the server binds it
            self.port = free_port()
            try:
                self.resume()
                return
            except subprocess.CalledProcessError:
                if attempt == 2:
                    raise

    def resume(self) -> None:
        """The server (again) on its port."""
        options = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.data} -c fsync=off "
                   f"-c synchronous_commit={'on' if self.durable else 'off'} -c full_page_writes=off "
                   "-c max_connections=200")
        self.run("pg_ctl", "-D", str(self.data / "db"), "-o", options, "-l", str(self.data / "log"), "-w", "start")

    def halt(self) -> None:
        """The server stopped as an outage stops it (its clients' connections cut), its data kept."""
        subprocess.run(self.stop_command(), check=True, capture_output=True, text=True, timeout=120)

    def stop_command(self) -> list[str]:
        return self.command("pg_ctl", "-D", str(self.data / "db"), "-m", "immediate", "-w", "stop")

    def new_database(self) -> str:
        """A fresh, empty database: its SQLAlchemy async URL."""
        name = f"choir_{os.getpid()}_{next(self._names)}"
        self.run("psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-d", "postgres", "-q",
                 "-c", f"CREATE DATABASE {name}")
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/{name}"


def _unavailable(reason: str) -> None:
    if REQUIRED:
        pytest.fail(f"PostgreSQL is required here (CHOIR_TEST_POSTGRES=1): {reason}", pytrace=False)
    pytest.skip(f"PostgreSQL variant: {reason}")


@contextmanager
def throwaway_cluster(durable: bool = False) -> Iterator[Cluster]:
    """A cluster of its own: trust auth, 127.0.0.1 only, fsync off; stopped and removed on leaving (or when
    pytest is killed first). Skips, or fails under CHOIR_TEST_POSTGRES=1, where none can start."""
    if not REQUIRED:
        _unavailable("CHOIR_TEST_POSTGRES=1 runs it (`make test` sets it)")
    bin_dir = _bin_dir()
    if bin_dir is None:
        _unavailable("no initdb found (`make test` installs Debian's postgresql)")
    assert bin_dir is not None
    root = os.geteuid() == 0
    # As root, a directory the `postgres` user can reach, its socket path short (unix sockets take ~100 bytes).
    data = Path(tempfile.mkdtemp(prefix="choir-pg-", dir="/tmp" if root else None))
    user = None
    if root:  # initdb will not run as root: the package's own user runs the cluster
        try:
            account = pwd.getpwnam("postgres")
        except KeyError:
            shutil.rmtree(data)
            _unavailable("running as root, and there is no `postgres` user to run the server as")
        user = account.pw_name
        os.chown(data, account.pw_uid, account.pw_gid)
    cluster = Cluster(bin_dir, data, user, durable)
    watchdog = subprocess.Popen([sys.executable, "-c", _WATCHDOG, str(data), *cluster.stop_command()],
                                stdin=subprocess.PIPE, start_new_session=True)
    try:
        try:
            cluster.start()
        except subprocess.CalledProcessError as exc:
            log = (data / "log").read_text(errors="replace") if (data / "log").exists() else ""
            _unavailable(f"the cluster did not start: {exc.stderr.strip()} {log[-500:]}")
        yield cluster
    finally:
        assert watchdog.stdin is not None
        watchdog.stdin.close()
        watchdog.wait(timeout=90)


@pytest.fixture(scope="session")
def postgres() -> Iterator[Cluster]:
    """One throwaway cluster per session (per pytest-xdist worker, were it used)."""
    with throwaway_cluster() as cluster:
        yield cluster


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store's URL, empty: a SQLite file of this test's, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'store.sqlite3'}"
    return postgres_url(request)


def postgres_url(request: pytest.FixtureRequest) -> str:
    """A fresh PostgreSQL database (its SQLAlchemy async URL), e.g. for a server under test; skips the test,
    or fails it under CHOIR_TEST_POSTGRES=1, where there is no cluster."""
    cluster: Cluster = request.getfixturevalue("postgres")
    return cluster.new_database()


def postgres_or_none(request: pytest.FixtureRequest) -> str | None:
    """A fresh PostgreSQL database for a server under test, or None where the PostgreSQL variants are skipped
    (then the server keeps its default SQLite store)."""
    try:
        return postgres_url(request)
    except pytest.skip.Exception:
        return None
