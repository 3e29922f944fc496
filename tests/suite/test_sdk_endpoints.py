"""The official SDK, friendli==0.12.8, drives the 12 lifecycle operations of dedicated
endpoints and the dedicated inference operations against a real `amity suite`
process (tests/suite/sdk012/check_endpoints.py, run in the second venv)."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.suite.conftest import ADMIN_TOKEN
from tests.suite.endpoint_fixtures import TINY_REPO, build_registry, start_suite
from tests.suite.test_sdk import SDK_PYTHON

CHECKS = Path(__file__).parent / "sdk012" / "check_endpoints.py"
ARTIFACT = "acme/registry/tiny:v0"


def suite_log_without_access_lines(suite) -> str:
    """Why an endpoint FAILED (the replica's exit and the end of its log) is in the
    Suite's log, not in the API's status."""
    lines = [line for line in suite.log_path.read_text().splitlines()
             if not line.startswith("INFO:     127.0.0.1:")]
    return "\nthe Suite's log, requests left out:\n" + "\n".join(lines)[-6000:]


@pytest.mark.slow
def test_friendli_0_12_8_drives_dedicated_endpoints(tmp_path, tiny_llama_path):
    if not SDK_PYTHON.exists():
        pytest.skip(f"{SDK_PYTHON} is missing: `make test` builds it (friendli==0.12.8)")
    registry = build_registry(tmp_path / "registry", tiny_llama_path)
    shutil.copytree(registry / TINY_REPO, tmp_path / "wandb" / "acme" / "registry" / "tiny" / "v0")
    suite = start_suite(tmp_path / "data", registry, "--wandb-artifact-dir", str(tmp_path / "wandb"))
    try:
        listing = suite.admin_list()
        env = {**os.environ, "SUITE_URL": suite.url, "SUITE_TOKEN": ADMIN_TOKEN,
               "SUITE_PROJECT": listing["projects"][0]["id"], "TINY_REPO": TINY_REPO,
               "WANDB_ARTIFACT": ARTIFACT}
        env.pop("PYTHONPATH", None)
        result = subprocess.run(
            [SDK_PYTHON, "-m", "pytest", CHECKS, "-v", "-p", "no:cacheprovider",
             "--confcutdir", CHECKS.parent, "--rootdir", CHECKS.parent],
            capture_output=True, text=True, timeout=1500, env=env, cwd=CHECKS.parent)
    finally:
        suite.stop()
    print(result.stdout[-5000:], result.stderr[-3000:])
    assert result.returncode == 0, result.stdout[-5000:] + suite_log_without_access_lines(suite)
    assert "= 3 passed in" in result.stdout
