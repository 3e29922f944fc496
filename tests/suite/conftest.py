"""The Suite under test: in-process (a TestClient on a fresh data directory) for most
tests, a real `amity suite` process on a real socket for the SDK and restart tests,
and the real servers its backends need: PostgreSQL (a throwaway cluster started
here) and an S3 API (moto in server mode). A backend that cannot start is a skip
with the reason, never a stand-in."""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from amity.config import StoreConfig, SuiteConfig
from amity.suite import accounts
from amity.suite.app import open_suite

ADMIN_TOKEN = "amity_test_admin_token"
REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Account:
    user_id: str
    team_id: str
    project_id: str
    token: str

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.token}"}


def make_account(sessions, name: str) -> Account:
    with sessions.begin() as session:
        team = accounts.create_team(session, f"{name}-team")
        user = accounts.create_user(session, name, team.id)
        project = accounts.create_project(session, team.id, f"{name}-project")
        return Account(user.id, team.id, project.id, accounts.create_token(session, user.id))


@dataclass
class InProcessSuite:
    client: TestClient
    sessions: object
    admin: Account
    other: Account  # a second user in a second team

    def account(self, name: str) -> Account:
        return make_account(self.sessions, name)


def start_in_process(data_dir: Path, database_url: str | None = None, **config) -> InProcessSuite:
    os.environ["AMITY_ADMIN_TOKEN"] = ADMIN_TOKEN
    try:
        # Replicas stay eager: a background compile per replica would slow the tests.
        suite = open_suite(SuiteConfig(**{"container_model": "none",
                                          "replica_args": "--kv-cache-memory 256MiB --compile false",
                                          **config}),
                           StoreConfig(str(data_dir), database_url),
                           announce=lambda _line: None)
    finally:
        del os.environ["AMITY_ADMIN_TOKEN"]
    with suite.sessions() as session:
        listing = accounts.listing(session)
    user = listing["users"][0]
    admin = Account(user["id"], user["defaultTeamId"], listing["projects"][0]["id"], ADMIN_TOKEN)
    client = TestClient(suite.app, base_url="http://127.0.0.1:8000")
    client.__enter__()  # runs the lifespan: the endpoint controller and its replicas
    return InProcessSuite(client, suite.sessions, admin, make_account(suite.sessions, "other"))


@pytest.fixture
def suite(tmp_path) -> InProcessSuite:
    running = start_in_process(tmp_path / "suite")
    yield running
    running.client.__exit__(None, None, None)


class SuiteProcess:
    """`amity suite` as a user starts it, on a free port."""

    def __init__(self, data_dir: Path, *extra: str):
        # No container of the default model unless a test asks for one.
        if not any(a.startswith("--container-model") for a in extra):
            extra = ("--container-model", "none", *extra)
        if "--replica-args" not in extra:  # eager replicas, as in start_in_process
            extra = ("--replica-args", "--kv-cache-memory 256MiB --compile false", *extra)
        self.data_dir, self.extra = data_dir, extra
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.output = ""

    def start(self, timeout_s: float = 60) -> "SuiteProcess":
        python_path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "AMITY_ADMIN_TOKEN": ADMIN_TOKEN, "PYTHONPATH": python_path}
        self.log_path = self.data_dir.parent / f"suite-{self.port}.log"
        self.log = open(self.log_path, "w+")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "amity.cli", "suite", "--port", str(self.port),
             "--data-dir", str(self.data_dir), *self.extra],
            stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + timeout_s
        while True:
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None or time.time() > deadline:
                self.log.seek(0)
                raise RuntimeError(f"amity suite did not start:\n{self.log.read()}")
            time.sleep(0.2)
        self.log.seek(0)
        self.output = self.log.read()
        return self

    def stop(self, timeout_s: float = 30) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=timeout_s)
        self.log.close()

    def admin_list(self) -> dict:
        import json
        out = subprocess.run(
            [sys.executable, "-m", "amity.cli", "admin", "list", "--json", "--data-dir",
             str(self.data_dir), *[a for a in self.extra if a.startswith("--database-url")]],
            capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)},
            check=True)
        return json.loads(out.stdout)


@pytest.fixture(scope="module")
def suite_process(tmp_path_factory):
    process = SuiteProcess(tmp_path_factory.mktemp("suite") / "data").start()
    yield process
    process.stop()


# --- PostgreSQL: a throwaway cluster -------------------------------------------------

def _pg_bin() -> Path | None:
    for candidate in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (candidate / "initdb").exists():
            return candidate
    found = shutil.which("initdb")
    return Path(found).parent if found else None


@pytest.fixture(scope="session")
def postgres_url():
    """A PostgreSQL server of our own, in a temporary directory, on a free port. initdb
    refuses to run as root: as root, the cluster belongs to the `postgres` user."""
    bin_dir = _pg_bin()
    if bin_dir is None:
        pytest.skip("PostgreSQL is not installed (Debian: apt-get install postgresql)")
    run_as: dict = {}
    if os.geteuid() == 0:
        import pwd
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no `postgres` user to run PostgreSQL as")
        run_as = {"user": "postgres", "group": "postgres"}
    root = Path(tempfile.mkdtemp(prefix="amity-pg-"))
    os.chmod(root, 0o777)
    data, port = root / "data", free_port()
    subprocess.run([bin_dir / "initdb", "-D", data, "-U", "amity", "--auth=trust", "-E", "UTF8"],
                   check=True, capture_output=True, cwd=root, **run_as)
    subprocess.run([bin_dir / "pg_ctl", "-D", data, "-l", root / "log", "-w", "start", "-o",
                    f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"],
                   check=True, capture_output=True, cwd=root, **run_as)
    try:
        yield f"postgresql+psycopg://amity@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([bin_dir / "pg_ctl", "-D", data, "-m", "immediate", "stop"],
                       capture_output=True, cwd=root, **run_as)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def fresh_postgres(postgres_url):
    """An empty database on the shared server, one per test."""
    from sqlalchemy import create_engine, text
    name = f"t{os.urandom(6).hex()}"
    admin = create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f"CREATE DATABASE {name}"))
    admin.dispose()
    return postgres_url.rsplit("/", 1)[0] + f"/{name}"


# --- S3: moto in server mode ---------------------------------------------------------

@pytest.fixture(scope="session")
def s3_endpoint():
    try:
        import moto.server  # noqa: F401
    except ImportError:
        pytest.skip("moto[server] is not installed")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while True:
        try:
            httpx.get(url, timeout=2)
            break
        except httpx.TransportError:
            if proc.poll() is not None or time.time() > deadline:
                pytest.skip("moto server did not start")
            time.sleep(0.2)
    yield url
    proc.terminate()
    proc.wait(timeout=30)
