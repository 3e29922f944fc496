"""A real embedding container (all-MiniLM-L6-v2 from its package, served by amity's
own server in a thread) and in-process Suites that embed with it
(`--knowledge-embedding-url`), for most tests; an `amity suite` process on a real
socket with no such flag, which starts its own embedding replica, for the CLI and
the SDK."""

import pytest

from amity.config import EngineConfig
from amity.engine.async_engine import AsyncEngine
from tests.models.conftest import minilm_dir  # noqa: F401
from tests.server.conftest import RunningServer, free_port
from tests.suite.conftest import SuiteProcess, start_in_process


@pytest.fixture(scope="session")
def embedder_url(minilm_dir):
    engine = AsyncEngine.from_config(EngineConfig(model=str(minilm_dir), dtype="float32"))
    with RunningServer(engine, free_port()) as running:
        yield running.url


@pytest.fixture
def knowledge_suite(tmp_path, embedder_url):
    running = start_in_process(tmp_path / "suite", knowledge_embedding_url=embedder_url)
    yield running
    running.client.__exit__(None, None, None)


@pytest.fixture(scope="module")
def knowledge_process(tmp_path_factory):
    process = SuiteProcess(tmp_path_factory.mktemp("suite") / "data",
                           "--wake-timeout-s", "900").start()
    yield process
    process.stop()
