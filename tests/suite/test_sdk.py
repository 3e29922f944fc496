"""The official SDK, friendli==0.12.8, drives every Files and Datasets operation against
a real `amity suite` process over a real socket (tests/suite/sdk012/check_sdk.py, run
in the second venv that `make test` builds)."""

import os
import subprocess
from pathlib import Path

import pytest

from tests.suite.conftest import ADMIN_TOKEN, REPO

SDK_PYTHON = REPO / ".venv-sdk012" / "bin" / "python"
CHECKS = Path(__file__).parent / "sdk012" / "check_sdk.py"


def test_friendli_0_12_8_drives_files_and_datasets(suite_process):
    if not SDK_PYTHON.exists():
        pytest.skip(f"{SDK_PYTHON} is missing: `make test` builds it (friendli==0.12.8)")
    listing = suite_process.admin_list()
    env = {**os.environ, "SUITE_URL": suite_process.url, "SUITE_TOKEN": ADMIN_TOKEN,
           "SUITE_PROJECT": listing["projects"][0]["id"], "SUITE_TEAM": listing["teams"][0]["id"]}
    env.pop("PYTHONPATH", None)  # the SDK venv must not see the main venv's packages
    result = subprocess.run(
        [SDK_PYTHON, "-m", "pytest", CHECKS, "-v", "-p", "no:cacheprovider",
         "--confcutdir", CHECKS.parent, "--rootdir", CHECKS.parent],
        capture_output=True, text=True, timeout=600, env=env, cwd=CHECKS.parent)
    print(result.stdout[-5000:], result.stderr[-3000:])
    assert result.returncode == 0, result.stdout[-5000:]
    assert "= 5 passed in" in result.stdout  # none skipped, none lost
