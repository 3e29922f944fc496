"""friendli==0.12.8 drives the model catalog, the 10 serverless inference operations
and tool-assisted chat (plain and streamed) against a real `amity suite` process,
which starts the replicas of the default model and of whisper-tiny.en itself on
their first requests (tests/suite/sdk012/check_serverless.py, run in the SDK venv)."""

import os
import subprocess

import pytest

from tests.audio.conftest import speech_dir  # noqa: F401 (a fixture)
from tests.suite.conftest import ADMIN_TOKEN, REPO, SuiteProcess

SDK_PYTHON = REPO / ".venv-sdk012" / "bin" / "python"
CHECKS = REPO / "tests" / "suite" / "sdk012" / "check_serverless.py"
SMOL = "HuggingFaceTB/SmolLM2-135M-Instruct"
WHISPER = "openai/whisper-tiny.en"
pytestmark = pytest.mark.slow  # a Suite process and two replicas, then several model turns


def test_friendli_0_12_8_drives_every_serverless_operation(tmp_path, speech_dir):  # noqa: F811
    if not SDK_PYTHON.exists():
        pytest.skip(f"{SDK_PYTHON} is missing: `make test` builds it (friendli==0.12.8)")
    # A replica's first start waits for no test: the wake wait is long enough for a
    # loaded machine (it only bounds the wait; the start itself is not cut short).
    # No prefix cache on the replicas: the 135M model's greedy tool call differs when the
    # same prompt's prefix comes from the cache (the streamed call after the plain one
    # wrote a broken expression), and the checks compare the call exactly.
    suite = SuiteProcess(tmp_path / "data", "--wake-timeout-s", "900", "--replica-args",
                         "--kv-cache-memory 256MiB --no-enable-prefix-caching --compile false").start()
    try:
        env = {**os.environ, "SUITE_URL": suite.url, "SUITE_TOKEN": ADMIN_TOKEN,
               "SUITE_MODEL": SMOL, "SUITE_WHISPER": WHISPER,
               "SPEECH_WAV": str(speech_dir / "park.wav")}
        env.pop("PYTHONPATH", None)  # the SDK venv must not see the main venv's packages
        result = subprocess.run(
            [SDK_PYTHON, "-m", "pytest", CHECKS, "-v", "-p", "no:cacheprovider",
             "--confcutdir", CHECKS.parent, "--rootdir", CHECKS.parent],
            capture_output=True, text=True, timeout=1800, env=env, cwd=CHECKS.parent)
    finally:
        suite.stop()
    print(result.stdout[-5000:], result.stderr[-3000:])
    assert result.returncode == 0, result.stdout[-5000:]
    assert "= 9 passed in" in result.stdout  # none skipped, none lost
