"""Real containers for the tool loop's tests: `python -m amity.cli serve` processes on
free ports, as a user starts them, stopped at the end of the session."""

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.suite.conftest import REPO, free_port

# A catalog entry (TOML) serving the default model under id {id}, with tools.
DEFAULT_MODEL_ENTRY = """
[[models]]
id = "{id}"
name = "{id}"
description = "The default model under another name."
source = "default"
replicas = "{replicas}"
max_completion_tokens = 100
context_length = 1000
hugging_face_url = "https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct"
license = "https://www.apache.org/licenses/LICENSE-2.0"
created = 1700000000
functionality = {{ tool_call = true, builtin_tool = true, parallel_tool_call = false }}
pricing = {{ input = 0.0, output = 0.0 }}
"""

START_TIMEOUT_S = 900  # a load takes 10-15 s here alone, minutes when the machine is shared


class Container:
    def __init__(self, *args: str, log_dir: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"container-{self.port}.log"
        self.log = open(self.log_path, "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "amity.cli", "serve", "--port", str(self.port),
             "--compile", "false", *args],
            cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(REPO)})
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the container did not start:\n{self.log_path.read_text()[-3000:]}")
            time.sleep(0.5)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture(scope="session")
def smol_container(tmp_path_factory):
    # No prefix cache: the 135M model's greedy output differs when a prompt's prefix
    # comes from the cache, and the tests compare answers and calls exactly.
    container = Container("--no-enable-prefix-caching", log_dir=tmp_path_factory.mktemp("containers"))
    yield container
    container.stop()
