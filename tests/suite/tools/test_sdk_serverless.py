"""friendli==0.12.8 drives the model catalog and tool-assisted chat (plain and
streamed) against a real `amity suite` process, itself in front of a real container
on the default model (tests/suite/sdk012/check_serverless.py, run in the SDK venv)."""

import os
import subprocess

import pytest

from tests.suite.conftest import ADMIN_TOKEN, REPO, SuiteProcess

SDK_PYTHON = REPO / ".venv-sdk012" / "bin" / "python"
CHECKS = REPO / "tests" / "suite" / "sdk012" / "check_serverless.py"
SMOL = "HuggingFaceTB/SmolLM2-135M-Instruct"
pytestmark = pytest.mark.slow  # a Suite process and a container, then several model turns


def test_friendli_0_12_8_drives_the_catalog_and_tool_assisted_chat(smol_container, tmp_path):
    if not SDK_PYTHON.exists():
        pytest.skip(f"{SDK_PYTHON} is missing: `make test` builds it (friendli==0.12.8)")
    suite = SuiteProcess(tmp_path / "data", "--serverless-model-urls",
                         f"{SMOL}={smol_container.url}").start()
    try:
        env = {**os.environ, "SUITE_URL": suite.url, "SUITE_TOKEN": ADMIN_TOKEN,
               "SUITE_MODEL": SMOL}
        env.pop("PYTHONPATH", None)  # the SDK venv must not see the main venv's packages
        result = subprocess.run(
            [SDK_PYTHON, "-m", "pytest", CHECKS, "-v", "-p", "no:cacheprovider",
             "--confcutdir", CHECKS.parent, "--rootdir", CHECKS.parent],
            capture_output=True, text=True, timeout=900, env=env, cwd=CHECKS.parent)
    finally:
        suite.stop()
    print(result.stdout[-5000:], result.stderr[-3000:])
    assert result.returncode == 0, result.stdout[-5000:]
    assert "= 4 passed in" in result.stdout  # none skipped, none lost
